#!/usr/bin/env bash
# test_mpirun_cluster: mpirun across two hosts of the test cluster
# (ci/cluster.sh), one rank on each, started through the rsh agent that
# enters a host's namespace in ssh's place (ci/cluster-rsh.sh), with Open
# MPI's TCP transport held to the cluster's subnet. It runs, for real:
#
#   coll_rank across_hosts  auto picks mpi, MPI sees one rank per machine,
#                           a 12 MiB allreduce is right
#   coll_rank correctness   every operation, dtype and size, as on one machine
#   fmnist_mlp              200 steps data-parallel: the loss falls
#
# and proves each time that rank 0 ran on node0 and rank 1 on node1: each
# rank's own process reports (tests/ci/whereami.sh) its network namespace,
# which must be that host's (and the two differ), and the address on its
# eth0; and node1's eth0 counts the job's bytes both ways, so the
# collectives crossed the link.
#
#   test_mpirun_cluster.sh MPIRUN COLL_RANK [FMNIST_MLP]
#
# Exits 77 (skipped) without Open MPI (MPIRUN "") or where the cluster
# cannot be made; without Fashion-MNIST the fmnist_mlp run is left out.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../../ci/cluster.sh
rsh=$here/../../ci/cluster-rsh.sh
mpirun=${1?usage: test_mpirun_cluster.sh MPIRUN COLL_RANK [FMNIST_MLP]}
coll_rank=${2:?usage: test_mpirun_cluster.sh MPIRUN COLL_RANK [FMNIST_MLP]}
fmnist=${3:-}
data=/usr/share/datasets/fashion-mnist
# shellcheck source=tests/ci/cluster_checks.sh
source "$here/cluster_checks.sh"

# Runs the rank program (argv) on node0 and node1 under mpirun (from node0,
# as a user on the head node would), within 120 s; its output goes to
# $tmp/out, and the checks of where the ranks ran are made.
mpi() {
    local vars=() v
    # The agent gives each host a login's environment, as ssh would: what
    # the ranks need goes with -x (the sanitizers' options, from ctest).
    for v in ASAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS; do
        [[ -z ${!v:-} ]] || vars+=(-x "$v")
    done
    local before rc=0
    before=$(eth0_bytes)
    on node0 timeout -k 5 120 "$mpirun" --allow-run-as-root --hostfile "$tmp/hostfile" -np 2 --map-by node \
        --mca plm_rsh_agent "$rsh" --mca btl tcp,self \
        --mca btl_tcp_if_include "$CT_CLUSTER_SUBNET" --mca oob_tcp_if_include "$CT_CLUSTER_SUBNET" \
        "${vars[@]}" "$here/whereami.sh" "$@" >"$tmp/out" 2>&1 || rc=$?
    if ((rc != 0)); then
        tail -n 40 "$tmp/out" >&2
        fail "mpirun ${*##*/} exited $rc"
    fi
    ranks_ran_on_both_hosts
    crossed_the_link "$before"
}

inside() {
    printf 'node0 slots=1\nnode1 slots=1\n' >"$tmp/hostfile"

    mpi "$coll_rank" across_hosts
    ranks_passed across_hosts
    echo "ok   coll_rank across_hosts"

    mpi "$coll_rank" correctness
    ranks_passed correctness
    echo "ok   coll_rank correctness"

    if [[ -z $fmnist ]]; then
        echo "  no fmnist_mlp in this build: its run is left out"
    elif [[ ! -r $data/train-images-idx3-ubyte.gz ]]; then
        echo "  Fashion-MNIST is not installed (dataset-fashion-mnist): the fmnist_mlp run is left out"
    else
        mpi "$fmnist" --epochs 1 --max-steps 200 --metrics "$tmp/metrics.jsonl" --data "$data"
        # The summary says 2 ranks; the loss of step 100 (a single batch's)
        # is under half that of step 0, and the test accuracy above 60 %
        # (a model that did not learn gets 10 %).
        grep -q '"bench": "train".*"ranks": 2,' "$tmp/out" ||
            fail "fmnist_mlp's summary does not say 2 ranks: $(tail -n 3 "$tmp/out")"
        awk -F'[:,]' '/"step":0,/ {first = $6} /"step":100,/ {later = $6}
                      /"test_acc"/ {for (i = 1; i < NF; i++) if ($i ~ /test_acc/) acc = $(i + 1)}
                      END {printf "  fmnist_mlp: loss %s at step 0, %s at step 100, test accuracy %s\n",
                                  first, later, acc
                           exit !(first > 0 && later < first / 2 && acc > 0.6)}' "$tmp/metrics.jsonl" ||
            fail "fmnist_mlp did not train: $(cat "$tmp/metrics.jsonl")"
        echo "ok   fmnist_mlp"
    fi
}

if [[ ${4:-} == --inside ]]; then
    tmp=$5
    inside
    exit
fi

if [[ -z $mpirun || ! -x $mpirun ]]; then
    echo "skipped: this build has no Open MPI (mpirun '$mpirun')"
    exit 77
fi
run_inside_cluster 2 400 "$mpirun" "$coll_rank" "$fmnist"
