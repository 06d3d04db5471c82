#!/usr/bin/env python3
"""Two metrics files (fmnist_mlp --metrics, JSON lines) hold the same loss,
within a tolerance, at every step of the first from a given step on.

    same_losses.py A.jsonl B.jsonl FIRST_STEP TOLERANCE NAME

A step written twice (before a restart and after it) counts as written
last. Prints the largest difference; exits 1 when it is past the
tolerance or B lacks a step of A, 0 otherwise.
"""
import json
import sys


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j:
                out[j["step"]] = j["loss"]
    return out


def main():
    a_path, b_path, first, tol, name = sys.argv[1:6]
    a, b, first, tol = losses(a_path), losses(b_path), int(first), float(tol)
    steps = sorted(s for s in a if s >= first)
    missing = [s for s in steps if s not in b]
    if not steps or missing:
        print(f"  FAIL: {name}: {len(steps)} steps from {first} in {a_path}; "
              f"not in {b_path}: {missing[:5]}", file=sys.stderr)
        return 1
    worst = max(steps, key=lambda s: abs(a[s] - b[s]))
    d = abs(a[worst] - b[worst])
    print(f"  {name}: steps {steps[0]}-{steps[-1]}: largest difference {d:.2g} "
          f"(step {worst}: {a[worst]} and {b[worst]})")
    if d > tol:
        print(f"  FAIL: {name}: the losses differ by {d:.3g} > {tol:g} at step {worst}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
