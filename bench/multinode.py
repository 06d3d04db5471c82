#!/usr/bin/python3
"""Summary of the multinode benchmark (ci/bench.sh multinode).

    multinode.py JSONL [--anchor-torch VERSION] [--link-gbit SHAPE=GBIT ...]

JSONL holds bench/multinode.sh's lines: allreduce sweeps on 2 hosts x 2
ranks, each tagged with its "round" and "shape" (the link). Per shape,
implementation and size it takes the best bus bandwidth over the rounds
(the one least disturbed by the machine's other work), prints them side
by side on stderr (and fmnist_mlp's and gpt's training rates on 2 x 2
ranks, flat gloo and hierarchical), and prints one JSON line per shape and size on stdout
with ct's hierarchical figure and its ratios to ct's flat gloo, ct's mpi
backend, Open MPI's MPI_Allreduce and torch's gloo (that of
--anchor-torch, the current release; other torches' by ratio alone).

The targets (issue 23), judged per shape at every size of 1 MiB and more:
hierarchical >= 1.5 x flat gloo, >= Open MPI, >= 2 x torch's gloo. For a
shape with a known link rate (--link-gbit), the hierarchical allreduce of
64 MiB must use at least 80 % of it: in that algorithm each host sends the
message's size across its link once per call (each of its L ranks carries
1/L of it there and back through the ring of H = 2 hosts), so the link's
use is the algorithm bandwidth over the rate.
"""
import argparse
import json
import sys

TARGET_FROM = 1 << 20
LINK_BYTES = 64 << 20
TARGETS = [("ct flat gloo", 1.5), ("openmpi", 1.0), ("torch gloo", 2.0)]
LINK_TARGET = 0.8


def impl_name(line):
    if line.get("impl") == "ct":
        backend = line.get("backend")
        return {"gloo": "ct flat gloo", "hier": "ct hier", "mpi": "ct mpi"}.get(backend,
                                                                               "ct " + str(backend))
    if line.get("impl") == "gloo":
        return "torch gloo %s" % line.get("torch")
    return line.get("impl")


def best(lines):
    """{shape: {impl: {bytes: busbw}}}, the best over rounds."""
    out = {}
    for r in lines:
        if r.get("op") != "allreduce" or "busbw_gbps" not in r or "shape" not in r:
            continue
        per = out.setdefault(r["shape"], {}).setdefault(impl_name(r), {})
        per[r["bytes"]] = max(per.get(r["bytes"], 0.0), r["busbw_gbps"])
    return out


def training(lines):
    """fmnist_mlp's samples/s and gpt's tokens/s on 2 x 2 ranks, flat gloo
    and hierarchical, the best round of each, and their ratio."""
    rates = {}
    for r in lines:
        run = r.get("run", "")
        rate = r.get("samples_per_s", r.get("tokens_per_s"))
        if run[:4] in ("fmni", "gpt_") and rate is not None and "shape" in r:
            key = (r["shape"], run.rsplit("_", 1)[0], run.rsplit("_", 1)[1])
            rates[key] = max(rates.get(key, 0.0), rate)
    for shape, model in sorted({(k[0], k[1]) for k in rates}):
        flat, hier = rates.get((shape, model, "gloo")), rates.get((shape, model, "auto"))
        unit = "samples/s" if model == "fmnist" else "tokens/s"
        row = {"bench": "multinode", "shape": shape, "model": model, "unit": unit,
               "flat_gloo": flat, "hier": hier}
        if flat and hier:
            row["ratio"] = round(hier / flat, 3)
        print(json.dumps(row))
        print("multinode, %s: %s on 2 x 2 ranks: %s %s hierarchical, %s flat gloo%s" % (
            shape, model, hier, unit, flat,
            " (%.2fx)" % (hier / flat) if flat and hier else ""), file=sys.stderr)


def summarize(lines, anchor, links):
    ok = True
    for shape, impls in sorted(best(lines).items()):
        hier = impls.get("ct hier", {})
        names = sorted(impls)
        print("multinode, %s: allreduce busbw (GB/s), best of the rounds" % shape, file=sys.stderr)
        print("%10s" % "bytes" + "".join("%24s" % n for n in names), file=sys.stderr)
        for nbytes in sorted(hier):
            print("%10d" % nbytes + "".join("%24.3f" % impls[n].get(nbytes, float("nan"))
                                            for n in names), file=sys.stderr)
            row = {"bench": "multinode", "shape": shape, "bytes": nbytes,
                   "hier_busbw_gbps": hier[nbytes]}
            for n in names:
                if n != "ct hier" and impls[n].get(nbytes):
                    row["ratio_vs_" + n.replace(" ", "_")] = round(hier[nbytes] / impls[n][nbytes], 3)
            print(json.dumps(row))
        for peer, want in TARGETS:
            key = "torch gloo %s" % anchor if peer == "torch gloo" else peer
            theirs = impls.get(key)
            if not theirs:
                print("target: hier >= %.1fx %s at >= 1 MiB (%s): no figures of %s" % (
                    want, peer, shape, key), file=sys.stderr)
                continue
            ratios = [(hier[b] / theirs[b], b) for b in sorted(hier)
                      if b >= TARGET_FROM and theirs.get(b)]
            worst = min(ratios) if ratios else (float("nan"), 0)
            met = bool(ratios) and worst[0] >= want
            ok &= met
            print("target: hier >= %.1fx %s at every size >= 1 MiB (%s): %s (worst: %.2f at %d "
                  "bytes)" % (want, key, shape, "met" if met else "missed", worst[0], worst[1]),
                  file=sys.stderr)
        rate = links.get(shape)
        if rate and LINK_BYTES in hier:
            # busbw = algbw x 2 (N-1)/N on N = 4 ranks.
            algbw = hier[LINK_BYTES] / 1.5
            use = algbw / (rate / 8)
            met = use >= LINK_TARGET
            ok &= met
            print(json.dumps({"bench": "multinode", "shape": shape, "bytes": LINK_BYTES,
                              "link_gbit": rate, "link_use": round(use, 3)}))
            print("target: hier allreduce of 64 MiB uses >= 80%% of the %g Gbit/s link (%s): %s "
                  "(%.0f%%)" % (rate, shape, "met" if met else "missed", use * 100),
                  file=sys.stderr)
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jsonl")
    parser.add_argument("--anchor-torch", metavar="VERSION")
    parser.add_argument("--link-gbit", action="append", default=[], metavar="SHAPE=GBIT")
    args = parser.parse_args()
    links = {}
    for item in args.link_gbit:
        shape, _, rate = item.rpartition("=")
        links[shape] = float(rate)
    with open(args.jsonl) as f:
        lines = [json.loads(line) for line in f if line.startswith("{")]
    summarize(lines, args.anchor_torch, links)
    training(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
