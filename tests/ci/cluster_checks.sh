# What the cluster tests (test_mpirun_cluster.sh, test_ctlaunch_cluster.sh,
# test_elastic_cluster.sh) check about a job across node0 and node1 of the
# test cluster, sourced by them: where each rank ran (its own process's
# report, tests/ci/whereami.sh) and what crossed node1's link; and how each
# runs itself inside a cluster. The caller sets $cluster (ci/cluster.sh),
# $tmp (the job's output is $tmp/out) and runs inside `cluster.sh run`.

# Bytes that node1's eth0 must count each way in a run: the large allreduce
# alone moves 12 MiB each way, fmnist_mlp's gradients far more (a caller
# sets less for a smaller job).
min_bytes=10000000
# Ranks on each of node0 and node1, numbered host by host (a caller sets
# more for a job of several ranks per host).
ranks_per_host=1

fail() {
    echo "  FAIL: $*" >&2
    return 1
}

on() { "$cluster" exec "$@"; }

eth0_bytes() {
    on node1 cat /sys/class/net/eth0/statistics/rx_bytes /sys/class/net/eth0/statistics/tx_bytes |
        paste -sd' '
}

# node1's eth0 counters before a job (one argument: "RX TX") and after
# it: the job's traffic crossed the link both ways, at least min_bytes.
crossed_the_link() {
    local rx0 tx0 rx1 tx1
    read -r rx0 tx0 <<<"$1"
    read -r rx1 tx1 <<<"$(eth0_bytes)"
    echo "  node1's eth0: $(((rx1 - rx0) / 1000000)) MB in, $(((tx1 - tx0) / 1000000)) MB out"
    ((rx1 - rx0 >= min_bytes && tx1 - tx0 >= min_bytes)) ||
        fail "node1's eth0 carried $((rx1 - rx0)) bytes in and $((tx1 - tx0)) out, not $min_bytes each way"
}

ranks_ran_on_both_hosts() {
    local hosts addrs r line ns
    read -r -a hosts <<<"$CT_CLUSTER_HOSTS"
    read -r -a addrs <<<"$CT_CLUSTER_ADDRS"
    local r h
    for ((r = 0; r < 2 * ranks_per_host; r++)); do
        h=$((r / ranks_per_host))
        line=$(grep -E "^(\[rank $r\] )?whereami rank=$r " "$tmp/out") ||
            fail "rank $r did not say where it ran: $(cat "$tmp/out")"
        ns=$(on "${hosts[h]}" readlink /proc/self/ns/net)
        [[ $line == *" netns=$ns "* ]] || fail "rank $r was not in ${hosts[h]}'s namespace $ns: $line"
        [[ $line == *" host=${hosts[h]} "* && $line == *" addr=${addrs[h]}/24" ]] ||
            fail "rank $r is not ${hosts[h]} at ${addrs[h]}: $line"
        echo "  $line"
    done
    [[ $(on node0 readlink /proc/self/ns/net) != $(on node1 readlink /proc/self/ns/net) ]] ||
        fail "node0 and node1 share a namespace"
}

# Every rank printed the rank harness's "ok   SCENARIO" (at a line's start,
# or after ctlaunch's "[rank R] "), and none FAIL.
ranks_passed() {
    local n want=$((2 * ranks_per_host))
    n=$(grep -cE "^(\[rank [0-9]+\] )?ok   $1\$" "$tmp/out" || true)
    if ((n != want)) || grep -q FAIL "$tmp/out"; then
        fail "$1: $n of $want ranks passed: $(grep -E 'FAIL|ok   ' "$tmp/out" | head -n 20)"
    fi
}

# Runs this script again inside a cluster of $1 hosts (ci/cluster.sh run,
# within $2 s) with the arguments that follow and then "--inside TMP", TMP
# a directory of its own removed afterwards; exits with its code, saying
# why when it is 77 (no cluster can be made here).
run_inside_cluster() {
    local nhosts=$1 timeout=$2 rc=0
    shift 2
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/$(basename "$0" .sh).XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    "$cluster" run --hosts "$nhosts" --timeout "$timeout" -- bash "$0" "$@" --inside "$tmp" || rc=$?
    if ((rc == 77)); then
        echo "skipped: the test cluster cannot be made here (above)"
    fi
    exit "$rc"
}
