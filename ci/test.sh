#!/usr/bin/env bash
# Builds ct and runs its tests: the README's test command, and what CI runs.
#
#   bash ci/test.sh
#
# Steps: install system packages (ci/setup.sh), configure, build, check the
# layering (ci/layers.py), install into a temporary prefix and build a
# program against it with find_package and with pkg-config, build and
# install the Debian packages (debian/) and use them the same way, then run
# ctest.
#
# Environment:
#   BUILD_DIR          build directory (default: build)
#   CC                 C compiler (default: CMake's choice)
#   CMAKE_BUILD_TYPE   Release (default), Debug or RelWithDebInfo
#   CT_SANITIZE        empty (default), "address;undefined" or "thread"
#   CT_CMAKE_ARGS      more arguments for cmake, split on spaces
#   CT_BUILD_ONLY      1: stop after the build (the CUDA job: no GPU there)
#   CI                 true: warnings are errors (-DCT_WERROR=ON)
#   CT_DEB_CHECK       0: skip the Debian packages' check (it needs root)
#   CT_TORCHRUN        1: also install python3-torch (ci/setup.sh --torchrun),
#                      so that the tests that run torchrun are not skipped
#   CT_FUZZ_SECONDS    seconds each fuzz target runs after the tests
#                      (ci/fuzz.sh, a separate clang build); default 20
#                      when CI is true, else 0 (no fuzzing)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS

step() { printf '\n==> [%3ds] %s\n' $((SECONDS - t0)) "$*"; }

build_dir=${BUILD_DIR:-build}
build_type=${CMAKE_BUILD_TYPE:-Release}
sanitize=${CT_SANITIZE:-}
werror=OFF
if [[ ${CI:-} == true ]]; then
    werror=ON
fi
read -r -a extra_args <<<"${CT_CMAKE_ARGS:-}"

case $sanitize in
"") san_flags="" ;;
"address;undefined" | "address,undefined") san_flags="-fsanitize=address,undefined" ;;
thread) san_flags="-fsanitize=thread" ;;
*)
    echo "ci/test.sh: CT_SANITIZE must be empty, 'address;undefined' or 'thread' (got '$sanitize')" >&2
    exit 2
    ;;
esac

step "ci/setup.sh${CT_TORCHRUN:+ --torchrun}"
bash ci/setup.sh ${CT_TORCHRUN:+--torchrun}

# CMake reads CC only when it first configures a build directory. When CC
# names another compiler than the cached one, configure afresh.
fresh=()
if [[ -n ${CC:-} && -f $build_dir/CMakeCache.txt ]]; then
    cached=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
    wanted=$(command -v "$CC" || true)
    if [[ -z $wanted || $(realpath -m "$cached") != $(realpath -m "$wanted") ]]; then
        echo "ci/test.sh: $build_dir was configured with $cached; configuring afresh for CC=$CC"
        fresh=(--fresh)
    fi
fi

step "configure $build_dir ($build_type, CC=${CC:-default}, CT_SANITIZE='$sanitize', CT_WERROR=$werror)"
cmake -S . -B "$build_dir" "${fresh[@]}" \
    -DCMAKE_BUILD_TYPE="$build_type" \
    -DCT_SANITIZE="$sanitize" \
    -DCT_WERROR="$werror" \
    -DCT_BUILD_TESTS=ON \
    "${extra_args[@]}"

step "build with $(nproc) jobs"
cmake --build "$build_dir" --parallel "$(nproc)"

# No include or call points up a layer (ARCHITECTURE.md): the sources, and
# nm on the objects just built. About a second.
step "layers: ci/layers.py --build $build_dir"
python3 ci/layers.py --build "$build_dir"
# Every symbol of libct says whose it is: public, or its module's prefix.
step "names: ci/names.py --build $build_dir"
python3 ci/names.py --build "$build_dir"

if [[ ${CT_BUILD_ONLY:-0} == 1 ]]; then
    step "built; CT_BUILD_ONLY=1, so no tests run"
    exit 0
