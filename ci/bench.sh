#!/usr/bin/env bash
# Builds ct's benchmarks (Release, in build-bench/) and runs them with their
# peers in the same run.
#
#   ci/bench.sh [NAME...]     NAME: ops, train, collectives, ddp, shard,
#                             checkpoint, rpc, cuda, gpt, multinode; with
#                             none, every benchmark
#
# stdout: one JSON object per result. stderr: build output, notes, and a
# ratio line per comparison. CT_BENCH_THREADS (default "1,2") lists the thread
# counts for ops (train runs at 1 thread); CT_BENCH_EPOCHS sets train's
# epochs (default 1: 1 measures throughput, 10 compares test accuracy; see
# docs/bench-train.md) and those of ddp's accuracy runs (default 2); collectives runs 2
# ranks under ctlaunch, and under mpirun when Open MPI is built, its
# allreduce in CT_BENCH_ROUNDS (default 3) rounds that interleave ct, Open
# MPI and gloo (docs/bench-collectives.md); ddp trains on 1 and 2 ranks
# (ctlaunch, mpirun) beside PyTorch DDP in as many rounds, then measures the
# allreduce that backward hides (docs/bench-ddp.md); shard trains
# fmnist_mlp and gpt on 2 ranks under each of ct_ddp's ZeRO stages beside
# two lone processes and PyTorch's DDP, ZeroRedundancyOptimizer and FSDP,
# in as many rounds (docs/sharding.md); checkpoint saves and
# loads a 1 GiB state with ct on 1 and 2 ranks, dd and torch in as many
# rounds, in a fresh directory under CT_BENCH_CKPT_DIR (default
# $build/ckpt-bench: the build's disk), and times an async save's blocking
# (docs/bench-checkpoint.md); rpc times RPC round trips on 2 workers beside
# plain zmq and torch.distributed.rpc, in as many rounds
# (docs/rpc-design.md); cuda runs ct on cuda:0 beside cudaMemcpy, cuBLAS
# and torch.cuda (elementwise bandwidth, matmul, fmnist_mlp --device cuda;
# CT_BENCH_QUICK=1 for the short form; skipped without a device); gpt
# trains examples/gpt beside bench/gpt_torch.py at 1 and 2 threads and ct on
# 2 ranks, in as many rounds of CT_BENCH_GPT_STEPS steps (default 30), then
# peak memory with and without activation checkpointing and the 200-step
# parity run, and with CT_BENCH_GPT_TIME=S both trained for S seconds on
# all cores, their validation losses compared and charted (docs/gpt.md);
# multinode runs allreduce on 2 hosts x 2 ranks of the test cluster, over
# veth and over a 10 Gbit/s link, for ct's flat gloo and hierarchical
# communicators, its mpi backend, MPI_Allreduce and torch's gloo, in as
# many rounds (as root; skipped where namespaces cannot be made;
# docs/multinode.md).
#
# Every PyTorch peer runs twice in its place of the run, under the current
# release (CT_BENCH_TORCH_PYTHON, default bench/.venv/bin/python: PyPI's
# torch), the anchor that the targets are judged against, then under
# CT_BENCH_OLD_TORCH_PYTHON (default /usr/bin/python3: Debian's
# python3-torch 1.13), whose figures are set beside ct by ratio alone; each
# torch line says which it was ("torch": the version). `bash ci/setup.sh
# --bench` installs both; a Python without torch is left out, with a note.
# PYTHON (default /usr/bin/python3) runs the summaries; CT_BENCH_BUILD_DIR
# moves the build.
#
# CT_BENCH_BASELINE=REV (any git revision: a sha, main~3, a tag) measures
# ct against that earlier revision of itself in the same run: REV is checked
# out in a detached worktree beside the build, build-bench-baseline/src (with
# CT_BENCH_BUILD_DIR=D, D-baseline/src; kept from run to run and moved to
# REV's commit when it is at another), and built with the same options in
# build-bench-baseline/build, incrementally. In every round of ops, train,
# collectives, ddp, checkpoint, rpc and gpt, each ct run (but checkpoint's
# async save loop) is repeated beside it with the same arguments and the
# baseline's own binaries (the two take turns going first, round by round),
# its ctlaunch too (an older ctlaunch and newer ranks need not speak the
# same protocol). ops and train, run once otherwise, then run ct in
# CT_BENCH_ROUNDS rounds (ops: bench_ops once per thread count and group;
# train: fmnist_mlp and bench_autograd), their PyTorch peers once after
# them, set beside the current's last round. Those lines carry "build":
# "baseline" and "rev": the short sha, the current ones (in such a run only)
# "build": "current". After its own summary each of the seven prints, per
# ct case, the ratio of every round (above 1: the current is better; ops:
# time per call, baseline / current; train: fmnist_mlp's samples/s, current
# / baseline, and autograd's time per node; gpt: tokens/s per thread and
# rank count) and their median, and the target that no case is more than 3%
# slower. A baseline run that fails (an older program that lacks a group or
# an option) is a note, not a failure; the cases one build alone measured
# are named and left out. cuda measures the current build alone
# (docs/benchmarks.md, "Against an earlier revision").
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# OpenBLAS's own threads, used by the direct cblas_sgemm peer, busy-wait for
# about 2^28 cycles after each call by default. Interleaved with ct's runs
# they would take a core from ct's pool; with 2^4 they sleep at once.
export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-4}
build=${CT_BENCH_BUILD_DIR:-$root/build-bench}
python=${PYTHON:-/usr/bin/python3}
torch_pythons=("${CT_BENCH_TORCH_PYTHON:-$root/bench/.venv/bin/python}"
    "${CT_BENCH_OLD_TORCH_PYTHON:-/usr/bin/python3}")
epochs=${CT_BENCH_EPOCHS:-1}
rounds=${CT_BENCH_ROUNDS:-3}
all=(ops train collectives ddp shard checkpoint rpc cuda gpt multinode)

# The comment at the top of this file, up to its first line of code.
usage() {
    sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
}

names=()
for arg in "$@"; do
    case $arg in
    -h | --help)
        usage
        exit 0
        ;;
    esac
    if [[ " ${all[*]} " != *" $arg "* ]]; then
        echo "ci/bench.sh: unknown benchmark '$arg' (known: ${all[*]})" >&2
        exit 2
    fi
    names+=("$arg")
done
if [[ ${#names[@]} -eq 0 ]]; then
    names=("${all[@]}")
fi
# Exits with a usage error unless $2, the value of the variable $1, is a
# whole number >= 1.
require_count() {
    if [[ ! $2 =~ ^[1-9][0-9]*$ ]]; then
        echo "ci/bench.sh: $1=$2: expected a whole number >= 1" >&2
        exit 2
    fi
}
require_count CT_BENCH_EPOCHS "$epochs"
require_count CT_BENCH_ROUNDS "$rounds"
# The commit of CT_BENCH_BASELINE, resolved before the builds so that a
# mistyped revision fails at once; compared: the benchmarks that run it.
compared=(ops train collectives ddp checkpoint rpc gpt)
baseline_commit=
if [[ -n ${CT_BENCH_BASELINE:-} ]]; then
    if ! baseline_commit=$(git -C "$root" rev-parse --verify --quiet \
        "$CT_BENCH_BASELINE^{commit}"); then
        echo "ci/bench.sh: CT_BENCH_BASELINE=$CT_BENCH_BASELINE: no such revision in $root" >&2
        exit 2
    fi
fi
# Succeeds when the benchmark $1 runs ct beside the baseline.
compares_baseline() {
    [[ " ${compared[*]} " == *" $1 "* ]]
}

# Examples are built too: ct's side of the training benchmarks is the main
# job itself, examples/fmnist_mlp. The baseline is configured alike.
cmake_options=(-DCMAKE_BUILD_TYPE=Release -DCT_BUILD_BENCH=ON -DCT_BUILD_TESTS=OFF
    -DCT_BUILD_EXAMPLES=ON)
cmake -S "$root" -B "$build" "${cmake_options[@]}" >&2
# The Open MPI peer exists only when the build found MPI, and ct's mpi
# backend with it. Neither launcher binds ranks to cores: ctlaunch does not,
# and mpirun is told not to, so that both get the same scheduling;
# --oversubscribe lets 2 ranks start whatever Open MPI counts as slots.
have_mpi=false
if [[ $(cmake --build "$build" --target help) == *bench_mpi_allreduce* ]] &&
    command -v mpirun >/dev/null; then
    have_mpi=true
fi
mpirun=(mpirun -np 2 --oversubscribe --bind-to none)
if (($(id -u) == 0)); then
    mpirun+=(--allow-run-as-root)
fi
# bench_cuda exists only when the build found the CUDA Toolkit.
have_cuda=false
if [[ $(cmake --build "$build" --target help) == *bench_cuda* ]]; then
    have_cuda=true
fi
# baseline_targets: those of the benchmarks that also run the baseline.
targets=()
baseline_targets=()
for name in "${names[@]}"; do
    named=()
    case $name in
    cuda)
        if $have_cuda; then
            named=(bench_cuda fmnist_mlp)
        fi
        ;;
    train) named=(bench_train_floor fmnist_mlp bench_autograd) ;;
    collectives)
        named=(bench_collectives ctlaunch)
        if $have_mpi; then
            named+=(bench_mpi_allreduce)
        fi
        ;;
    ddp) named=(fmnist_mlp ctlaunch bench_ddp) ;;
    shard) named=(fmnist_mlp gpt ctlaunch) ;;
    rpc) named=(bench_rpc ctlaunch) ;;
    gpt) named=(gpt ctlaunch ctplot) ;;
    checkpoint) named=(bench_checkpoint ctlaunch) ;;
    multinode)
        named=(bench_collectives ctlaunch)
        if $have_mpi; then
            named+=(bench_mpi_allreduce)
        fi
        ;;
    *) named=("bench_$name") ;;
    esac
    targets+=("${named[@]}")
    if [[ -n $baseline_commit ]] && compares_baseline "$name"; then
        baseline_targets+=("${named[@]}")
    fi
