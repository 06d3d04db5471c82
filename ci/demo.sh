#!/usr/bin/env bash
# Builds ct in Release and runs the main job: the README's first command.
#
#   bash ci/demo.sh [ARGS...]
#
# The main job is examples/fmnist_mlp, which trains an MLP on Fashion-MNIST
# with the reference recipe (SGD with momentum, 10 epochs); ARGS go to it
# (--help lists them; --recipe adamw is the second recipe). BUILD_DIR
# (default: build) and CC are honoured as in ci/test.sh.
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

step "build fmnist_mlp with $(nproc) jobs"
cmake --build "$build_dir" --parallel "$(nproc)" --target fmnist_mlp

# Metrics (JSON lines) go next to the build unless ARGS name another file.
step "run $build_dir/examples/fmnist_mlp $*"
"$build_dir/examples/fmnist_mlp" --metrics "$build_dir/fmnist_mlp.metrics.jsonl" "$@"
