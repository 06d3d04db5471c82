#!/usr/bin/env bash
# test_resize: a checkpoint resumes on another number of ranks with the same
# result, on this machine (test_elastic_cluster changes the ranks of a
# running job across hosts). fmnist_mlp's adamw recipe, whose dropout is
# keyed by sample (ct_dropout_key_rows): 2 ranks train to step 50 and stop,
# 3 ranks resume from there to step 120, and every step's loss equals, to
# 1e-6, that of one rank that never stopped; then 3 ranks to step 50, 1
# rank on. The data order, the dropout masks and the random stream follow
# the global batch, not the ranks; only float reassociation differs. And
# the tiny gpt (no dropout: its masks are not keyed), 2 ranks to step 20,
# then 4 to step 40, against one rank unbroken, where fortunes is
# installed and GPT is given.
#
#   test_resize.sh CTLAUNCH FMNIST_MLP PYTHON3 [GPT]
#
# Exits 77 (skipped) without Fashion-MNIST.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ctlaunch=${1:?usage: test_resize.sh CTLAUNCH FMNIST_MLP PYTHON3}
fmnist=${2:?}
python=${3:?}
gpt=${4:-}
data=/usr/share/datasets/fashion-mnist
fortunes=/usr/share/games/fortunes
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

# $program on $1 ranks with "${train[@]}" and the rest of the arguments;
# $tmp/$2.out keeps what it printed.
on_ranks() {
    local np=$1 name=$2
    shift 2
    timeout 120 "$ctlaunch" -np "$np" "$program" "${train[@]}" "$@" >"$tmp/$name.out" 2>&1 ||
        fail "$name: ctlaunch -np $np exited $?: $(tail -n 20 "$tmp/$name.out")"
}

# Trains to step $3 on $1 ranks, stops, resumes on $2 ranks to the end, and
# compares every step's loss with $tmp/unbroken.$program_name.jsonl.
resized() {
    local before=$1 after=$2 stop=$3 name=$program_name.from$1.to$2
    on_ranks "$before" "$name.a" --checkpoint-dir "$tmp/$name.ck" --stop-at-step "$stop" \
        --metrics "$tmp/$name.jsonl"
    on_ranks "$after" "$name.b" --checkpoint-dir "$tmp/$name.ck" --metrics "$tmp/$name.jsonl"
    grep -q "resumed from .* at step $stop" "$tmp/$name.b.out" ||
        fail "$name: no resume at step $stop: $(tail -n 5 "$tmp/$name.b.out")"
    "$python" "$here/same_losses.py" "$tmp/$name.jsonl" "$tmp/unbroken.$program_name.jsonl" 0 1e-6 \
        "$program_name: $before ranks to step $stop, then $after, vs 1 rank unbroken" ||
        fail "$name"
    echo "ok   $program_name: $before ranks, then $after from their checkpoint: the losses of 1 rank unbroken"
}

program=$fmnist program_name=fmnist_mlp
on_ranks 1 unbroken --metrics "$tmp/unbroken.fmnist_mlp.jsonl"
resized 2 3 50
resized 3 1 50

if [[ -z $gpt ]]; then
    echo "  no gpt in this build: its run is left out"
elif [[ ! -d $fortunes ]]; then
    echo "  fortunes is not installed: the gpt run is left out"
else
    program=$gpt program_name=gpt
    train=(--layers 2 --heads 2 --width 32 --context 32 --batch 8 --steps 40 --eval-every 0
        --sample-tokens 0 --log-every 1 --threads 1)
    on_ranks 1 unbroken --metrics "$tmp/unbroken.gpt.jsonl"
    resized 2 4 20
fi