done
if ((${#targets[@]})); then
    cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >&2
fi

# Checks out $baseline_commit in a detached worktree, $baseline_dir/src,
# and builds baseline_targets in $baseline_dir/build with the current
# build's options. A worktree already there is kept, and moved when it is
# at another commit: that rewrites only the files that differ, so the build
# stays incremental (a fresh worktree's files are all newer than the build).
build_baseline() {
    local src=$baseline_dir/src
    if [[ -e $src/.git ]]; then
        if [[ $(git -C "$src" rev-parse HEAD) != "$baseline_commit" ]]; then
            git -C "$src" checkout --quiet --force --detach "$baseline_commit"
        fi
    else
        # A worktree whose folder was deleted by hand stays registered, and
        # git worktree add refuses its path until it is pruned.
        git -C "$root" worktree prune
        git -C "$root" worktree add --detach "$src" "$baseline_commit" >&2
    fi
    cmake -S "$src" -B "$baseline_dir/build" "${cmake_options[@]}" >&2
    cmake --build "$baseline_dir/build" -j"$(nproc)" --target "${baseline_targets[@]}" >&2
}

# baseline_rev, the baseline's short sha, is set only when a benchmark runs
# it: ct_builds and compare_baseline go by it.
baseline_dir=$(realpath -m -- "$build-baseline")
baseline_rev=
if ((${#baseline_targets[@]})); then
    build_baseline
    baseline_rev=$(git -C "$root" rev-parse --short "$baseline_commit")
    echo "ci/bench.sh: baseline: $(git -C "$root" log -1 --format='%h %s' "$baseline_commit")" \
        "(CT_BENCH_BASELINE=$CT_BENCH_BASELINE), built in $baseline_dir/build" >&2
fi
if [[ -n $baseline_commit ]]; then
    alone=()
    for name in "${names[@]}"; do
        if ! compares_baseline "$name"; then
            alone+=("$name")
        fi
    done
    if ((${#alone[@]})); then
        echo "ci/bench.sh: CT_BENCH_BASELINE: not compared with the baseline (the current" \
            "build alone): ${alone[*]}" >&2
    fi
fi

# Each Python's torch, asked once: torch_versions[i] is that of
# torch_pythons[i], empty where there is none (the peers then leave that
# Python out) or where it is the anchor's (measured once). anchor is the
# first's, the torch that the summaries judge the targets against.
torch_roles=("the anchor" "set beside the anchor")
torch_versions=()
for i in "${!torch_pythons[@]}"; do
    py=${torch_pythons[i]}
    version=
    if [[ -x $py ]]; then
        version=$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null) || version=
    fi
    if [[ -z $version ]]; then
        echo "ci/bench.sh: no torch for $py (${torch_roles[i]}); its PyTorch peers are" \
            "skipped (bash ci/setup.sh --bench installs it)" >&2
    elif ((i > 0)) && [[ $version == "${torch_versions[0]}" ]]; then
        echo "ci/bench.sh: $py has torch $version, as ${torch_pythons[0]} does; measured" \
            "once" >&2
        version=
    else
        echo "ci/bench.sh: torch $version under $py (${torch_roles[i]})" >&2
    fi
    torch_versions+=("$version")
done
anchor=${torch_versions[0]}

# Runs the PyTorch peer bench/$1 with the remaining arguments under each
# Python that has torch, the anchor first, so that both torches run in the
# same place of every round; in an argument, @torch@ becomes that torch's
# version (for a file each writes). Returns the status of the last that
# failed.
run_peer() {
    local peer=$root/bench/$1 status=0 i
    shift
    for i in "${!torch_pythons[@]}"; do
        if [[ -n ${torch_versions[i]} ]]; then
            "${torch_pythons[i]}" "$peer" "${@//@torch@/${torch_versions[i]}}" || status=$?
        fi
    done
    return "$status"
}

# Runs a summary, which needs no torch, with $python and the arguments
# given: "-" and the code on stdin, or a script and its arguments.
run_summary() {
    if [[ -x $python ]]; then
        "$python" "$@"
    else
        echo "ci/bench.sh: $python not found; no summary" >&2
    fi
}

# The machine's load over a section, which the figures depend on: $1 the
# section, $2 the load average when it began, $3 the seconds it took. A line
# for the reader and a JSON line, as the summaries print theirs.
report_load() {
    local end
    end=$(cut -d' ' -f1-3 /proc/loadavg)
    echo "load average $2 at the start, $end at the end; $3 s" >&2
    printf '{"bench": "%s", "summary": "load", "start": [%s], "end": [%s], "seconds": %d}\n' \
        "$1" "${2// /, }" "${end// /, }" "$3"
}

# With a baseline, sets each of ct's cases in the rounds of the benchmark $1
# beside the baseline's, round by round. One or more pairs follow: "time"
# (the metric after it is better lower: the ratio is baseline / current) or
# "rate" (better higher: current / baseline), so that above 1 the current
# is better; a line is compared on the first of those metrics it has. The
# rest are the fields that name a case. The verdict goes by each case's
# median over the rounds, each round's ratio printed beside it: on a shared
# machine one round's noise can pass the 3% the target allows. A case that
# one build alone measured (a program that gained or lost cases between the
# two) is named as left out, and the others are compared.
compare_baseline() {
    if [[ -z $baseline_rev ]]; then
        return 0
    fi
    run_summary - "$tmp" "$baseline_rev" "$@" <<'EOF'
"""ct's cases in a benchmark's rounds, the current build beside the baseline's."""
import json
import statistics
import sys

path, rev, bench = sys.argv[1:4]
args = sys.argv[4:]
# metric -> "time" or "rate", in the order given
kinds = {}
while len(args) >= 2 and args[0] in ("time", "rate"):
    kinds[args[1]] = args[0]
    args = args[2:]
fields = args
# A case meets the target when its ratio is at least this: no more than 3% slower.
TARGET = 0.97


def hashable(v):
    return tuple(v) if isinstance(v, list) else v


# (metric,) + the case's fields -> {"current" or "baseline": {round: value}},
# in the order measured
values = {}
with open(path) as f:
    for r in (json.loads(line) for line in f if line.startswith("{")):
        metric = next((m for m in kinds if m in r), None)
        if (r.get("impl") == "ct" and r.get("build") in ("current", "baseline")
                and "round" in r and metric):
            case = (metric,) + tuple(hashable(r.get(field)) for field in fields)
            values.setdefault(case, {}).setdefault(r["build"], {})[r["round"]] = r[metric]


def log(text):
    print(text, file=sys.stderr)


def emit(record):
    print(json.dumps(dict({"bench": bench}, **record)), flush=True)


def shown(field, v):
    """A field's value in a label: "65536 bytes", "1024x1024", "nn"."""
    if isinstance(v, tuple):
        return "x".join(map(str, v))
    return "%d %s" % (v, field) if isinstance(v, int) else str(v)


def label(case):
    """The case's values, a count with its field's name: "allreduce 65536 bytes";
    its metric first where there are several."""
    words = [case[0]] if len(kinds) > 1 else []
    return " ".join(words + [shown(f, v) for f, v in zip(fields, case[1:]) if v is not None])


def fields_of(case):
    return {f: list(v) if isinstance(v, tuple) else v
            for f, v in zip(fields, case[1:]) if v is not None}


def ratio(metric, current, baseline):
    return baseline / current if kinds[metric] == "time" else current / baseline


def direction(metric):
    return "%s, %s" % (metric, "baseline / current" if kinds[metric] == "time"
                       else "current / baseline")


compared, left_out, held_by_round = [], [], {}
width = max((len(label(case)) for case in values), default=0)
log("\nagainst the baseline %s: %s per round, above 1 where the current is better; "
    "the median of the rounds [each round's]" % (rev, "; ".join(map(direction, kinds))))
for case, by in values.items():
    current, baseline = by.get("current", {}), by.get("baseline", {})
    rounds = [n for n in sorted(current) if n in baseline and current[n] and baseline[n]]
    if not rounds:
        log("  %-*s %s" % (width, label(case), "not measured by both builds in one round"
                           if current and baseline else "left out: measured by the %s alone"
                           % ("current build" if current else "baseline")))
        left_out.append(case)
        continue
    by_round = [ratio(case[0], current[n], baseline[n]) for n in rounds]
    median = statistics.median(by_round)
    compared.append((median, case))
    for n, x in zip(rounds, by_round):
        held_by_round[n] = held_by_round.get(n, True) and x >= TARGET
    log("  %-*s %6.3f [%s]" % (width, label(case), median,
                               " ".join("%.3f" % x for x in by_round)))
    emit(dict({"summary": "baseline_ratio", "rev": rev}, **fields_of(case), metric=case[0],
              ratio=round(median, 4), round_ratios=[round(x, 4) for x in by_round]))

what = "no case more than %.0f%% slower than %s" % (100 * (1 - TARGET), rev)
if compared:
    worst, case = min(compared, key=lambda c: c[0])
    met = worst >= TARGET
    log("target: %s: %s (worst: %s %.3f%s)"
        % (what, "met" if met else "missed", label(case), worst,
           "; %d case(s) left out" % len(left_out) if left_out else ""))
    record = {"summary": "target", "target": "vs_baseline", "rev": rev, "metric": case[0],
              "ratio": round(worst, 4), "worst": fields_of(case), "target_ratio": TARGET,
              "met": met, "cases": len(compared), "rounds": len(held_by_round),
              "rounds_met": sum(held_by_round.values())}
    if left_out:
        record["left_out"] = [dict(fields_of(c), metric=c[0]) for c in left_out]
    emit(record)
else:
    log("target: %s: not measured" % what)
EOF
}

# bench_ops over CT_BENCH_THREADS, then ops_torch.py. With a baseline,
# CT_BENCH_ROUNDS rounds instead, each of which runs bench_ops once per
# thread count and group (the groups its usage line names), the baseline's
# right beside it; the torch peer sets itself beside the current's last
# round. Each bench_ops run times its peers (cblas_sgemm, memcpy) too.
run_ops() {
    local bench=$build/bench/bench_ops round threads group list groups
    if [[ -z $baseline_rev ]]; then
        "$bench" | tee "$tmp"
    else
        IFS=, read -ra list <<<"${CT_BENCH_THREADS:-1,2}"
        read -ra groups < <("$bench" --help 2>&1 |
            sed -n 's/^usage: bench_ops \[\(.*\)\]\.\.\.$/\1/p' | tr '|' ' ') || true
        if ((${#groups[@]} == 0)); then
            groups=("")
        fi
        for ((round = 1; round <= rounds; round++)); do
            echo "ci/bench.sh: ops round $round of $rounds" >&2
            for threads in "${list[@]}"; do
                for group in "${groups[@]}"; do
                    ct_builds ops_ct "$round" env CT_BENCH_THREADS="$threads" "$bench" \
                        ${group:+"$group"}
                done
            done
        done
    fi
    run_peer ops_torch.py --compare "$tmp"
    compare_baseline ops time us op layout shape threads
}

# One round's run of bench_ops: the command in the rest of the arguments,
# its lines tagged with "round": $1.
ops_ct() {
    local tag="\"round\": $1, "
    shift
    "$@" | json_lines "$tag" | tee -a "$tmp"
}

# The fmnist_mlp recipe at one thread, whatever CT_BENCH_THREADS says: the
# hand-written floor, ct, then PyTorch, which sets both beside its own
# figure; ct's autograd chain (bench_autograd) and PyTorch's. With a
# baseline, ct's two run in CT_BENCH_ROUNDS rounds, the baseline's right
# beside them; the peers set themselves beside the current's last round.
run_train() {
    local n=1 tag='' round
    OPENBLAS_NUM_THREADS=1 "$build/bench/bench_train_floor" --epochs "$epochs" | tee "$tmp"
    if [[ -n $baseline_rev ]]; then
        n=$rounds
    fi
    for ((round = 1; round <= n; round++)); do
        if [[ -n $baseline_rev ]]; then
            echo "ci/bench.sh: train round $round of $rounds" >&2
            tag="\"round\": $round, "
        fi
        # fmnist_mlp prints its progress and per-epoch accuracy too; its
        # last line is the JSON result.
        ct_builds train_ct "$tag" "$build/examples/fmnist_mlp" --epochs "$epochs" --threads 1 \
            --metrics ""
        ct_builds train_ct "$tag" "$build/bench/bench_autograd"
    done
    run_peer train_torch.py --epochs "$epochs" --compare "$tmp"
    run_peer autograd_torch.py --compare "$tmp"
    compare_baseline train rate samples_per_s time us_per_node nodes
}

# Runs ct's command in the rest of the arguments and keeps its JSON lines
# (fmnist_mlp's last line; every line of bench_autograd), each tagged with
# $1 (empty without a baseline: the lines as they were printed).
train_ct() {
    local tag=$1
    shift
    "$@" | grep '^{' | json_lines "$tag" | tee -a "$tmp"
}

# Takes ctlaunch's "[rank 0] " prefix off the JSON lines and inserts $1,
# when given, after their "bench", then build_fields, which ct_builds sets
# while it runs ct: each is fields with a trailing ", ", e.g. '"round": 2, '.
json_lines() {
    sed -u -e 's/^\[rank 0\] //' -e "s/^{\"bench\": \"[a-z_]*\", /&${1:-}${build_fields:-}/"
}

# Runs the command in the arguments, a ct run of a round, and, with a
# baseline, the same run of the baseline right beside it, so that both meet
# the same state of the host: every argument that is a path under $build/
# becomes the same path under the baseline's build (its ctlaunch too: an
# older ctlaunch and newer ranks need not speak the same protocol). The two
# take turns going first (by the caller's round; the current first where
# there is none), since going second is no neutral place: a save then
# meets the disk the first one left dirty, a run the caches it left. The
# command tags its lines through json_lines, which adds build_fields. A
# failed baseline run (an older program without a case, an option or a
# group the current one has) is a note, not a failed benchmark: its cases
# are left out of the comparison, which names them.
ct_builds() {
    local build_fields= order=(current baseline) which status
    if [[ -z $baseline_rev ]]; then
        "$@"
        return
    fi
    if [[ ${round:-} =~ ^[0-9]+$ ]] && ((round % 2 == 0)); then
        order=(baseline current)
    fi
    for which in "${order[@]}"; do
        if [[ $which == current ]]; then
            build_fields='"build": "current", '
            "$@"
        else
            build_fields="\"build\": \"baseline\", \"rev\": \"$baseline_rev\", "
            status=0
            "${@/#"$build/"/"$baseline_dir/build/"}" || status=$?
            if ((status)); then
                echo "ci/bench.sh: the baseline's run failed (status $status):" \
                    "${*/#"$build/"/"$baseline_dir/build/"}" >&2
            fi
        fi
    done
}

# Two ranks, nccl-tests' sizes (8 B to 64 MiB): allreduce at every power of
# two, the other operations at every fourth.
#
# The host's speed for traffic between its cores flips between a fast and a
# slow state that lasts tens of seconds, so allreduce, the operation every
# implementation runs, is measured in rounds: each round runs ct's shm
# backend under ctlaunch, MPI_Allreduce under mpirun and gloo back to back,
# at half the time per size, and the summary (collectives_gloo.py --compare)
# takes each one's best round. ct's other operations and its mpi backend,
# compared with no peer, run once after the rounds.
run_collectives() {
    local bench=$build/bench/bench_collectives
    local ctlaunch=("$build/launcher/ctlaunch" -np 2)
    local mpirun=("${mpirun[@]}" -x CT_NUM_THREADS=1)
    local sizes=(-b 8 -e 64M -f 2)
    local round_sweep=("${sizes[@]}" --seconds 0.1)
    local others=(--ops "broadcast,allgather,reduce_scatter" -b 8 -e 64M -f 4)
    local gloo_failed=false round
    if ! $have_mpi; then
        echo "ci/bench.sh: no MPI in this build (or no mpirun); skipping ct's mpi backend" \
            "and the Open MPI peer" >&2
    fi
    "$bench" --memcpy -e 64M | tee "$tmp"
    for ((round = 1; round <= rounds; round++)); do
        echo "ci/bench.sh: allreduce round $round of $rounds" >&2
        ct_builds coll_ct "$round" "${ctlaunch[@]}" "$bench" --ops allreduce "${round_sweep[@]}"
        if $have_mpi; then
            "${mpirun[@]}" "$build/bench/bench_mpi_allreduce" "${round_sweep[@]}" |
                json_lines "\"round\": $round, " | tee -a "$tmp"
        fi
        # A failed gloo sweep fails the run, after the summary of the rest.
        run_peer collectives_gloo.py "${round_sweep[@]}" | json_lines "\"round\": $round, " |
            tee -a "$tmp" || gloo_failed=true
    done
    "${ctlaunch[@]}" "$bench" "${others[@]}" | json_lines | tee -a "$tmp"
    if $have_mpi; then
        "${mpirun[@]}" -x CT_BACKEND=mpi "$bench" --ops allreduce "${sizes[@]}" |
            json_lines | tee -a "$tmp"
        "${mpirun[@]}" -x CT_BACKEND=mpi "$bench" "${others[@]}" | json_lines | tee -a "$tmp"
    fi
    run_summary "$root/bench/collectives_gloo.py" --compare "$tmp" --anchor-torch "$anchor"
    compare_baseline collectives time us op bytes
    if $gloo_failed; then
        return 1
    fi
}

# One round's allreduce sweep of ct: the command in the rest of the
# arguments, its lines tagged with "round": $1.
coll_ct() {
    local tag="\"round\": $1, "
    shift
    "$@" | json_lines "$tag" | tee -a "$tmp"
}

# The fmnist_mlp recipe (global batch 64) data-parallel: rounds that each
# train 1000 timed steps (after 20 untimed) with ct on 1 rank at 1 and 2
# threads, on 2 ranks under ctlaunch (shm), as two lone processes at half
# the batch, and under mpirun (its default on one machine, shm, then
# CT_BACKEND=mpi), then with PyTorch DDP (gloo) on 2 ranks
# and plain PyTorch on 1, so that every run gets the same chances at the
# host's fast and slow states (docs/bench-collectives.md, "Rounds"). Then ct
# trains CT_BENCH_EPOCHS whole epochs on 1 rank and on 2 for the test
# accuracy, and bench_ddp measures how much of the allreduce backward hides,
# with ct_ddp's buckets and with one bucket. The summary sets each run's best
# round beside the others and checks the targets (docs/bench-ddp.md).
run_ddp() {
    local fmnist=$build/examples/fmnist_mlp
    local ctlaunch=("$build/launcher/ctlaunch" -np 2)
    local steps=1000 warmup=20
    local ct_steps=(--max-steps $((warmup + steps)) --warmup-steps "$warmup" --metrics "")
    local torch_steps=(--steps "$steps" --warmup-steps "$warmup")
    local one_bucket=(--first-bucket-bytes $((1 << 30)) --bucket-bytes $((1 << 30)))
    local torch_failed=false started=$SECONDS load_start round
    load_start=$(cut -d' ' -f1-3 /proc/loadavg)
    echo "ci/bench.sh: ddp: load average $load_start" >&2
    if ! $have_mpi; then
        echo "ci/bench.sh: no MPI in this build (or no mpirun); skipping ct under mpirun" >&2
    fi
    for ((round = 1; round <= rounds; round++)); do
        echo "ci/bench.sh: ddp round $round of $rounds" >&2
        ct_builds ddp_ct ct_1rank_1thread "$round" "$fmnist" "${ct_steps[@]}" --threads 1
        ct_builds ddp_ct ct_1rank_2threads "$round" "$fmnist" "${ct_steps[@]}" --threads 2
        ct_builds ddp_ct ct_2ranks_ctlaunch "$round" "${ctlaunch[@]}" "$fmnist" "${ct_steps[@]}" \
            --threads 1
        ct_builds ddp_nocomm "$round" "$fmnist" "${ct_steps[@]}" --threads 1 --batch 32
        if $have_mpi; then
            ct_builds ddp_ct ct_2ranks_mpirun "$round" "${mpirun[@]}" "$fmnist" "${ct_steps[@]}" \
                --threads 1
            ct_builds ddp_ct ct_2ranks_mpirun_mpi "$round" "${mpirun[@]}" -x CT_BACKEND=mpi \
                "$fmnist" "${ct_steps[@]}" --threads 1
        fi
        # A failed PyTorch run fails the whole run, after the summary.
        run_peer ddp_torch.py --ranks 2 "${torch_steps[@]}" |
            json_lines "\"run\": \"torch_ddp_2ranks\", \"round\": $round, " |
            tee -a "$tmp" || torch_failed=true
        run_peer ddp_torch.py --ranks 1 "${torch_steps[@]}" |
            json_lines "\"run\": \"torch_1rank\", \"round\": $round, " |
            tee -a "$tmp" || torch_failed=true
    done
    # One epoch leaves the test accuracy within its own step-to-step noise
    # (docs/bench-ddp.md, "Accuracy"): ddp's default is 2.
    local acc_epochs=${CT_BENCH_EPOCHS:-2}
    echo "ci/bench.sh: ddp: $acc_epochs epoch(s) on 1 rank and on 2 for the test accuracy" >&2
    # Results do not depend on the thread count; 2 threads only go faster.
    ddp_ct ct_1rank_epochs "" "$fmnist" --epochs "$acc_epochs" --threads 2 --metrics ""
    ddp_ct ct_2ranks_epochs "" "${ctlaunch[@]}" "$fmnist" --epochs "$acc_epochs" --threads 1 \
        --metrics ""
    "${ctlaunch[@]}" "$build/bench/bench_ddp" | json_lines '"run": "ct_buckets", ' | tee -a "$tmp"
    "${ctlaunch[@]}" "$build/bench/bench_ddp" "${one_bucket[@]}" |
        json_lines '"run": "ct_one_bucket", ' | tee -a "$tmp"
    run_summary - "$tmp" "$steps" "$warmup" "$acc_epochs" "$anchor" <<'EOF'
"""The data-parallel benchmark's summary, from ci/bench.sh ddp's lines."""
import json
import sys

path, steps, warmup, epochs, anchor = sys.argv[1:]
# ct's runs; each torch's runs are TORCH_RUNS, named with its version.
RUNS = {
    "ct_1rank_1thread": "ct, 1 rank, 1 thread",
    "ct_1rank_2threads": "ct, 1 rank, 2 threads",
    "ct_2ranks_ctlaunch": "ct, 2 ranks, ctlaunch (shm)",
    "ct_2procs_nocomm": "ct, 2 lone processes, batch 32 each",
    "ct_2ranks_mpirun": "ct, 2 ranks, mpirun (shm, its default)",
    "ct_2ranks_mpirun_mpi": "ct, 2 ranks, mpirun (CT_BACKEND=mpi)",
}
TORCH_RUNS = {
    "torch_ddp_2ranks": "%s DDP, 2 ranks (gloo)",
    "torch_1rank": "%s, 1 rank",
}
# (name, run, against, target ratio or None): run's samples/s over against's.
# The target compares 2 ranks of one core each with 1 rank on one core; the
# lone processes are the ceiling that no communication at all would reach
# (docs/bench-ddp.md, "Which 1-rank figure the target uses").
RATIOS = [
    ("ct_2ranks_vs_1rank", "ct_2ranks_ctlaunch", "ct_1rank_1thread", 1.3),
    (None, "ct_2ranks_ctlaunch", "ct_1rank_2threads", None),
    (None, "ct_2ranks_ctlaunch", "ct_2procs_nocomm", None),
    (None, "ct_2procs_nocomm", "ct_1rank_1thread", None),
    (None, "ct_2procs_nocomm", "ct_1rank_2threads", None),
    (None, "ct_2ranks_mpirun", "ct_1rank_1thread", None),
    (None, "ct_2ranks_mpirun_mpi", "ct_1rank_1thread", None),
]
# The same with each torch's runs: the target only with the anchor's.
TORCH_RATIOS = [
    ("ct_2ranks_vs_torch_ddp", "ct_2ranks_ctlaunch", "torch_ddp_2ranks", 5.0),
    (None, "ct_1rank_2threads", "torch_1rank", None),
    (None, "torch_ddp_2ranks", "torch_1rank", None),
]
ACCURACY_POINTS = 1.0


def log(text):
    print(text, file=sys.stderr)


def emit(record):
    print(json.dumps(dict({"bench": "ddp"}, **record)), flush=True)


def keyed(run, version):
    """A run's key: (run, its torch's version, None for ct's)."""
    return run, version if run in TORCH_RUNS else None


def torch_field(*keys):
    """{"torch": version} for a record about a torch's run, else {}."""
    return next(({"torch": v} for _, v in keys if v), {})


rate, finals, overlap = {}, {}, []
with open(path) as f:
    for r in (json.loads(line) for line in f if line.startswith("{")):
        # The baseline's runs are set beside the current ones by ci/bench.sh's
        # compare_baseline alone.
        if "run" not in r or r.get("build") == "baseline":
            continue
        if r["bench"] == "ddp_overlap":
            overlap.append(r)
        elif "round" in r:
            rate.setdefault(keyed(r["run"], r.get("torch")), {})[r["round"]] = r["samples_per_s"]
        else:
            finals[r["run"]] = r
rounds = sorted({n for by in rate.values() for n in by})
best = {key: max(by.values()) for key, by in rate.items()}
# The anchor first, then every other torch measured.
versions = [anchor] + sorted({v for _, v in rate if v and v != anchor})
runs = {keyed(run, None): what for run, what in RUNS.items()}
ratios = [(name, keyed(run, None), keyed(against, None), target)
          for name, run, against, target in RATIOS]
for v in versions:
    runs.update((keyed(run, v), what % ("PyTorch " + v).strip())
                for run, what in TORCH_RUNS.items())
    ratios += [(name if v == anchor else None, keyed(run, v), keyed(against, v),
                target if v == anchor else None) for name, run, against, target in TORCH_RATIOS]
width = max(len(what) for what in runs.values())

log("\nsummary: the fmnist_mlp recipe, global batch 64, %s timed steps after %s; global "
    "samples/s, the best of the rounds (the sample the host disturbed least), then each round"
    % (steps, warmup))
log("%-*s %9s" % (width, "run", "best") + "".join(" %9s" % ("round %d" % n) for n in rounds))
for key, what in runs.items():
    if key in rate:
        log("%-*s %9.0f" % (width, what, best[key]) + "".join(
            " %9s" % ("%.0f" % rate[key][n] if n in rate[key] else "-") for n in rounds))
        emit(dict({"summary": "samples_per_s", "run": key[0]}, **torch_field(key),
                  best=best[key], rounds=[rate[key].get(n) for n in rounds]))

log("ratios on the best figures [each round's own]:")
for name, run, against, target in ratios:
    what = "%s / %s" % (runs[run], runs[against])
    if run not in best or against not in best:
        log("  %s: not measured" % what)
        continue
    ratio = best[run] / best[against]
    by_round = [rate[run][n] / rate[against][n] for n in rounds
                if n in rate[run] and n in rate[against]]
    line = "  %-72s %5.2f [%s]" % (what, ratio, " ".join("%.2f" % x for x in by_round))
    record = dict({"summary": "target" if name else "ratio", "run": run[0],
                   "against": against[0]}, **torch_field(run, against), ratio=round(ratio, 3),
                  round_ratios=[round(x, 3) for x in by_round])
    if name:
        met, held = ratio >= target, sum(x >= target for x in by_round)
        line += "  target >= %g: %s, met in %d of %d rounds" % (
            target, "met" if met else "MISSED", held, len(by_round))
        record = dict({"summary": "target", "target": name}, **record,
                      target_ratio=target, met=met, rounds=len(by_round), rounds_met=held)
    log(line)
    emit(record)

one, two = finals.get("ct_1rank_epochs"), finals.get("ct_2ranks_epochs")
if one and two:
    points = abs(two["test_acc"] - one["test_acc"]) * 100
    met = points <= ACCURACY_POINTS
    log("after %s epoch(s), test accuracy (last epoch's mean training loss, samples/s): ct 1 "
        "rank %.2f%% (%.4f, %.0f), ct 2 ranks (ctlaunch) %.2f%% (%.4f, %.0f): %.2f points apart; "
        "target <= %g point: %s"
        % (epochs, 100 * one["test_acc"], one["final_loss"], one["samples_per_s"],
           100 * two["test_acc"], two["final_loss"], two["samples_per_s"], points,
           ACCURACY_POINTS, "met" if met else "MISSED"))
    emit({"summary": "target", "target": "accuracy_2ranks_vs_1rank", "epochs": int(epochs),
          "test_acc_1rank": one["test_acc"], "test_acc_2ranks": two["test_acc"],
          "final_loss_1rank": one["final_loss"], "final_loss_2ranks": two["final_loss"],
          "points": round(points, 2), "target_points": ACCURACY_POINTS, "met": met})
else:
    log("test accuracy: not measured")

for r in overlap:
    log("overlap, %s (%s bytes): backward %.0f us with the allreduce, %.0f us without; the "
        "buckets' allreduce alone %.0f us; %.0f us exposed: %.0f%% hidden"
        % ("ct_ddp's %d buckets" % r["buckets"] if r["run"] == "ct_buckets" else "one bucket",
           " + ".join(map(str, r["bucket_bytes"])), r["backward_sync_us"],
           r["backward_nosync_us"], r["allreduce_us"], r["exposed_us"], 100 * r["hidden"]))
    emit({"summary": "overlap", "run": r["run"], "buckets": r["buckets"],
          "backward_sync_us": r["backward_sync_us"],
          "backward_nosync_us": r["backward_nosync_us"], "allreduce_us": r["allreduce_us"],
          "exposed_us": r["exposed_us"], "hidden": r["hidden"]})

EOF
    compare_baseline ddp rate samples_per_s run
    report_load ddp "$load_start" $((SECONDS - started))
    if $torch_failed; then
        return 1
    fi
}

# Runs ct's training command (the rest of the arguments) and keeps its last
# line, fmnist_mlp's JSON result, tagged with "run": $1 and, unless $2 is
# empty, "round": $2.
ddp_ct() {
    local tag="\"run\": \"$1\", "
    if [[ -n $2 ]]; then
        tag+="\"round\": $2, "
    fi
    shift 2
    "$@" | tail -n 1 | json_lines "$tag" | tee -a "$tmp"
}

# The ceiling of 2 ranks on this machine: the training command (the rest of
# the arguments, at half the global batch) twice at once, two lone processes
# that communicate nothing. Their samples/s, summed, as one line tagged
# "run": "ct_2procs_nocomm", "round": $1.
ddp_nocomm() {
    nocomm_pair train ct_2procs_nocomm samples_per_s "$@"
}

# nocomm_pair BENCH RUN METRIC ROUND COMMAND...: COMMAND twice at once; the
# two last lines' METRIC summed, as one line of bench BENCH tagged "run":
# RUN, "round": ROUND.
nocomm_pair() {
    local bench=$1 run=$2 metric=$3 round=$4 pid
    shift 4
    local a b
    a=$(mktemp)
    b=$(mktemp)
    "$@" | tail -n 1 >"$a" &
    pid=$!
    "$@" | tail -n 1 >"$b"
    wait "$pid"
    awk -v round="$round" -v bench="$bench" -v run="$run" -v metric="$metric" '
        match($0, "\"" metric "\": [0-9.]+") {
            v = substr($0, RSTART + length(metric) + 4, RLENGTH - length(metric) - 4)
            sum += v; each = each (each ? ", " : "") v
        }
        END {
            printf "{\"bench\": \"%s\", \"run\": \"%s\", \"round\": %s, " \
                "\"impl\": \"ct\", \"processes\": 2, \"%s\": %.1f, " \
                "\"each_%s\": [%s]}\n", bench, run, round, metric, sum, metric, each
        }' "$a" "$b" | json_lines | tee -a "$tmp"
    rm -f "$a" "$b"
}

# ct_ddp's ZeRO stages on 2 ranks of 1 thread (docs/sharding.md), in
# rounds that interleave: fmnist_mlp (the ddp benchmark's recipe and steps)
# under --shard 0..3, two lone processes at half the batch (the ceiling of
# 2 ranks that communicate nothing), PyTorch's DDP, ZeroRedundancyOptimizer
# and FSDP (SHARD_GRAD_OP, FULL_SHARD) on gloo; then gpt (its default
# model, CT_BENCH_GPT_STEPS steps) under --shard 0..3 and its two lone
# processes. The summary (bench/shard_summary.py) sets each run's best
# round beside the others: throughput, scaling efficiency against the
# ceiling, model state per rank against DDP's, each stage against
# PyTorch's nearest, and the targets.
run_shard() {
    local fmnist=$build/examples/fmnist_mlp gpt=$build/examples/gpt
    local ctlaunch=("$build/launcher/ctlaunch" -np 2)
    local steps=1000 warmup=20 gpt_steps=${CT_BENCH_GPT_STEPS:-30} round stage kind
    local ct_steps=(--max-steps $((warmup + steps)) --warmup-steps "$warmup" --metrics "")
    local torch_steps=(--steps "$steps" --warmup-steps "$warmup")
    local gpt_common=(--steps "$gpt_steps" --bench --metrics "" --eval-every 0 --threads 1)
    local torch_failed=false load_start started=$SECONDS
    require_count CT_BENCH_GPT_STEPS "$gpt_steps"
    load_start=$(cut -d' ' -f1-3 /proc/loadavg)
    for ((round = 1; round <= rounds; round++)); do
        echo "ci/bench.sh: shard round $round of $rounds" >&2
        for stage in 0 1 2 3; do
            ct_builds ddp_ct "fm_shard$stage" "$round" "${ctlaunch[@]}" "$fmnist" \
                "${ct_steps[@]}" --threads 1 --shard "$stage" --plan
        done
        nocomm_pair train fm_nocomm samples_per_s "$round" "$fmnist" "${ct_steps[@]}" \
            --threads 1 --batch 32
        for kind in ddp zero1 zero2 fsdp; do
            run_peer ddp_torch.py --ranks 2 --shard "$kind" "${torch_steps[@]}" |
                json_lines "\"run\": \"torch_fm_$kind\", \"round\": $round, " |
                tee -a "$tmp" || torch_failed=true
        done
        for stage in 0 1 2 3; do
            ct_builds ddp_ct "gpt_shard$stage" "$round" "${ctlaunch[@]}" "$gpt" \
                "${gpt_common[@]}" --shard "$stage" --plan
        done
        nocomm_pair gpt gpt_nocomm tokens_per_s "$round" "$gpt" "${gpt_common[@]}" --batch 16
    done
    report_load shard "$load_start" $((SECONDS - started)) | tee -a "$tmp"
    run_summary "$root/bench/shard_summary.py" "$tmp" --anchor-torch "$anchor"
    if $torch_failed; then
        echo "ci/bench.sh: shard: a PyTorch peer failed (above): its figures are missing" >&2
    fi
}

# Checkpoints of a 1 GiB state: 16 float32 tensors of 64 MiB, each sharded
# by rows over the ranks (docs/bench-checkpoint.md). Each round runs, back to
# back, dd's sequential write and read of 1 GiB, ct's save and load on 1 rank
# and on 2 (ctlaunch), torch.save and torch.load of the same tensors, and a
# training loop on 1 rank that saves asynchronously beside a synchronous
# save, in an order that rotates from round to round: the disk's speed, too,
# moves with the host and its other tenants. Before the rounds, a
# single-thread memcpy and XXH3 of 1 GiB measure the machine's own limits.
# Every load reads the disk: the page cache of the files it reads is dropped
# first; a warm load follows. Each run's files are removed after it, then
# `sync` (untimed) lets the file system finish the removal (with the discard
# mount option, the freed blocks' discards) before the next timed write. At
# most 2 GiB are on the disk at once (the async loop's newest checkpoint and
# the one it replaces). The summary sets each run's best round beside the
# others and checks the targets.
run_checkpoint() {
    local bench=$build/bench/bench_checkpoint
    local ctlaunch=("$build/launcher/ctlaunch" -np 2)
    local parent=${CT_BENCH_CKPT_DIR:-$build/ckpt-bench}
    local bytes=$((1 << 30)) tensors=16
    local state=(--bytes "$bytes" --tensors "$tensors")
    local torch_failed=false started=$SECONDS load_start round free_k fs
    mkdir -p "$parent"
    ckpt_dir=$(mktemp -d "$parent/run.XXXXXX")
    # 2 GiB at most at once, and room to spare for the rest of the disk's
    # users.
    free_k=$(df -Pk "$ckpt_dir" | awk 'NR == 2 { print $4 }')
    fs=$(stat -f -c %T "$ckpt_dir")
    echo "ci/bench.sh: checkpoint: in $ckpt_dir ($fs, $((free_k >> 20)) GiB free)" >&2
    if ((free_k < 3 << 20)); then
        echo "ci/bench.sh: checkpoint: fewer than 3 GiB free in $parent; set CT_BENCH_CKPT_DIR" \
            "to a directory with more" >&2
        return 1
    fi
    if [[ $fs == tmpfs ]]; then
        echo "ci/bench.sh: checkpoint: $parent is in memory (tmpfs): the figures are no" \
            "disk's" >&2
    fi
    load_start=$(cut -d' ' -f1-3 /proc/loadavg)
    echo "ci/bench.sh: checkpoint: load average $load_start" >&2
    "$bench" memcpy --bytes "$bytes" | json_lines '"run": "memcpy", ' | tee -a "$tmp"
    # Round r starts at run r of the list, so that no run follows the same
    # one in every round: a write ran slower right after some runs than
    # after others (docs/bench-checkpoint.md, "Rounds").
    local runs=(dd ct_1rank ct_2ranks torch ct_async_1rank) i run
    for ((round = 1; round <= rounds; round++)); do
        echo "ci/bench.sh: checkpoint round $round of $rounds" >&2
        for ((i = 0; i < ${#runs[@]}; i++)); do
            run=${runs[(i + round - 1) % ${#runs[@]}]}
            case $run in
            dd) ckpt_dd "$round" "$bench" "$ckpt_dir/dd.bin" "$bytes" ;;
            ct_1rank) ct_builds ckpt_ct ct_1rank "$round" "$bench" ;;
            ct_2ranks) ct_builds ckpt_ct ct_2ranks "$round" "${ctlaunch[@]}" "$bench" ;;
            torch)
                # checkpoint_torch.py syncs after removing its file, also
                # between the two torches.
                run_peer checkpoint_torch.py --dir "$ckpt_dir" "${state[@]}" |
                    json_lines "\"run\": \"torch\", \"round\": $round, " |
                    tee -a "$tmp" || torch_failed=true
                ;;
            ct_async_1rank)
                "$bench" async --dir "$ckpt_dir" "${state[@]}" |
                    json_lines "\"run\": \"ct_async_1rank\", \"round\": $round, " |
                    tee -a "$tmp"
                sync
                ;;
            esac
        done
    done
    rm -rf "$ckpt_dir"
    ckpt_dir=
    run_summary - "$tmp" "$parent" "$fs" "$anchor" <<'EOF'
"""The checkpoint benchmark's summary, from ci/bench.sh checkpoint's lines."""
import json
import sys

path, where, fs, anchor = sys.argv[1:]
# (run, op, cache): what the table calls it; torch's rows come once for each
# torch measured.
ROWS = [
    (("dd", "write", None), "dd write (64 MiB blocks, conv=fsync)"),
    (("ct_1rank", "save", None), "ct save, 1 rank"),
    (("ct_2ranks", "save", None), "ct save, 2 ranks (ctlaunch)"),
    (("torch", "save", None), "torch.save + fsync"),
    (("dd", "read", "cold"), "dd read, cache dropped"),
    (("ct_1rank", "load", "cold"), "ct load, 1 rank, cache dropped"),
    (("ct_2ranks", "load", "cold"), "ct load, 2 ranks, cache dropped"),
    (("torch", "load", "cold"), "torch.load, cache dropped"),
    (("ct_1rank", "load", "warm"), "ct load, 1 rank, warm"),
    (("ct_2ranks", "load", "warm"), "ct load, 2 ranks, warm"),
    (("torch", "load", "warm"), "torch.load, warm"),
]
NAMES = dict(ROWS)
# (target name or None, run, against, target ratio or None): run's GB/s over
# against's; a target holds when the ratio is at least (or, with ">", above)
# its value. A ratio with torch comes once for each torch measured, its
# target only with the anchor's.
RATIOS = [
    ("ct_save_1rank_vs_dd_write", ("ct_1rank", "save", None), ("dd", "write", None), 0.7),
    ("ct_save_2ranks_vs_dd_write", ("ct_2ranks", "save", None), ("dd", "write", None), 0.7),
    ("ct_load_1rank_vs_dd_read", ("ct_1rank", "load", "cold"), ("dd", "read", "cold"), 0.7),
    ("ct_load_2ranks_vs_dd_read", ("ct_2ranks", "load", "cold"), ("dd", "read", "cold"), 0.7),
    ("ct_save_vs_torch_save", ("ct_1rank", "save", None), ("torch", "save", None), ">1"),
    ("ct_load_vs_torch_load", ("ct_1rank", "load", "cold"), ("torch", "load", "cold"), ">1"),
    (None, ("ct_2ranks", "save", None), ("ct_1rank", "save", None), None),
    (None, ("ct_2ranks", "load", "cold"), ("ct_1rank", "load", "cold"), None),
    (None, ("ct_1rank", "load", "warm"), ("torch", "load", "warm"), None),
]
ASYNC_TARGET = 0.1


def log(text=""):
    print(text, file=sys.stderr)


def emit(record):
    print(json.dumps(dict({"bench": "checkpoint"}, **record)), flush=True)


def held(ratio, target):
    return ratio > 1 if target == ">1" else ratio >= target


def rounds_text(values):
    return " ".join("%.2f" % x for x in values)


def keyed(key, version):
    """A row's key: (run, op, cache, its torch's version, None for ct's and dd's)."""
    return key + (version if key[0] == "torch" else None,)


def name(key):
    return "%s (torch %s)" % (NAMES[key[:3]], key[3]) if key[3] else NAMES[key[:3]]


def torch_field(*keys):
    """{"torch": version} for a record about a torch's run, else {}."""
    return next(({"torch": k[3]} for k in keys if k[3]), {})


gbps, hw, runs_async = {}, {}, {}
with open(path) as f:
    for r in (json.loads(line) for line in f if line.startswith("{")):
        if (r.get("bench") != "checkpoint" or "summary" in r or "run" not in r
                or r.get("build") == "baseline"):
            continue
        if r["run"] == "memcpy":
            hw[r["impl"]] = r["gbps"]
        elif r["op"] == "async":
            runs_async[r["round"]] = r
        else:
            key = keyed((r["run"], r["op"], r.get("cache")), r.get("torch"))
            gbps.setdefault(key, {})[r["round"]] = r["gbps"]
rounds = sorted({n for by in gbps.values() for n in by} | set(runs_async))
best = {key: max(by.values()) for key, by in gbps.items()}
# The anchor first, then every other torch measured.
versions = [anchor] + sorted({k[3] for k in gbps if k[3] and k[3] != anchor})
rows = [keyed(key, v) for key, _ in ROWS for v in (versions if key[0] == "torch" else [None])]
ratios = []
for target_name, run, against, target in RATIOS:
    for v in versions if "torch" in (run[0], against[0]) else [None]:
        judged = v in (None, anchor)
        ratios.append((target_name if judged else None, keyed(run, v), keyed(against, v),
                       target if judged else None))
width = max(len(name(key)) for key in rows)
ratio_width = max(len("%s / %s" % (name(run), name(against))) for _, run, against, _ in ratios)

log("\nsummary: checkpoints of a 1 GiB state (16 float32 tensors of 64 MiB) under %s (%s); "
    "GB/s (10^9 bytes/s of the whole state), the best of the rounds, then each round" % (where, fs))
log("%-*s %8s" % (width, "run", "best") + "".join(" %8s" % ("round %d" % n) for n in rounds))
for key in rows:
    if key not in gbps:
        log("%-*s %8s" % (width, name(key), "-"))
        continue
    log("%-*s %8.3f" % (width, name(key), best[key]) + "".join(
        " %8s" % ("%.3f" % gbps[key][n] if n in gbps[key] else "-") for n in rounds))
    emit(dict({"summary": "gbps", "run": key[0]}, **torch_field(key), op=key[1], cache=key[2],
              best=best[key], rounds=[gbps[key].get(n) for n in rounds]))
if hw:
    log("the machine, 1 thread over 1 GiB: memcpy %.2f GB/s copied, XXH3-64 %.2f GB/s"
        % (hw.get("memcpy", float("nan")), hw.get("xxh3", float("nan"))))
    emit({"summary": "hardware", "memcpy_gbps": hw.get("memcpy"), "xxh3_gbps": hw.get("xxh3")})

targets = []
log("ratios on the best figures [each round's own]:")
for target_name, run, against, target in ratios:
    what = "%s / %s" % (name(run), name(against))
    if run not in best or against not in best:
        log("  %s: not measured" % what)
        if target_name:
            targets.append("target: %s: not measured" % what)
        continue
    ratio = best[run] / best[against]
    by_round = [gbps[run][n] / gbps[against][n] for n in rounds
                if n in gbps[run] and n in gbps[against]]
    log("  %-*s %5.2f [%s]" % (ratio_width, what, ratio, rounds_text(by_round)))
    record = dict({"summary": "ratio", "run": list(run[:3]), "against": list(against[:3])},
                  **torch_field(run, against), ratio=round(ratio, 3),
                  round_ratios=[round(x, 3) for x in by_round])
    if target_name:
        met = held(ratio, target)
        bar = "> 1" if target == ">1" else ">= %g" % target
        targets.append("target: %s %s: %s (ratio %.2f; per round %s; met in %d of %d rounds)"
                       % (what, bar, "met" if met else "missed", ratio, rounds_text(by_round),
                          sum(held(x, target) for x in by_round), len(by_round)))
        record = dict(record, summary="target", target=target_name, target_ratio=target, met=met,
                      rounds=len(by_round), rounds_met=sum(held(x, target) for x in by_round))
    emit(record)

if runs_async:
    a = [runs_async[n] for n in rounds if n in runs_async]
    blocked, sync = min(r["blocked_ms"] for r in a), min(r["sync_save_ms"] for r in a)
    by_round = [r["blocked_ms"] / r["sync_save_ms"] for r in a]
    ratio = blocked / sync

    def each(field, form="%.0f"):
        return " ".join(form % r[field] for r in a)

    log("async save, 1 rank, a %dx%d matmul per step; per round: a step took %s ms alone and "
        "%s ms with saves in flight; a save every %s steps; ct_checkpointer_save blocked %s ms "
        "(the longest call; the first: %s ms); a synchronous save took %s ms; "
        "before a save the loop waited %s ms for the one before; the last save drained %s ms "
        "after the loop"
        % (a[0]["matmul"], a[0]["matmul"], each("step_ms_idle", "%.1f"),
           each("step_ms_loop", "%.1f"), each("every", "%d"), each("blocked_ms"),
           each("blocked_first_ms"), each("sync_save_ms"), each("waited_ms"), each("drain_ms")))
    staging_ok = not any(r["staging_grew"] for r in a)
    rss_ok = not any(r["rss_grew"] for r in a)
    log("async save: staging %s across saves (%s bytes); RSS after the second save, then at "
        "the end: %s"
        % ("constant" if staging_ok else "GREW", "/".join(
            str(x) for x in sorted({s for r in a for s in r["staging_bytes"]})),
           "; ".join("%.0f -> %.0f MiB" % (r["rss_bytes"][1] / 2**20, r["rss_bytes_end"] / 2**20)
                     for r in a)) + ("" if rss_ok else " (GREW)"))
    met = ratio < ASYNC_TARGET
    targets.append("target: async save blocking < %g x synchronous save: %s (ratio %.3f; per "
                   "round %s; met in %d of %d rounds)"
                   % (ASYNC_TARGET, "met" if met else "missed", ratio,
                      " ".join("%.3f" % x for x in by_round),
                      sum(x < ASYNC_TARGET for x in by_round), len(by_round)))
    emit({"summary": "async", "blocked_ms": [r["blocked_ms"] for r in a],
          "blocked_first_ms": [r["blocked_first_ms"] for r in a],
          "sync_save_ms": [r["sync_save_ms"] for r in a],
          "waited_ms": [r["waited_ms"] for r in a],
          "drain_ms": [r["drain_ms"] for r in a], "staging_constant": staging_ok,
          "rss_constant": rss_ok,
          "rss_growth_after_save2": [r["rss_growth_after_save2"] for r in a]})
    emit({"summary": "target", "target": "async_blocked_vs_sync", "ratio": round(ratio, 4),
          "round_ratios": [round(x, 4) for x in by_round], "target_ratio": ASYNC_TARGET,
          "met": met, "rounds": len(by_round),
          "rounds_met": sum(x < ASYNC_TARGET for x in by_round)})
else:
    targets.append("target: async save blocking < %g x synchronous save: not measured"
                   % ASYNC_TARGET)

for line in targets:
    log(line)
EOF
    compare_baseline checkpoint rate gbps run op cache
    report_load checkpoint "$load_start" $((SECONDS - started))
    if $torch_failed; then
        return 1
    fi
}

# Runs ct's save of run_checkpoint's $state, then its load (cold, then warm)
# of the checkpoint the save made, with the command in the rest of the
# arguments (bench_checkpoint, maybe under ctlaunch); tags the lines with
# "run": $1, "round": $2, and removes the checkpoint.
ckpt_ct() {
    local tag="\"run\": \"$1\", \"round\": $2, "
    shift 2
    "$@" save --dir "$ckpt_dir" "${state[@]}" | json_lines "$tag" | tee -a "$tmp"
    "$@" load --dir "$ckpt_dir" "${state[@]}" | json_lines "$tag" | tee -a "$tmp"
    rm -rf "$ckpt_dir/ct"
    sync
}

# dd's sequential write of $4 bytes to the file $3 in 64 MiB blocks,
# conv=fsync (the data on the disk when it returns, as after a ct save), and
# its read back with the file's page cache dropped first (by $2, i.e.
# bench_checkpoint drop), as JSON lines tagged "run": "dd", "round": $1. The
# timing is taken here, since dd's own report changes with its locale and
# version; it includes starting dd, about a millisecond.
ckpt_dd() {
    local round=$1 bench=$2 file=$3 bytes=$4 t0 t1 cached
    t0=$(date +%s%N)
    dd if=/dev/zero of="$file" bs=64M count=$((bytes >> 26)) conv=fsync status=none
    t1=$(date +%s%N)
    dd_line "$round" write "" "" "$bytes" $((t1 - t0))
    cached=$("$bench" drop "$file")
    t0=$(date +%s%N)
    dd if="$file" of=/dev/null bs=64M status=none
    t1=$(date +%s%N)
    dd_line "$round" read cold "$cached" "$bytes" $((t1 - t0))
    rm -f "$file"
    sync
}

# One dd JSON line: round, op, cache and the share cached (or empty), bytes,
# nanoseconds.
dd_line() {
    awk -v round="$1" -v op="$2" -v cache="$3" -v cached="$4" -v bytes="$5" -v ns="$6" 'BEGIN {
        printf "{\"bench\": \"checkpoint\", \"run\": \"dd\", \"round\": %d, \"impl\": \"dd\", " \
            "\"op\": \"%s\", ", round, op
        if (cache != "")
            printf "\"cache\": \"%s\", \"cached_share\": %s, ", cache, cached
        printf "\"ranks\": 1, \"bytes\": %.0f, \"seconds\": %.4f, \"gbps\": %.4f}\n", bytes,
            ns / 1e9, bytes / ns
    }' | tee -a "$tmp"
}

# RPC round trips on 2 workers (ctlaunch), beside the same round trips
# through a plain zmq socket pair in the same program (bench/rpc.c), then
# torch.distributed.rpc's (bench/rpc_torch.py: TensorPipe with its own
# choice of transport on one host, then with TCP only, the path ct and zmq
# take), in CT_BENCH_ROUNDS rounds; the summary takes each figure's best
# round, sets ct beside torch per size (round-trip time and bandwidth,
# ct / torch, on the best figures and round by round) and checks ct's
# targets (docs/rpc-design.md, "First figures").
run_rpc() {
    local torch_failed=false round transport
    # rpc_torch.py skips itself (exit 0) without torch.distributed.rpc, and
    # exits 1 when a run fails, which fails the run after the summary.
    for ((round = 1; round <= rounds; round++)); do
        echo "ci/bench.sh: rpc round $round of $rounds" >&2
        ct_builds rpc_ct "$round" "$build/launcher/ctlaunch" -np 2 "$build/bench/bench_rpc"
        for transport in default tcp; do
            run_peer rpc_torch.py --transport "$transport" |
                json_lines "\"round\": $round, " | tee -a "$tmp" || torch_failed=true
        done
    done
    run_summary - "$tmp" "$anchor" <<'EOF'
"""The RPC benchmark's summary, from ci/bench.sh rpc's lines."""
import json
import sys

# What the ratios set ct against: torch as it runs by default, and over TCP,
# each under every torch measured.
PEERS = ["torch", "torch_tcp"]

path, anchor = sys.argv[1:]
# (impl, its torch's version or None, bytes) -> {round: the line}
runs = {}
skipped = set()
for line in open(path):
    r = json.loads(line)
    if r.get("bench") != "rpc" or "summary" in r or r.get("build") == "baseline":
        continue
    if "skipped" in r:
        skipped.add((r["impl"], r["skipped"]))
    elif "us" in r:
        runs.setdefault((r["impl"], r.get("torch"), r["bytes"]), {})[r.get("round", 1)] = r
best = {key: min(by.values(), key=lambda r: r["us"]) for key, by in runs.items()}
rounds = sorted({n for by in runs.values() for n in by})
sizes = sorted({k[2] for k in best})
# The anchor first, then every other torch measured.
versions = [anchor] + sorted({k[1] for k in best if k[1] and k[1] != anchor})
who_all = [("ct", None), ("zmq", None)] + [(peer, v) for v in versions for peer in PEERS]


def log(s):
    print(s, file=sys.stderr)


def emit(d):
    print(json.dumps(dict({"bench": "rpc"}, **d)), flush=True)


def torch_field(version):
    return {"torch": version} if version else {}


def cell(who, b, field, form):
    r = best.get(who + (b,))
    return form % r[field] if r else "-"


def table(who):
    """A row per size: each of who's round trip, then its bandwidth."""
    columns = [(w, "us", "%.1f", w[0] + " us") for w in who] + [
        (w, "gbps", "%.3f", w[0] + " GB/s") for w in who]
    log("%-10s" % "bytes" + "".join(" %*s" % (max(9, len(h)), h) for _, _, _, h in columns))
    for b in sizes:
        log("%-10d" % b + "".join(" %*s" % (max(9, len(h)), cell(w, b, f, form))
                                  for w, f, form, h in columns))


log("summary: round trips between 2 workers on loopback, the best of the rounds; torch is "
    "torch.distributed.rpc (TensorPipe), torch_tcp the same over TCP only; first with torch %s "
    "(the anchor)" % anchor)
table([("ct", None), ("zmq", None)] + [(peer, anchor) for peer in PEERS])
for v in versions[1:]:
    log("with torch %s:" % v)
    table([(peer, v) for peer in PEERS])
for b in sizes:
    for w in who_all:
        if w + (b,) in best:
            emit(dict({"summary": "round_trip", "impl": w[0]}, **torch_field(w[1]), bytes=b,
                      us=best[w + (b,)]["us"], gbps=best[w + (b,)]["gbps"],
                      round_us=[runs[w + (b,)][n]["us"] if n in runs[w + (b,)] else None
                                for n in rounds]))
for impl, reason in sorted(skipped):
    log("%s: skipped: %s" % (impl, reason))

# Time over time: above 1, ct's round trip is the slower. Bandwidth over
# bandwidth (the same bytes): above 1, ct moves them faster.
log("ct / torch on the best figures [each round's own]: round-trip time, then bandwidth")
width = max(len(("%s %s" % w).strip()) for w in who_all)
for peer, v in who_all[2:]:
    label = ("%s %s" % (peer, v)).strip()
    if not any(k[:2] == (peer, v) for k in best):
        log("  ct / %s: not measured" % label)
        continue
    for b in sizes:
        if ("ct", None, b) not in best or (peer, v, b) not in best:
            log("  ct / %s, %d bytes: not measured" % (label, b))
            continue
        mine, theirs = runs[("ct", None, b)], runs[(peer, v, b)]
        c, t = best[("ct", None, b)], best[(peer, v, b)]
        both = [n for n in rounds if n in mine and n in theirs]
        us_ratio = c["us"] / t["us"]
        by_round = [mine[n]["us"] / theirs[n]["us"] for n in both]
        record = dict({"summary": "ratio", "run": "ct", "against": peer}, **torch_field(v),
                      bytes=b, us_ratio=round(us_ratio, 3),
                      round_us_ratios=[round(x, 3) for x in by_round])
        line = "  ct / %-*s %10d bytes: time %5.2f [%s]" % (
            width, label, b, us_ratio, " ".join("%.2f" % x for x in by_round))
        if b:
            gbps_ratio = c["gbps"] / t["gbps"]
            gbps_by_round = [mine[n]["gbps"] / theirs[n]["gbps"] for n in both]
            record.update(gbps_ratio=round(gbps_ratio, 3),
                          round_gbps_ratios=[round(x, 3) for x in gbps_by_round])
            line += ", bandwidth %5.2f [%s]" % (
                gbps_ratio, " ".join("%.2f" % x for x in gbps_by_round))
        log(line)
        emit(record)

if ("ct", None, 0) in best and ("zmq", None, 0) in best:
    empty = best[("ct", None, 0)]["us"]
    met = empty < 50
    log("target: ct empty-call round trip < 50 us: %s (%.1f us; plain zmq %.1f us)"
        % ("met" if met else "missed", empty, best[("zmq", None, 0)]["us"]))
    emit({"summary": "target", "target": "empty_call_us", "us": empty, "target_us": 50,
          "met": met})
else:
    log("target: ct empty-call round trip < 50 us: not measured")
big = max((k[2] for k in best if k[0] == "ct"), default=None)
if big and ("zmq", None, big) in best:
    ratio = best[("ct", None, big)]["gbps"] / best[("zmq", None, big)]["gbps"]
    log("target: ct %d-byte echo >= 0.5 x plain zmq's bandwidth: %s (ratio %.2f)"
        % (big, "met" if ratio >= 0.5 else "missed", ratio))
    emit({"summary": "target", "target": "large_tensor_vs_zmq", "bytes": big,
          "ratio": round(ratio, 3), "target_ratio": 0.5, "met": ratio >= 0.5})
else:
    log("target: ct's largest echo >= 0.5 x plain zmq's bandwidth: not measured")
EOF
    compare_baseline rpc time us op bytes
    if $torch_failed; then
        return 1
    fi
}

# One round's ct side of run_rpc: the command in the rest of the arguments
# (bench_rpc under ctlaunch), rank 0's JSON lines tagged with "round": $1.
rpc_ct() {
    local tag="\"round\": $1, "
    shift
    "$@" 2>&1 | grep '^\[rank 0\] {' | json_lines "$tag" | tee -a "$tmp"
}

# ct on cuda:0 (bench/cuda.c: elementwise bandwidth beside cudaMemcpy,
# matmul beside cuBLAS, and the targets' verdicts), fmnist_mlp's training
# throughput with --device cuda, then bench/cuda_torch.py's same figures and
# ct / torch. Without CUDA in the build, or a device, one line says why it
# was skipped.
run_cuda() {
    local quick=()
    if [[ ${CT_BENCH_QUICK:-0} == 1 ]]; then
        quick=(--quick)
    fi
    if ! $have_cuda; then
        echo '{"bench": "cuda", "skipped": "ct was built without CUDA (no CUDA Toolkit found)"}'
        return 0
    fi
    "$build/bench/bench_cuda" "${quick[@]}" | tee "$tmp"
    if grep -q '"skipped"' "$tmp"; then
        return 0
    fi
    # fmnist_mlp prints its progress too; its last line is the JSON result.
    if "$build/examples/fmnist_mlp" --help 2>&1 | grep -- '--device' >/dev/null; then
        "$build/examples/fmnist_mlp" --device cuda --epochs "$epochs" --metrics "" |
            tail -n 1 | tee -a "$tmp"
    else
        echo '{"bench": "cuda", "op": "fmnist_mlp", "skipped": "examples/fmnist_mlp has no' \
            '--device flag yet"}'
    fi
    run_peer cuda_torch.py "${quick[@]}" --compare "$tmp"
}

# One round's run of examples/gpt: the command in the rest of the arguments
# (gpt, maybe under ctlaunch), its JSON result (rank 0's) tagged with
# "round": $1; its progress on stderr is dropped.
gpt_ct() {
    local tag="\"round\": $1, "
    shift
    "$@" 2>/dev/null | grep '"bench": "gpt"' | json_lines "$tag" | tee -a "$tmp"
}

# examples/gpt beside its PyTorch reference (docs/gpt.md, "Benchmarks"):
# training throughput of the default model, the best of the rounds; peak
# memory; parity over 200 steps; and, with CT_BENCH_GPT_TIME, the race of
# the two recipes given the same wall time, charted.
run_gpt() {
    local gpt=$build/examples/gpt steps=${CT_BENCH_GPT_STEPS:-30} round threads flag
    local common=(--steps "$steps" --bench --metrics "" --eval-every 0) race_dir=
    require_count CT_BENCH_GPT_STEPS "$steps"
    for ((round = 1; round <= rounds; round++)); do
        echo "ci/bench.sh: gpt round $round of $rounds" >&2
        for threads in 1 2; do
            ct_builds gpt_ct "$round" "$gpt" "${common[@]}" --threads "$threads"
            run_peer gpt_torch.py "${common[@]}" --threads "$threads" |
                json_lines "\"round\": $round, " | tee -a "$tmp"
        done
        ct_builds gpt_ct "$round" "$build/launcher/ctlaunch" -np 2 "$gpt" "${common[@]}" \
            --threads 1
    done
    for flag in --bench --checkpoint-activations; do
        "$gpt" --steps 5 --bench --metrics "" --threads 1 "$flag" 2>/dev/null | tail -n 1 |
            json_lines '"run": "memory", ' | tee -a "$tmp"
    done
    # A parity failure (1), under either torch, is reported by its own line
    # and fails the run at the end; without the corpus it exits 77.
    local parity=0
    run_peer gpt_parity.py --gpt "$gpt" --steps 200 | tee -a "$tmp" || parity=$?
    if [[ -n ${CT_BENCH_GPT_TIME:-} ]]; then
        require_count CT_BENCH_GPT_TIME "$CT_BENCH_GPT_TIME"
        race_dir=$build/gpt-race
        mkdir -p "$race_dir"
        echo "ci/bench.sh: gpt race: each recipe gets $CT_BENCH_GPT_TIME s on $(nproc) cores;" \
            "metrics, charts and ct's sample in $race_dir" >&2
        "$gpt" --time "$CT_BENCH_GPT_TIME" --metrics "$race_dir/ct.jsonl" \
            --plot "$race_dir/ct.png" >"$race_dir/ct.out" 2>/dev/null
        tail -n 1 "$race_dir/ct.out" | json_lines '"run": "race", ' | tee -a "$tmp"
        run_peer gpt_torch.py --time "$CT_BENCH_GPT_TIME" --threads "$(nproc)" \
            --metrics "$race_dir/torch-@torch@.jsonl" | json_lines '"run": "race", ' |
            tee -a "$tmp"
    fi
    run_summary - "$tmp" "$race_dir" "$build/examples/ctplot" "$anchor" <<'EOF'
import json, os, subprocess, sys
path, race_dir, ctplot, anchor = sys.argv[1:]
# The baseline's runs are set beside the current ones by compare_baseline alone.
lines = [json.loads(l) for l in open(path) if l.startswith("{")]
gpt = [r for r in lines if r.get("bench") == "gpt" and "tokens_per_s" in r
       and r.get("build") != "baseline"]
# The anchor first, then every other torch measured; ct's lines have no "torch".
versions = [anchor] + sorted({r["torch"] for r in gpt if r.get("torch") not in (None, anchor)})
def by_round(impl, threads, ranks=1, run=None, torch=None):
    return {r["round"]: r["tokens_per_s"] for r in gpt if r["impl"] == impl
            and r.get("torch") == torch and r["threads"] == threads and r["ranks"] == ranks
            and r.get("run") == run}
def best(impl, threads, ranks=1, run=None, torch=None):
    rates = by_round(impl, threads, ranks, run, torch)
    return max(rates.values()) if rates else None
for threads in (1, 2):
    for v in versions:
        ct, torch = best("ct", threads), best("torch", threads, torch=v)
        if not (ct and torch):
            continue
        # The ratio of the best figures, as the other benchmarks report, and
        # each round's own: the two ran one after the other in a round.
        a, b = by_round("ct", threads), by_round("torch", threads, torch=v)
        rounds = [a[n] / b[n] for n in sorted(a) if n in b]
        out = {"bench": "gpt", "summary": "throughput", "threads": threads, "torch": v,
               "ct_tokens_per_s": ct, "torch_tokens_per_s": torch, "ratio": round(ct / torch, 3),
               "round_ratios": [round(x, 3) for x in rounds]}
        if threads == 1 and v == anchor:
            out.update(target=1.5, met=ct / torch >= 1.5,
                       rounds_met=sum(x >= 1.5 for x in rounds))
        print(json.dumps(out))
        print("gpt: %d thread(s): ct %.0f tokens/s, torch %s %.0f: %.2fx [%s]"
              % (threads, ct, v, torch, ct / torch, " ".join("%.2f" % x for x in rounds)),
              file=sys.stderr)
one, two = best("ct", 1), best("ct", 1, 2)
if one and two:
    print(json.dumps({"bench": "gpt", "summary": "ranks", "ct_1rank_tokens_per_s": one,
                      "ct_2ranks_tokens_per_s": two, "scaling": round(two / one, 3)}))
mem = {r["checkpoint"]: r["peak_bytes"] for r in gpt if r.get("run") == "memory"}
if len(mem) == 2:
    print(json.dumps({"bench": "gpt", "summary": "memory", "peak_bytes": mem[False],
                      "peak_bytes_checkpointed": mem[True],
                      "saved": round(1 - mem[True] / mem[False], 3)}))
# (impl, torch) -> the race's line; the met verdict is the anchor's.
race = {(r["impl"], r.get("torch")): r for r in gpt if r.get("run") == "race"}
ct = race.get(("ct", None))
for v in versions:
    torch = race.get(("torch", v))
    if ct and torch:
        out = {"bench": "gpt", "summary": "race", "torch": v, "seconds": ct["train_s"],
               "ct_val_loss": ct["val_loss"], "torch_val_loss": torch["val_loss"],
               "ct_steps": ct["steps"], "torch_steps": torch["steps"]}
        if v == anchor:
            out["met"] = ct["val_loss"] < torch["val_loss"]
        print(json.dumps(out))
if ct and len(race) > 1:
    # Every run on one chart, each field named after its implementation, as
    # its metrics file is.
    with open(os.path.join(race_dir, "race.jsonl"), "w") as out:
        for impl, v in race:
            name = "torch-" + v if v else impl
            for l in open(os.path.join(race_dir, name + ".jsonl")):
                r = json.loads(l)
                out.write(json.dumps({k if k == "time_s" else name + "_" + k: x
                                      for k, x in r.items()}) + "\n")
    subprocess.run([ctplot, os.path.join(race_dir, "race.jsonl"), "-o",
                    os.path.join(race_dir, "race.png"), "--x", "time_s", "--title",
                    "ct and PyTorch given the same wall time"], check=False)
EOF
    compare_baseline gpt rate tokens_per_s threads ranks
    if ((parity == 1)); then
        echo "ci/bench.sh: gpt: parity with PyTorch failed (see the gpt_parity lines)" >&2
        return 1
    fi
}

# Two hosts of the test cluster (ci/cluster.sh), 2 ranks each, over veth as
# it is and shaped to 10 Gbit/s with 50 us each way (rate alone where the
# kernel has no netem): bench/multinode.sh's allreduce sweeps of ct's flat
# gloo, ct's hierarchical communicator, ct's mpi backend, Open MPI's
# MPI_Allreduce and torch's gloo, in CT_BENCH_ROUNDS rounds each, then
# bench/multinode.py's summary and targets (docs/multinode.md). Skipped,
# with a note, where the cluster cannot be made (not root, a container).
run_multinode() {
    local shape rc args
    for shape in veth 10gbit-50us; do
        args=()
        [[ $shape == veth ]] || args=(--rate 10gbit --delay 50us)
        rc=0
        "$root/ci/cluster.sh" run --hosts 2 "${args[@]}" --timeout 3600 -- bash \
            "$root/bench/multinode.sh" "$build" "$rounds" "$shape" 0.1 "${torch_pythons[@]}" |
            tee -a "$tmp" || rc=$?
        if ((rc == 77)) && [[ $shape != veth ]]; then
            echo "ci/bench.sh: multinode: no netem here; the shaped link is 10 Gbit/s without" \
                "the delay" >&2
            shape=10gbit
            rc=0
            "$root/ci/cluster.sh" run --hosts 2 --rate 10gbit --timeout 3600 -- bash \
                "$root/bench/multinode.sh" "$build" "$rounds" "$shape" 0.1 \
                "${torch_pythons[@]}" | tee -a "$tmp" || rc=$?
        fi
        if ((rc == 77)); then
            echo "ci/bench.sh: multinode: the test cluster cannot be made here; skipped" >&2
            return 0
        fi
        if ((rc)); then
            echo "ci/bench.sh: multinode: a sweep failed ($shape, status $rc)" >&2
        fi
    done
    run_summary "$root/bench/multinode.py" "$tmp" --anchor-torch "$anchor" \
        --link-gbit 10gbit-50us=10 --link-gbit 10gbit=10
}

tmp=$(mktemp)
# run_checkpoint's directory holds files of a GiB each: gone however the run
# ends.
ckpt_dir=
trap 'rm -f "$tmp"; if [[ -n $ckpt_dir ]]; then rm -rf "$ckpt_dir"; fi' EXIT
for name in "${names[@]}"; do
    # Each summary reads its own benchmark's lines alone: ddp's would fail
    # on checkpoint's, which have a "run" and a "round" too.
    : >"$tmp"
    "run_$name"
done