fi

# Sanitizer settings, unless the caller chose their own.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
# CI runs as root; Open MPI's mpirun refuses to unless told.
if ((EUID == 0)); then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# The sanitizers of GCC 12 and LLVM 14 map shadow memory at fixed addresses
# and fail on kernels with more than 28 bits of mmap randomisation
# (vm.mmap_rnd_bits = 32 on some recent kernels). Run the test programs
# without address randomisation then, if this machine allows it.
run=()
if [[ -n $sanitize ]]; then
    rnd_bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)
    if ((rnd_bits > 28)); then
        if setarch "$(uname -m)" -R true 2>/dev/null; then
            echo "ci/test.sh: vm.mmap_rnd_bits is $rnd_bits; running tests under setarch -R"
            run=(setarch "$(uname -m)" -R)
        else
            echo "ci/test.sh: warning: vm.mmap_rnd_bits is $rnd_bits and setarch -R is not" \
                "allowed here; the sanitizers may fail to start (sysctl vm.mmap_rnd_bits=28)" >&2
        fi
    fi
fi

step "install into a temporary prefix and build against it"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ct-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build_dir" --prefix "$prefix" >"$tmp/install.log"
for h in ct/ct.h ct/tensor.h; do
    if [[ ! -f $prefix/include/$h ]]; then
        echo "ci/test.sh: install did not put include/$h into the prefix" >&2
        exit 1
    fi
done
private=$(find "$prefix/include" -name '*_impl.h')
if [[ -n $private ]]; then
    echo "ci/test.sh: private headers were installed: $private" >&2
    exit 1
fi

