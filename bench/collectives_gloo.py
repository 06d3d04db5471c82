#!/usr/bin/python3
"""gloo peer of bench_collectives, and the summary of the collectives benchmark.

    collectives_gloo.py [-b BYTES] [-e BYTES] [-f FACTOR] [--seconds S] [--ranks N]
                        [--nodes H --node-rank K --store FILE --iface IF]
    collectives_gloo.py --compare JSONL [--anchor-torch VERSION]

Times torch.distributed's all_reduce on the gloo backend (float32 sum, in
place, blocking) over the same sizes and with the same method as
bench/coll_bench.c: 5 passes over the sizes, each timing one repetition per
size (a barrier, then a batch of calls that fills it; the first pass
calibrates the batch by doubling untimed ones); a repetition's time is the
slowest rank's average per call, the result the median of the passes. The ranks
are processes started by torch.multiprocessing, meeting through a FileStore in
a fresh temporary folder, talking over the loopback interface, one intra-op
thread each. With --nodes H, this is node K of H (each node runs this
with the same --ranks, --store and sizes): its ranks are K x N .. K x N + N
- 1 of a world of H x N, meeting in --store, a file on a file system every
node sees, over interface IF (bench/multinode.sh). Rank 0 prints one JSON
line per size, "impl": "gloo", "torch": the version. Without torch the sweep is skipped with a note (exit 0); a
failed sweep exits 1.

With --compare nothing is measured: the summary of JSONL, every
implementation's lines of every round ("round" fields, as ci/bench.sh tags
them; a line without one counts as round 1), follows on stderr and as JSON
lines with "ratio" fields on stdout. Per implementation and size it takes
the best figure over the rounds, the one least disturbed by the machine's
other tenants: ct's shm allreduce bus bandwidth beside Open MPI's and gloo's
from 64 KiB to 64 MiB, the ratios round by round, the 8-byte latency of
every implementation, and whether the targets hold, on the best figures and
in how many rounds (a miss is reported, not an error); the lines of a
baseline build ("build": "baseline") are left out. ci/bench.sh runs the
gloo sweep under two torches: the target is judged against the gloo of
--anchor-torch (the current release; needed only when JSONL holds more than
one torch's), and every other torch's gloo is set beside ct by ratio alone.
"""
import argparse
import datetime
import json
import os
import sys
import tempfile
import time

# One thread per rank, as ct's ranks get (CT_NUM_THREADS=1): set before torch
# is imported, or Debian's torch leaves OpenBLAS on every core; the spawned
# ranks inherit it.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

REPS = 5
MAX_CALIBRATION_ITERS = 1 << 24

# The targets for ct's shm allreduce: its busbw over Open MPI's, and
# over the anchor torch's gloo.
BUSBW_RANGE = (64 << 10, 64 << 20)
OPENMPI_TARGET = 1.0
GLOO_TARGET = 2.0
LATENCY_BYTES = 8
LATENCY_TARGET_US = 5.0


def parse_bytes(text):
    """'64M' -> 67108864, as nccl-tests' -b and -e read sizes."""
    shift = {"K": 10, "M": 20, "G": 30}.get(text[-1:], 0)
    digits = text[:-1] if shift else text
    if not digits.isdigit() or int(digits) <= 0:
        raise argparse.ArgumentTypeError("%r: expected a positive size such as 8, 64K or 64M"
                                         % text)
    return int(digits) << shift


def sizes(args, nranks):
    """(bytes, count) of the sweep, as coll_sweep makes them."""
    nbytes = args.b
    while nbytes <= args.e:
        count = nbytes // 4
        count -= count % nranks
        if count > 0:
            yield count * 4, count
        nbytes *= args.f


# ------------------------------------------------------------------ gloo

