#!/usr/bin/env bash
# Builds ct's libFuzzer targets and runs each for a bounded time: a check
# that the parsers of files ct reads from anywhere survive hostile input.
#
#   bash ci/fuzz.sh [SECONDS]
#
# Every target listed in tests/fuzz/CMakeLists.txt (NAME, built from
# tests/fuzz/NAME.c) runs for SECONDS (default: $CT_FUZZ_SECONDS, else 60) on
# a copy of its seed corpus, tests/fuzz/corpus/<NAME without "fuzz_">/, with
# tests/fuzz/NAME.dict as its dictionary when there is one. The build is a
# separate directory, configured with clang and -DCT_FUZZ=ON (coverage
# instrumentation, ASan and UBSan). A crash, a leak, undefined behaviour, a
# timeout or running out of memory is a finding: the script fails and prints
# where the input that triggers it is and how to replay it. The inputs that
# found new coverage are dropped with the copy; the seeds stay as committed.
#
# Environment:
#   FUZZ_BUILD_DIR    build directory (default: build-fuzz)
#   CC                the clang to build with (default: clang)
#   CXX               the clang++ to link with (default: clang++)
#   CT_FUZZ_SECONDS   seconds per target when no argument is given
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS

step() { printf '\n==> [%3ds] %s\n' $((SECONDS - t0)) "$*"; }

seconds=${1:-${CT_FUZZ_SECONDS:-60}}
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds < 1)); then
    echo "ci/fuzz.sh: SECONDS must be a positive whole number (got '$seconds')" >&2
    exit 2
fi
build_dir=${FUZZ_BUILD_DIR:-build-fuzz}
cc=${CC:-clang}
# The gloo shim is C++, so the fuzzers link with the C++ driver: it must be
# clang's too, since only clang knows -fsanitize=fuzzer.
cxx=${CXX:-clang++}

# CMake reads the compiler only when it first configures a build directory.
fresh=()
if [[ -f $build_dir/CMakeCache.txt ]]; then
    for pair in "C:$cc" "CXX:$cxx"; do
        lang=${pair%%:*}
        cached=$(sed -n "s/^CMAKE_${lang}_COMPILER:[A-Z]*=//p" "$build_dir/CMakeCache.txt")
        wanted=$(command -v "${pair#*:}" || true)
        if [[ -z $wanted || $(realpath -m "$cached") != $(realpath -m "$wanted") ]]; then
            echo "ci/fuzz.sh: $build_dir was configured with ${cached:-no $lang compiler}; configuring afresh for ${pair#*:}"
            fresh=(--fresh)
        fi
    done
fi

step "configure $build_dir (CC=$cc, CXX=$cxx, CT_FUZZ=ON)"
cmake -S . -B "$build_dir" "${fresh[@]}" \
    -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCT_FUZZ=ON \
    -DCT_SANITIZE= \
    -DCT_BUILD_TESTS=ON \
    -DCT_BUILD_EXAMPLES=OFF \
    -DCT_BUILD_BENCH=OFF

list=$build_dir/tests/fuzz/targets.txt
mapfile -t targets < <(grep -v '^$' "$list")
if ((${#targets[@]} == 0)); then
    echo "ci/fuzz.sh: $list lists no fuzz targets" >&2
    exit 1
fi

step "build ${targets[*]} with $(nproc) jobs"
cmake --build "$build_dir" --parallel "$(nproc)" --target "${targets[@]}"

# libFuzzer reports leaks itself; UBSan's reports need a stack to act on.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# As in ci/test.sh: the sanitizers of LLVM 14 fail to start on kernels with
# more than 28 bits of mmap randomisation; run without it where allowed.
run=()
rnd_bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)
if ((rnd_bits > 28)); then
    if setarch "$(uname -m)" -R true 2>/dev/null; then
        echo "ci/fuzz.sh: vm.mmap_rnd_bits is $rnd_bits; running under setarch -R"
        run=(setarch "$(uname -m)" -R)
    else
        echo "ci/fuzz.sh: warning: vm.mmap_rnd_bits is $rnd_bits and setarch -R is not" \
            "allowed here; the sanitizers may fail to start (sysctl vm.mmap_rnd_bits=28)" >&2
    fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/ct-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
artifacts=$(realpath -m "$build_dir/fuzz-artifacts")
failed=()
for t in "${targets[@]}"; do
    exe=$build_dir/tests/fuzz/$t
    seeds=tests/fuzz/corpus/${t#fuzz_}
    corpus=$work/corpus-$t
    out=$artifacts/$t
    log=$out/fuzz.log
    rm -rf "$out"
    mkdir -p "$corpus" "$out"
    if [[ -d $seeds ]]; then
        cp -R "$seeds"/. "$corpus"/
    else
        echo "ci/fuzz.sh: warning: $t has no seed corpus ($seeds)" >&2
    fi
    args=(-max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$out/")
    if [[ -f tests/fuzz/$t.dict ]]; then
        args+=(-dict="tests/fuzz/$t.dict")
    fi

    step "$t: $seconds s from $(find "$corpus" -type f | wc -l) seeds (log: $log)"
    rc=0
    "${run[@]}" "$exe" "${args[@]}" "$corpus" >"$log" 2>&1 || rc=$?
    findings=$(find "$out" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
        -o -name 'oom-*' \) | sort)
    grep -E '^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' \
        "$log" || true
    if ((rc != 0)) || [[ -n $(grep -l '^SUMMARY: ' "$log" || true) ]]; then
        failed+=("$t")
        echo "--- $t failed (exit code $rc); the end of its log:"
        tail -n 60 "$log"
        if [[ -n $findings ]]; then
            echo "--- the input that triggers it:"
            while IFS= read -r f; do
                echo "  $f"
                echo "  replay: $exe $f"
            done <<<"$findings"
        else
            echo "--- libFuzzer wrote no input file; see $log"
        fi
    else
        echo "$t: no findings in $seconds s"
    fi
done

if ((${#failed[@]} > 0)); then
    echo "ci/fuzz.sh: findings in ${failed[*]} (inputs under $artifacts)" >&2
    exit 1
fi
step "no findings in ${targets[*]}"
