#!/usr/bin/python3
"""PyTorch peer of bench_ops: times the same cases and prints the same JSON.

    ops_torch.py [--compare CT_JSONL]

Threads come from CT_BENCH_THREADS (default "1,2"), as for bench_ops. With
--compare, each result is also set beside ct's matching one from bench_ops's
output, as a one-line ratio on stderr. Each line names its torch ("torch":
the version), since ci/bench.sh runs this under two Pythons. Without torch,
it says so on stderr and exits 0, so that a machine without it still runs
the C benchmarks.
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import sys
import time

REPS = 7
REP_SECONDS = 0.02
WARM_SECONDS = 0.01


def median_us(fn):
    """Median time per call in microseconds, after an untimed warm-up."""
    t0 = time.perf_counter()
    fn()
    while time.perf_counter() - t0 < WARM_SECONDS:
        fn()
    t0 = time.perf_counter()
    fn()
    once = time.perf_counter() - t0
    iters = 1 if once >= REP_SECONDS else int(REP_SECONDS / once) + 1
    samples = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters)
    samples.sort()
    return samples[REPS // 2] * 1e6


def cases(torch):
    """Yields (fields, metric, amount, fn) in bench_ops's order."""
    for n in (64, 128, 256, 512, 1024, 2048):
        a = torch.rand(n, n)
        w = torch.rand(n, n)
        for layout, b in (("nn", w), ("nt", w.t())):
            yield ({"op": "matmul", "layout": layout, "size": n, "shape": [n, n]}, "gflops",
                   2.0 * n**3, lambda a=a, b=b: torch.matmul(a, b))
    for n in (1 << 20, 1 << 22, 1 << 24, 1 << 26):
        a = torch.rand(n)
        b = torch.rand(n)
        rows = a.view(n // 1024, 1024)
        v = torch.rand(1024)
        yield ({"op": "add", "size": n, "shape": [n]}, "gbps", 12.0 * n,
               lambda a=a, b=b: a + b)
        yield ({"op": "mul", "size": n, "shape": [n]}, "gbps", 12.0 * n,
               lambda a=a, b=b: a * b)
        yield ({"op": "add_bcast", "size": n, "shape": [n // 1024, 1024]}, "gbps", 8.0 * n,
               lambda rows=rows, v=v: rows + v)
    for shape in ((1024, 1024), (4096, 1024), (64, 65536)):
        t = torch.rand(*shape)
        numel = shape[0] * shape[1]
        yield ({"op": "sum", "size": numel, "shape": list(shape)}, "gbps",
               4.0 * (numel + shape[0]), lambda t=t: t.sum(-1))
        yield ({"op": "softmax", "size": numel, "shape": list(shape)}, "gbps", 8.0 * numel,
               lambda t=t: torch.softmax(t, -1))
    rows, width = 4096, 128
    numel = rows * width
    x, g = torch.rand(rows, width), torch.rand(rows, width)
    w, b = torch.rand(width), torch.rand(width)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]

    def layer_norm_fwd_bwd():
        y = torch.nn.functional.layer_norm(leaves[0], (width,), leaves[1], leaves[2], 1e-5)
        return torch.autograd.grad(y, leaves, g)

    yield ({"op": "layer_norm", "size": numel, "shape": [rows, width]}, "gbps", 8.0 * numel,
           lambda: torch.nn.functional.layer_norm(x, (width,), w, b, 1e-5))
    yield ({"op": "layer_norm_fwd_bwd", "size": numel, "shape": [rows, width]}, "gbps",
           20.0 * numel, layer_norm_fwd_bwd)


def blas_thread_setter():
    """torch.set_num_threads leaves the threads of an OpenBLAS that torch calls
    for matmul alone (Debian's torch uses the system OpenBLAS); without this,
    Debian's torch at "1 thread" multiplies on every core. PyPI's torch calls
    MKL, whose threads torch.set_num_threads does set."""
    for name in ("libopenblas.so.0", ctypes.util.find_library("openblas")):
        try:
            return ctypes.CDLL(name).openblas_set_num_threads
        except (OSError, TypeError, AttributeError):
            continue
    return None


def key(result):
    return (result["op"], result.get("layout"), tuple(result["shape"]), result["threads"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", metavar="CT_JSONL",
                        help="bench_ops output to compare against")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("ops_torch.py: torch is not installed for %s; skipping the PyTorch peer "
              "(bash ci/setup.sh --bench installs it)" % sys.executable,
              file=sys.stderr)
        return 0
    ct = {}
    if args.compare:
        with open(args.compare) as f:
            for line in f:
                r = json.loads(line)
                # With ci/bench.sh's baseline, the current build's last round.
                if (r.get("bench") == "ops" and r.get("impl") == "ct"
                        and r.get("build") != "baseline"):
                    ct[key(r)] = r
    threads = [int(t) for t in os.environ.get("CT_BENCH_THREADS", "1,2").split(",")]
    print("ops_torch.py: torch %s from %s" % (torch.__version__, os.path.dirname(torch.__file__)),
          file=sys.stderr)
    set_blas_threads = None
    if "BLAS_INFO=mkl" not in torch.__config__.show():
        set_blas_threads = blas_thread_setter()
        if not set_blas_threads:
            print("ops_torch.py: no OpenBLAS found; torch's BLAS threads are left as they are",
                  file=sys.stderr)
    for nthreads in threads:
        torch.set_num_threads(nthreads)
        if set_blas_threads:
            set_blas_threads(nthreads)
        for fields, metric, amount, fn in cases(torch):
            us = median_us(fn)
            result = {"bench": "ops", "op": fields["op"]}
            if "layout" in fields:
                result["layout"] = fields["layout"]
            result.update(impl="torch", torch=torch.__version__, size=fields["size"],
                          shape=fields["shape"], threads=nthreads, us=round(us, 2))
            result[metric] = round(amount / us * 1e-3, 3)
            print(json.dumps(result), flush=True)
            mine = ct.get(key(result))
            if mine and metric in mine:
                print("ops %s %s %s threads=%d: ct %.2f %s, torch %s %.2f: ct/torch %.2f" % (
                    result["op"], result.get("layout", ""), result["shape"], nthreads,
                    mine[metric], metric, torch.__version__, result[metric],
                    mine[metric] / result[metric]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
