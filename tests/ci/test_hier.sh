#!/usr/bin/env bash
# test_hier: hierarchical collectives (shm within a machine, gloo across
# machines) on a job of two ctlaunch nodes on this machine (loopback), each
# node its own machine for ct: coll_rank's scenarios on 2 nodes x 2 ranks
# (and the correctness one on 2 x 3), the same checks they make on the flat
# backends; and ctlaunch_rank's dist mode, which must report backend=hier.
#
#   test_hier.sh CTLAUNCH COLL_RANK CTLAUNCH_RANK
#
# Exits 77 (skipped) in a build without gloo.
set -euo pipefail

ctlaunch=${1:?usage: test_hier.sh CTLAUNCH COLL_RANK CTLAUNCH_RANK}
coll_rank=${2:?}
dist_rank=${3:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/ci/common.sh
source "$(dirname "$0")/common.sh"
for v in CT_BACKEND CT_RANK CT_WORLD_SIZE RANK WORLD_SIZE MASTER_ADDR MASTER_PORT SLURM_PROCID \
    SLURM_STEP_ID OMPI_COMM_WORLD_RANK PMI_RANK PMIX_RANK; do
    unset "$v"
done
# Two nodes span machines for ct: they need a job secret, and their gloo
# connections may bind loopback only because both nodes are here.
export CT_JOB_SECRET=test-hier-secret-0123456789abcdef CT_BIND_ADDR=127.0.0.1

# Runs PROGRAM ARG on 2 nodes of NP ranks each, within 90 s; the nodes'
# outputs go to $tmp/NAME.K.out, their launchers' exit codes to codes.
codes=()
run_nodes() {
    local name=$1 np=$2 program=$3 arg=$4 port k pids=()
    port=$(free_ports 1)
    for k in 0 1; do
        timeout 90 "$ctlaunch" --nnodes 2 --node-rank "$k" --master "127.0.0.1:$port" -np "$np" \
            --grace 20 "$program" "$arg" >"$tmp/$name.$k.out" 2>&1 &
        pids+=($!)
    done
    for k in 0 1; do
        codes[k]=0
        wait "${pids[k]}" || codes[k]=$?
    done
}

# Every rank of the job but SKIP (-1: none) passed SCENARIO, and without a
# SKIP (a rank that dies) both launchers exited 0: a sanitizer's report at
# a rank's exit fails it.
check_passed() {
    local name=$1 n=$2 scenario=$3 skip=$4 r
    if ((skip < 0 && (codes[0] || codes[1]))); then
        fail "$name: the launchers exited ${codes[0]} and ${codes[1]}"
    fi
    for ((r = 0; r < n; r++)); do
        ((r == skip)) && continue
        grep -q "^\[rank $r\] ok   $scenario" "$tmp/$name".*.out ||
            fail "$name: rank $r did not pass $scenario"
    done
}

run_nodes dist 2 "$dist_rank" dist
if grep -q "no gloo\|has no gloo" "$tmp"/dist.*.out; then
    echo "skipped: this build has no gloo backend"
    exit 77
fi
for r in 0 1 2 3; do
    grep -q "dist rank=$r size=4 local=$((r % 2))/2 backend=hier sum=10 " "$tmp"/dist.*.out ||
        fail "dist: rank $r did not join one world of 4 on the hierarchical backend"
done
echo "ok   2 nodes x 2 ranks: auto picks the hierarchical backend"

run_nodes correct2 2 "$coll_rank" correctness
check_passed correct2 4 correctness -1
echo "ok   every operation on 2 nodes x 2 ranks"
run_nodes correct3 3 "$coll_rank" correctness
check_passed correct3 6 correctness -1
echo "ok   every operation on 2 nodes x 3 ranks"

# The failure scenarios: the victim (the last rank) is on the second node,
# so every failure crosses machines; the others report what flat backends
# do (coll_rank.c checks the codes, the names and the times).
for scenario in peer_killed count_mismatch dtype_mismatch op_mismatch late_rank stuck_peer; do
    skip=-1
    [[ $scenario == peer_killed ]] && skip=3
    run_nodes "$scenario" 2 "$coll_rank" "$scenario"
    check_passed "$scenario" 4 "$scenario" "$skip"
    echo "ok   $scenario on 2 nodes x 2 ranks"
done
echo "test_hier: all passed"
