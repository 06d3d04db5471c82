#!/usr/bin/python3
"""The sharding benchmark's summary, from ci/bench.sh shard's lines.

    shard_summary.py LINES --anchor-torch VERSION

Reads the JSON lines ci/bench.sh shard wrote (ct's fmnist_mlp and gpt runs
under each --shard stage, their two-lone-process ceilings, and PyTorch's
DDP, ZeroRedundancyOptimizer and FSDP runs, each tagged "run" and "round"),
and prints to stderr, for each run, the best round and every round; then
the ratios on the best figures with their targets, each "target: ... met"
or "missed". The targets (docs/sharding.md) are judged against the anchor
torch only. stdout: one JSON line per figure and per ratio.
"""
import argparse
import json
import sys

STAGES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3 (FSDP)")
# PyTorch's nearest equivalent of each of ct's stages (ddp_torch.py --shard).
TORCH_KIND = ("ddp", "zero1", "zero2", "fsdp")
TORCH_NAME = {"ddp": "DDP", "zero1": "DDP + ZeroRedundancyOptimizer",
              "zero2": "FSDP SHARD_GRAD_OP", "fsdp": "FSDP FULL_SHARD"}
# Scaling efficiency against two lone processes: (model, stage) -> target.
EFFICIENCY = {("fm", 0): 0.85, ("fm", 1): 0.85, ("fm", 2): 0.85,
              ("gpt", 1): 0.9, ("gpt", 2): 0.9, ("gpt", 3): 0.8}
# Each stage against PyTorch's nearest on fmnist_mlp, with the anchor torch.
SPEED_VS_TORCH = 3.0
# The memory plan against the measured step peak: within 10% (the bar).
PLAN_TOLERANCE = 0.10
METRIC = {"fm": "samples_per_s", "gpt": "tokens_per_s"}
MODEL = {"fm": "fmnist_mlp", "gpt": "gpt"}


def log(text=""):
    print(text, file=sys.stderr)


def emit(record):
    print(json.dumps(dict({"bench": "shard"}, **record)), flush=True)


