#!/usr/bin/python3
"""Step-by-step parity of examples/gpt with bench/gpt_torch.py.

    gpt_parity.py --gpt PATH [--steps N] [--tiny] [--tolerance X]
                  [--workdir DIR] [--data DIR]

PyTorch builds the model, writes its initial weights to safetensors and
trains; ct's gpt starts from those weights and trains on the same batches
(the shared batch rule), both with dropout off, at one thread, in float32,
logging the loss of every step. The largest relative difference of the two
loss curves must stay below --tolerance (default 1e-3). --tiny trains a
2-layer, 2-head, 32-wide model on 32-character windows in batches of 4,
for the test suite.

Prints one JSON line ("bench": "gpt_parity", "torch": the version) and
exits 0 when parity holds, 1 when it does not, 2 on a usage error, and 77
(a skipped test) when this Python has no torch.
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile

# One thread for both, set before torch loads OpenBLAS (Debian's torch) or
# MKL (PyPI's).
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_torch  # noqa: E402

TINY = ["--layers", "2", "--heads", "2", "--width", "32", "--context", "32", "--batch", "4",
        "--warmup", "5"]


def losses(path):
    """step -> loss of a metrics file's per-step lines."""
    out = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "loss" in rec:
                out[rec["step"]] = rec["loss"]
    return out


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpt", required=True, help="ct's examples/gpt binary")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--tolerance", type=float, default=1e-3)
    p.add_argument("--workdir", default="")
    p.add_argument("--data", default=gpt_torch.CORPUS_DIR)
    a = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpt_parity.py: torch is not installed for %s (bash ci/setup.sh --bench installs "
              "it); skipped" % sys.executable, file=sys.stderr)
        return 77
    if not os.path.isdir(a.data):
        print("gpt_parity.py: %s is missing (Debian's fortunes); skipped" % a.data,
              file=sys.stderr)
        return 77
    work = a.workdir or tempfile.mkdtemp(prefix="gpt_parity.")
    os.makedirs(work, exist_ok=True)
    init = os.path.join(work, "init.safetensors")
    ref, got = os.path.join(work, "torch.jsonl"), os.path.join(work, "ct.jsonl")
    common = (TINY if a.tiny else []) + [
        "--steps", str(a.steps), "--dropout", "0", "--threads", "1", "--log-every", "1",
        "--eval-every", "0", "--data", a.data]
    with open(os.devnull, "w") as quiet:
        with contextlib.redirect_stdout(quiet):
            rc = gpt_torch.main(common + ["--metrics", ref, "--save-init", init, "--bench"])
        if rc:
            return rc
        ct = subprocess.run([a.gpt] + common + ["--metrics", got, "--init", init,
                                                 "--sample-tokens", "0"],
                            stdout=quiet, stderr=subprocess.PIPE, text=True, check=False)
    if ct.returncode:
        print("gpt_parity.py: %s failed (exit %d): %s" % (a.gpt, ct.returncode,
                                                          ct.stderr.strip()[-2000:]),
              file=sys.stderr)
        return 1
    want, have = losses(ref), losses(got)
    missing = [s for s in range(a.steps) if s not in want or s not in have]
    if missing:
        print("gpt_parity.py: no loss logged for steps %s" % missing[:10], file=sys.stderr)
        return 1
    worst, at = 0.0, 0
    for s in range(a.steps):
        d = abs(have[s] - want[s]) / abs(want[s])
        if d > worst or d != d:
            worst, at = d, s
    ok = worst < a.tolerance
    print(json.dumps({"bench": "gpt_parity", "torch": torch.__version__, "steps": a.steps,
                      "tiny": a.tiny, "max_rel_diff": worst, "at_step": at,
                      "torch_loss": want[at], "ct_loss": have[at],
                      "final_torch_loss": want[a.steps - 1],
                      "final_ct_loss": have[a.steps - 1], "tolerance": a.tolerance, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
