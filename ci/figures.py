#!/usr/bin/env python3
"""The training figures quoted in README.md and docs/*.md, made by the
programs that print them.

    python3 ci/figures.py --write [--build DIR]   # rerun, rewrite the blocks
    python3 ci/figures.py --check [--build DIR]   # rerun, compare (a ctest)

A quoted block sits between two markers:

    <!-- figures: fmnist_mlp -->
    ```
    fmnist_mlp: recipe sgd, ...
    epoch  1  train loss 0.5552  test accuracy 83.22%  (76139 samples/s, 0.9 s)
    ...
    ```
    _Measured on: CPU; build. ..._
    <!-- /figures -->

--write runs each block's command and puts its stdout (and a line naming the
CPU, the build and the date) between the markers. --check runs them again
and compares every "epoch N  train loss L  test accuracy A%" line quoted
with the fresh one: exactly when this machine and build are the ones the
block names, within the block's tolerance otherwise (other CPUs and builds
round differently, and momentum SGD carries the difference on). Throughput
and times are not compared: they are the benchmarks' business. Exit codes:
0 the figures hold, 1 they do not, 77 not checked here (a sanitized build,
or no examples).
"""
import argparse
import datetime
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# What each block runs (paths relative to the build directory), and how far
# a figure may move on another CPU or build: the train loss, and the test
# accuracy in points. Momentum SGD's test accuracy moves by up to 2 points
# from one epoch to the next (epoch 4 of fmnist_mlp's default run on the
# machine the README names), which bounds what a different rounding can
# shift it by; the loss, an average over the epoch, moves far less.
BLOCKS = {
    "fmnist_mlp": {
        "argv": ["examples/fmnist_mlp", "--metrics", ""],
        "loss": 0.01,
        "accuracy": 3.0,
    },
    "two_stage": {
        "argv": ["launcher/ctlaunch", "-np", "2", "examples/two_stage"],
        "loss": 0.01,
        "accuracy": 3.0,
    },
    # Asynchronous: the trainers' interleaving differs from run to run, so
    # even this machine does not repeat its bits; the first epoch's loss,
    # an average over the steps that staleness disturbs most, moved by 0.04
    # between two runs in a row.
    "param_server": {
        "argv": ["launcher/ctlaunch", "-np", "3", "examples/param_server"],
        "loss": 0.08,
        "accuracy": 3.0,
        "asynchronous": True,
    },
}

EPOCH = re.compile(r"epoch\s+(\d+)\s+train loss ([0-9.]+|nan)\s+test accuracy ([0-9.]+)%")
MARK = re.compile(r"<!-- figures: (\w+) -->\n(.*?)<!-- /figures -->\n", re.S)
MEASURED = re.compile(r"_Measured on: (.*?); ")


def machine(build):
    """The CPU and the build, as a block names them: figures repeat
    exactly only where both are the same."""
    # A virtual machine may show only "AMD EPYC": the family and model
    # numbers tell the generations apart.
    info = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    model = info.get("model name", "unknown CPU")
    avx512 = " avx512f " in " " + info.get("flags", "") + " "
    cache = {}
    try:
        for line in open(build / "CMakeCache.txt"):
            m = re.match(r"(\w+):\w+=(.*)", line)
            if m:
                cache[m.group(1)] = m.group(2)
    except OSError:
        pass
    cpu = (f"{model} (family {info.get('cpu family', '?')} model {info.get('model', '?')}, "
           f"{'AVX-512' if avx512 else 'no AVX-512'})")
    native = "-march=native" if cache.get("CT_NATIVE", "ON") == "ON" else "generic x86-64"
    flavour = f"a {cache.get('CMAKE_BUILD_TYPE', 'Release')} build, {native}"
    return f"{cpu}, {flavour}", cache


