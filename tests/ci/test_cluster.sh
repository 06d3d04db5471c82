#!/usr/bin/env bash
# test_cluster: ci/cluster.sh, the test cluster of network namespaces. Each
# case brings a cluster up for real and checks it from inside (names,
# addresses, TCP between hosts, the shaping measured) and from outside
# (nothing of it left after teardown: no namespace, no /etc/netns entry, no
# process, whether the command passed, failed, ran too long or the script
# was sent SIGTERM; the root namespace's links, addresses and routes never
# change).
#
#   test_cluster.sh PYTHON3 [CASE...]     (default: every case but delay)
#
# Exits 77 (skipped) where the cluster cannot be made (not root, no
# CAP_SYS_ADMIN, no veth), as cluster.sh does; the delay case alone also
# where the kernel has no netem.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../../ci/cluster.sh
net=$here/cluster_net.py
python=${1:?usage: test_cluster.sh PYTHON3 [CASE...]}
shift
# The commands run inside the clusters (this script again, --inside) share
# the driver's directory and prefix.
if [[ ${1:-} != --inside ]]; then
    TEST_CLUSTER_TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_cluster.XXXXXX")
    # A prefix of this run's cluster names, so that what is left is ours.
    TEST_CLUSTER_PREFIX=ctt$$
    export TEST_CLUSTER_TMP TEST_CLUSTER_PREFIX
    # Whatever a failing case left (a cluster.sh killed before its
    # teardown) goes too, so that no run of this test leaves anything.
    leave_nothing() {
        local ns
        for ns in $(ip netns list | awk '{print $1}' | grep "^$TEST_CLUSTER_PREFIX-" || true); do
            ip netns pids "$ns" | xargs -r kill -KILL
            ip netns del "$ns"
            rm -rf "/etc/netns/$ns"
        done
        rm -rf "$TEST_CLUSTER_TMP"
    }
    trap leave_nothing EXIT
fi
tmp=$TEST_CLUSTER_TMP
prefix=$TEST_CLUSTER_PREFIX

fail() {
    echo "  FAIL: $*" >&2
    return 1
}

on() { "$cluster" exec "$@"; }

# Fails unless nothing of cluster name is left: no namespace, no /etc/netns
# entry, and none of the pids in the files given alive.
nothing_left() {
    local name=$1 f pid
    shift
    local ns
    ns=$(ip netns list | awk '{print $1}' | grep -E "^$name-" || true)
    [[ -z $ns ]] || fail "namespaces of $name left after teardown: $ns"
    [[ -z $(compgen -G "/etc/netns/$name-*") ]] ||
        fail "/etc/netns entries of $name left: $(compgen -G "/etc/netns/$name-*")"
    for f in "$@"; do
        while read -r pid; do
            # A zombie has left its namespace already; its parent reaps it.
            if [[ -e /proc/$pid ]] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
                fail "process $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline")) is still running"
            fi
        done <"$f"
    done
}

# The root namespace's interfaces, addresses and routes.
root_net() {
    ip -o link show | awk -F': ' '{print $2}'
    ip -o addr show | awk '{print $2, $4}'
    ip route show table all
}

# Starts a process on host that lives on after its starter (in a session
# of its own) and writes its pid to file; with "stubborn", one that ignores
# SIGTERM, which teardown must SIGKILL.
daemon() {
    local host=$1 file=$2 ignore="" tries=0
    [[ ${3:-} != stubborn ]] || ignore='trap "" TERM;'
    # shellcheck disable=SC2016 # the inner shell expands $$ and $0
    on "$host" setsid sh -c "$ignore"' echo $$ >"$0"; exec sleep 300' "$file" </dev/null >/dev/null 2>&1 &
    until [[ -s $file ]]; do
        ((++tries < 100)) || fail "the process on $host did not start within 10 s"
        sleep 0.1
    done
}

# ------------------------------------------------------------ the cases

