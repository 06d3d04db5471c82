#!/usr/bin/python3
"""PyTorch reference of examples/gpt: the same character-level GPT, data,
batches and recipe, in eager PyTorch (Debian's 1.13 and the current release).

    gpt_torch.py [--layers N] [--heads N] [--width N] [--context N]
                 [--batch N] [--steps N | --time S] [--lr X] [--min-lr X]
                 [--warmup N] [--weight-decay X] [--clip X] [--dropout X]
                 [--seed N] [--threads N] [--blas-threads N] [--eval-every N]
                 [--eval-batches N] [--log-every N] [--metrics FILE]
                 [--save-init FILE] [--init FILE] [--checkpoint-activations]
                 [--data DIR] [--bench]

Everything that both sides must agree on is defined here and in
docs/gpt.md, and examples/gpt implements the same rules:
  - the corpus: the regular files of DIR whose names do not end in ".dat",
    in byte order of their names, concatenated; the vocabulary is the
    sorted set of bytes it holds; the first 90% (rounded down) trains, the
    rest validates;
  - the batches: row r of step s's global batch is the window of
    context + 1 tokens at train offset splitmix64_n(seed, s * batch + r)
    mod (len(train) - context); a rank of R takes rows [k B/R, (k+1) B/R);
  - validation: the non-overlapping windows of the validation split, in
    order, batch at a time; every --eval-every steps the first
    --eval-batches batches, at the end all of them;
  - the schedule: linear warmup from 0.01 x lr over --warmup steps, then
    cosine to --min-lr at the last step (ct_lr_schedule's closed form);
    with --time S the last step is estimated from the rate of the first 12
    steps, and again after 120, so that training takes about S seconds.
--save-init writes the initial weights as safetensors (examples/gpt
--init reads them); --init starts from such a file. --bench prints one JSON
line with the training throughput and "torch": the version. The loss of
every --log-every-th step goes to stderr. Without torch, it says so and
exits 0.
"""
import argparse
import json
import math
import os
import struct
import sys
import time


CORPUS_DIR = "/usr/share/games/fortunes"
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


# ------------------------------------------------------------------ data


def load_corpus(directory):
    """(train ids, val ids, vocabulary bytes) as bytes objects."""
    names = sorted(
        (n for n in os.listdir(directory)
         if not n.endswith(".dat")
         and os.path.isfile(os.path.join(directory, n))
         and not os.path.islink(os.path.join(directory, n))),
        key=lambda n: n.encode())
    if not names:
        raise ValueError("%s: no corpus files (install Debian's fortunes package)" % directory)
    text = b"".join(open(os.path.join(directory, n), "rb").read() for n in names)
    vocab = bytes(sorted(set(text)))
    table = bytearray(256)
    for i, b in enumerate(vocab):
        table[b] = i
    ids = text.translate(bytes(table))
    cut = len(ids) * 9 // 10
    return ids[:cut], ids[cut:], vocab