def run(build, spec):
    argv = [str(build / spec["argv"][0])] + [
        str(build / a) if a.startswith("examples/") else a for a in spec["argv"][1:]
    ]
    env = dict(os.environ)
    env.pop("CT_NUM_THREADS", None)
    out = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"ci/figures.py: {' '.join(spec['argv'])} exited {out.returncode}:\n"
                 f"{out.stderr[-2000:]}")
    return out.stdout


def epochs(text):
    return {int(m.group(1)): (m.group(2), m.group(3)) for m in EPOCH.finditer(text)}


def block_text(name, stdout, where):
    spec = BLOCKS[name]
    lines = [line for line in stdout.splitlines() if line.strip()]
    note = ("the trainers' interleaving differs from run to run, so these move by up to "
            if spec.get("asynchronous") else
            "a run here repeats these bits; other CPUs and builds round differently, and "
            "the figures move by up to ")
    today = datetime.date.today().isoformat()
    return (f"<!-- figures: {name} -->\n```\n" + "\n".join(lines) + "\n```\n"
            f"_Measured on: {where}; {today}, by `python3 ci/figures.py --write`. "
            f"{note[0].upper() + note[1:]}{spec['loss']} in the loss and "
            f"{spec['accuracy']:g} points in accuracy (`ci/figures.py --check`, a test)._\n"
            "<!-- /figures -->\n")


def documents():
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rerun and rewrite the blocks")
    mode.add_argument("--check", action="store_true", help="rerun and compare")
    ap.add_argument("--build", default=str(ROOT / "build"), help="the build directory")
    args = ap.parse_args()
    build = pathlib.Path(args.build).resolve()
    where, cache = machine(build)
    if cache.get("CT_SANITIZE"):
        print(f"skipped: a sanitized build (CT_SANITIZE={cache['CT_SANITIZE']}) runs slower and "
              "rounds like no release build")
        return 77
    if not (build / "examples" / "fmnist_mlp").exists():
        print("skipped: the examples are not built")
        return 77
    fresh, failures, checked = {}, 0, 0
    for doc in documents():
        text = doc.read_text()
        out = []
        pos = 0
        for m in MARK.finditer(text):
            name = m.group(1)
            if name not in BLOCKS:
                sys.exit(f"ci/figures.py: {doc.name}: no command for the block '{name}'")
            if name not in fresh:
                fresh[name] = run(build, BLOCKS[name])
            out.append(text[pos:m.start()])
            out.append(block_text(name, fresh[name], where))
            pos = m.end()
            if args.write:
                continue
            spec, quoted, now = BLOCKS[name], epochs(m.group(2)), epochs(fresh[name])
            said = MEASURED.search(m.group(2))
            exact = said and said.group(1) == where and not spec.get("asynchronous")
            if not quoted:
                print(f"{doc.name} [{name}]: no epoch line quoted")
                failures += 1
            for epoch, (loss, acc) in sorted(quoted.items()):
                checked += 1
                if epoch not in now:
                    print(f"{doc.name} [{name}] epoch {epoch}: not in the fresh run")
                    failures += 1
                    continue
                nloss, nacc = now[epoch]
                if exact:
                    ok = (loss, acc) == (nloss, nacc)
                    how = "exactly, as this machine and build are the block's"
                else:
                    ok = (abs(float(loss) - float(nloss)) <= spec["loss"]
                          and abs(float(acc) - float(nacc)) <= spec["accuracy"])
                    how = f"within {spec['loss']} and {spec['accuracy']:g} points"
                print(f"{doc.name} [{name}] epoch {epoch:2d}: quoted {loss} {acc}%, "
                      f"now {nloss} {nacc}%: {'ok' if ok else 'DIFFERS'} ({how})")
                failures += not ok
        out.append(text[pos:])
        if args.write:
            doc.write_text("".join(out))
    if args.write:
        print(f"ci/figures.py: rewrote {len(fresh)} kinds of block on {where}")
        return 0
    print(f"ci/figures.py: {checked} quoted epochs, {failures} that do not hold")
    return 1 if failures or not checked else 0


if __name__ == "__main__":
    sys.exit(main())