class Timer:
    """coll_bench.c's timing, over torch.distributed: passes over all the
    sizes, each timing one repetition per size after a barrier; the first
    pass calibrates by doubling untimed batches."""

    def __init__(self, torch, dist, seconds):
        self.dist = dist
        self.rep_s = seconds / (REPS + 1)
        self.slowest = torch.zeros(1, dtype=torch.float64)

    def batch(self, run, iters):
        """The slowest rank's seconds for iters calls after a barrier."""
        self.dist.barrier()
        t0 = time.perf_counter()
        run(iters)
        self.slowest[0] = time.perf_counter() - t0
        self.dist.all_reduce(self.slowest, op=self.dist.ReduceOp.MAX)
        return self.slowest.item()

    def one_pass(self, run, iters):
        """Seconds per call of one repetition and the calls it made: iters,
        or, when None, calibrated at the fastest rate that doubling batches
        showed (a neighbour's stall only ever slows a batch down)."""
        run(1)
        if iters is None:
            n, fastest = 1, float("inf")
            while True:
                t = self.batch(run, n)
                fastest = min(fastest, t / n)
                if t >= self.rep_s / 2 or n >= MAX_CALIBRATION_ITERS:
                    break
                n *= 2
            iters = max(1, round(self.rep_s / max(fastest, 1e-9)))
        elif iters >= 4:
            run(iters // 4)
        return self.batch(run, iters) / iters, iters


def gloo_rank(local, nranks, args, store_path):
    """One rank of the gloo sweep (local: its index on this node); rank 0
    reports."""
    import torch
    import torch.distributed as dist
    rank = args.node_rank * args.ranks + local
    torch.set_num_threads(1)
    # A rank that dies makes spawn stop the others; the timeout covers a
    # rank that hangs.
    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank,
                            world_size=nranks, timeout=datetime.timedelta(seconds=120))
    timer = Timer(torch, dist, args.seconds)
    todo = list(sizes(args, nranks))
    iters = [None] * len(todo)
    samples = [[] for _ in todo]
    for _ in range(REPS):
        for i, (_, count) in enumerate(todo):
            t = torch.ones(count, dtype=torch.float32)

            def run(n, t=t):
                for _ in range(n):
                    dist.all_reduce(t)

            sec, iters[i] = timer.one_pass(run, iters[i])
            samples[i].append(sec)
    dist.destroy_process_group()
    if rank != 0:
        return
    print("%-8s %-14s %12s %10s %12s %12s %12s" % (
        "gloo", "op", "bytes", "iters", "time (us)", "algbw (GB/s)", "busbw (GB/s)"),
        file=sys.stderr)
    for (nbytes, count), n, secs in zip(todo, iters, samples):
        sec = sorted(secs)[REPS // 2]
        algbw = nbytes / sec * 1e-9
        busbw = algbw * 2 * (nranks - 1) / nranks
        print(json.dumps({"bench": "collectives", "impl": "gloo", "torch": torch.__version__,
                          "op": "allreduce", "dtype": "float32", "ranks": nranks,
                          "bytes": nbytes, "count": count,
                          "iters": n, "us": round(sec * 1e6, 2), "algbw_gbps": round(algbw, 4),
                          "busbw_gbps": round(busbw, 4)}), flush=True)
        print("%-8s %-14s %12d %10d %12.2f %12.4f %12.4f" % (
            "gloo", "allreduce", nbytes, n, sec * 1e6, algbw, busbw), file=sys.stderr)


def run_gloo(args):
    """Runs the gloo sweep; False when it failed, True when it ran or torch
    is missing (each with a note on stderr)."""
    try:
        import torch
        import torch.multiprocessing
    except ImportError:
        print("collectives_gloo.py: torch is not installed for %s; skipping the gloo peer "
              "(bash ci/setup.sh --bench installs it)" % sys.executable,
              file=sys.stderr)
        return True
    nranks = args.ranks * args.nodes
    print("collectives_gloo.py: torch %s, gloo over %s, %d ranks"
          % (torch.__version__, args.iface, nranks), file=sys.stderr)
    # gloo binds to the address the host name resolves to unless told an
    # interface; on a machine without a resolvable name that fails.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", args.iface)
    with tempfile.TemporaryDirectory(prefix="ct-bench-gloo-") as tmp:
        store = args.store or os.path.join(tmp, "store")
        try:
            torch.multiprocessing.spawn(gloo_rank, args=(nranks, args, store),
                                        nprocs=args.ranks, join=True)
        except Exception as e:  # a rank's failure, re-raised by spawn with its traceback
            print("collectives_gloo.py: the gloo sweep failed: %s" % e, file=sys.stderr)
            return False
    return True


# --------------------------------------------------------------- summary

def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def allreduce_rounds(results, impl, backend=None, torch=None):
    """{round: {bytes: line}}: impl's allreduce lines (those of torch's gloo)
    by round and size; a line without a "round" counts as round 1. A
    baseline's lines ("build": "baseline") are left out: ci/bench.sh sets
    them beside the current build's itself."""
    rounds = {}
    for r in results:
        if (r.get("impl") == impl and r.get("backend") == backend
                and r.get("torch") == torch and r.get("build") != "baseline"
                and r.get("op") == "allreduce" and "busbw_gbps" in r):
            rounds.setdefault(r.get("round", 1), {})[r["bytes"]] = r
    return rounds


def best_of_rounds(rounds):
    """{bytes: line}: per size, the line of the round with the least time,
    hence the highest busbw (chosen on "us": at small sizes busbw's 4 decimals
    tie, the time's do not)."""
    best = {}
    for by_size in rounds.values():
        for nbytes, r in by_size.items():
            if nbytes not in best or r["us"] < best[nbytes]["us"]:
                best[nbytes] = r
    return best


def log(text):
    print(text, file=sys.stderr)


def emit(record):
    print(json.dumps(dict({"bench": "collectives", "op": "allreduce"}, **record)), flush=True)


def rounds_met(met_by_round):
    """The verdict's tail: in how many of the rounds measured a target held."""
    return "met in %d of %d rounds" % (sum(met_by_round), len(met_by_round))


def torch_versions(results):
    """The torch versions of the gloo lines in results."""
    return {r.get("torch") for r in results if r.get("impl") == "gloo"}


def busbw_peers(results, anchor):
    """[(name, fields, target)] of the busbw peers: Open MPI, the anchor's
    gloo, then every other torch's gloo, with no target. fields name the
    peer in the JSON lines."""
    def gloo(version):
        if not version:
            return "gloo", {"peer": "gloo"}
        return "gloo %s" % version, {"peer": "gloo", "torch": version}

    peers = [("openmpi", {"peer": "openmpi"}, OPENMPI_TARGET), gloo(anchor) + (GLOO_TARGET,)]
    others = sorted(torch_versions(results) - {anchor}, key=str)
    return peers + [gloo(v) + (None,) for v in others]


def peer_rounds(results, fields):
    return allreduce_rounds(results, fields["peer"], torch=fields.get("torch"))


def busbw_by_round(mine, peer, sizes_in_range, name, fields, target):
    """Prints and emits ct shm / peer busbw per round and size, for the rounds
    that measured both; returns whether each round met the target, if any,
    at every size."""
    common = sorted(set(mine) & set(peer))
    if not common:
        return []
    log("per round: busbw ratio ct shm / %s, each from the two figures of that round" % name)
    log("%12s" % "bytes" + "".join(" %9s" % ("round %d" % n) for n in common))
    lowest = {n: None for n in common}
    for nbytes in sizes_in_range:
        row = "%12d" % nbytes
        for n in common:
            a, b = mine[n].get(nbytes), peer[n].get(nbytes)
            if not a or not b or b["busbw_gbps"] <= 0:
                row += " %9s" % "-"
                continue
            ratio = a["busbw_gbps"] / b["busbw_gbps"]
            lowest[n] = ratio if lowest[n] is None else min(lowest[n], ratio)
            row += " %9.2f" % ratio
            emit(dict({"summary": "busbw_round", "round": n, "bytes": nbytes,
                       "metric": "busbw_gbps", "ct_backend": "shm", "ct": a["busbw_gbps"]},
                      **fields, peer_value=b["busbw_gbps"], ratio=round(ratio, 3)))
        log(row)
    log("%12s" % "lowest" + "".join(
        " %9s" % ("-" if lowest[n] is None else "%.2f" % lowest[n]) for n in common))
    if target is None:
        return []
    return [all(nbytes in mine[n] and nbytes in peer[n] for nbytes in sizes_in_range)
            and lowest[n] is not None and lowest[n] >= target for n in common]


def summarize(results, anchor):
    """Prints the comparison; returns nothing: a missed target is a finding."""
    peers = busbw_peers(results, anchor)
    impls = {"ct shm": allreduce_rounds(results, "ct", "shm"),
             "ct mpi": allreduce_rounds(results, "ct", "mpi")}
    impls.update((name, peer_rounds(results, fields)) for name, fields, _ in peers)
    best = {name: best_of_rounds(rounds) for name, rounds in impls.items()}
    shm = best["ct shm"]
    lo, hi = BUSBW_RANGE
    in_range = sorted(b for b in shm if lo <= b <= hi)

    log("\nsummary: allreduce, float32 sum, busbw in GB/s (nccl-tests' definition); per "
        "implementation and size the best of its rounds, the sample the machine's other tenants "
        "disturbed least (rounds: %s); ratio = ct shm / peer%s"
        % (", ".join("%s %d" % (name, len(rounds)) for name, rounds in impls.items() if rounds),
           "; the gloo target's torch: %s" % anchor if anchor else ""))
    width = {name: max(10, len(name)) for name, _, _ in peers}
    log("%12s %10s" % ("bytes", "ct shm") + "".join(
        " %*s %10s" % (width[name], name, "ratio") for name, _, _ in peers))
    ratios = {name: [] for name, _, _ in peers}
    for nbytes in in_range:
        mine = shm[nbytes]["busbw_gbps"]
        row = "%12d %10.3f" % (nbytes, mine)
        for name, fields, target in peers:
            peer = best[name].get(nbytes)
            if not peer or peer["busbw_gbps"] <= 0:
                row += " %*s %10s" % (width[name], "-", "-")
                continue
            ratio = mine / peer["busbw_gbps"]
            ratios[name].append((ratio, nbytes))
            row += " %*.3f %10.2f" % (width[name], peer["busbw_gbps"], ratio)
            record = dict({"summary": "busbw", "bytes": nbytes, "metric": "busbw_gbps",
                           "ct_backend": "shm", "ct": round(mine, 4)}, **fields,
                          peer_value=peer["busbw_gbps"], ratio=round(ratio, 3))
            if target is not None:
                record.update(target_ratio=target, met=ratio >= target)
            emit(record)
        log(row)

    met_by_round = {name: busbw_by_round(impls["ct shm"], impls[name], in_range, name, fields,
                                         target)
                    for name, fields, target in peers}
    for name, fields, target in peers:
        if target is None:
            continue
        rs = ratios[name]
        what = "ct shm busbw >= %gx %s's at every size from %d to %d bytes" % (target, name, lo, hi)
        if not rs or len(rs) < len(in_range):
            log("target: %s: not measured (%s's or ct shm's figures are missing)" % (what, name))
            continue
        worst, at = min(rs)
        met = worst >= target
        missed = [b for r, b in rs if r < target]
        log("target: %s: %s on the best figures (%d sizes measured, %d to %d; lowest ratio %.2f, "
            "at %d bytes%s); %s"
            % (what, "met" if met else "MISSED", len(rs), min(b for _, b in rs),
               max(b for _, b in rs), worst, at,
               "; below target at " + ", ".join(map(str, sorted(missed))) if missed else "",
               rounds_met(met_by_round[name])))
        emit(dict({"summary": "target", "target": "busbw_vs_" + fields["peer"]}, **fields,
                  metric="busbw_gbps", ratio=round(worst, 3), bytes=at, target_ratio=target,
                  met=met, rounds=len(met_by_round[name]), rounds_met=sum(met_by_round[name])))

    latency = {name: by[LATENCY_BYTES]["us"] for name, by in best.items() if LATENCY_BYTES in by}
    log("%d-byte allreduce latency, best of rounds: %s" % (LATENCY_BYTES, ", ".join(
        "%s %.2f us" % (name, us) for name, us in latency.items()) or "none"))
    # ct shm against every peer, and ct's mpi backend against the MPI it calls.
    peer_fields = dict({"ct mpi": {"peer": "ct_mpi"}}, **{name: f for name, f, _ in peers})
    for mine, peer in [("ct shm", name) for name in list(impls)[1:]] + [("ct mpi", "openmpi")]:
        if mine in latency and peer in latency and latency[peer] > 0:
            emit(dict({"summary": "latency", "bytes": LATENCY_BYTES, "metric": "us",
                       "ct_backend": mine.split()[1], "ct": round(latency[mine], 2)},
                      **peer_fields[peer], peer_value=round(latency[peer], 2),
                      ratio=round(latency[mine] / latency[peer], 3)))
    if "ct shm" in latency:
        met = latency["ct shm"] <= LATENCY_TARGET_US
        met_by_round = [by[LATENCY_BYTES]["us"] <= LATENCY_TARGET_US
                        for by in impls["ct shm"].values() if LATENCY_BYTES in by]
        log("target: ct shm %d-byte allreduce <= %g us: %s on the best figure (%.2f us); %s"
            % (LATENCY_BYTES, LATENCY_TARGET_US, "met" if met else "MISSED", latency["ct shm"],
               rounds_met(met_by_round)))
        emit({"summary": "target", "target": "latency_8b", "metric": "us", "bytes": LATENCY_BYTES,
              "ct": round(latency["ct shm"], 2), "target_us": LATENCY_TARGET_US, "met": met,
              "rounds": len(met_by_round), "rounds_met": sum(met_by_round)})
    else:
        log("target: ct shm %d-byte allreduce <= %g us: not measured"
            % (LATENCY_BYTES, LATENCY_TARGET_US))

    ref = [r for r in results if r.get("impl") == "memcpy"]
    if ref and ref[-1]["bytes"] in shm:
        nbytes = ref[-1]["bytes"]
        log("hardware: memcpy of %d bytes, 1 thread: %.2f GB/s copied; ct shm allreduce busbw "
            "there, best of rounds: %.2f GB/s (%.2f of memcpy)" % (
                nbytes, ref[-1]["algbw_gbps"], shm[nbytes]["busbw_gbps"],
                shm[nbytes]["busbw_gbps"] / ref[-1]["algbw_gbps"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-b", type=parse_bytes, default=8, help="smallest message (default 8)")
    parser.add_argument("-e", type=parse_bytes, default=64 << 20,
                        help="largest message (default 64M)")
    parser.add_argument("-f", type=int, default=2, help="size factor between steps (default 2)")
    parser.add_argument("--seconds", type=float, default=0.2,
                        help="time aimed at per size (default 0.2)")
    parser.add_argument("--ranks", type=int, default=2,
                        help="gloo ranks (on this node; default 2)")
    parser.add_argument("--nodes", type=int, default=1, help="nodes of the world (default 1)")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's index (default 0)")
    parser.add_argument("--store", help="the file store every node sees (with --nodes > 1)")
    parser.add_argument("--iface", default="lo", help="gloo's interface (default lo)")
    parser.add_argument("--compare", metavar="JSONL",
                        help="summarize these lines, every implementation's of every round, "
                             "instead of measuring")
    parser.add_argument("--anchor-torch", metavar="VERSION",
                        help="with --compare: the torch whose gloo the target is judged against "
                             "(default: the only one in JSONL)")
    args = parser.parse_args()
    if args.f < 2 or args.ranks < 1 or not 0 < args.seconds < 3600 or args.b > args.e:
        parser.error("need -f >= 2, --ranks >= 1, 0 < --seconds < 3600 and -b <= -e")
    if not 0 <= args.node_rank < args.nodes or (args.nodes > 1 and not args.store):
        parser.error("need 0 <= --node-rank < --nodes, and --store with --nodes > 1")
    if args.compare:
        results = load(args.compare)
        anchor = args.anchor_torch
        if anchor is None:
            versions = torch_versions(results)
            if len(versions) > 1:
                parser.error("%s holds the gloo lines of torch %s: name the anchor with "
                             "--anchor-torch"
                             % (args.compare, ", ".join(sorted(map(str, versions)))))
            anchor = versions.pop() if versions else None
        summarize(results, anchor)
        return 0
    return 0 if run_gloo(args) else 1


if __name__ == "__main__":
    sys.exit(main())