def splitmix64_n(seed, i):
    """Output i (from 0) of SplitMix64 started at seed."""
    z = (seed + (i + 1) * GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def train_batch(torch, train, seed, step, batch, context, lo=0, hi=None):
    """Rows [lo, hi) of step's global batch: inputs and targets [rows, context]."""
    hi = batch if hi is None else hi
    span = len(train) - context
    rows = []
    for r in range(lo, hi):
        off = splitmix64_n(seed, step * batch + r) % span
        rows.append(train[off:off + context + 1])
    t = torch.frombuffer(bytearray(b"".join(rows)), dtype=torch.uint8).long()
    t = t.view(hi - lo, context + 1)
    return t[:, :-1], t[:, 1:]


def val_batches(torch, val, batch, context, limit=None):
    """The validation split's non-overlapping windows, batch at a time."""
    windows = (len(val) - 1) // context
    count = windows // batch
    if limit is not None:
        count = min(count, limit)
    for b in range(count):
        rows = [val[(b * batch + r) * context:(b * batch + r) * context + context + 1]
                for r in range(batch)]
        t = torch.frombuffer(bytearray(b"".join(rows)), dtype=torch.uint8).long()
        t = t.view(batch, context + 1)
        yield t[:, :-1], t[:, 1:]


# ----------------------------------------------------------------- model


def build_model(torch, cfg):
    nn = torch.nn
    F = torch.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(cfg.width, 3 * cfg.width)
            self.c_proj = nn.Linear(cfg.width, cfg.width)
            self.attn_dropout = nn.Dropout(cfg.dropout)
            self.resid_dropout = nn.Dropout(cfg.dropout)
            mask = torch.tril(torch.ones(cfg.context, cfg.context, dtype=torch.bool))
            self.register_buffer("mask", mask.view(1, 1, cfg.context, cfg.context),
                                 persistent=False)

        def forward(self, x):
            B, T, C = x.shape
            h = cfg.heads
            q, k, v = self.c_attn(x).split(C, dim=2)
            q = q.view(B, T, h, C // h).transpose(1, 2)
            k = k.view(B, T, h, C // h).transpose(1, 2)
            v = v.view(B, T, h, C // h).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // h))
            att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
            att = self.attn_dropout(F.softmax(att, dim=-1))
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            return self.resid_dropout(self.c_proj(y))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(cfg.width, 4 * cfg.width)
            self.c_proj = nn.Linear(4 * cfg.width, cfg.width)
            self.dropout = nn.Dropout(cfg.dropout)

        def forward(self, x):
            return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(cfg.width)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(cfg.width)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(cfg.vocab, cfg.width),
                wpe=nn.Embedding(cfg.context, cfg.width),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList([Block() for _ in range(cfg.layers)]),
                ln_f=nn.LayerNorm(cfg.width)))
            self.lm_head = nn.Linear(cfg.width, cfg.vocab, bias=False)
            self.lm_head.weight = self.transformer.wte.weight
            # GPT-2's initialisation: N(0, 0.02), residual projections
            # scaled down by sqrt(2 * layers), zero biases.
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.layers))
                elif name.endswith(".weight") and p.dim() == 2:
                    nn.init.normal_(p, 0.0, 0.02)
                elif name.endswith(".bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            T = idx.shape[1]
            pos = torch.arange(T, dtype=torch.long)
            x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
            for block in self.transformer.h:
                if cfg.checkpoint and self.training:
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)
                else:
                    x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    return GPT()


# ----------------------------------------------------------- safetensors

DTYPES = {"F32": ("float32", 4), "F64": ("float64", 8)}


def save_safetensors(torch, path, tensors, metadata):
    """Writes name -> tensor (float32/float64) in the safetensors format:
    an 8-byte little-endian header length, a JSON header padded with
    spaces to a multiple of 8, then the raw data in header order."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        code = {torch.float32: "F32", torch.float64: "F64"}[t.dtype]
        data = t.detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)


def load_safetensors(torch, path):
    import numpy
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        kind, _ = DTYPES[e["dtype"]]
        s, t = e["data_offsets"]
        a = numpy.frombuffer(data[8 + n + s:8 + n + t], dtype=kind).copy()
        out[name] = torch.from_numpy(a).view(*e["shape"])
    return out


def model_tensors(model):
    """The state to save: every parameter once (lm_head.weight is
    transformer.wte.weight, tied, so it is left out)."""
    return {n: p for n, p in model.named_parameters() if n != "lm_head.weight"}


# -------------------------------------------------------------- training


def schedule(cfg, step, total):
    """ct_lr_schedule's closed form: LinearLR warmup then cosine."""
    warmup = min(cfg.warmup, total // 5)
    main = total - warmup

    def main_rate(t):
        t = min(t, main)
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * t / main)) / 2

    if step >= warmup:
        return main_rate(step - warmup)
    f = 0.01
    return main_rate(0) * (f + (1 - f) * step / warmup)


def evaluate(torch, model, val, cfg, limit):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in val_batches(torch, val, cfg.batch, cfg.context, limit):
            total += model(x, y).item()
            count += 1
    model.train()
    return total / count if count else float("nan")


