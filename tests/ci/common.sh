# Sourced by the tests of tests/ci: free TCP ports, for those that must name
# a port before anything listens on it (torchrun's agent, env://, Slurm's
# derived port, slurmctld), and the failure report of those that keep the
# outputs of their processes in $tmp/*.out.

# Prints FAIL: and the message, then every $tmp/*.out, and exits 1.
fail() {
    echo "FAIL: $*" >&2
    for f in "$tmp"/*.out; do
        [[ -e $f ]] && { echo "--- $(basename "$f")"; cat "$f"; } >&2
    done
    exit 1
}

# The local ports in use on this host now, in any state (listening,
# connected, TIME_WAIT), as " P1 P2 ... ".
ports_in_use() {
    echo " $(ss -Htan 2>/dev/null | awk '{ n = split($4, a, ":"); print a[n] }' | tr '\n' ' ') "
}

# free_ports N prints a port P such that P..P+N-1 are free now. The ports lie
# below the kernel's ephemeral range, so that no client's connection
# elsewhere on the machine takes one between this check and the listener's
# bind; the search starts at a place of this process's own, so that tests
# running side by side try different ports.
free_ports() {
    local n=$1 low=20000 high eph used p i tries
    read -r eph _ </proc/sys/net/ipv4/ip_local_port_range
    high=$((eph < 32768 ? eph : 32768))
    ((high - low > 2 * n)) || {
        echo "free_ports: no room below the ephemeral range, which starts at $eph" >&2
        return 1
    }
    used=$(ports_in_use)
    p=$((low + ($$ * 7919 + RANDOM) % (high - low - n)))
    for ((tries = 0; tries < high - low; tries++)); do
        for ((i = 0; i < n; i++)); do
            [[ $used == *" $((p + i)) "* ]] && break
        done
        if ((i == n)); then
            echo "$p"
            return 0
        fi
        p=$((p + 1))
        ((p + n <= high)) || p=$low
    done
    echo "free_ports: no $n free ports in $low..$high" >&2
    return 1
}
