#!/usr/bin/env bash
# test_elastic_cluster: elastic jobs (ctlaunch --nnodes MIN:MAX) on three
# hosts of the test cluster (ci/cluster.sh), fmnist_mlp training on through
# a change of members (240 steps, a checkpoint every 20 into one directory that
# every host sees, as a shared file system would be):
#
#   a host dies   node0 and node1, 2 ranks each, --nnodes 1:2. node1 is
#                 crashed mid-training (every process on it killed at
#                 once). node0's ranks fail, naming a rank of node1, within
#                 seconds; its ctlaunch names the host that is gone and
#                 re-forms the job on node0 alone, which resumes from the
#                 newest checkpoint (saved by 4 ranks, loaded by 2) and
#                 finishes. Its losses from there equal, to 1e-6, those of
#                 a run on one machine resumed from that checkpoint, and
#                 those of an unbroken run on one machine.
#   a host joins  node0 and node1, 1 rank each, --nnodes 2:3; node2 starts
#                 mid-training. The job re-forms on 3 ranks and resumes;
#                 every step's loss (the global batch's, which fmnist_mlp
#                 writes) equals, to 1e-6, an unbroken 2-rank run's: the
#                 same global batches, on 2 ranks and then on 3.
#
# The losses are the global batch's mean, so runs on different numbers of
# ranks differ only by float reassociation (about 1e-7 here).
#
#   test_elastic_cluster.sh CTLAUNCH FMNIST_MLP PYTHON3
#
# Exits 77 (skipped) where the cluster cannot be made, in a build without
# gloo (CT_TEST_GLOO), or without Fashion-MNIST.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../../ci/cluster.sh
usage="usage: test_elastic_cluster.sh CTLAUNCH FMNIST_MLP PYTHON3"
ctlaunch=${1:?$usage}
fmnist=${2:?$usage}
python=${3:?$usage}
data=/usr/share/datasets/fashion-mnist
port=29532
steps=240
# shellcheck source=tests/ci/cluster_checks.sh
source "$here/cluster_checks.sh"

# Waits up to $1 s for the command that follows to succeed.
wait_for() {
    local limit=$1 waited=0
    shift
    until "$@"; do
        ((waited++ < limit * 20)) || return 1
        sleep 0.05
    done
}

# Starts ctlaunch on host $1 (its output in $tmp/$2.out, its exit code in
# $tmp/$2.rc once it ends) with the ctlaunch flags up to "--" and then
# fmnist_mlp's arguments.
start() {
    local host=$1 name=$2 flags=()
    shift 2
    while [[ $1 != -- ]]; do
        flags+=("$1")
        shift
    done
    shift
    (
        rc=0
        on "$host" timeout -k 5 150 "$ctlaunch" "${flags[@]}" --master "node0:$port" \
            --secret-file "$tmp/secret" --grace 5 "$fmnist" "${train[@]}" "$@" \
            >"$tmp/$name.out" 2>&1 || rc=$?
        echo "$rc" >"$tmp/$name.rc"
    ) &
}

# Waits for the ctlaunch named $1 to end; fails unless it exited 0.
ended_well() {
    wait_for 150 test -e "$tmp/$1.rc" || fail "$1: ctlaunch did not end within 150 s"
    local rc
    rc=$(cat "$tmp/$1.rc")
    ((rc == 0)) || fail "$1: ctlaunch exited $rc: $(grep -v ETA "$tmp/$1.out" | tail -n 30)"
}

# The step a run resumed at, from its output $1.
resumed_at() {
    sed -nE 's/.*resumed from .* at step ([0-9]+) .*/\1/p' "$1" | tail -n 1
}

# Metrics files $1 and $2 hold the same loss, to 1e-6, at every step of $1
# from step $3 on; $4 names the comparison.
same_losses() {
    "$python" "$here/same_losses.py" "$1" "$2" "$3" 1e-6 "$4" || fail "$4"
}

# A run of 2 ranks on node0 alone, to compare with, into $tmp/$1.jsonl;
# the rest of the arguments go to fmnist_mlp.
alone() {
    local name=$1
    shift
    on node0 "$ctlaunch" -np 2 "$fmnist" "${train[@]}" --metrics "$tmp/$name.jsonl" "$@" \
        >"$tmp/$name.out" 2>&1 || fail "$name: ctlaunch -np 2 exited $?: $(tail -n 20 "$tmp/$name.out")"
}

