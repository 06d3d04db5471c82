#!/usr/bin/python3
"""PyTorch peer of the data-parallel benchmark: the fmnist_mlp recipe under DDP.

    ddp_torch.py [--ranks N] [--steps N] [--epochs N] [--warmup-steps N]
                 [--seed S] [--data DIR] [--shard ddp|zero1|zero2|fsdp]

Trains bench/train_torch.py's recipe (784-256-256-10 MLP with ReLU,
nn.Linear's default init from torch.manual_seed(seed), F.cross_entropy,
SGD lr 0.05 momentum 0.9, pixels / 255) with the global batch of 64 split
evenly over N ranks (32 each on 2), each rank a process with one intra-op
thread. Ranks >= 2 wrap the model in DistributedDataParallel over gloo on
the loopback interface; the ranks meet through a TCPStore that this process
serves on 127.0.0.1 at a port the kernel picks. --ranks 1 runs plain PyTorch
in this process, no process group and no DDP, for reference.

Every rank shuffles through a DistributedSampler (seeded with --seed, set to
each epoch) and indexes the training tensors, which this process loads once
and shares with the ranks, so no DataLoader runs. Rank r takes every N-th
index of the epoch's permutation, so step k's global batch is the same 64
samples whatever N is (the last partial batch is kept: 938 steps an epoch);
as DDP averages the ranks' gradients, N ranks train the same model as one,
up to the order of floating-point sums.

--shard picks PyTorch's nearest equivalent of each of ct_ddp's stages
(ci/bench.sh shard): ddp (the default), zero1 (DDP with
ZeroRedundancyOptimizer), zero2 and fsdp (FSDP2's fully_shard on a CPU
device mesh, each nn.Linear a unit and the model the root, zero2 with
reshard_after_forward=False as FSDP1's SHARD_GRAD_OP, fsdp with True as
FULL_SHARD; FSDP1 itself asks for an accelerator); a torch that cannot run
one (1.13 has no fully_shard) fails the run with its error. The line then carries
"shard" and "peak_rss_bytes", rank 0's peak resident set.

Steps mode (the default) trains --warmup-steps untimed steps, then times
--steps steps. --epochs E instead trains E whole epochs, of which all but
the first --warmup-steps steps are timed, and rank 0 evaluates on the 10k
test images after each; given both, the run stops at whichever limit comes
first. A step is timed from its batch gather to the end of its update; the
shuffle, the evaluation and the barrier after them are not. samples_per_s
is the global samples of the timed steps over the slowest rank's summed
step time. Rank 0 prints one JSON line: {"bench": "ddp", "impl", "torch" (the
version), "backend", "ranks", "threads_per_rank": 1, "global_batch": 64,
"rank_batch", "epochs", "steps", "timed_steps", "samples_per_s",
"final_loss"}, where epochs counts whole epochs, final_loss is the
per-sample mean training loss of the last (possibly partial) epoch, and
"test_acc" is added when the run ended at the end of an epoch. Notes go to
stderr. Without torch it exits 1.
"""
import argparse
import datetime
import json
import os
import sys

# train_torch.py sets the BLAS, MKL and OpenMP thread counts at import, before
# torch loads those libraries; import it first. The spawned ranks import this
# file again and so get the same settings.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_torch import (BATCH, DATA_DIR, LR, MOMENTUM, build_model, evaluate,  # noqa: E402
                         load_split, train_step)

PROG = "ddp_torch.py"
# Long enough for a rank on a loaded 2-core machine, short enough that a
# lost peer ends the run instead of hanging it.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)


def note(text):
    print("%s: %s" % (PROG, text), file=sys.stderr, flush=True)


class Group:
    """The collectives a rank's bookkeeping needs; with one rank (dist is
    None) each is the identity."""

    def __init__(self, torch, dist, rank, nranks):
        self.torch, self.dist, self.rank, self.nranks = torch, dist, rank, nranks

    def barrier(self):
        if self.dist:
            self.dist.barrier()

    def reduce(self, values, op):
        """values (floats) reduced over the ranks with op ("sum" or "max")."""
        t = self.torch.tensor(values, dtype=self.torch.float64)
        if self.dist:
            ops = {"sum": self.dist.ReduceOp.SUM, "max": self.dist.ReduceOp.MAX}
            self.dist.all_reduce(t, op=ops[op])
        return t.tolist()


