#!/usr/bin/python3
"""PyTorch peer of bench_rpc: torch.distributed.rpc round trips between 2 workers.

    rpc_torch.py [--iters N] [--transport default|tcp] [--timeout S]

Worker 0 calls worker 1 with rpc_sync as bench/rpc.c's rank 0 calls rank 1:
an empty call (no arguments; the function returns None), then calls that
send a float32 tensor of 4 KiB, 1 MiB and 64 MiB and get the same tensor
back. The sizes, the round trips per size (--iters for the small ones,
fewer for the large, at least 5), the 3 untimed calls before them, the
median and GB/s (2 x size over the median) are bench_rpc's.

The workers are two processes that this one starts, each running this file
with --rank, with one intra-op thread and TensorPipe's agent (2 worker
threads), meeting through env:// rendezvous at MASTER_ADDR=127.0.0.1 and a
port the kernel picked as free. With --transport default, TensorPipe picks
what it prefers on one host (its shared-memory transport and, for tensors,
cross-memory attach, when they work here); --transport tcp restricts it to
its TCP transport and the channel that copies tensors through it, the path
that ct and the zmq peer take.

stdout: one JSON line per result from worker 0, as bench_rpc's:
{"bench": "rpc", "impl": "torch" ("torch_tcp" with --transport tcp), "torch"
(the version), "op": "empty" | "echo", "bytes", "iters", "us" (median round
trip), "gbps"}.
Without torch or torch.distributed.rpc it prints one line {"bench": "rpc",
"impl", "skipped": reason} and exits 0. A run that fails, or
outlives --timeout, exits 1 with its workers ended. stderr: notes.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

PROG = "rpc_torch.py"
SIZES = (4 << 10, 1 << 20, 64 << 20)
WARMUP = 3
# The worker threads that run the callee's functions: one call is in flight
# at a time, so more would only sit idle.
WORKER_THREADS = 2
# A call that takes longer than this has lost its peer.
RPC_TIMEOUT_S = 60.0


def note(text):
    print("%s: %s" % (PROG, text), file=sys.stderr, flush=True)


def echo(x=None):
    """The callee: the tensor back as it came, or None for the empty call."""
    return x


def iters_for(nbytes, iters):
    """bench_rpc's round trips for a payload: --iters, or 256 MiB's worth
    when that is fewer, but at least 5."""
    n = (256 << 20) // (nbytes or 1)
    return max(5, n) if n < iters else iters


def median(values):
    # The upper median for an even count, as bench_rpc takes it.
    return sorted(values)[len(values) // 2]


def report(torch, impl, op, nbytes, n, seconds):
    gbps = 2.0 * nbytes / seconds * 1e-9 if nbytes else 0.0
    print(json.dumps({"bench": "rpc", "impl": impl, "torch": torch.__version__, "op": op,
                      "bytes": nbytes, "iters": n, "us": round(seconds * 1e6, 2),
                      "gbps": round(gbps, 4)}), flush=True)


def impl_name(args):
    return "torch_tcp" if args.transport == "tcp" else "torch"


def why_unavailable():
    """None when torch.distributed.rpc can run here, else the reason."""
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install's own error
        return "torch is not importable by %s: %s" % (sys.executable, e)
    try:
        import torch.distributed as dist
        if not dist.is_available():
            return "torch %s was built without torch.distributed" % torch.__version__
        import torch.distributed.rpc as rpc
        if not rpc.is_available():
            return "torch %s was built without torch.distributed.rpc" % torch.__version__
    except Exception as e:
        return "torch.distributed.rpc is not importable: %s" % e
    return None


def time_calls(torch, rpc, impl, iters):
    """Worker 0's side: every size's round trips, a JSON line each."""
    peer = "worker1"
    for nbytes in (0,) + SIZES:
        n = iters_for(nbytes, iters)
        x = torch.ones(nbytes // 4, dtype=torch.float32) if nbytes else None
        args = (x,) if nbytes else ()
        t = []
        for i in range(-WARMUP, n):
            t0 = time.perf_counter()
            y = rpc.rpc_sync(peer, echo, args=args)
            dt = time.perf_counter() - t0
            # A wrong answer would time something else; checking it costs
            # nothing beside a round trip.
            if (y is None) != (x is None) or (x is not None and y.numel() != x.numel()):
                raise RuntimeError("echo of %d bytes came back as %r" % (nbytes, y))
            if i >= 0:
                t.append(dt)
        report(torch, impl, "echo" if nbytes else "empty", nbytes, n, median(t))


def run_worker(args):
    import torch
    import torch.distributed.rpc as rpc

    torch.set_num_threads(1)
    options = {"num_worker_threads": WORKER_THREADS, "rpc_timeout": RPC_TIMEOUT_S}
    if args.transport == "tcp":
        options.update(_transports=["uv"], _channels=["basic"])
    rpc.init_rpc("worker%d" % args.rank, rank=args.rank, world_size=2,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(**options))
    failed = False
    try:
        if args.rank == 0:
            time_calls(torch, rpc, impl_name(args), args.iters)
    except Exception as e:
        note("worker %d: %s" % (args.rank, e))
        failed = True
    # A graceful shutdown waits for the other worker: worker 1 stays up
    # until worker 0 has made its last call. After a failure the peer may be
    # gone, and waiting for it would only hold the run up.
    rpc.shutdown(graceful=not failed, timeout=RPC_TIMEOUT_S)
    return 1 if failed else 0


def free_port():
    # The kernel's pick; another process could take it before rank 0 binds
    # it, which would fail the run, not mismeasure it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def end(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def run_pair(args):
    """Starts the 2 workers and waits for them; returns the exit status."""
    # A TERM (a timeout around the whole benchmark) unwinds through the
    # finally below, so the workers do not outlive this process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    # TensorPipe listens on the address the host name resolves to unless
    # told an interface; a container's name may resolve to nothing.
    env.setdefault("TP_SOCKET_IFNAME", "lo")
    # The agents' start and shutdown notices (glog's INFO) would interleave
    # with the benchmark's own output; warnings and errors still show.
    env.setdefault("GLOG_minloglevel", "1")
    cmd = [sys.executable, os.path.abspath(__file__), "--iters", str(args.iters),
           "--transport", args.transport]
    procs = []
    deadline = time.monotonic() + args.timeout
    try:
        for rank in (0, 1):
            procs.append(subprocess.Popen(cmd + ["--rank", str(rank)], env=env,
                                          stdin=subprocess.DEVNULL))
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                note("the workers ran past --timeout %g s; ending them" % args.timeout)
                return 1
            # A worker that failed leaves its peer waiting out the RPC
            # timeout; the grace lets it report, then it is ended.
            if any(p.returncode for p in procs):
                deadline = min(deadline, time.monotonic() + 5)
            time.sleep(0.05)
        bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode]
        for rank, rc in bad:
            note("worker %d exited with status %d" % (rank, rc))
        return 1 if bad else 0
    finally:
        end(procs)


def main():
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=2000,
                    help="round trips per small size (default 2000); large sizes run fewer "
                         "(at least 5)")
    ap.add_argument("--transport", choices=("default", "tcp"), default="default",
                    help="TensorPipe's own choice on one host, or TCP only (default: default)")
    ap.add_argument("--timeout", type=float, default=180.0,
                    help="seconds the whole run may take before its workers are ended "
                         "(default 180)")
    ap.add_argument("--rank", type=int, choices=(0, 1), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.iters < 5:
        ap.error("--iters must be at least 5")
    if args.rank is not None:
        return run_worker(args)
    reason = why_unavailable()
    if reason:
        note("skipped: %s" % reason)
        print(json.dumps({"bench": "rpc", "impl": impl_name(args), "skipped": reason}),
              flush=True)
        return 0
    return run_pair(args)


if __name__ == "__main__":
    sys.exit(main())
