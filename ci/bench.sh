#!/usr/bin/env bash
# Builds ct's benchmarks (Release, in build-bench/) and runs them with their
# peers in the same run.
#
#   ci/bench.sh [NAME...]     NAME: ops; with none, every benchmark
#
# stdout: one JSON object per result. stderr: build output, notes, and a
# ratio line per comparison. CT_BENCH_THREADS (default "1,2") lists the thread
# counts; PYTHON (default /usr/bin/python3, Debian's, with python3-torch)
# runs the PyTorch peers; CT_BENCH_BUILD_DIR moves the build.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# OpenBLAS's own threads, used by the direct cblas_sgemm peer, busy-wait for
# about 2^28 cycles after each call by default. Interleaved with ct's runs
# they would take a core from ct's pool; with 2^4 they sleep at once.
export OPENBLAS_THREAD_TIMEOUT=${OPENBLAS_THREAD_TIMEOUT:-4}
build=${CT_BENCH_BUILD_DIR:-$root/build-bench}
python=${PYTHON:-/usr/bin/python3}
all=(ops)

usage() {
    sed -n '2,11s/^# \{0,1\}//p' "$0"
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

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCT_BUILD_BENCH=ON \
    -DCT_BUILD_TESTS=OFF -DCT_BUILD_EXAMPLES=OFF >&2
targets=()
for name in "${names[@]}"; do
    targets+=("bench_$name")
done
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >&2

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for name in "${names[@]}"; do
    "$build/bench/bench_$name" | tee "$tmp"
    peer=$root/bench/${name}_torch.py
    if [[ -f $peer ]]; then
        if [[ -x $python ]]; then
            "$python" "$peer" --compare "$tmp"
        else
            echo "ci/bench.sh: $python not found; skipping $peer" >&2
        fi
    fi
done