# Three hosts: each has its name, its address on eth0 and loopback up,
# resolves every host's name to its address, and reaches every other host
# by name over TCP (the server sees the client's address); the root
# namespace is the same before, during and after.
inside_hosts_reach_each_other() {
    local hosts addrs i j n
    read -r -a hosts <<<"$CT_CLUSTER_HOSTS"
    read -r -a addrs <<<"$CT_CLUSTER_ADDRS"
    n=${#hosts[@]}
    root_net >"$tmp/root.during"
    for ((i = 0; i < n; i++)); do
        local h=${hosts[i]}
        [[ $(on "$h" hostname) == "$h" ]] || fail "hostname on $h is '$(on "$h" hostname)'"
        [[ $(on "$h" ip -4 -o addr show dev eth0) == *" ${addrs[i]}/24 "* ]] ||
            fail "$h's eth0 lacks ${addrs[i]}/24: $(on "$h" ip -4 -o addr show dev eth0)"
        [[ $(on "$h" ip -o link show lo) == *",UP"* ]] || fail "loopback is down on $h"
        for ((j = 0; j < n; j++)); do
            local got
            got=$(on "$h" getent hosts "${hosts[j]}" | awk '{print $1}')
            [[ $got == "${addrs[j]}" ]] || fail "on $h, ${hosts[j]} resolves to '$got', not ${addrs[j]}"
        done
    done
    for ((j = 0; j < n; j++)); do
        on "${hosts[j]}" "$python" "$net" serve 5000 $((n - 1)) >"$tmp/serve.$j" &
    done
    for ((i = 0; i < n; i++)); do
        for ((j = 0; j < n; j++)); do
            ((i == j)) || on "${hosts[i]}" "$python" "$net" send "${hosts[j]}" 5000 "from ${hosts[i]}"
        done
    done
    wait
    for ((j = 0; j < n; j++)); do
        for ((i = 0; i < n; i++)); do
            ((i == j)) || grep -qx "${addrs[i]} [0-9]* [0-9.]* from ${hosts[i]}" "$tmp/serve.$j" ||
                fail "${hosts[j]} got no connection from ${hosts[i]} (${addrs[i]}): $(cat "$tmp/serve.$j")"
        done
    done
}
case_hosts_reach_each_other() {
    root_net >"$tmp/root.before"
    "$cluster" run --hosts 3 --name "$prefix-a" --timeout 60 -- bash "$0" "$python" --inside hosts_reach_each_other
    root_net >"$tmp/root.after"
    diff "$tmp/root.before" "$tmp/root.during" >&2 || fail "the root namespace changed while the cluster was up"
    diff "$tmp/root.before" "$tmp/root.after" >&2 || fail "the root namespace changed after teardown"
    nothing_left "$prefix-a"
}

# Seconds node1 takes to receive 2 MB from node0.
transfer_s() {
    on node1 "$python" "$net" serve 5001 1 >"$tmp/sink" &
    on node0 "$python" "$net" send node1 5001 bulk 2000000
    wait
    awk '$2 == 2000000 {print $3}' "$tmp/sink"
}
inside_rate() {
    local dev q
    for dev in node0 node1; do
        q=$(on "$dev" tc qdisc show dev eth0)
        [[ $q == *"tbf"*"rate 16Mbit"* ]] || fail "no tbf of 16Mbit on $dev's eth0: $q"
    done
    transfer_s >"$tmp/shaped"
}
inside_unshaped() {
    [[ $(on node0 tc qdisc show dev eth0) != *tbf* ]] || fail "an unshaped cluster has a tbf"
    transfer_s >"$tmp/unshaped"
}
# --rate 16mbit: 2 MB take 1 s (less the 64 KiB burst), against a few ms
# unshaped.
case_rate() {
    "$cluster" run --name "$prefix-r" --rate 16mbit --timeout 60 -- bash "$0" "$python" --inside rate
    "$cluster" run --name "$prefix-u" --timeout 60 -- bash "$0" "$python" --inside unshaped
    local shaped unshaped
    shaped=$(cat "$tmp/shaped") unshaped=$(cat "$tmp/unshaped")
    echo "  2 MB node0 -> node1: ${shaped} s at 16mbit, ${unshaped} s unshaped"
    awk -v s="$shaped" 'BEGIN {exit !(s >= 0.9 && s < 10)}' ||
        fail "2 MB took $shaped s at 16mbit, expected about 1 s (at least 0.9)"
    awk -v s="$unshaped" 'BEGIN {exit !(s < 0.5)}' || fail "2 MB took $unshaped s unshaped"
    nothing_left "$prefix-r"
    nothing_left "$prefix-u"
}

inside_rtt() {
    on node1 "$python" "$net" serve 5002 20 >/dev/null &
    on node0 "$python" "$net" rtt node1 5002 20 >"$tmp/rtt.$1"
    wait
    if [[ $1 == shaped ]]; then
        [[ $(on node0 tc qdisc show dev eth0) == *"netem"*"delay 2ms"*"tbf"* ]] ||
            fail "node0's eth0 lacks netem delay 2ms over tbf: $(on node0 tc qdisc show dev eth0)"
    fi
}
# --delay 2ms on each host's link: a round trip node0 -> node1 -> node0
# takes at least 4 ms (the best of 19 TCP handshakes), against well under 2
# ms unshaped; with --rate too, both qdiscs are there.
case_delay() {
    "$cluster" run --name "$prefix-d" --delay 2ms --rate 1gbit --timeout 60 -- \
        bash "$0" "$python" --inside rtt shaped
    "$cluster" run --name "$prefix-e" --timeout 60 -- bash "$0" "$python" --inside rtt unshaped
    local shaped unshaped
    shaped=$(cat "$tmp/rtt.shaped") unshaped=$(cat "$tmp/rtt.unshaped")
    echo "  round trip node0 -> node1: ${shaped} ms with --delay 2ms, ${unshaped} ms unshaped"
    awk -v s="$shaped" 'BEGIN {exit !(s >= 3.9)}' || fail "the round trip took $shaped ms with 2 ms each way"
    awk -v s="$unshaped" 'BEGIN {exit !(s < 2)}' || fail "the round trip took $unshaped ms unshaped"
    nothing_left "$prefix-d"
    nothing_left "$prefix-e"
}

# A process on each host (node1's stubborn), then: fail, or wait for a
# signal.
inside_daemons_then() {
    daemon node0 "$tmp/pid.node0"
    daemon node1 "$tmp/pid.node1" stubborn
    echo $$ >"$tmp/cmd.pid"
    case $1 in
    fail) exit 3 ;;
    wait)
        sleep 300 &
        echo $! >>"$tmp/cmd.pid"
        touch "$tmp/ready"
        wait
        ;;
    esac
}
# The command fails (exit 3) with a process left on each host, one of them
# ignoring SIGTERM: run exits 3, and teardown leaves nothing.
case_teardown_after_failure() {
    rm -f "$tmp"/pid.* "$tmp/ready"
    local rc=0
    "$cluster" run --name "$prefix-f" --timeout 60 -- bash "$0" "$python" --inside daemons_then fail || rc=$?
    ((rc == 3)) || fail "run exited $rc, not the command's 3"
    nothing_left "$prefix-f" "$tmp"/pid.node[01] "$tmp/cmd.pid"
}

