#!/usr/bin/env bash
# test_ctlaunch_cluster: ctlaunch on two hosts of the test cluster
# (ci/cluster.sh), `--nnodes 2 --node-rank K --master node0:PORT`, one rank
# on each, with a shared secret file, as docs/launcher.md shows. It runs,
# for real:
#
#   coll_rank across_hosts  auto picks gloo, each rank is alone on its
#                           machine, a 12 MiB allreduce is right
#   coll_rank correctness   every operation, dtype and size over gloo, and
#                           again with 2 ranks on each host (hierarchical)
#   fmnist_mlp, gpt         100 and 12 steps data-parallel across the hosts:
#                           the same losses, to the last digit printed, as
#                           `ctlaunch -np 2` on one machine at the same
#                           global batch (two ranks' sums are exact in any
#                           order, so the backends agree bit for bit)
#
# env:// by hand with 2 ranks on node0 and 1 on node1 (ctlaunch_rank
# dist): machines of different sizes, so auto keeps flat gloo on every rank
# alike, and CT_BACKEND=hier is refused on every rank, naming the sizes;
# and, where torchrun is installed, `torchrun --nnodes 2 --node_rank K
# --master_addr node0 --no_python` on each host, coll_rank across_hosts
# again (one world of 2 on gloo, the secret in CT_SECRET_FILE); it proves
# each time where the ranks ran and that node1's link carried the job
# (tests/ci/cluster_checks.sh).
#
#   test_ctlaunch_cluster.sh CTLAUNCH COLL_RANK DIST_RANK [FMNIST_MLP GPT TORCHRUN]
#
# Exits 77 (skipped) where the cluster cannot be made, or when CT_TEST_GLOO
# is not ON (a build without gloo); without Fashion-MNIST or fortunes that
# run is left out.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../../ci/cluster.sh
usage="usage: test_ctlaunch_cluster.sh CTLAUNCH COLL_RANK DIST_RANK [FMNIST_MLP GPT TORCHRUN]"
ctlaunch=${1:?$usage}
coll_rank=${2:?$usage}
dist_rank=${3:?$usage}
fmnist=${4:-}
gpt=${5:-}
torchrun=${6:-}
data=/usr/share/datasets/fashion-mnist
fortunes=/usr/share/games/fortunes
port=29512
# shellcheck source=tests/ci/cluster_checks.sh
source "$here/cluster_checks.sh"

# Runs argv on node0 and node1, each under its own ctlaunch (node 0 hosts
# the store), within 120 s; both launchers' output goes to $tmp/out, and
# the checks of where the ranks ran are made.
across() {
    local before rc0=0 rc1=0 pid
    before=$(eth0_bytes)
    on node1 timeout -k 5 120 "$ctlaunch" -np "$ranks_per_host" --nnodes 2 --node-rank 1 --master "node0:$port" \
        --secret-file "$tmp/secret" "$here/whereami.sh" "$@" >"$tmp/out1" 2>&1 &
    pid=$!
    on node0 timeout -k 5 120 "$ctlaunch" -np "$ranks_per_host" --nnodes 2 --node-rank 0 --master "node0:$port" \
        --secret-file "$tmp/secret" "$here/whereami.sh" "$@" >"$tmp/out" 2>&1 || rc0=$?
    wait "$pid" || rc1=$?
    cat "$tmp/out1" >>"$tmp/out"
    if ((rc0 != 0 || rc1 != 0)); then
        tail -n 40 "$tmp/out" >&2
        fail "ctlaunch ${*##*/} exited $rc0 on node0 and $rc1 on node1"
    fi
    ranks_ran_on_both_hosts
    crossed_the_link "$before"
}

# As across, under a torchrun on each of node0 and node1 (static
# rendezvous: node0's agent serves torchrun's store on the port, ct's store
# takes the next one). Debian's torchrun (torch 1.13 on Python 3.11) fails
# to parse its own default for --redirects, which is therefore given.
across_torchrun() {
    local before rc0=0 rc1=0 pid k
    before=$(eth0_bytes)
    for k in 1 0; do
        on "node$k" env CT_SECRET_FILE="$tmp/secret" timeout -k 5 120 "$torchrun" --nnodes 2 \
            --node_rank "$k" --nproc_per_node 1 --master_addr node0 --master_port "$((port + 10))" \
            --redirects 1 --tee 1 --no_python "$here/whereami.sh" "$@" >"$tmp/out$k" 2>&1 &
        pid[k]=$!
    done
    wait "${pid[0]}" || rc0=$?
    wait "${pid[1]}" || rc1=$?
    # torchrun's tee prefixes each line of local rank N with "[defaultN]:".
    sed -E 's/^\[default[0-9]+\]://' "$tmp/out0" "$tmp/out1" >"$tmp/out"
    if ((rc0 != 0 || rc1 != 0)); then
        tail -n 40 "$tmp/out" >&2
        fail "torchrun ${*##*/} exited $rc0 on node0 and $rc1 on node1"
    fi
    ranks_ran_on_both_hosts
    crossed_the_link "$before"
}

# Ranks 0 and 1 on node0 and rank 2 on node1 under env:// (set by hand,
# with each host's LOCAL_WORLD_SIZE), the variables that follow added:
# ctlaunch_rank's dist mode, its outputs in $tmp/uneven.R; the number of
# ranks that failed.
uneven() {
    local r host pids=() failed=0
    for r in 0 1 2; do
        host=node$((r / 2))
        on "$host" env RANK=$r WORLD_SIZE=3 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=$((2 - r / 2)) \
            MASTER_ADDR=node0 MASTER_PORT=$((port + 20)) CT_SECRET_FILE="$tmp/secret" "$@" \
            timeout -k 5 60 "$dist_rank" dist >"$tmp/uneven.$r" 2>&1 &
        pids+=($!)
    done
    for r in 0 1 2; do
        wait "${pids[r]}" || failed=$((failed + 1))
    done
    return "$failed"
}

