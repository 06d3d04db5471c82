#!/usr/bin/python3
"""PyTorch peer of bench_train_floor: the fmnist_mlp recipe in eager PyTorch.

    train_torch.py [--epochs N] [--max-steps N] [--seed S] [--warmup-steps N]
                   [--data DIR] [--compare JSONL]

A 784-256-256-10 MLP with ReLU (nn.Linear's default init), F.cross_entropy,
torch.optim.SGD(lr=0.05, momentum=0.9), batch 64 with the last partial batch
kept, inputs = pixels / 255. The data is loaded once into tensors; each epoch
indexes them with a permutation from a seeded torch.Generator, so no
DataLoader runs. One thread. A step (batch gather, forward, backward, update)
is timed from its start to its end; the first --warmup-steps steps and the
evaluation are not. Prints one JSON line in bench_train_floor's schema, with
"torch": the version.

With --compare, every other implementation's "train" line in that file is set
beside torch's as a ratio of samples/s on stderr, and ct's beside c_floor's.
Without torch, it says so on stderr and exits 0.
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

# OpenBLAS (Debian's torch), MKL (PyPI's) and OpenMP read these when torch
# loads them: set before the import, so that none starts a thread pool this
# single-thread benchmark never uses.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

BATCH = 64
LR = 0.05
MOMENTUM = 0.9
DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path, inner):
    """The payload of a gzipped IDX file of unsigned bytes as a numpy array
    of shape (count, *inner); raises ValueError on a malformed file."""
    import numpy
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except EOFError as e:
        raise ValueError("%s: %s" % (path, e)) from e
    ndim = 1 + len(inner)
    head = 4 + 4 * ndim
    if len(data) < head:
        raise ValueError("%s: the header needs %d bytes but the file ends after %d"
                         % (path, head, len(data)))
    magic = struct.unpack(">I", data[:4])[0]
    if magic != 0x0800 | ndim:
        raise ValueError("%s: magic 0x%08x, expected 0x%08x (unsigned bytes, %d dims)"
                         % (path, magic, 0x0800 | ndim, ndim))
    dims = struct.unpack(">%dI" % ndim, data[4:head])
    if tuple(dims[1:]) != tuple(inner):
        raise ValueError("%s: dims %s, expected (N, %s)"
                         % (path, list(dims), ", ".join(map(str, inner))))
    want = dims[0]
    for d in inner:
        want *= d
    if len(data) - head != want:
        raise ValueError("%s: %d items need %d bytes of payload, the file has %d"
                         % (path, dims[0], want, len(data) - head))
    return numpy.frombuffer(data, dtype=numpy.uint8, offset=head).reshape(dims)


def load_split(torch, data_dir, split):
    """(images, labels): float32 (N, 784) in [0, 1] and int64 (N)."""
    images = read_idx(os.path.join(data_dir, "%s-images-idx3-ubyte.gz" % split), (28, 28))
    labels = read_idx(os.path.join(data_dir, "%s-labels-idx1-ubyte.gz" % split), ())
    if len(labels) != len(images):
        raise ValueError("%s: %d labels for %d images" % (split, len(labels), len(images)))
    if labels.max() >= 10:
        raise ValueError("%s: label %d is not below 10" % (split, labels.max()))
    x = torch.from_numpy(images.copy()).reshape(len(images), -1).float() / 255
    return x, torch.from_numpy(labels.astype("int64"))


def evaluate(torch, model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def compare(path, mine):
    """Ratio lines on stderr: every other train line against torch's, and ct
    against the floor."""
    others = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            # With ci/bench.sh's baseline, the current build's last round.
            if (r.get("bench") == "train" and r.get("impl") != "torch"
                    and r.get("build") != "baseline"):
                others[r["impl"]] = r
    for impl, r in others.items():
        print("train threads=1: %s %.1f samples/s, torch %s %.1f: %s/torch %.2f" % (
            impl, r["samples_per_s"], mine["torch"], mine["samples_per_s"], impl,
            r["samples_per_s"] / mine["samples_per_s"]), file=sys.stderr)
    if "ct" in others and "c_floor" in others:
        print("train threads=1: ct/c_floor %.2f"
              % (others["ct"]["samples_per_s"] / others["c_floor"]["samples_per_s"]),
              file=sys.stderr)


def build_model(torch, seed):
    """The recipe's MLP, 784-256-256-10 with ReLU, from seed (ddp_torch.py uses it too)."""
    torch.manual_seed(seed)
    nn = torch.nn
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def train_step(F, model, opt, x, y, idx):
    """One SGD step on rows idx of x, y; returns the loss and the seconds it took."""
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach(), time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int,
                        help="stop after this many steps (default: run every epoch)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup-steps", type=int, default=50,
                        help="steps run but not timed")
    parser.add_argument("--data", default=DATA_DIR, help="folder of the Fashion-MNIST .gz files")
    parser.add_argument("--compare", metavar="JSONL", help="other implementations' output")
    args = parser.parse_args()
    if args.epochs < 1 or (args.max_steps is not None and args.max_steps < 1):
        parser.error("--epochs and --max-steps must be >= 1")
    if args.warmup_steps < 0:
        parser.error("--warmup-steps must be >= 0")
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("train_torch.py: torch is not installed for %s; skipping the PyTorch peer "
              "(bash ci/setup.sh --bench installs it)" % sys.executable,
              file=sys.stderr)
        return 0
    torch.set_num_threads(1)
    print("train_torch.py: torch %s from %s, 1 thread"
          % (torch.__version__, os.path.dirname(torch.__file__)), file=sys.stderr)
    try:
        x_train, y_train = load_split(torch, args.data, "train")
        x_test, y_test = load_split(torch, args.data, "t10k")
    except (OSError, ValueError) as e:
        print("train_torch.py: %s" % e, file=sys.stderr)
        return 1
    n = len(x_train)
    total = args.epochs * -(-n // BATCH)
    if args.max_steps is not None:
        total = min(total, args.max_steps)
    if total <= args.warmup_steps:
        print("train_torch.py: %d steps leave none to time after %d warm-up steps"
              % (total, args.warmup_steps), file=sys.stderr)
        return 2

    model = build_model(torch, args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    gen = torch.Generator().manual_seed(args.seed)

    step = epoch = timed_samples = 0
    timed = 0.0
    while step < total:
        perm = torch.randperm(n, generator=gen)
        losses = []
        for start in range(0, n, BATCH):
            if step == total:
                break
            idx = perm[start:start + BATCH]
            loss, seconds = train_step(F, model, opt, x_train, y_train, idx)
            if step >= args.warmup_steps:
                timed += seconds
                timed_samples += len(idx)
            losses.append(loss)
            step += 1
        epoch += 1
        acc = evaluate(torch, model, x_test, y_test)
        final_loss = torch.stack(losses).mean().item()
        print("train_torch.py: epoch %d: %d steps, mean loss %.4f, test accuracy %.4f"
              % (epoch, len(losses), final_loss, acc), file=sys.stderr)

    result = {"bench": "train", "impl": "torch", "torch": torch.__version__, "threads": 1,
              "batch": BATCH, "epochs": epoch, "steps": step,
              "timed_steps": step - args.warmup_steps,
              "samples_per_s": round(timed_samples / timed, 1), "test_acc": round(acc, 4),
              "final_loss": round(final_loss, 4)}
    print(json.dumps(result), flush=True)
    if args.compare:
        compare(args.compare, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
