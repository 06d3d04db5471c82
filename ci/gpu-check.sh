#!/usr/bin/env bash
# The CUDA check for a machine with a GPU: builds ct with CUDA, runs every
# CUDA test, then the GPU benchmarks, and ends with a table. It stops itself
# after 8 minutes (CT_GPU_BUDGET seconds), so that a lease of a few minutes
# is enough.
#
#   bash ci/gpu-check.sh               build, test and benchmark (on the GPU machine)
#   bash ci/gpu-check.sh --pack FILE   pack the headers and libraries ct builds
#                                      against into FILE (.tar.xz), here
#
# What ct needs besides the CUDA Toolkit (OpenBLAS, libzmq, cJSON, xxHash,
# zlib)
# comes from ci/setup.sh where apt-get works. A GPU machine with no network
# gets it from a pack made here with --pack and named by CT_GPU_DEPS
# (default .gpu-deps.tar.xz in the repository root; .gitignore keeps it out
# of git). NCCL comes from the CUDA Toolkit, or from PyTorch's nvidia-nccl
# wheel when the toolkit has none.
#
# Without a GPU every CUDA test is skipped (exit 77), so the script can be
# dry-run anywhere: the table then says "skipped (no device)".
#
# Environment:
#   BUILD_DIR       build directory (default: build-gpu)
#   CT_GPU_BUDGET   seconds for the whole check (default 480)
#   CT_GPU_DEPS     the pack (default .gpu-deps.tar.xz)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS
step() { printf '\n==> [%3ds] %s\n' $((SECONDS - t0)) "$*"; }

build_dir=${BUILD_DIR:-build-gpu}
budget=${CT_GPU_BUDGET:-480}
pack=${CT_GPU_DEPS:-.gpu-deps.tar.xz}

# ------------------------------------------------------------------ --pack

# The files of one library (its sonames and their targets), copied into
# $1/lib without the links that point outside.
copy_lib() {
    local dest=$1 name=$2 path
    path=$(ldconfig -p | awk -v n="$name" '$1 == n && !p { p = $NF } END { print p }')
    if [[ -z $path ]]; then
        echo "ci/gpu-check.sh --pack: $name is not installed here (run ci/setup.sh)" >&2
        exit 1
    fi
    cp -L "$path" "$dest/lib/$name"
}

# A pkg-config file that finds the pack wherever it is unpacked.
write_pc() {
    local dest=$1 name=$2 version=$3 libs=$4
    cat >"$dest/lib/pkgconfig/$name.pc" <<EOF
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: $name
Description: packed by ci/gpu-check.sh for an offline GPU machine
Version: $version
Libs: -L\${libdir} $libs
Cflags: -I\${includedir}
EOF
}

if [[ ${1:-} == --pack ]]; then
    out=${2:?"usage: bash ci/gpu-check.sh --pack FILE"}
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/ct-deps/include/cjson" "$tmp/ct-deps/lib/pkgconfig"
    d=$tmp/ct-deps
    blas_inc=$(pkg-config --variable=includedir openblas)
    cp "$blas_inc"/{cblas.h,openblas_config.h} "$d/include/"
    cp /usr/include/{zmq.h,zmq_utils.h,xxhash.h,xxh3.h,zlib.h,zconf.h} "$d/include/"
    cp /usr/include/cjson/cJSON.h "$d/include/cjson/"
    # The libraries and what they need that a CUDA image is unlikely to have.
    for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libzmq.so.5 libsodium.so.23 \
        libpgm-5.3.so.0 libnorm.so.1 libbsd.so.0 libmd.so.0 libcjson.so.1 libxxhash.so.0 libz.so.1; do
        copy_lib "$d" "$lib"
    done
    ln -s libopenblas.so.0 "$d/lib/libopenblas.so"
    ln -s libzmq.so.5 "$d/lib/libzmq.so"
    ln -s libcjson.so.1 "$d/lib/libcjson.so"
    ln -s libxxhash.so.0 "$d/lib/libxxhash.so"
    ln -s libz.so.1 "$d/lib/libz.so"
    write_pc "$d" openblas "$(pkg-config --modversion openblas)" -lopenblas
    write_pc "$d" libzmq "$(pkg-config --modversion libzmq)" -lzmq
    write_pc "$d" libcjson "$(pkg-config --modversion libcjson)" -lcjson
    write_pc "$d" libxxhash "$(pkg-config --modversion libxxhash)" -lxxhash
    write_pc "$d" zlib "$(pkg-config --modversion zlib)" -lz
    tar -C "$tmp" -cJf "$out" ct-deps
    echo "ci/gpu-check.sh: packed $(du -h "$out" | cut -f1) into $out"
    exit 0
