#!/usr/bin/python3
"""Autograd overhead in PyTorch: backward time per node of a long chain of tiny ops.

    autograd_torch.py [--compare JSONL]

The chain, which ct's benchmark mirrors op for op: x is a float32 tensor of
shape [1], a leaf that requires grad, holding 1.0; then for i = 0 .. N-1,
y = y * 1.0001 when i is even and y = y + 0.5 when i is odd (y starts as x).
That is N nodes, half of which (the multiplies) do arithmetic in backward,
while the adds pass the gradient through. Only y.backward() is timed: neither
building the chain nor freeing it afterwards. A fresh chain is built for each
of RUNS[N] runs and the best is kept, divided by N. One thread.

Prints {"bench": "autograd_overhead", "impl": "torch", "torch": version,
"threads": 1, "nodes": N, "us_per_node": ...} for each N in RUNS. With
--compare, every other implementation's matching line in that file is set
beside torch's as a ratio on stderr. Without torch, it says so on stderr and
exits 0.
"""
import argparse
import json
import os
import sys
import time

# OpenBLAS (Debian's torch), MKL (PyPI's) and OpenMP read these when torch
# loads them.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

# Chain length -> runs, best of which is kept: a long chain is its own
# average and takes about a second to build here.
RUNS = {1000: 20, 100000: 3}


def backward_seconds(torch, nodes):
    """Seconds y.backward() takes on a fresh chain of `nodes` ops."""
    x = torch.ones(1, requires_grad=True)
    y = x
    for i in range(nodes):
        y = y * 1.0001 if i % 2 == 0 else y + 0.5
    t0 = time.perf_counter()
    y.backward()
    t = time.perf_counter() - t0
    # Each multiply's backward scales by float32(1.0001), which drifts about
    # 1e-3 from the exact power over 50000 of them.
    expect = 1.0001 ** ((nodes + 1) // 2)
    got = x.grad.item()
    if abs(got - expect) > 1e-2 * expect:
        raise AssertionError("chain of %d: dy/dx = %g, expected %g" % (nodes, got, expect))
    return t


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", metavar="JSONL", help="other implementations' output")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("autograd_torch.py: torch is not installed for %s; skipping the PyTorch peer "
              "(bash ci/setup.sh --bench installs it)" % sys.executable,
              file=sys.stderr)
        return 0
    torch.set_num_threads(1)
    # (impl, nodes) -> the line; with ci/bench.sh's baseline, the current
    # build's last round.
    others = {}
    if args.compare:
        with open(args.compare) as f:
            for r in map(json.loads, f):
                if (r.get("bench") == "autograd_overhead" and r.get("impl") != "torch"
                        and r.get("build") != "baseline"):
                    others[r["impl"], r["nodes"]] = r
    for nodes, runs in RUNS.items():
        best = min(backward_seconds(torch, nodes) for _ in range(runs))
        us = best / nodes * 1e6
        print(json.dumps({"bench": "autograd_overhead", "impl": "torch",
                          "torch": torch.__version__, "threads": 1, "nodes": nodes,
                          "us_per_node": round(us, 4)}), flush=True)
        for r in others.values():
            if r["nodes"] == nodes:
                print("autograd_overhead nodes=%d: %s %.3f us/node, torch %s %.3f: %s/torch %.2f"
                      % (nodes, r["impl"], r["us_per_node"], torch.__version__, us, r["impl"],
                         r["us_per_node"] / us), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
