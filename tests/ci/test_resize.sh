#!/usr/bin/env bash
# test_resize: a checkpoint resumes on another number of ranks with the same
# result, on this machine (test_elastic_cluster changes the ranks of a
# running job across hosts). fmnist_mlp's adamw recipe, whose dropout is
# keyed by sample (ct_dropout_key_rows): 2 ranks train to step 50 and stop,
# 3 ranks resume from there to step 120, and every step's loss equals, to
# 1e-6, that of one rank that never stopped; then 3 ranks to step 50, 1
# rank on. The data order, the dropout masks and the random stream follow
# the global batch, not the ranks; only float reassociation differs.
#
#   test_resize.sh CTLAUNCH FMNIST_MLP PYTHON3
#
# Exits 77 (skipped) without Fashion-MNIST.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ctlaunch=${1:?usage: test_resize.sh CTLAUNCH FMNIST_MLP PYTHON3}
fmnist=${2:?}
python=${3:?}
data=/usr/share/datasets/fashion-mnist
if [[ ! -r $data/train-images-idx3-ubyte.gz ]]; then
    echo "skipped: Fashion-MNIST is not installed (dataset-fashion-mnist)"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/ci/common.sh
source "$here/common.sh"
for v in CT_BACKEND CT_RANK CT_WORLD_SIZE RANK WORLD_SIZE MASTER_ADDR MASTER_PORT SLURM_PROCID; do
    unset "$v"
done
train=(--recipe adamw --hidden 128 --batch 96 --max-steps 120 --metrics-every 1 --threads 1
    --data "$data")

# fmnist_mlp on $1 ranks with the rest of the arguments; $name.out keeps
# what it printed.
on_ranks() {
    local np=$1 name=$2
    shift 2
    timeout 120 "$ctlaunch" -np "$np" "$fmnist" "${train[@]}" "$@" >"$tmp/$name.out" 2>&1 ||
        fail "$name: ctlaunch -np $np exited $?: $(tail -n 20 "$tmp/$name.out")"
}

on_ranks 1 unbroken --metrics "$tmp/unbroken.jsonl"
for sizes in "2 3" "3 1"; do
    read -r before after <<<"$sizes"
    name=from$before.to$after
    on_ranks "$before" "$name.a" --checkpoint-dir "$tmp/$name.ck" --stop-at-step 50 \
        --metrics "$tmp/$name.jsonl"
    on_ranks "$after" "$name.b" --checkpoint-dir "$tmp/$name.ck" --metrics "$tmp/$name.jsonl"
    grep -q "resumed from .* at step 50 " "$tmp/$name.b.out" ||
        fail "$name: no resume at step 50: $(tail -n 5 "$tmp/$name.b.out")"
    "$python" "$here/same_losses.py" "$tmp/$name.jsonl" "$tmp/unbroken.jsonl" 0 1e-6 \
        "$before ranks to step 50, then $after, vs 1 rank unbroken" || fail "$name"
    echo "ok   $before ranks, then $after from their checkpoint: the losses of 1 rank unbroken"
done