# cluster.sh is sent SIGTERM while its command waits: it exits 143 within
# seconds and leaves nothing, neither the command nor the hosts' processes.
case_teardown_on_sigterm() {
    rm -f "$tmp"/pid.* "$tmp/ready"
    "$cluster" run --name "$prefix-t" --timeout 120 -- bash "$0" "$python" --inside daemons_then wait &
    local pid=$! tries=0 rc=0 t0=$SECONDS
    until [[ -e $tmp/ready ]]; do
        ((++tries < 300)) || { kill -TERM "$pid"; fail "the command did not start within 30 s"; }
        sleep 0.1
    done
    kill -TERM "$pid"
    tries=0
    while kill -0 "$pid" 2>/dev/null; do
        ((++tries < 300)) || { kill -KILL "$pid"; fail "cluster.sh still runs 30 s after SIGTERM"; }
        sleep 0.1
    done
    wait "$pid" || rc=$?
    ((rc == 143)) || fail "cluster.sh exited $rc after SIGTERM, not 143"
    echo "  SIGTERM to teardown: $((SECONDS - t0)) s"
    nothing_left "$prefix-t" "$tmp"/pid.node[01] "$tmp/cmd.pid"
}

# A command past --timeout is stopped: exit 124, nothing left (the
# stubborn process costs teardown its 5 s of grace).
case_timeout() {
    rm -f "$tmp"/pid.* "$tmp/ready"
    local rc=0 t0=$SECONDS
    "$cluster" run --name "$prefix-o" --timeout 4 -- bash "$0" "$python" --inside daemons_then wait || rc=$?
    ((rc == 124)) || fail "run exited $rc past its --timeout, not 124"
    ((SECONDS - t0 < 30)) || fail "run took $((SECONDS - t0)) s with --timeout 4"
    nothing_left "$prefix-o" "$tmp"/pid.node[01] "$tmp/cmd.pid"
}

inside_hold() {
    echo "$CT_CLUSTER_STATE" >"$tmp/held.state"
    local tries=0
    until [[ -e $tmp/go ]]; do
        ((++tries < 300)) || fail "not told to go within 30 s"
        sleep 0.1
    done
}
inside_beside() {
    [[ $CT_CLUSTER_STATE != "$(cat "$tmp/held.state")" ]] || fail "two clusters share a state file"
    [[ $(on node1 hostname) == node1 ]] || fail "node1 of the second cluster is not node1"
    local a b
    a=$(CT_CLUSTER_STATE=$(cat "$tmp/held.state") on node0 readlink /proc/self/ns/net)
    b=$(on node0 readlink /proc/self/ns/net)
    [[ $a != "$b" ]] || fail "both clusters' node0 are namespace $a"
}
# Two clusters at once with the default names (their pids) do not collide.
case_two_clusters_at_once() {
    rm -f "$tmp/go" "$tmp/held.state"
    "$cluster" run --timeout 60 -- bash "$0" "$python" --inside hold &
    local pid=$! tries=0 rc=0
    until [[ -s $tmp/held.state ]]; do
        ((++tries < 300)) || { kill -TERM "$pid"; fail "the first cluster did not come up"; }
        sleep 0.1
    done
    "$cluster" run --timeout 60 -- bash "$0" "$python" --inside beside || rc=$?
    touch "$tmp/go"
    wait "$pid" || fail "the first cluster's run failed"
    ((rc == 0)) || fail "the second cluster's run failed ($rc)"
    nothing_left "ctc$pid"
}

