#!/usr/bin/env bash
# Builds ct's benchmarks (Release, in build-bench/) and runs them with their
# peers in the same run.
#
#   ci/bench.sh [NAME...]     NAME: ops, train, collectives; with none, every
#                             benchmark
#
# stdout: one JSON object per result. stderr: build output, notes, and a
# ratio line per comparison. CT_BENCH_THREADS (default "1,2") lists the thread
# counts for ops (train runs at 1 thread); CT_BENCH_EPOCHS (default 1) sets
# train's epochs: 1 measures throughput, 10 compares test accuracy (see
# docs/bench-train.md); collectives runs 2 ranks under ctlaunch, and under
# mpirun when Open MPI is built, its allreduce in CT_BENCH_ROUNDS (default 3)
# rounds that interleave ct, Open MPI and gloo (docs/bench-collectives.md);
# PYTHON (default /usr/bin/python3, Debian's, with python3-torch) runs the
# PyTorch peers; CT_BENCH_BUILD_DIR moves the build.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# OpenBLAS's own threads, used by the direct cblas_sgemm peer, busy-wait for
# about 2^28 cycles after each call by default. Interleaved with ct's runs
# they would take a core from ct's pool; with 2^4 they sleep at once.
export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-4}
build=${CT_BENCH_BUILD_DIR:-$root/build-bench}
python=${PYTHON:-/usr/bin/python3}
epochs=${CT_BENCH_EPOCHS:-1}
rounds=${CT_BENCH_ROUNDS:-3}
all=(ops train collectives)

usage() {
    sed -n '2,17s/^# \{0,1\}//p' "$0"
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

# Examples are built too: ct's side of the training benchmark is the main
# job itself, examples/fmnist_mlp.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCT_BUILD_BENCH=ON \
    -DCT_BUILD_TESTS=OFF -DCT_BUILD_EXAMPLES=ON >&2
targets=()
have_mpi=false
for name in "${names[@]}"; do
    case $name in
    train) targets+=(bench_train_floor fmnist_mlp bench_autograd) ;;
    collectives)
        targets+=(bench_collectives ctlaunch)
        # The Open MPI peer exists only when the build found MPI, and ct's
        # mpi backend with it.
        if [[ $(cmake --build "$build" --target help) == *bench_mpi_allreduce* ]] &&
            command -v mpirun >/dev/null; then
            have_mpi=true
            targets+=(bench_mpi_allreduce)
        fi
        ;;
    *) targets+=("bench_$name") ;;
    esac
done
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >&2

# Runs the PyTorch peer bench/$1 with the remaining arguments.
run_peer() {
    local peer=$root/bench/$1
    shift
    if [[ -x $python ]]; then
        "$python" "$peer" "$@"
    else
        echo "ci/bench.sh: $python not found; skipping $peer" >&2
    fi
}

run_ops() {
    "$build/bench/bench_ops" | tee "$tmp"
    run_peer ops_torch.py --compare "$tmp"
}

# The fmnist_mlp recipe at one thread, whatever CT_BENCH_THREADS says: the
# hand-written floor, ct, then PyTorch, which sets both beside its own figure.
run_train() {
    OPENBLAS_NUM_THREADS=1 "$build/bench/bench_train_floor" --epochs "$epochs" | tee "$tmp"
    # fmnist_mlp prints its progress and per-epoch accuracy too; its last
    # line is the JSON result.
    "$build/examples/fmnist_mlp" --epochs "$epochs" --threads 1 --metrics "" |
        tail -n 1 | tee -a "$tmp"
    "$build/bench/bench_autograd" | tee -a "$tmp"
    run_peer train_torch.py --epochs "$epochs" --compare "$tmp"
    run_peer autograd_torch.py --compare "$tmp"
}

# Takes ctlaunch's "[rank 0] " prefix off the JSON lines and, with an
# argument, tags them with "round": $1.
coll_lines() {
    local tag=
    if (($# > 0)); then
        tag="s/^{\"bench\": \"collectives\", /&\"round\": $1, /"
    fi
    sed -u -e 's/^\[rank 0\] //' -e "$tag"
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
# compared with no peer, run once after the rounds. Neither launcher binds
# ranks to cores: ctlaunch does not, and mpirun is told not to, so that both
# get the same scheduling.
run_collectives() {
    local bench=$build/bench/bench_collectives
    local ctlaunch=("$build/launcher/ctlaunch" -np 2)
    local mpirun=(mpirun -np 2 --oversubscribe --bind-to none -x CT_NUM_THREADS=1)
    local sizes=(-b 8 -e 64M -f 2)
    local round_sweep=("${sizes[@]}" --seconds 0.1)
    local others=(--ops "broadcast,allgather,reduce_scatter" -b 8 -e 64M -f 4)
    local gloo_failed=false round
    if (($(id -u) == 0)); then
        mpirun+=(--allow-run-as-root)
    fi
    if ! $have_mpi; then
        echo "ci/bench.sh: no MPI in this build (or no mpirun); skipping ct's mpi backend" \
            "and the Open MPI peer" >&2
    fi
    "$bench" --memcpy -e 64M | tee "$tmp"
    for ((round = 1; round <= rounds; round++)); do
        echo "ci/bench.sh: allreduce round $round of $rounds" >&2
        "${ctlaunch[@]}" "$bench" --ops allreduce "${round_sweep[@]}" |
            coll_lines "$round" | tee -a "$tmp"
        if $have_mpi; then
            "${mpirun[@]}" "$build/bench/bench_mpi_allreduce" "${round_sweep[@]}" |
                coll_lines "$round" | tee -a "$tmp"
        fi
        # A failed gloo sweep fails the run, after the summary of the rest.
        run_peer collectives_gloo.py "${round_sweep[@]}" | coll_lines "$round" |
            tee -a "$tmp" || gloo_failed=true
    done
    "${ctlaunch[@]}" "$bench" "${others[@]}" | coll_lines | tee -a "$tmp"
    if $have_mpi; then
        "${mpirun[@]}" -x CT_BACKEND=mpi "$bench" --ops allreduce "${sizes[@]}" |
            coll_lines | tee -a "$tmp"
        "${mpirun[@]}" -x CT_BACKEND=mpi "$bench" "${others[@]}" | coll_lines | tee -a "$tmp"
    fi
    run_peer collectives_gloo.py --compare "$tmp"
    if $gloo_failed; then
        return 1
    fi
}

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for name in "${names[@]}"; do
    "run_$name"
done
