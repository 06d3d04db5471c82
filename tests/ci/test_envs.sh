#!/usr/bin/env bash
# test_envs: the worlds ct forms where no launcher of ct's started the
# ranks, with real processes on this machine (ctlaunch_rank's "dist" mode:
# ct_dist_init, an allreduce of rank + 1, finalize):
#
#   env://      RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by hand (as
#               Kubernetes' PyTorchJob does, without LOCAL_*): one world of
#               2 on shm, the machine found by the check-in, the job's
#               secret from rank 0's private file (also over a stale file
#               of a crashed job, and removed at the end)
#   torchrun    `torchrun --nproc_per_node 2 --no_python RANK dist`: one
#               world of 2 beside torchrun's own store (skipped without
#               torchrun)
#   Slurm       a step's variables without PMI: one world at the step's
#               first host, on the port from the job and step ids
#   refusals    a rank claimed twice (every process fails at once, one naming
#               it), ranks across machines without a secret, env:// by hand
#               that disagrees with the Slurm step's world, and, with MPI,
#               Slurm's world of 2 where MPI's PMI sees 1
#
#   test_envs.sh RANK_PROGRAM [TORCHRUN] [MPI:0|1]
set -euo pipefail

usage="usage: test_envs.sh RANK_PROGRAM [TORCHRUN] [MPI]"
rank_program=${1:?$usage}
torchrun=${2:-}
mpi=${3:-0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Secret files go under a private directory of this test's own.
export XDG_RUNTIME_DIR=$tmp/run
mkdir -m 700 "$XDG_RUNTIME_DIR"
export CT_TIMEOUT=20
launcher_vars=(CT_RANK CT_WORLD_SIZE CT_LOCAL_RANK CT_LOCAL_WORLD_SIZE CT_MASTER_ADDR
    CT_MASTER_PORT CT_JOB_SECRET CT_SECRET_FILE CT_BACKEND RANK WORLD_SIZE LOCAL_RANK
    LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK
    PMI_SIZE PMIX_RANK SLURM_PROCID SLURM_NTASKS SLURM_STEP_ID SLURM_JOB_ID)
for v in "${launcher_vars[@]}"; do
    unset "$v"
done
# shellcheck source=tests/ci/common.sh
source "$(dirname "$0")/common.sh"
# Each part takes free ports of its own: two, as torchrun's agent store
# takes one and ct's the next.
port=$(free_ports 2)

# Runs the rank program's dist mode as N processes, rank R with the
# variables "$R" expands in the arguments ("VAR=value" words, @R@ becoming
# the rank), each within 60 s; outputs in $tmp/NAME.R.out. Returns the
# number of processes that failed.
run_ranks() {
    local name=$1 n=$2 r failed=0
    shift 2
    local pids=()
    for ((r = 0; r < n; r++)); do
        env "${@//@R@/$r}" timeout 60 "$rank_program" dist >"$tmp/$name.$r.out" 2>&1 &
        pids+=($!)
    done
    for r in "${!pids[@]}"; do
        wait "${pids[r]}" || failed=$((failed + 1))
    done
    return "$failed"
}

# Every rank of $1 printed the same world of $2 ranks on backend $3.
check_world() {
    local name=$1 n=$2 backend=$3 r
    for ((r = 0; r < n; r++)); do
        grep -q "^dist rank=$r size=$n local=[0-9]*/$n backend=$backend sum=$((n * (n + 1) / 2)) " \
            "$tmp/$name.$r.out" || fail "$name: rank $r did not join one world of $n on $backend"
    done
}

# --- env:// by hand, on one machine
env_vars=(RANK=@R@ WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port)
run_ranks env 2 "${env_vars[@]}" || fail "env://: a rank failed"
check_world env 2 shm
secret_file=$XDG_RUNTIME_DIR/ct/job-$port-0.secret
[[ ! -e $secret_file ]] || fail "env://: rank 0 left its secret file behind"
echo "ok   env:// by hand: one world of 2 on shm"

# A crashed job's file on the same port: rank 0 replaces it, and a rank
# that read the old one reads again. Rank 1 starts a second early, so that
# it reads the old one and waits for the store with it.
printf 'stale-secret-of-a-crashed-job\n' >"$secret_file"
chmod 600 "$secret_file"
env "${env_vars[@]//@R@/1}" timeout 60 "$rank_program" dist >"$tmp/stale.1.out" 2>&1 &
stale_pid=$!
sleep 1
env "${env_vars[@]//@R@/0}" timeout 60 "$rank_program" dist >"$tmp/stale.0.out" 2>&1 ||
    fail "env:// over a stale secret file: rank 0 failed"
wait "$stale_pid" || fail "env:// over a stale secret file: rank 1 failed"
check_world stale 2 shm
grep -q "refused a connection.*wrong job secret" "$tmp/stale.0.out" ||
    fail "env:// over a stale secret file: rank 1 did not try the stale secret first"
echo "ok   env:// over a crashed job's secret file"

# --- torchrun, whose agent serves its own store on MASTER_PORT
if [[ -n $torchrun ]]; then
    port=$(free_ports 2)
    timeout 120 "$torchrun" --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 \
        --master_port "$port" --redirects 1 --tee 1 --no_python "$rank_program" dist \
        >"$tmp/torchrun.out" 2>&1 || fail "torchrun: failed"
    for r in 0 1; do
        grep -q "dist rank=$r size=2 local=$r/2 backend=shm sum=3 " "$tmp/torchrun.out" ||
            fail "torchrun: rank $r did not join one world of 2"
    done
    echo "ok   torchrun --nproc_per_node 2: one world of 2"
else
    echo "skip torchrun: not installed (python3-torch)"
fi

# --- a Slurm step without PMI: the step's first host, a port from the ids
# A job id whose derived port (ct's rule, docs/multinode.md) is free.
used=$(ports_in_use)
for ((job = 1000 + $$ % 1000, tries = 0; tries < 1000; job++, tries++)); do
    [[ $used == *" $((15000 + job % 1000 * 10 + 1)) "* ]] || break
done
slurm_vars=(SLURM_JOB_ID=$job SLURM_STEP_ID=1 SLURM_PROCID=@R@ SLURM_LOCALID=@R@ SLURM_NTASKS=2
    SLURM_STEP_NODELIST=localhost SLURM_STEP_NUM_NODES=1)
run_ranks slurm 2 "${slurm_vars[@]}" || fail "Slurm without PMI: a rank failed"
check_world slurm 2 shm
echo "ok   Slurm step without PMI: one world of 2 at port $((15000 + job % 1000 * 10 + 1))"

# --- refusals
# Ranks 0, 1 and 1 of 3: the second claim of rank 1 fails, and the two
# others, whose world cannot form, are told at once.
port=$(free_ports 2)
start=$SECONDS
twice_failed=0
run_ranks twice 2 RANK=@R@ WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port &
twice_pid=$!
env RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$rank_program" dist \
    >"$tmp/twice.2.out" 2>&1 || twice_failed=$((twice_failed + 1))
wait "$twice_pid" || twice_failed=$((twice_failed + $?))
((twice_failed == 3)) || fail "a rank claimed twice: $twice_failed of 3 processes failed, not all"
((SECONDS - start < CT_TIMEOUT)) || fail "a rank claimed twice took the whole timeout to fail"
grep -q "two processes claim rank 1 of 3" "$tmp"/twice.*.out ||
    fail "a rank claimed twice: no message naming it"
n=$(cat "$tmp"/twice.*.out | grep -c "another rank could not join" || true)
((n == 2)) || fail "a rank claimed twice: $n of the 2 other processes were told"
echo "ok   a rank claimed twice: all three fail at once"

if run_ranks apart 1 RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port; then
    fail "ranks across machines without a secret joined"
fi
grep -q "span machines.*CT_JOB_SECRET or CT_SECRET_FILE" "$tmp/apart.0.out" ||
    fail "ranks across machines without a secret: no message saying to give one"
echo "ok   ranks across machines without a secret: refused"

if run_ranks two 1 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port SLURM_PROCID=1 \
    SLURM_NTASKS=2 SLURM_STEP_ID=0 SLURM_JOB_ID=5; then
    fail "env:// against a Slurm step's other world joined"
fi
grep -q "two worlds: env:// says rank 0 of 2.*Slurm says rank 1 of 2" "$tmp/two.0.out" ||
    fail "env:// against Slurm: no message naming both"
echo "ok   env:// by hand against the Slurm step's world: refused, naming both"

if ((mpi)); then
    # PMI says this is a Slurm task, but MPI (a singleton here, as under
    # srun without a PMI that MPI supports) sees a world of one.
    if run_ranks pmi 1 SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_STEP_ID=0 SLURM_JOB_ID=5 \
        PMI_FD=99; then
        fail "Slurm's world of 2 with MPI's of 1 joined"
    fi
    grep -q "Slurm says rank 1 of 2, but MPI's world has this process as rank 0 of 1" \
        "$tmp/pmi.0.out" || fail "Slurm against MPI: no message naming both"
    echo "ok   Slurm's world of 2 where MPI sees 1: refused, naming both"
fi
echo "test_envs: all passed"