# Model state per rank against DDP's on 2 ranks (fp32: params, gradients and
# the optimizer's state; SGD with momentum for fmnist_mlp keeps 4 bytes a
# parameter, AdamW for the GPT 8).
def zero_share(stage, state_per_param, ranks=2):
    """ZeRO's model state of a stage against DDP's: 4 bytes of parameters, 4
    of gradients and state_per_param of optimizer state, each divided by the
    ranks once sharded."""
    p, g, o = 4.0, 4.0, float(state_per_param)
    shares = [(p, g, o), (p, g, o / ranks), (p, (g + o) / ranks, 0), ((p + g + o) / ranks, 0, 0)]
    return sum(shares[stage]) / (p + g + o)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lines")
    parser.add_argument("--anchor-torch", default="")
    args = parser.parse_args()
    rate, last = {}, {}
    with open(args.lines) as f:
        for r in (json.loads(line) for line in f if line.startswith("{")):
            run = r.get("run")
            if not run or "round" not in r or r.get("build") == "baseline":
                continue
            model = "gpt" if run.startswith("gpt") else "fm"
            value = r.get(METRIC[model])
            if value is None:
                continue
            key = (run, r.get("torch"))
            rate.setdefault(key, {})[r["round"]] = value
            last[key] = r
    if not rate:
        log("shard: no runs to summarise")
        return 1
    best = {key: max(by.values()) for key, by in rate.items()}
    rounds = sorted({n for by in rate.values() for n in by})
    versions = sorted({v for _, v in rate if v}, key=lambda v: v != args.anchor_torch)

    def name(run, version):
        if run.startswith("torch_fm_"):
            return "PyTorch %s %s, 2 ranks (gloo)" % (version, TORCH_NAME[run[len("torch_fm_"):]])
        model = "gpt" if run.startswith("gpt") else "fm"
        if run.endswith("nocomm"):
            return "ct %s, 2 lone processes" % MODEL[model]
        return "ct %s, 2 ranks, %s" % (MODEL[model], STAGES[int(run[-1])])

    keys = [(("%s_shard%d" % (m, s)), None) for m in ("fm", "gpt") for s in range(4)]
    keys += [("fm_nocomm", None), ("gpt_nocomm", None)]
    keys += [("torch_fm_" + k, v) for v in versions for k in TORCH_KIND]
    width = max(len(name(*k)) for k in keys)
    log("\nsummary: fmnist_mlp samples/s and gpt tokens/s, the best of the rounds, then each "
        "round")
    log("%-*s %9s" % (width, "run", "best") + "".join(" %9s" % ("round %d" % n) for n in rounds))
    for key in keys:
        if key not in rate:
            log("%-*s %9s" % (width, name(*key), "not run"))
            continue
        log("%-*s %9.0f" % (width, name(*key), best[key]) + "".join(
            " %9s" % ("%.0f" % rate[key][n] if n in rate[key] else "-") for n in rounds))
        emit({"summary": "rate", "run": key[0], "torch": key[1], "best": best[key],
              "rounds": [rate[key].get(n) for n in rounds]})

    def judge(label, value, target, above=True):
        if value is None:
            log("  %s: not measured" % label)
            return
        line = "  %s: %.3f" % (label, value)
        if target is not None:
            met = value >= target if above else value <= target
            line += "; target: %s %s %.3g %s" % (label.split(":")[0], ">=" if above else "<=",
                                                 target, "met" if met else "missed")
        log(line)
        emit({"summary": "ratio", "what": label, "value": value, "target": target})

    log("scaling efficiency (2 ranks' rate over 2 lone processes'):")
    for model in ("fm", "gpt"):
        ceiling = best.get((model + "_nocomm", None))
        for stage in range(4):
            run = best.get(("%s_shard%d" % (model, stage), None))
            judge("%s %s efficiency" % (MODEL[model], STAGES[stage]),
                  run / ceiling if run and ceiling else None, EFFICIENCY.get((model, stage)))

    log("model state per rank against DDP's (params + gradients + optimizer state; ZeRO's "
        "accounting, within 5% plus the staging):")
    for model, state in (("fm", 4), ("gpt", 8)):
        base = last.get(("%s_shard0" % model, None))
        for stage in range(1, 4):
            r = last.get(("%s_shard%d" % (model, stage), None))
            if not base or not r or "model_state_bytes" not in r:
                judge("%s %s model state" % (MODEL[model], STAGES[stage]), None, None)
                continue
            ratio = r["model_state_bytes"] / base["model_state_bytes"]
            slack = r.get("staging_bytes", 0) / base["model_state_bytes"]
            judge("%s %s model state" % (MODEL[model], STAGES[stage]), ratio,
                  zero_share(stage, state) * 1.05 + slack, above=False)
        if model == "gpt" and base:
            for stage in range(1, 4):
                r = last.get(("gpt_shard%d" % stage, None))
                if r and "peak_bytes" in r:
                    judge("gpt %s whole-step peak" % STAGES[stage],
                          r["peak_bytes"] / base["peak_bytes"], None, above=False)

    log("memory plan against the measured step peak (ct_memory_plan, --plan; rank 0's, the "
        "last round's):")
    for model in ("fm", "gpt"):
        for stage in range(4):
            r = last.get(("%s_shard%d" % (model, stage), None)) or {}
            label = "%s %s plan/measured step peak" % (MODEL[model], STAGES[stage])
            if not r.get("plan_peak_bytes") or not r.get("step_peak_bytes"):
                log("  %s: not measured" % label)
                continue
            ratio = r["plan_peak_bytes"] / r["step_peak_bytes"]
            log("  %s: %.4f; target: %s within %g of 1 %s" % (
                label, ratio, label, PLAN_TOLERANCE,
                "met" if abs(ratio - 1) <= PLAN_TOLERANCE else "missed"))
            emit({"summary": "ratio", "what": label, "value": ratio, "target": PLAN_TOLERANCE})

    log("each stage against PyTorch's nearest (fmnist_mlp; the target with the anchor):")
    for version in versions:
        for stage, kind in enumerate(TORCH_KIND):
            ours, theirs = best.get(("fm_shard%d" % stage, None)), best.get(("torch_fm_" + kind,
                                                                            version))
            judge("ct %s / PyTorch %s %s" % (STAGES[stage], version, TORCH_NAME[kind]),
                  ours / theirs if ours and theirs else None,
                  SPEED_VS_TORCH if version == args.anchor_torch else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
