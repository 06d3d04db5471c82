#!/usr/bin/env bash
# A cluster of hosts on this machine, for the multi-node tests: each host
# is a network namespace with an eth0 joined by a veth pair to a bridge
# (the switch, in a namespace of its own), an address, loopback, a host
# name that every host resolves, and optionally a shaped link. Nothing in
# the root namespace changes: no interface, address, route or firewall rule
# (docs/multinode.md, "The test cluster").
#
#   ci/cluster.sh run [OPTIONS] [--timeout S] -- COMMAND...
#   ci/cluster.sh up [OPTIONS] --state FILE
#   ci/cluster.sh exec [--state FILE] HOST COMMAND...
#   ci/cluster.sh crash [--state FILE] HOST
#   ci/cluster.sh down [--state FILE]
#
# run brings a cluster up, runs COMMAND (in this namespace) with
# CT_CLUSTER_STATE, CT_CLUSTER_HOSTS, CT_CLUSTER_ADDRS and CT_CLUSTER_SUBNET
# set, tears the cluster down whatever happens (failure, SIGINT, SIGTERM,
# the timeout: default 600 s, 0 for none) and exits with COMMAND's code
# (124 past the timeout, 128 + N after signal N). up leaves the cluster
# running for exec and down. exec runs COMMAND on HOST (a host name or
# address), in its own UTS namespace with HOST as its host name; the state
# file is --state's, else CT_CLUSTER_STATE's. crash kills every process on
# HOST at once (SIGKILL), as a power cut would, and waits until none is left;
# the host stays, empty, until down.
#
# OPTIONS:
#   --hosts N       hosts node0 .. node<N-1> (default 2, at most 200)
#   --subnet A.B.C  their /24: nodeI is A.B.C.<I+1> (default 10.77.0)
#   --delay D       one-way delay from each host (netem: 50us, 2ms)
#   --rate R        each host's bandwidth, both ways (tbf: 10gbit, 16mbit)
#   --name P        the namespaces' prefix, P-node0 .. and P-sw (default
#                   ctc<pid>, so that clusters made at once never collide)
#
# Exit code 77 (a skipped test) when namespaces cannot be made here: not
# root, no ip, no CAP_SYS_ADMIN, no veth or bridge, or --delay on a kernel
# without netem.
set -euo pipefail

self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
# Seconds teardown waits for a namespace's processes after SIGTERM, and
# after SIGKILL.
term_grace=5
kill_grace=5

usage() {
    sed -n '9,37s/^# \{0,1\}//p' "$self"
}

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

skip() {
    echo "cluster.sh: cannot make the test cluster here: $*" >&2
    exit 77
}

# ---------------------------------------------------------------- state

# The state file holds, one per line: name, subnet, hosts (space-separated)
# and addrs, the same order. It is written before the first namespace is
# made, so that down cleans up after a half-made cluster too.
write_state() {
    local file=$1
    {
        printf 'name=%s\n' "$name"
        printf 'subnet=%s\n' "$subnet"
        printf 'hosts=%s\n' "${hosts[*]}"
        printf 'addrs=%s\n' "${addrs[*]}"
    } >"$file"
}

read_state() {
    local file=$1 key value
    [[ -f $file ]] || die "no cluster state at '$file' (ci/cluster.sh up --state FILE makes one)"
    name="" subnet="" hosts=() addrs=()
    while IFS='=' read -r key value; do
        case $key in
        name) name=$value ;;
        subnet) subnet=$value ;;
        hosts) read -r -a hosts <<<"$value" ;;
        addrs) read -r -a addrs <<<"$value" ;;
        esac
    done <"$file"
    [[ $name =~ ^[A-Za-z0-9_.-]+$ && ${#hosts[@]} -gt 0 ]] || die "'$file' is not a cluster state file"
}

state_arg() {
    local file=${state:-${CT_CLUSTER_STATE:-}}
    [[ -n $file ]] || die "no state file: pass --state FILE or set CT_CLUSTER_STATE"
    printf '%s' "$file"
}

ns_of() { printf '%s-%s' "$name" "$1"; }

# ---------------------------------------------------------------- up

# Bits per second of a tc rate (10gbit, 500mbit, 16mbit, 100kbit).
rate_bits() {
    local n=${1%%[a-z]*} unit=${1##*[0-9]}
    case $unit in
    bit) echo "$n" ;;
    kbit) echo $((n * 1000)) ;;
    mbit) echo $((n * 1000000)) ;;
    gbit) echo $((n * 1000000000)) ;;
    esac
}