# up, exec, crash and down by hand: the state file finds the cluster, an
# unknown host is an error naming the hosts, crash empties one host, and
# down removes it all.
case_up_exec_down() {
    local state=$tmp/up.state out
    out=$("$cluster" up --hosts 2 --name "$prefix-m" --state "$state")
    [[ $out == $'node0 10.77.0.1\nnode1 10.77.0.2' ]] || fail "up printed '$out'"
    [[ $("$cluster" exec --state "$state" node1 hostname) == node1 ]] || fail "exec --state: not node1"
    [[ $(CT_CLUSTER_STATE=$state "$cluster" exec 10.77.0.1 hostname) == node0 ]] ||
        fail "exec by address with CT_CLUSTER_STATE: not node0"
    if out=$("$cluster" exec --state "$state" node7 true 2>&1); then
        fail "exec on a host that is not there succeeded"
    fi
    [[ $out == *"no host 'node7'"*"node0 node1"* ]] || fail "exec node7 said '$out'"
    # crash kills everything on node1 at once, SIGTERM ignored or not, and
    # nothing on node0.
    export CT_CLUSTER_STATE=$state
    daemon node1 "$tmp/crash1.pid"
    daemon node1 "$tmp/crash2.pid" stubborn
    daemon node0 "$tmp/crash0.pid"
    "$cluster" crash node1
    [[ -z $(ip netns pids "$prefix-m-node1") ]] || fail "crash left processes on node1: $(ip netns pids "$prefix-m-node1")"
    kill -0 "$(cat "$tmp/crash0.pid")" || fail "crash node1 killed node0's process"
    unset CT_CLUSTER_STATE
    "$cluster" down --state "$state"
    [[ ! -e $state ]] || fail "down left the state file"
    nothing_left "$prefix-m"
}

# Where namespaces cannot be made, 77 and a message saying why: not root,
# and root without CAP_SYS_ADMIN (as in a container).
case_skips_where_it_cannot() {
    local rc=0 out
    out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$cluster" run -- true 2>&1) || rc=$?
    ((rc == 77)) || fail "as uid 65534, run exited $rc, not 77: $out"
    [[ $out == *"cannot make the test cluster here"*"need root"* ]] || fail "as uid 65534: '$out'"
    rc=0
    out=$(setpriv --bounding-set -sys_admin --inh-caps -sys_admin "$cluster" run --name "$prefix-c" -- true 2>&1) ||
        rc=$?
    ((rc == 77)) || fail "without CAP_SYS_ADMIN, run exited $rc, not 77: $out"
    [[ $out == *"cannot make the test cluster here"*"ip netns add"* ]] || fail "without CAP_SYS_ADMIN: '$out'"
    nothing_left "$prefix-c"
}

# ------------------------------------------------------------ main

if [[ ${1:-} == --inside ]]; then
    shift
    "inside_$1" "${@:2}"
    exit
fi

# Whether a cluster can be made here at all; if not, say why and skip.
rc=0
out=$("$cluster" run --hosts 1 --name "$prefix-p" -- true 2>&1) || rc=$?
if ((rc == 77)); then
    echo "skipped: $out"
    exit 77
fi
((rc == 0)) || { echo "FAIL: a cluster of one host did not come up (exit $rc): $out" >&2; exit 1; }

cases=("$@")
if ((${#cases[@]} == 0)); then
    cases=(hosts_reach_each_other rate teardown_after_failure teardown_on_sigterm timeout
           two_clusters_at_once up_exec_down skips_where_it_cannot)
fi
failed=0
for c in "${cases[@]}"; do
    t0=$SECONDS
    # Not "(...) || rc=$?": set -e is off in a command whose status is
    # tested, and a failed check must end its case.
    set +e
    (set -e; "case_$c")
    rc=$?
    set -e
    if ((rc == 77)); then
        echo "skip $c"
        [[ ${#cases[@]} -gt 1 ]] || exit 77
    elif ((rc != 0)); then
        echo "FAIL $c ($((SECONDS - t0)) s)"
        failed=$((failed + 1))
    else
        echo "ok   $c ($((SECONDS - t0)) s)"
    fi
done
((failed == 0)) || { echo "$failed of ${#cases[@]} cases failed"; exit 1; }
echo "${#cases[@]} cases passed"
