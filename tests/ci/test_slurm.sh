#!/usr/bin/env bash
# test_slurm: ct under a real Slurm on this machine. It starts slurmctld and
# slurmd of its own (Debian's slurm-wlm; a configuration of its own in a
# temporary directory, on free ports, auth/none, so nothing outside the
# test is touched), then runs ctlaunch_rank's "dist" mode (ct_dist_init, an
# allreduce of rank + 1, finalize):
#
#   srun -n 2 --mpi=none       one world of 2, met at the step's first host
#                              without PMI (shm: one node)
#   sbatch -n 2 --wait         a batch script that runs the rank program
#                              itself (a world of one: the script is one
#                              process) and then srun -n 2 (a world of 2)
#   srun -n 2 --mpi=pmix       with MPI and Slurm's PMIx plugin: MPI brings
#                              the ranks together, in one world of 2 (left
#                              out where either is missing)
#
#   test_slurm.sh RANK_PROGRAM [MPI:0|1]
#
# Exits 77 (skipped) without slurm-wlm, or where slurmd cannot start (not
# root, no such daemons allowed).
set -euo pipefail

usage="usage: test_slurm.sh RANK_PROGRAM [MPI]"
rank_program=${1:?$usage}
mpi=${2:-0}
for tool in slurmctld slurmd srun sbatch sinfo; do
    if ! command -v "$tool" >/dev/null; then
        echo "skipped: no $tool (slurm-wlm is not installed; ci/setup.sh installs it)"
        exit 77
    fi
done
if ((EUID != 0)); then
    echo "skipped: slurmd needs root here"
    exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_slurm.XXXXXX")
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT

# free_ports; this test's own fail, below, replaces the shared one, to show
# the daemons' logs too.
# shellcheck source=tests/ci/common.sh
source "$(dirname "$0")/common.sh"

fail() {
    echo "FAIL: $*" >&2
    for f in "$tmp"/*.out "$tmp"/*.log; do
        [[ -e $f ]] && { echo "--- $(basename "$f")"; tail -n 30 "$f"; } >&2
    done
    exit 1
}

# Free TCP ports for the two daemons.
ctld_port=$(free_ports 2)
slurmd_port=$((ctld_port + 1))
# The node is this host, under a name that resolves, as the ranks need
# for the step's first host.
node=$(hostname -s)
if ! getent hosts "$node" >/dev/null; then
    node=localhost
fi
cpus=$(nproc)
mkdir -p "$tmp/state" "$tmp/spool"
export SLURM_CONF=$tmp/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=cttest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=ct Nodes=$node Default=YES MaxTime=10 State=UP OverSubscribe=YES
EOF

slurmctld -D -i -f "$SLURM_CONF" >"$tmp/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$node" >"$tmp/slurmd.out" 2>&1 &
pids+=($!)
# Until the node is idle (registered), at most 30 s.
for ((i = 0; i < 300; i++)); do
    state=$(sinfo -h -n "$node" -o %t 2>/dev/null || true)
    [[ $state == idle ]] && break
    if ! kill -0 "${pids[0]}" 2>/dev/null || ! kill -0 "${pids[1]}" 2>/dev/null; then
        echo "skipped: slurmctld or slurmd could not start here:"
        tail -n 5 "$tmp/slurmctld.out" "$tmp/slurmd.out" "$tmp"/*.log 2>/dev/null || true
        exit 77
    fi
    sleep 0.1
done
[[ $state == idle ]] || fail "the node did not come up in 30 s (state '$state')"
echo "ok   slurmctld and slurmd up: node $node, $cpus CPUs"

export CT_TIMEOUT=30
# Every task of the output $1 printed one world of $2 ranks on backend $3.
check_world() {
    local out=$1 n=$2 backend=$3 r
    for ((r = 0; r < n; r++)); do
        grep -q "^dist rank=$r size=$n local=$r/$n backend=$backend sum=$((n * (n + 1) / 2)) " \
            "$out" || fail "$(basename "$out"): rank $r did not join one world of $n on $backend"
    done
}

timeout 120 srun -n 2 --mpi=none "$rank_program" dist >"$tmp/srun.out" 2>&1 ||
    fail "srun -n 2 --mpi=none exited $?"
check_world "$tmp/srun.out" 2 shm
echo "ok   srun -n 2 --mpi=none: one world of 2 without PMI"

cat >"$tmp/job.sh" <<EOF
#!/bin/sh
env >"$tmp/batch-env.out"
"$rank_program" dist >"$tmp/batch-alone.out" 2>&1
srun --mpi=none "$rank_program" dist >"$tmp/batch-srun.out" 2>&1
EOF
timeout 120 sbatch -n 2 --wait -o "$tmp/sbatch.out" "$tmp/job.sh" >/dev/null ||
    fail "sbatch --wait exited $?"
# The script sees the allocation's task count: ct must not take it for a
# world of 2.
grep -qx "SLURM_NTASKS=2" "$tmp/batch-env.out" || fail "the batch script has no SLURM_NTASKS=2"
check_world "$tmp/batch-alone.out" 1 shm
check_world "$tmp/batch-srun.out" 2 shm
echo "ok   sbatch -n 2: the script alone is a world of one, its srun a world of 2"

if ((mpi)) && srun --mpi=list 2>&1 | grep pmix >/dev/null; then
    n=$(timeout 60 srun -n 2 --mpi=pmix env | grep -c "^PMIX_RANK=" || true)
    ((n == 2)) || fail "srun --mpi=pmix: $n of 2 tasks have PMIX_RANK"
    # Open MPI leaks at exit by design; the leak check is off for this run
    # alone, as for the other MPI tests.
    ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 timeout 120 \
        srun -n 2 --mpi=pmix "$rank_program" dist >"$tmp/pmix.out" 2>&1 ||
        fail "srun -n 2 --mpi=pmix exited $?"
    check_world "$tmp/pmix.out" 2 shm
    echo "ok   srun -n 2 --mpi=pmix: one world of 2 through MPI"
else
    echo "skip srun --mpi=pmix: $( ((mpi)) && echo "Slurm has no pmix plugin" || echo "no MPI in this build")"
fi
echo "test_slurm: all passed"