# The qdiscs of one end of a host's link: netem for the delay (on the
# host's end only, so that host-to-host one-way latency is the delay, not
# twice it), tbf for the rate (on both ends: the host sends and receives at
# the rate, as a full-duplex NIC does). tbf's burst is 1 ms at the rate, at
# least 64 KiB: the largest GSO packet veth hands it.
shape() {
    local ns=$1 dev=$2 delay=$3 rate=$4 parent=(root)
    if [[ -n $delay ]]; then
        local out
        if ! out=$(tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "$delay" 2>&1); then
            if [[ $out == *"qdisc kind is unknown"* ]]; then
                skip "--delay needs netem, which this kernel lacks (CONFIG_NET_SCH_NETEM): $out"
            fi
            die "tc netem delay $delay on $dev of $ns: $out"
        fi
        parent=(parent 1:1 handle 10:)
    fi
    if [[ -n $rate ]]; then
        local burst=$(($(rate_bits "$rate") / 8 / 1000))
        ((burst >= 65536)) || burst=65536
        tc -n "$ns" qdisc add dev "$dev" "${parent[@]}" tbf rate "$rate" burst "$burst" latency 20ms ||
            die "tc tbf rate $rate on $dev of $ns failed"
    fi
}

# Runs a step that only fails where this machine cannot make namespaces,
# veths or bridges: that is a skip, not an error.
need() {
    local out
    out=$("$@" 2>&1) || skip "'$*' failed: $out"
}

up() {
    local file=$1 nhosts=$2 delay=$3 rate=$4
    ((EUID == 0)) || skip "network namespaces need root (running as uid $EUID)"
    local tool
    for tool in ip unshare hostname; do
        command -v "$tool" >/dev/null || skip "no '$tool' (ci/setup.sh installs iproute2 and util-linux)"
    done
    if [[ -n $delay$rate ]] && ! command -v tc >/dev/null; then
        skip "--delay and --rate need tc (ci/setup.sh installs iproute2)"
    fi

    hosts=() addrs=()
    local i
    for ((i = 0; i < nhosts; i++)); do
        hosts+=("node$i")
        addrs+=("$subnet.$((i + 1))")
    done
    for i in "${hosts[@]}" sw; do
        [[ ! -e /run/netns/$(ns_of "$i") ]] ||
            die "namespace $(ns_of "$i") exists: a cluster named $name is up (ci/cluster.sh down)"
    done
    write_state "$file"

    local sw
    sw=$(ns_of sw)
    need ip netns add "$sw"
    need ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    for ((i = 0; i < nhosts; i++)); do
        local ns
        ns=$(ns_of "${hosts[i]}")
        need ip netns add "$ns"
        need ip -n "$ns" link add eth0 type veth peer name "p$i" netns "$sw"
        ip -n "$sw" link set "p$i" master br0 up
        ip -n "$ns" addr add "${addrs[i]}/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        shape "$ns" eth0 "$delay" "$rate"
        shape "$sw" "p$i" "" "$rate"
        # ip netns exec bind-mounts these over /etc/hosts and
        # /etc/resolv.conf. No name server: a name that is not a host's
        # fails at once instead of waiting for DNS that is not there.
        mkdir -p "/etc/netns/$ns"
        {
            echo "127.0.0.1 localhost"
            echo "::1 localhost ip6-localhost ip6-loopback"
            local j
            for ((j = 0; j < nhosts; j++)); do
                echo "${addrs[j]} ${hosts[j]}"
            done
        } >"/etc/netns/$ns/hosts"
        : >"/etc/netns/$ns/resolv.conf"
    done
    # A veth reports carrier once both ends are up; wait for it, bounded.
    for ((i = 0; i < nhosts; i++)); do
        local tries=0
        until ip -n "$(ns_of "${hosts[i]}")" -o link show eth0 | grep 'LOWER_UP' >/dev/null; do
            ((++tries <= 50)) || die "${hosts[i]}'s eth0 has no carrier after 5 s"
            sleep 0.1
        done
    done
}

