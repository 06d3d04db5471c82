#!/bin/sh
# Prints where this rank (of mpirun's, ctlaunch's or torchrun's) runs, as its own
# process sees it, then becomes
# the rank program (exec: the same process, so the same namespaces):
#
#   whereami rank=R host=H netns=net:[INODE] addr=A.B.C.D/24
#
# tests/ci/cluster_checks.sh matches the network namespace and address
# against the cluster's hosts.
set -eu
addr=$(ip -4 -o addr show dev eth0 | awk '{print $4}')
echo "whereami rank=${OMPI_COMM_WORLD_RANK:-${CT_RANK:-${RANK:-?}}} host=$(hostname) netns=$(readlink /proc/self/ns/net) addr=$addr"
exec "$@"