# Every installed program starts from the prefix without help from the
# environment (its RUNPATH finds libct.so), also from a copy of the prefix
# moved elsewhere: --help exits 0 and prints its usage.
cp -a "$prefix" "$tmp/moved"
mapfile -t programs < <(find "$tmp/moved/bin" "$tmp/moved/libexec/ct" -type f -perm -u+x | sort)
if ((${#programs[@]} == 0)); then
    echo "ci/test.sh: install put no programs into the prefix" >&2
    exit 1
fi
for p in "${programs[@]}"; do
    if ! help=$(env -u LD_LIBRARY_PATH "${run[@]}" "$p" --help 2>&1) || [[ $help != *usage* ]]; then
        echo "ci/test.sh: the installed ${p#"$tmp/moved/"} does not run: $help" >&2
        exit 1
    fi
done
echo "installed programs run:          ${programs[*]##*/}"

consumer_args=(-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE="$build_type")
if [[ -n ${CC:-} ]]; then
    consumer_args+=(-DCMAKE_C_COMPILER="$CC")
fi
if [[ -n $san_flags ]]; then
    consumer_args+=(-DCMAKE_C_FLAGS="$san_flags")
fi
cmake -S tests/install -B "$tmp/consumer" "${consumer_args[@]}" >"$tmp/consumer.log" ||
    { cat "$tmp/consumer.log"; exit 1; }
cmake --build "$tmp/consumer" --parallel "$(nproc)" >>"$tmp/consumer.log" ||
    { cat "$tmp/consumer.log"; exit 1; }
out=$("${run[@]}" "$tmp/consumer/consumer")
echo "find_package(ct), ct::ct:        $out"
out=$("${run[@]}" "$tmp/consumer/consumer_static")
echo "find_package(ct), ct::ct_static: $out"

pc_dir=$(dirname "$(find "$prefix" -name ct.pc -print -quit)")
export PKG_CONFIG_PATH=$pc_dir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
read -r -a pc_flags <<<"$(pkg-config --cflags --libs ct)"
read -r -a san_array <<<"$san_flags"
"${CC:-cc}" -std=c11 -Wall -Wextra -Wpedantic -Werror "${san_array[@]}" tests/install/main.c \
    "${pc_flags[@]}" -Wl,-rpath,"$(pkg-config --variable=libdir ct)" -o "$tmp/consumer_pc"
out=$("${run[@]}" "$tmp/consumer_pc")
echo "pkg-config ct:                   $out"
# The static route: libct.a by path in place of -lct (which picks libct.so),
# and everything it needs from Libs.private.
read -r -a static <<<"$(pkg-config --cflags --static --libs ct)"
for i in "${!static[@]}"; do
    if [[ ${static[i]} == -lct ]]; then
        static[i]=$(pkg-config --variable=libdir ct)/libct.a
    fi
done
"${CC:-cc}" -std=c11 -Wall -Wextra -Wpedantic -Werror "${san_array[@]}" tests/install/main.c \
    "${static[@]}" -o "$tmp/consumer_pc_static"
out=$("${run[@]}" "$tmp/consumer_pc_static")
echo "pkg-config --static ct, libct.a: $out"

# The Debian packages (debian/, docs/build.md#debian-packages): built with
# dpkg-buildpackage in a copy of the tree, so that nothing lands in it;
# installed with apt-get, used as a user would (the five programs, a
# pkg-config and a find_package build of tests/install/), then purged, so
# that the machine is left as it was. It needs root, for apt-get (CI runs
# as root), and runs in the unsanitized jobs only: the packages are built
# without sanitizers whatever the job's flags. CT_DEB_CHECK=0 skips it.
deb_packages=(libct0 libct-dev ct-tools)
deb_purge() {
    DEBIAN_FRONTEND=noninteractive apt-get -q purge -y "${deb_packages[@]}" >"$tmp/deb-purge.log" 2>&1 ||
        { cat "$tmp/deb-purge.log" >&2; return 1; }
}
deb_check() {
    local why=""
    if [[ ${CT_DEB_CHECK:-1} == 0 ]]; then
        why="CT_DEB_CHECK=0"
    elif [[ -n $sanitize ]]; then
        why="a sanitized job (CT_SANITIZE='$sanitize')"
    elif ((EUID != 0)); then
        why="not root (apt-get installs the packages)"
    elif ! command -v dpkg-buildpackage >/dev/null || ! command -v dh >/dev/null; then
        why="dpkg-buildpackage or dh is missing (ci/setup.sh installs dpkg-dev and debhelper)"
    elif ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        why="not a git checkout (the copy of the tree is made from git ls-files)"
    elif [[ $(dpkg-query -W -f='${Status}\n' "${deb_packages[@]}" 2>/dev/null || true) == *" installed"* ]]; then
        why="ct's packages are installed already; apt-get purge ${deb_packages[*]} first"
    fi
    if [[ -n $why ]]; then
        echo "ci/test.sh: skipping the Debian package check: $why"
        return 0
    fi
    local deb=$tmp/deb src=$tmp/deb/ct f
    mkdir -p "$src"
    # The files git knows and the new ones it does not ignore: no build
    # directories, no bench/.venv, nothing deleted in the working tree.
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do
            if [[ -f $f ]]; then printf '%s\0' "$f"; fi
        done | tar -c --null -T - | tar -x -C "$src"
    # nocheck: the tests ran above; noautodbgsym: no -dbgsym packages. The
    # packages are built with the system's compiler, as Debian builds them,
    # whatever CC is (clang 14's DWARF 5 also stops Debian 12's dwz); CC
    # compiles the programs below that use them.
    (cd "$src" && env -u CC DEB_BUILD_OPTIONS="nocheck noautodbgsym parallel=$(nproc)" \
        dpkg-buildpackage -us -uc -b) >"$deb/build.log" 2>&1 ||
        { tail -n 60 "$deb/build.log"; echo "ci/test.sh: dpkg-buildpackage failed;" \
            "the log is above" >&2; exit 1; }
    local debs=() p
    for p in "${deb_packages[@]}"; do
        debs+=("$(find "$deb" -maxdepth 1 -name "${p}_*.deb" -print -quit)")
        if [[ -z ${debs[-1]} ]]; then
            echo "ci/test.sh: dpkg-buildpackage made no $p package" >&2
            exit 1
        fi
    done
    echo "built:                           ${debs[*]##*/}"

    trap 'deb_purge; rm -rf "$tmp"' EXIT
    DEBIAN_FRONTEND=noninteractive apt-get -q install -y --no-install-recommends "${debs[@]}" \
        >"$deb/install.log" 2>&1 || { cat "$deb/install.log"; exit 1; }

    local programs=(/usr/bin/ctlaunch /usr/bin/ctckpt /usr/bin/ctplot
                    /usr/libexec/ct/fmnist_mlp /usr/libexec/ct/gpt) help
    for p in "${programs[@]}"; do
        if ! help=$(env -u LD_LIBRARY_PATH "$p" --help 2>&1) || [[ $help != *usage* ]]; then
            echo "ci/test.sh: the packaged $p does not run: $help" >&2
            exit 1
        fi
        if readelf -d "$p" | grep -Eq 'RUNPATH|RPATH'; then
            echo "ci/test.sh: the packaged $p has a RUNPATH; the package builds with" \
                "-DCMAKE_SKIP_INSTALL_RPATH=ON" >&2
            exit 1
        fi
    done
    echo "packaged programs run:           ${programs[*]##*/}"

    # The system's pkg-config and CMake, not the temporary prefix's.
    local pc
    read -r -a pc <<<"$(env -u PKG_CONFIG_PATH pkg-config --cflags --libs ct)"
    "${CC:-cc}" -std=c11 -Wall -Wextra -Wpedantic -Werror tests/install/main.c "${pc[@]}" \
        -o "$deb/consumer_pc"
    out=$(env -u LD_LIBRARY_PATH "$deb/consumer_pc")
    echo "packaged ct, pkg-config:         $out"
    local cmake_args=(-DCMAKE_BUILD_TYPE=Release)
    if [[ -n ${CC:-} ]]; then
        cmake_args+=(-DCMAKE_C_COMPILER="$CC")
    fi
    env -u CMAKE_PREFIX_PATH cmake -S tests/install -B "$deb/consumer" "${cmake_args[@]}" \
        >"$deb/consumer.log" || { cat "$deb/consumer.log"; exit 1; }
    cmake --build "$deb/consumer" >>"$deb/consumer.log" || { cat "$deb/consumer.log"; exit 1; }
    local found
    found=$(sed -n 's/^ct_DIR:PATH=//p' "$deb/consumer/CMakeCache.txt")
    if [[ $found != /usr/lib/*/cmake/ct ]]; then
        echo "ci/test.sh: find_package(ct) found $found, not the package's /usr/lib/<triplet>/cmake/ct" >&2
        exit 1
    fi
    out=$(env -u LD_LIBRARY_PATH "$deb/consumer/consumer")
    echo "packaged ct, ct::ct:             $out"
    out=$(env -u LD_LIBRARY_PATH "$deb/consumer/consumer_static")
    echo "packaged ct, ct::ct_static:      $out"

    deb_purge
    trap 'rm -rf "$tmp"' EXIT
    echo "purged:                          ${deb_packages[*]}"
}
step "Debian packages: build, install, use, purge"
deb_check

step "ctest"
"${run[@]}" ctest --test-dir "$build_dir" --output-on-failure --no-tests=error -j2

# The parsers of files that come from anywhere (checkpoint manifests,
# safetensors headers) get a bounded fuzzing run: it needs clang, which
# ci/setup.sh installs.
fuzz_seconds=${CT_FUZZ_SECONDS:-0}
if [[ ${CI:-} == true ]]; then
    fuzz_seconds=${CT_FUZZ_SECONDS:-20}
fi
if ((fuzz_seconds > 0)); then
    step "fuzz: ci/fuzz.sh $fuzz_seconds"
    bash ci/fuzz.sh "$fuzz_seconds"
fi
