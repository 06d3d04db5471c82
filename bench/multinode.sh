#!/usr/bin/env bash
# The multinode benchmark's measurements, run by ci/bench.sh multinode
# inside a test cluster of two hosts (ci/cluster.sh run, which sets
# CT_CLUSTER_STATE and CT_CLUSTER_SUBNET):
#
#   bench/multinode.sh BUILD ROUNDS SHAPE SECONDS PYTHON...
#
# In each of ROUNDS rounds, 2 hosts x 2 ranks sweep a float32 sum allreduce
# from 64 KiB to 64 MiB, in turn: ct's flat gloo communicator and its
# hierarchical one (each host under its own ctlaunch; then fmnist_mlp for
# 500 steps and gpt for 30 on each, "run": "fmnist_gloo", "gpt_auto"...,
# where their data is installed), ct's mpi backend
# and Open MPI's own MPI_Allreduce (one mpirun over both hosts, through
# ci/cluster-rsh.sh), and torch.distributed's gloo under each PYTHON that
# has torch (two processes per host, meeting in a file store). SECONDS is
# the time aimed at per size. stdout: the sweeps' JSON lines, each tagged
# with "round", "shape" (SHAPE, the link's description) and "hosts": 2;
# stderr: their tables and notes.
set -euo pipefail

build=${1:?usage: multinode.sh BUILD ROUNDS SHAPE SECONDS PYTHON...}
rounds=${2:?}
shape=${3:?}
seconds=${4:?}
shift 4
pythons=("$@")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cluster=$root/ci/cluster.sh
bench=$build/bench/bench_collectives
sweep=(--ops allreduce -b 64K -e 64M -f 2 --seconds "$seconds")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$tmp/secret")
printf 'node0 slots=2\nnode1 slots=2\n' >"$tmp/hostfile"
port=29600
fmnist_data=/usr/share/datasets/fashion-mnist
fortunes=/usr/share/games/fortunes

# Tags the JSON lines of rank 0 (ctlaunch prefixes them) with the round
# and the shape.
tag() {
    sed -u -n -e 's/^\[rank 0\] //' \
        -e "s/^{\"bench\": \"collectives\", /&\"round\": $1, \"shape\": \"$shape\", \"hosts\": 2, /p"
}

# Runs the command on node1 and node0 at once, @K@ in its words becoming
# the node's index, with outputs in $tmp/NAME<K>.out and .err; the status
# of the last that failed.
both() {
    local name=$1 k pids=() rc=0
    shift
    for k in 1 0; do
        "$cluster" exec "node$k" "${@//@K@/$k}" >"$tmp/$name$k.out" 2>"$tmp/$name$k.err" &
        pids+=($!)
    done
    for k in "${pids[@]}"; do
        wait "$k" || rc=$?
    done
    return "$rc"
}

# ct on both hosts, each under its own ctlaunch (2 ranks): CT_BACKEND=$1,
# the program and its arguments after it; node0's output on stdout.
ct_nodes() {
    local backend=$1
    shift
    port=$((port + 1))
    if ! both ct env CT_NUM_THREADS=1 CT_BACKEND="$backend" timeout -k 5 300 \
        "$build/launcher/ctlaunch" -np 2 --nnodes 2 --node-rank @K@ --master "node0:$port" \
        --secret-file "$tmp/secret" "$@"; then
        echo "multinode.sh: ct ($backend, ${1##*/}) failed:" >&2
        tail -n 20 "$tmp/ct0.err" "$tmp/ct1.err" >&2
        return 1
    fi
    cat "$tmp/ct0.out"
}

# Training on 2 x 2 ranks: rank 0's summary line (the last JSON line),
# tagged with the run's name, the round and the shape.
train() {
    local run=$1 round=$2
    shift 2
    ct_nodes "$@" | sed -n 's/^\[rank 0\] {/{/p' | tail -n 1 |
        sed -u "s/^{\"bench\": \"[a-z_]*\", /&\"run\": \"$run\", \"round\": $round, \"shape\": \"$shape\", \"hosts\": 2, /"
}

mpi() {
    "$cluster" exec node0 timeout -k 5 300 mpirun --allow-run-as-root --hostfile "$tmp/hostfile" \
        -np 4 --mca plm_rsh_agent "$root/ci/cluster-rsh.sh" --mca btl tcp,vader,self \
        --mca btl_tcp_if_include "$CT_CLUSTER_SUBNET" --mca oob_tcp_if_include "$CT_CLUSTER_SUBNET" \
        -x CT_NUM_THREADS=1 "$@"
}

# torch.distributed's gloo: two processes on each host, one world of 4.
torch_gloo() {
    local rc=0
    rm -rf "$tmp/store"
    mkdir "$tmp/store"
    both gloo timeout -k 5 300 "$1" "$root/bench/collectives_gloo.py" -b 64K -e 64M -f 2 \
        --seconds "$seconds" --ranks 2 --nodes 2 --node-rank @K@ --store "$tmp/store/file" \
        --iface eth0 || rc=$?
    cat "$tmp/gloo0.out"
    cat "$tmp/gloo0.err" >&2
    return "$rc"
}

failed=0
for ((round = 1; round <= rounds; round++)); do
    echo "multinode.sh: $shape, round $round of $rounds" >&2
    ct_nodes gloo "$bench" "${sweep[@]}" | tag "$round" || failed=1
    ct_nodes auto "$bench" "${sweep[@]}" | tag "$round" || failed=1
    for backend in gloo auto; do
        if [[ -r $fmnist_data/train-images-idx3-ubyte.gz ]]; then
            train "fmnist_$backend" "$round" "$backend" "$build/examples/fmnist_mlp" \
                --max-steps 520 --warmup-steps 20 --metrics "" --threads 1 --data "$fmnist_data" ||
                failed=1
        fi
        if [[ -d $fortunes ]]; then
            train "gpt_$backend" "$round" "$backend" "$build/examples/gpt" --steps 30 --bench \
                --metrics "" --eval-every 0 --threads 1 || failed=1
        fi
    done
    if command -v mpirun >/dev/null && [[ -x $build/bench/bench_mpi_allreduce ]]; then
        mpi -x CT_BACKEND=mpi "$bench" "${sweep[@]}" | tag "$round" || failed=1
        mpi "$build/bench/bench_mpi_allreduce" -b 64K -e 64M -f 2 --seconds "$seconds" |
            tag "$round" || failed=1
    fi
    for python in "${pythons[@]}"; do
        if "$python" -c 'import torch' 2>/dev/null; then
            torch_gloo "$python" | tag "$round" || failed=1
        fi
    done
done
exit "$failed"