# argv's output on one machine, two ranks under one ctlaunch, into $tmp/one.
alone() {
    "$ctlaunch" -np 2 "$@" >"$tmp/one" 2>&1 || fail "ctlaunch -np 2 ${*##*/} exited $?: $(tail -n 20 "$tmp/one")"
}

# The metrics file of the run across the hosts ($1) and of the one on one
# machine ($2) hold the same losses; $3 names the run.
same_losses() {
    local a b
    a=$(grep -oE '"(loss|train_loss|val_loss)": ?[-0-9.e]+' "$1") || true
    b=$(grep -oE '"(loss|train_loss|val_loss)": ?[-0-9.e]+' "$2") || true
    [[ -n $a ]] || fail "$3: no loss in $1: $(head -c 400 "$1")"
    [[ $a == "$b" ]] || fail "$3: the losses across the hosts differ from one machine's:
$(diff <(echo "$a") <(echo "$b") | head -n 10)"
    echo "  $3: $(echo "$a" | wc -l) losses equal to one machine's, the last $(echo "$a" | tail -n 1)"
}

inside() {
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/secret"
    chmod 600 "$tmp/secret"

    across "$coll_rank" across_hosts
    ranks_passed across_hosts
    echo "ok   coll_rank across_hosts"

    across "$coll_rank" correctness
    ranks_passed correctness
    echo "ok   coll_rank correctness"

    # Two ranks on each host: auto picks the hierarchical communicator
    # (shm within each host, gloo across; test_hier checks the choice),
    # every operation again.
    ranks_per_host=2 across "$coll_rank" correctness
    ranks_per_host=2 ranks_passed correctness
    echo "ok   coll_rank correctness on 2 hosts x 2 ranks (hierarchical)"

    uneven || fail "env:// with 2 ranks on node0 and 1 on node1: $? ranks failed: $(cat "$tmp"/uneven.*)"
    for r in 0 1 2; do
        grep -q "^dist rank=$r size=3 local=$((r % 2))/$((2 - r / 2)) backend=gloo sum=6 " "$tmp/uneven.$r" ||
            fail "uneven machines: rank $r is not in one world of 3 on flat gloo: $(cat "$tmp/uneven.$r")"
    done
    echo "ok   machines of 2 and 1 ranks: auto keeps flat gloo"
    if uneven CT_BACKEND=hier; then
        fail "CT_BACKEND=hier on machines of 2 and 1 ranks succeeded"
    fi
    for r in 0 1 2; do
        grep -q "different numbers of ranks (2 on rank 0's, 1 on rank 2's)" "$tmp/uneven.$r" ||
            fail "CT_BACKEND=hier on uneven machines: rank $r did not say why: $(cat "$tmp/uneven.$r")"
    done
    echo "ok   machines of 2 and 1 ranks: CT_BACKEND=hier refused, naming the sizes"

    if [[ -z $fmnist ]]; then
        echo "  no fmnist_mlp in this build: its run is left out"
    elif [[ ! -r $data/train-images-idx3-ubyte.gz ]]; then
        echo "  Fashion-MNIST is not installed (dataset-fashion-mnist): the fmnist_mlp run is left out"
    else
        local args=(--epochs 1 --max-steps 100 --threads 1 --data "$data")
        across "$fmnist" "${args[@]}" --metrics "$tmp/fmnist.jsonl"
        alone "$fmnist" "${args[@]}" --metrics "$tmp/fmnist1.jsonl"
        same_losses "$tmp/fmnist.jsonl" "$tmp/fmnist1.jsonl" fmnist_mlp
        echo "ok   fmnist_mlp"
    fi

    if [[ -z $gpt ]]; then
        echo "  no gpt in this build: its run is left out"
    elif [[ ! -d $fortunes ]]; then
        echo "  fortunes is not installed: the gpt run is left out"
    else
        local args=(--layers 2 --heads 2 --width 32 --context 32 --batch 8 --steps 12 --eval-every 0
            --sample-tokens 0 --log-every 1 --threads 1)
        # The tiny model's 12 steps of gradients: about 1.6 MB each way.
        min_bytes=1000000 across "$gpt" "${args[@]}" --metrics "$tmp/gpt.jsonl"
        alone "$gpt" "${args[@]}" --metrics "$tmp/gpt1.jsonl"
        same_losses "$tmp/gpt.jsonl" "$tmp/gpt1.jsonl" gpt
        echo "ok   gpt"
    fi

    if [[ -z $torchrun ]]; then
        echo "  no torchrun (python3-torch): its run is left out"
    else
        across_torchrun "$coll_rank" across_hosts
        ranks_passed across_hosts
        echo "ok   torchrun: coll_rank across_hosts"
    fi
}

if [[ ${7:-} == --inside ]]; then
    tmp=$8
    inside
    exit
fi

if [[ ${CT_TEST_GLOO:-ON} != ON ]]; then
    echo "skipped: this build has no gloo backend (libgloo-dev was not found), which ranks across hosts need"
    exit 77
fi
run_inside_cluster 2 400 "$ctlaunch" "$coll_rank" "$dist_rank" "$fmnist" "$gpt" "$torchrun"