fi
if (($# > 0)); then
    sed -n '2,26s/^# \{0,1\}//p' "$0" >&2
    exit 2
fi

# ------------------------------------------------------------ dependencies

have_deps() { pkg-config --exists openblas libzmq libcjson libxxhash zlib 2>/dev/null; }

step "dependencies"
if have_deps; then
    echo "OpenBLAS, libzmq, cJSON and xxHash are installed"
elif command -v apt-get >/dev/null && bash ci/setup.sh; then
    echo "installed by ci/setup.sh"
elif [[ -f $pack ]]; then
    deps=/tmp/ct-gpu-deps
    rm -rf "$deps"
    mkdir -p "$deps"
    tar -C "$deps" -xJf "$pack"
    export PKG_CONFIG_PATH=$deps/ct-deps/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export LD_LIBRARY_PATH=$deps/ct-deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "from the pack $pack"
else
    echo "ci/gpu-check.sh: OpenBLAS, libzmq, cJSON or xxHash is missing, apt-get cannot install" \
        "them, and there is no pack at $pack (make one where they are installed:" \
        "bash ci/gpu-check.sh --pack .gpu-deps.tar.xz)" >&2
    exit 1
fi
have_deps || {
    echo "ci/gpu-check.sh: pkg-config still finds no OpenBLAS, libzmq, cJSON or xxHash" >&2
    exit 1
}

# NCCL from the toolkit, or else from PyTorch's wheel.
nccl_args=()
cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [[ ! -f $cuda_home/include/nccl.h ]]; then
    wheel=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' \
        2>/dev/null || true)
    if [[ -n $wheel && -f $wheel/include/nccl.h ]]; then
        nccl_args=(-DNCCL_INCLUDE_DIR="$wheel/include" -DNCCL_LIBRARY="$wheel/lib/libnccl.so.2")
        export LD_LIBRARY_PATH=$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        echo "NCCL from $wheel"
    fi
fi

# ------------------------------------------------------------------- build

step "configure ($build_dir)"
PATH=$cuda_home/bin:$PATH
logs=$build_dir/gpu-check
mkdir -p "$logs"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DCT_CUDA=ON -DCT_NCCL=AUTO \
    -DCT_BUILD_TESTS=ON "${nccl_args[@]}" >"$logs/configure.log" 2>&1 || {
    cat "$logs/configure.log" >&2
    exit 1
}
grep -E '^-- +(CUDA|NCCL|OpenBLAS|libzmq)' "$logs/configure.log" || true

step "build"
cmake --build "$build_dir" -j"$(nproc)" >"$logs/build.log" 2>&1 || {
    tail -40 "$logs/build.log" >&2
    exit 1
}

# ------------------------------------------------------------------- tests

left() { echo $((budget - (SECONDS - t0))); }

step "CUDA tests"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
    echo "(nvidia-smi: no GPU visible)"
results=()
gpu_tests=(test_cuda_allocator test_cuda test_cuda_reduce test_cuda_index test_cuda_matmul
           test_cuda_checkpoint test_nccl test_coll_device
           example_cuda_h test_core)
for t in "${gpu_tests[@]}"; do
    if (($(left) < 30)); then
        results+=("$t|not run (out of time)|0")
        continue
    fi
    t1=$SECONDS
    set +e
    (cd "$build_dir" && timeout "$(left)" ctest -R "^$t\$" --output-on-failure) >"$logs/$t.log" 2>&1
    rc=$?
    set -e
    if grep -q 'Skipped\|Not Run' "$logs/$t.log"; then
        verdict="skipped (no device)"
    elif ((rc == 0)); then
        verdict=passed
    else
        verdict="FAILED (rc $rc; $logs/$t.log)"
        tail -30 "$logs/$t.log"
    fi
    results+=("$t|$verdict|$((SECONDS - t1))")
done

# ci/bench.sh cuda in this build (its short form when time is short): the
# targets' verdicts go into the table. A missed target is a figure, not a
# failure; a benchmark that fails is.
step "GPU benchmarks"
if (($(left) < 60)); then
    results+=("benchmarks|not run (out of time)|0")
else
    quick=0
    if (($(left) < 150)); then
        quick=1
    fi
    t1=$SECONDS
    set +e
    CT_BENCH_BUILD_DIR=$PWD/$build_dir CT_BENCH_QUICK=$quick timeout "$(left)" \
        bash ci/bench.sh cuda >"$logs/bench.jsonl" 2>"$logs/bench.log"
    rc=$?
    set -e
    grep -E '^(target|elementwise|matmul|ct / torch|  )' "$logs/bench.log" || true
    if ((rc != 0)); then
        results+=("benchmarks|FAILED (rc $rc; $logs/bench.log)|$((SECONDS - t1))")
        tail -20 "$logs/bench.log"
    elif grep -q '"skipped"' "$logs/bench.jsonl" && ! grep -q '^target:' "$logs/bench.log"; then
        results+=("benchmarks|skipped (no device)|$((SECONDS - t1))")
    else
        results+=("benchmarks|ran ($logs/bench.jsonl)|$((SECONDS - t1))")
        while IFS= read -r line; do
            # "target: matmul >= 0.9 x cuBLAS: met (ratio 0.97)"
            what=${line#target: }
            results+=("${what%%: *}|${what#*: }|")
        done < <(grep '^target:' "$logs/bench.log")
    fi
fi

# ------------------------------------------------------------------- table

step "summary"
printf '%-34s %-40s %s\n' "check" "result" "seconds"
failed=0
for r in "${results[@]}"; do
    IFS='|' read -r name verdict secs <<<"$r"
    printf '%-34s %-40s %s\n' "$name" "$verdict" "$secs"
    [[ $verdict == FAILED* ]] && failed=1
done
echo "total $((SECONDS - t0)) s of a $budget s budget"
exit $failed