def train(torch, cfg, train_ids, val_ids, out):
    model = build_model(torch, cfg)
    if cfg.init:
        state = load_safetensors(torch, cfg.init)
        missing = [n for n in model_tensors(model) if n not in state]
        if missing:
            raise ValueError("%s lacks %s" % (cfg.init, ", ".join(missing)))
        with torch.no_grad():
            for n, p in model_tensors(model).items():
                p.copy_(state[n])
    if cfg.save_init:
        save_safetensors(torch, cfg.save_init, model_tensors(model),
                         {"format": "pt", "vocab": str(cfg.vocab)})
    params = list(model_tensors(model).values())
    decay = [p for p in params if p.dim() >= 2]
    plain = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": plain, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.99), eps=1e-8, foreach=True)
    metrics = open(cfg.metrics, "w") if cfg.metrics else None
    total = cfg.steps
    tokens = cfg.batch * cfg.context
    start = time.perf_counter()
    timed, timed_steps, loss = 0.0, 0, float("nan")
    step = 0
    while step < total:
        t0 = time.perf_counter()
        lr = schedule(cfg, step, total)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = train_batch(torch, train_ids, cfg.seed, step, cfg.batch, cfg.context)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.item()
        dt = time.perf_counter() - t0
        if step >= 2:
            timed += dt
            timed_steps += 1
        rate = tokens * timed_steps / timed if timed > 0 else 0.0
        elapsed = time.perf_counter() - start
        if cfg.time and step + 1 in (12, 120):
            # The run's length in steps from the rate so far, estimated
            # after 12 steps and again after 120, as examples/gpt does.
            total = max(step + 1, int(cfg.time / (elapsed / (step + 1))))
        if step % cfg.log_every == 0 or step + 1 == total:
            print("step %5d  loss %.6f  lr %.3g  %.0f tokens/s" % (step, loss, lr, rate),
                  file=sys.stderr)
            if metrics:
                metrics.write(json.dumps({"step": step, "loss": loss, "lr": lr,
                                          "tokens_per_s": round(rate, 1),
                                          "time_s": round(elapsed, 3)}) + "\n")
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < total:
            v = evaluate(torch, model, val_ids, cfg, cfg.eval_batches)
            if metrics:
                metrics.write(json.dumps({"step": step + 1, "val_loss": v,
                                          "time_s": round(time.perf_counter() - start, 3)})
                              + "\n")
        step += 1
    train_s = time.perf_counter() - start
    val = None if cfg.bench else evaluate(torch, model, val_ids, cfg, None)
    if metrics and val is not None:
        metrics.write(json.dumps({"step": step, "val_loss": val,
                                  "time_s": round(time.perf_counter() - start, 3)}) + "\n")
        metrics.close()
    rate = tokens * timed_steps / timed if timed > 0 else 0.0
    out.write(json.dumps({"bench": "gpt", "impl": "torch", "torch": torch.__version__,
                          "threads": cfg.threads, "ranks": 1, "batch": cfg.batch,
                          "context": cfg.context, "layers": cfg.layers, "width": cfg.width,
                          "steps": step, "tokens_per_s": round(rate, 1),
                          "train_s": round(train_s, 2),
                          "final_loss": loss, "val_loss": val,
                          "checkpoint": cfg.checkpoint}) + "\n")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--time", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr", type=float, default=2e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--blas-threads", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--metrics", default="")
    p.add_argument("--save-init", default="")
    p.add_argument("--init", default="")
    p.add_argument("--checkpoint-activations", dest="checkpoint", action="store_true")
    p.add_argument("--data", default=CORPUS_DIR)
    p.add_argument("--bench", action="store_true")
    cfg = p.parse_args(argv)
    if cfg.steps <= 0 and cfg.time <= 0:
        cfg.time = 600.0
    if cfg.steps > 0 and cfg.time > 0:
        p.error("give --steps or --time, not both")
    if cfg.time > 0:
        cfg.steps = 1 << 62
    if cfg.width % cfg.heads:
        p.error("--width must be a multiple of --heads")
    return cfg


def main(argv):
    cfg = parse(argv)
    # OpenBLAS (Debian's torch) sizes its pool from this when torch loads it
    # (torch's set_num_threads leaves it alone). One BLAS thread beside
    # torch's OpenMP threads is Debian's torch 1.13's fastest setting on a
    # 2-core machine: 5.4k tokens/s at --threads 2, against 4.1k with
    # OpenBLAS on 2 threads too, whose pool then competes with OpenMP's
    # (docs/gpt.md). PyPI's torch calls MKL on its OpenMP threads instead,
    # which set_num_threads sizes to --threads too.
    if "torch" not in sys.modules:
        os.environ["OPENBLAS_NUM_THREADS"] = str(cfg.blas_threads)
        os.environ["OMP_NUM_THREADS"] = str(cfg.threads)
        os.environ["MKL_NUM_THREADS"] = str(cfg.threads)
    try:
        import torch
    except ImportError:
        print("gpt_torch.py: torch is not installed for %s (bash ci/setup.sh --bench installs "
              "it); skipped" % sys.executable, file=sys.stderr)
        return 0
    import torch.utils.checkpoint
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    train_ids, val_ids, vocab = load_corpus(cfg.data)
    cfg.vocab = len(vocab)
    train(torch, cfg, train_ids, val_ids, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