# ---------------------------------------------------------------- down

# Kills what runs in namespace ns: SIGTERM, then SIGKILL; whether none is
# left.
kill_in() {
    local ns=$1 sig grace waited pids
    for sig in TERM KILL; do
        mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
        ((${#pids[@]} > 0)) || return 0
        kill "-$sig" "${pids[@]}" 2>/dev/null || true
        grace=$term_grace
        [[ $sig == TERM ]] || grace=$kill_grace
        waited=0
        while [[ -n $(ip netns pids "$ns" 2>/dev/null) ]] && ((waited++ < grace * 10)); do
            sleep 0.1
        done
    done
    [[ -z $(ip netns pids "$ns" 2>/dev/null) ]]
}

down() {
    local file=$1 left=() h ns
    read_state "$file"
    for h in "${hosts[@]}" sw; do
        ns=$(ns_of "$h")
        if [[ -e /run/netns/$ns ]]; then
            kill_in "$ns" || left+=("$ns: processes $(ip netns pids "$ns" | tr '\n' ' ')")
            ip netns del "$ns" || left+=("$ns: ip netns del failed")
        fi
        rm -rf "/etc/netns/$ns"
    done
    rm -f "$file"
    if ((${#left[@]} > 0)); then
        printf 'cluster.sh: teardown left %s\n' "${left[@]}" >&2
        return 1
    fi
}

# ---------------------------------------------------------------- exec

host_index() {
    local i
    for i in "${!hosts[@]}"; do
        if [[ $1 == "${hosts[i]}" || $1 == "${addrs[i]}" ]]; then
            echo "$i"
            return 0
        fi
    done
    die "no host '$1' in cluster $name (hosts: ${hosts[*]}; addresses: ${addrs[*]})"
}

# ip netns exec shares the UTS namespace with this one, so the host name
# comes from a UTS namespace of the command's own (unshare --uts): every
# process on a host sees its name, as gethostname() on a real host does.
exec_on() {
    local i
    i=$(host_index "$1")
    shift
    # shellcheck disable=SC2016 # the inner shell expands $0 and $@
    exec ip netns exec "$(ns_of "${hosts[i]}")" unshare --uts \
        sh -c 'hostname "$0" && exec "$@"' "${hosts[i]}" "$@"
}

# Every process in HOST's namespace gets SIGKILL at once, again for those
# that a dying one started meanwhile, until none is left (5 s at most).
crash() {
    local ns pids waited=0
    ns=$(ns_of "${hosts[$(host_index "$1")]}")
    while mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null) && ((${#pids[@]} > 0)); do
        kill -KILL "${pids[@]}" 2>/dev/null || true
        ((waited++ < 50)) || die "crash $1: processes ${pids[*]} are still there after 5 s"
        sleep 0.1
    done
}

# ---------------------------------------------------------------- run

run() {
    local timeout_s=$1
    shift
    # Globals, not locals: the EXIT trap runs after run has returned.
    run_dir=$(mktemp -d "${TMPDIR:-/tmp}/ct-cluster.XXXXXX")
    run_state=$run_dir/state
    child=""
    # Teardown on every way out.
    cleanup() {
        if [[ -f $run_state ]]; then
            down "$run_state" || true
        fi
        rm -rf "$run_dir"
    }
    # On a signal, the command (timeout passes it on to the command's
    # process group) gets a moment to stop before teardown.
    on_signal() {
        trap - INT TERM
        if [[ -n $child ]]; then
            kill -TERM "$child" 2>/dev/null || true
            local waited=0
            while kill -0 "$child" 2>/dev/null && ((waited++ < 60)); do
                sleep 0.1
            done
        fi
        exit $((128 + $1))
    }
    trap cleanup EXIT
    trap 'on_signal 2' INT
    trap 'on_signal 15' TERM
    up "$run_state" "$nhosts" "$delay" "$rate"

    export CT_CLUSTER_STATE=$run_state CT_CLUSTER_HOSTS="${hosts[*]}" CT_CLUSTER_ADDRS="${addrs[*]}"
    export CT_CLUSTER_SUBNET=$subnet.0/24
    # In the background, so that a signal reaches the trap at once (bash
    # runs traps only between foreground commands), with stdin passed on
    # (a background command gets /dev/null). timeout 0 sets no limit but
    # still passes our signals on to the command's process group.
    local rc=0
    timeout --kill-after=5 "$timeout_s" "$@" <&0 &
    child=$!
    wait "$child" || rc=$?
    child=""
    if ((rc == 124 && timeout_s > 0)); then
        echo "cluster.sh: '$*' ran past --timeout $timeout_s s; stopped" >&2
    fi
    return "$rc"
}

# ---------------------------------------------------------------- main

(($# > 0)) || {
    usage >&2
    exit 2
}
if [[ $1 == -h || $1 == --help ]]; then
    usage
    exit 0
fi
cmd=$1
shift
nhosts=2 subnet=10.77.0 delay="" rate="" name=ctc$$ state="" timeout_s=600
while (($# > 0)); do
    case $1 in
    --hosts) nhosts=${2:?--hosts needs a value} ;;
    --subnet) subnet=${2:?--subnet needs a value} ;;
    --delay) delay=${2:?--delay needs a value} ;;
    --rate) rate=${2:?--rate needs a value} ;;
    --name) name=${2:?--name needs a value} ;;
    --state) state=${2:?--state needs a value} ;;
    --timeout) timeout_s=${2:?--timeout needs a value} ;;
    --) shift; break ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown option '$1' (ci/cluster.sh --help)" ;;
    *) break ;;
    esac
    shift 2
done

if ! [[ $nhosts =~ ^[0-9]+$ ]] || ((nhosts < 1 || nhosts > 200)); then
    die "--hosts must be 1..200 (got '$nhosts')"
fi
[[ $subnet =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] ||
    die "--subnet must be the first three numbers of a /24, like 10.77.0 (got '$subnet')"
[[ -z $delay || $delay =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] || die "--delay must be like 50us or 2ms (got '$delay')"
[[ -z $rate || $rate =~ ^[1-9][0-9]*(bit|kbit|mbit|gbit)$ ]] || die "--rate must be like 10gbit or 16mbit (got '$rate')"
[[ $name =~ ^[A-Za-z0-9_.-]{1,40}$ ]] || die "--name must be 1-40 letters, digits, '_', '.' or '-' (got '$name')"
[[ $timeout_s =~ ^[0-9]+$ ]] || die "--timeout must be whole seconds (got '$timeout_s')"

case $cmd in
run)
    (($# > 0)) || die "run needs a command: ci/cluster.sh run [OPTIONS] -- COMMAND..."
    run "$timeout_s" "$@"
    ;;
up)
    [[ -n $state ]] || die "up needs --state FILE (where exec and down find the cluster)"
    # A half-made cluster is taken down again.
    trap 'rc=$?; if ((rc != 0)) && [[ -f $state ]]; then down "$state" || true; fi' EXIT
    up "$state" "$nhosts" "$delay" "$rate"
    trap - EXIT
    for i in "${!hosts[@]}"; do
        printf '%s %s\n' "${hosts[i]}" "${addrs[i]}"
    done
    ;;
exec)
    (($# >= 2)) || die "exec needs a host and a command: ci/cluster.sh exec HOST COMMAND..."
    read_state "$(state_arg)"
    exec_on "$@"
    ;;
crash)
    (($# == 1)) || die "crash needs a host: ci/cluster.sh crash HOST"
    read_state "$(state_arg)"
    crash "$1"
    ;;
down)
    down "$(state_arg)"
    ;;
*)
    die "unknown command '$cmd' (run, up, exec, crash or down; ci/cluster.sh --help)"
    ;;
esac
