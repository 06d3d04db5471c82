#!/usr/bin/env bash
# Builds ct in Release and runs the main job: the README's first command.
#
#   bash ci/demo.sh [ARGS...]
#
# For now the main job is examples/tensor_demo, which runs ct's tensor core
# on Fashion-MNIST; ARGS go to it. BUILD_DIR (default: build) and CC are
# honoured as in ci/test.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS
step() { printf '\n==> [%3ds] %s\n' $((SECONDS - t0)) "$*"; }

step "ci/setup.sh"
bash ci/setup.sh

build_dir=${BUILD_DIR:-build}
fresh=()
if [[ -n ${CC:-} && -f $build_dir/CMakeCache.txt ]]; then
    cached=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
    wanted=$(command -v "$CC" || true)
    if [[ -z $wanted || $(realpath -m "$cached") != $(realpath -m "$wanted") ]]; then
        fresh=(--fresh)
    fi
fi

step "configure $build_dir (Release)"
cmake -S . -B "$build_dir" "${fresh[@]}" -DCMAKE_BUILD_TYPE=Release -DCT_SANITIZE= \
    -DCT_BUILD_EXAMPLES=ON

step "build tensor_demo with $(nproc) jobs"
cmake --build "$build_dir" --parallel "$(nproc)" --target tensor_demo

step "run $build_dir/examples/tensor_demo $*"
"$build_dir/examples/tensor_demo" "$@"