def total_steps(args, steps_per_epoch):
    """The steps a run trains, warm-up included: --steps' after the warm-up,
    --epochs' whole epochs, or the fewer of the two."""
    total = args.warmup_steps + args.steps if args.steps is not None else float("inf")
    if args.epochs is not None:
        total = min(total, args.epochs * steps_per_epoch)
    return total


def wrap(torch, model, group, shard):
    """The model as the stage trains it, and its optimizer."""
    if not group.dist:
        return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    if shard in ("ddp", "zero1"):
        # DDP broadcasts rank 0's parameters here and averages the gradients
        # in backward, in buckets overlapped with it.
        net = torch.nn.parallel.DistributedDataParallel(model)
        if shard == "ddp":
            return net, torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return net, ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.SGD,
                                            lr=LR, momentum=MOMENTUM)
    # FSDP2 (fully_shard), which runs on the CPU over gloo where FSDP1 asks
    # for an accelerator: each nn.Linear a unit, then the model; zero2
    # keeps the parameters from forward to backward (SHARD_GRAD_OP).
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (group.nranks,))
    keep = shard == "zero2"
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=not keep)
    fully_shard(model, mesh=mesh, reshard_after_forward=not keep)
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def train(torch, group, args, data):
    """Trains on one rank; returns the result line on rank 0, None elsewhere."""
    import torch.nn.functional as F
    from torch.utils.data import TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    x_train, y_train, x_test, y_test = data
    rank_batch = BATCH // group.nranks
    sampler = DistributedSampler(TensorDataset(x_train, y_train), num_replicas=group.nranks,
                                 rank=group.rank, shuffle=True, seed=args.seed)
    steps_per_epoch = -(-len(sampler) // rank_batch)
    total = total_steps(args, steps_per_epoch)

    model = build_model(torch, args.seed)
    net, opt = wrap(torch, model, group, args.shard)

    step = epoch = 0
    timed = timed_samples = 0.0
    acc = None
    while step < total:
        sampler.set_epoch(epoch)
        perm = torch.tensor(list(sampler))
        # A rank that finished the shuffle (or rank 0's evaluation) early
        # must not time its wait for the others in its next step.
        group.barrier()
        loss_sum = torch.zeros((), dtype=torch.float64)
        loss_samples = 0
        for start in range(0, len(perm), rank_batch):
            if step == total:
                break
            idx = perm[start:start + rank_batch]
            loss, seconds = train_step(F, net, opt, x_train, y_train, idx)
            if step >= args.warmup_steps:
                timed += seconds
                timed_samples += len(idx)
            loss_sum += loss * len(idx)
            loss_samples += len(idx)
            step += 1
        loss_sum, loss_samples = group.reduce([loss_sum.item(), loss_samples], "sum")
        final_loss = loss_sum / loss_samples
        if loss_samples < len(perm) * group.nranks:
            acc = None
            break
        epoch += 1
        # A fully sharded model's forward is a collective: every rank
        # evaluates it then (the same images), rank 0 alone otherwise.
        if group.rank == 0 or args.shard in ("zero2", "fsdp"):
            acc = evaluate(torch, model, x_test, y_test)
        if group.rank == 0:
            note("epoch %d: %d steps, mean loss %.4f, test accuracy %.4f"
                 % (epoch, steps_per_epoch, final_loss, acc))

    (timed,) = group.reduce([timed], "max")
    (timed_samples,) = group.reduce([timed_samples], "sum")
    if group.rank != 0:
        return None
    result = {"bench": "ddp", "impl": "torch_ddp" if group.dist else "torch",
              "torch": torch.__version__, "backend": "gloo" if group.dist else None,
              "ranks": group.nranks, "threads_per_rank": 1, "global_batch": BATCH,
              "rank_batch": rank_batch,
              "epochs": epoch, "steps": step, "timed_steps": step - args.warmup_steps,
              "samples_per_s": round(timed_samples / timed, 1),
              "final_loss": round(final_loss, 4)}
    if acc is not None:
        result["test_acc"] = round(acc, 4)
    if group.dist and args.shard != "ddp":
        import resource
        result.update(impl="torch_" + args.shard, shard=args.shard,
                      peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return result


def run_rank(rank, nranks, port, args, data):
    """One DDP rank, started by torch.multiprocessing.spawn; rank 0 prints the
    result. An exception here makes spawn stop the other ranks and re-raise
    it in the parent."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, nranks, False, COLLECTIVE_TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=nranks,
                            timeout=COLLECTIVE_TIMEOUT)
    result = train(torch, Group(torch, dist, rank, nranks), args, data)
    dist.destroy_process_group()
    if result is not None:
        print(json.dumps(result), flush=True)
    # torch 2.15's gloo can abort in its destructors at exit ("terminate
    # called without an active exception", one run in three here), which
    # spawn reports as a failed run; the figures are out by now, so the rank
    # leaves without running them.
    sys.stdout.flush()
    os._exit(0)


def run_ddp(torch, args, data):
    """Spawns the ranks; returns the exit status."""
    import torch.distributed as dist
    import torch.multiprocessing

    if not dist.is_available() or not dist.is_gloo_available():
        note("this torch (%s) was built without torch.distributed's gloo backend; "
             "--ranks %d needs it" % (torch.__version__, args.ranks))
        return 1
    # FSDP2's fully_shard came in 2.4 (with the device mesh); FSDP1 asks for
    # an accelerator. An older torch has nothing to run: said, not failed.
    import importlib.util
    if args.shard in ("zero2", "fsdp") and importlib.util.find_spec(
            "torch.distributed.device_mesh") is None:
        note("torch %s has no fully_shard (FSDP2, torch >= 2.4): --shard %s not run"
             % (torch.__version__, args.shard))
        return 0
    # gloo binds to the address the host name resolves to unless told an
    # interface; on a machine without a resolvable name that fails.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # The store lives as long as this process, which outlives the ranks;
    # port 0 lets the kernel pick a free port, so two runs cannot collide.
    store = dist.TCPStore("127.0.0.1", 0, None, True, COLLECTIVE_TIMEOUT,
                          wait_for_workers=False)
    note("DDP over gloo, %d ranks, store at 127.0.0.1:%d" % (args.ranks, store.port))
    try:
        torch.multiprocessing.spawn(run_rank, args=(args.ranks, store.port, args, data),
                                    nprocs=args.ranks, join=True)
    except Exception as e:  # a rank's failure, re-raised by spawn with its traceback
        note("the DDP run failed: %s" % e)
        return 1
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2,
                        help="processes (default 2); 1 runs plain PyTorch without DDP")
    parser.add_argument("--steps", type=int,
                        help="timed steps after the warm-up (default 300 unless --epochs)")
    parser.add_argument("--epochs", type=int, help="train this many whole epochs and evaluate")
    parser.add_argument("--warmup-steps", type=int, default=20,
                        help="steps run but not timed (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=DATA_DIR, help="folder of the Fashion-MNIST .gz files")
    parser.add_argument("--shard", choices=("ddp", "zero1", "zero2", "fsdp"), default="ddp",
                        help="DDP, or PyTorch's equivalent of a ZeRO stage (default ddp)")
    args = parser.parse_args()
    if args.steps is None and args.epochs is None:
        args.steps = 300
    if args.ranks < 1 or BATCH % args.ranks:
        parser.error("--ranks %d: need a divisor of the global batch %d" % (args.ranks, BATCH))
    if (args.steps is not None and args.steps < 1) or (args.epochs is not None
                                                       and args.epochs < 1):
        parser.error("--steps and --epochs must be >= 1")
    if args.warmup_steps < 0:
        parser.error("--warmup-steps must be >= 0")
    try:
        import torch
        import torch.multiprocessing  # registers the reductions that share tensors with ranks
    except ImportError:
        note("torch is not installed for %s; the PyTorch DDP peer cannot run "
             "(bash ci/setup.sh --bench installs it)" % sys.executable)
        return 1
    torch.set_num_threads(1)
    cpus = os.cpu_count() or 1
    note("torch %s from %s, %d rank%s of 1 thread, %d CPUs, load average %.2f %.2f %.2f"
         % ((torch.__version__, os.path.dirname(torch.__file__), args.ranks,
             "s" if args.ranks > 1 else "", cpus) + os.getloadavg()))
    if args.ranks > cpus:
        note("%d ranks share %d CPUs: expect the throughput of oversubscription"
             % (args.ranks, cpus))
    try:
        data = load_split(torch, args.data, "train") + load_split(torch, args.data, "t10k")
    except (OSError, ValueError) as e:
        note(str(e))
        return 1
    total = total_steps(args, -(-len(data[0]) // BATCH))
    if total <= args.warmup_steps:
        parser.error("%d steps leave none to time after %d warm-up steps"
                     % (total, args.warmup_steps))

    if args.ranks > 1:
        return run_ddp(torch, args, data)
    print(json.dumps(train(torch, Group(torch, None, 0, 1), args, data)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