host_dies() {
    local ck=$tmp/ck1 t0 took s
    start node1 n1 --nnodes 1:2 -np 2 -- --checkpoint-dir "$ck" --metrics "$tmp/n1.jsonl"
    start node0 n0 --nnodes 1:2 --node-rank 0 -np 2 --last-call 5 --max-restarts 1 -- \
        --checkpoint-dir "$ck" --metrics "$tmp/el1.jsonl"
    wait_for 60 test -d "$ck/step-00000040" || fail "no checkpoint of step 40 within 60 s: $(tail -n 20 "$tmp/n0.out")"
    grep -q "round 0 (start): 2 nodes, 4 ranks" "$tmp/n0.out" ||
        fail "round 0 is not 2 nodes of 2 ranks: $(grep ctlaunch "$tmp/n0.out")"
    t0=$(date +%s%N)
    "$cluster" crash node1
    wait_for 60 grep -q "round 1 (fail)" "$tmp/n0.out" ||
        fail "node0 did not re-form the job within 60 s of the crash: $(grep -v ETA "$tmp/n0.out" | tail -n 20)"
    took=$((($(date +%s%N) - t0) / 1000000))
    ended_well n0
    grep -E "^\[rank [01]\] fmnist_mlp: .*rank [23]" "$tmp/n0.out" >/dev/null ||
        fail "node0's ranks did not fail naming rank 2 or 3 of node1: $(grep -v ETA "$tmp/n0.out" | head -n 20)"
    grep -q "round 1 (fail): 1 node, 2 ranks: node 0 (node0, ctlaunch pid [0-9]*); gone since round 0: node 1 (node1, ctlaunch pid [0-9]*)" "$tmp/n0.out" ||
        fail "node0's ctlaunch did not name node1 as gone: $(grep ctlaunch "$tmp/n0.out")"
    s=$(resumed_at "$tmp/n0.out")
    [[ -n $s ]] || fail "node0 did not resume from a checkpoint: $(grep -v ETA "$tmp/n0.out" | tail -n 20)"
    echo "  node1 crashed; node0 re-formed the job $took ms later and resumed at step $s on 2 ranks"
    # One machine from the same checkpoint, and one that never stopped.
    mkdir "$tmp/ck1ref"
    cp -r "$ck/step-$(printf %08d "$s")" "$tmp/ck1ref/"
    alone ref1 --checkpoint-dir "$tmp/ck1ref"
    same_losses "$tmp/el1.jsonl" "$tmp/ref1.jsonl" "$s" "resumed on node0 vs one machine resumed from step $s"
    alone unbroken
    same_losses "$tmp/el1.jsonl" "$tmp/unbroken.jsonl" 0 "2 hosts x 2 ranks, then node0 alone, vs an unbroken run"
}

host_joins() {
    local ck=$tmp/ck2 s
    start node1 j1 --nnodes 2:3 -np 1 -- --checkpoint-dir "$ck" --metrics "$tmp/j1.jsonl"
    start node0 j0 --nnodes 2:3 --node-rank 0 -np 1 --last-call 1 -- --checkpoint-dir "$ck" \
        --metrics "$tmp/el2.jsonl"
    wait_for 60 test -d "$ck/step-00000020" || fail "no checkpoint of step 20 within 60 s: $(tail -n 20 "$tmp/j0.out")"
    start node2 j2 --nnodes 2:3 -np 1 -- --checkpoint-dir "$ck" --metrics "$tmp/j2.jsonl"
    ended_well j0
    ended_well j1
    ended_well j2
    grep -q "round 0 (start): 2 nodes, 2 ranks" "$tmp/j0.out" ||
        fail "round 0 is not 2 nodes: $(grep ctlaunch "$tmp/j0.out")"
    grep -q "round 1 (grow): 3 nodes, 3 ranks" "$tmp/j0.out" ||
        fail "node2 did not join a round of 3: $(grep ctlaunch "$tmp/j0.out")"
    grep -q "round 1: this is node 2 of 3" "$tmp/j2.out" || fail "node2 is not node 2 of round 1: $(cat "$tmp/j2.out")"
    s=$(resumed_at "$tmp/j0.out")
    if [[ -z $s ]] || ! grep -q "batch 96 (32 per rank), .* 3 ranks" "$tmp/j0.out"; then
        fail "the job did not resume on 3 ranks: $(grep -v ETA "$tmp/j0.out" | tail -n 20)"
    fi
    echo "  node2 joined; the job resumed at step $s on 3 ranks"
    same_losses "$tmp/el2.jsonl" "$tmp/unbroken.jsonl" 0 "2 then 3 ranks vs an unbroken 2-rank run"
}

inside() {
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/secret"
    chmod 600 "$tmp/secret"
    train=(--batch 96 --max-steps "$steps" --save-every 20 --keep-last 0 --metrics-every 1 --threads 1
        --data "$data")
    host_dies
    echo "ok   a host dies: the job goes on on the survivor"
    host_joins
    echo "ok   a host joins: the job goes on on 3 ranks, with the same global batches"
}

if [[ ${4:-} == --inside ]]; then
    tmp=$5
    inside
    exit
fi

if [[ ${CT_TEST_GLOO:-ON} != ON ]]; then
    echo "skipped: this build has no gloo backend (libgloo-dev was not found), which ranks across hosts need"
    exit 77
fi
if [[ ! -r $data/train-images-idx3-ubyte.gz ]]; then
    echo "skipped: Fashion-MNIST is not installed (dataset-fashion-mnist)"
    exit 77
fi
run_inside_cluster 3 280 "$ctlaunch" "$fmnist" "$python"
