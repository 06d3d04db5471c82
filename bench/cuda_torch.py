#!/usr/bin/python3
"""PyTorch peer of bench_cuda: the same elementwise and matmul cases on
torch.cuda, timed the same way, printed as the same JSON with "impl": "torch"
and "torch": the version.

    cuda_torch.py [--quick] [--compare CT_JSONL]

--quick runs what bench_cuda --quick runs. With --compare, each figure is set
beside ct's from bench_cuda's output, one ratio line on stderr (above 1: ct
is faster). Without torch or a CUDA device it prints one line saying why it
skipped, and exits 0.
"""
import argparse
import json
import sys
import time

MIN_SECONDS = 0.05


RESULTS = []


def emit(d, torch=None):
    r = dict({"bench": "cuda", "impl": "torch"}, **d)
    if torch:
        r["torch"] = torch.__version__
    RESULTS.append(r)
    print(json.dumps(r), flush=True)


def time_calls(torch, fn, reps):
    """Seconds per call: the best of reps rounds of at least MIN_SECONDS."""
    fn()
    torch.cuda.synchronize()
    best, iters = float("inf"), 1
    for _ in range(reps):
        while True:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if dt >= MIN_SECONDS:
                break
            iters *= 2
        best = min(best, dt / iters)
    return best


def run(torch, quick):
    reps = 3 if quick else 5
    dev = torch.device("cuda", 0)
    emit({"device": torch.cuda.get_device_name(0)}, torch)
    for mib in (64,) if quick else (64, 256):
        n = (mib << 20) // 4
        a = torch.full((n,), 1.5, device=dev)
        b = torch.full((n,), 0.5, device=dev)
        out = torch.empty_like(a)
        gelu = torch.nn.functional.gelu
        for op, traffic, fn in (("add", 3, lambda: a + b), ("mul", 3, lambda: a * b),
                                ("copy", 2, lambda: out.copy_(a)), ("gelu", 2, lambda: gelu(a))):
            s = time_calls(torch, fn, reps)
            emit({"op": op, "mib": mib, "gbps": round(traffic * n * 4 / s / 1e9, 1)}, torch)
        del a, b, out
    shapes = [(1, 4096)] if quick else [(1, 4096), (32, 1024)]
    for batch, size in shapes:
        for mode, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                                  ("bf16", torch.bfloat16, False)):
            shape = (batch, size, size) if batch > 1 else (size, size)
            a = torch.full(shape, 0.25, device=dev, dtype=dtype)
            b = torch.full(shape, 0.5, device=dev, dtype=dtype)
            torch.backends.cuda.matmul.allow_tf32 = tf32
            s = time_calls(torch, lambda: torch.matmul(a, b), reps)
            torch.backends.cuda.matmul.allow_tf32 = False
            emit({"op": "matmul", "mode": mode, "batch": batch, "size": size,
                  "tflops": round(2.0 * batch * size**3 / s / 1e12, 2)}, torch)


def compare(path, version):
    """ct (from bench_cuda's lines in path) / torch (this run), on stderr."""
    ct, th = {}, {}
    for r in [json.loads(line) for line in open(path)] + RESULTS:
        if "summary" in r or "op" not in r or r.get("impl") not in ("ct", "torch"):
            continue
        key = (r["op"], r.get("mib"), r.get("mode"), r.get("batch"), r.get("size"))
        (ct if r["impl"] == "ct" else th)[key] = r
    print("ct / torch %s (above 1: ct is faster):" % version, file=sys.stderr)
    for key, c in sorted(ct.items(), key=lambda kv: str(kv[0])):
        t = th.get(key)
        if not t:
            continue
        field = "tflops" if "tflops" in c else "gbps"
        ratio = c[field] / t[field]
        what = ("matmul %s %dx%d^3" % (key[2], key[3], key[4]) if key[0] == "matmul"
                else "%s %d MiB" % (key[0], key[1]))
        print("  %-24s ct %8.1f, torch %8.1f %s: %.2f" % (what, c[field], t[field], field, ratio),
              file=sys.stderr)
        print(json.dumps({"bench": "cuda", "summary": "ratio", "against": "torch",
                          "torch": version, "op": key[0], "mib": key[1], "mode": key[2],
                          "batch": key[3], "size": key[4], "ratio": round(ratio, 3)}),
              flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--compare", metavar="CT_JSONL")
    args = p.parse_args()
    try:
        import torch
    except ImportError as e:
        emit({"skipped": "no torch: %s" % e})
        return 0
    if not torch.cuda.is_available():
        emit({"skipped": "torch sees no CUDA device"}, torch)
        return 0
    run(torch, args.quick)
    if args.compare:
        compare(args.compare, torch.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
