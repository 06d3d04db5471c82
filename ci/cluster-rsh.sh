#!/usr/bin/env bash
# Open MPI's remote shell on the test cluster (ci/cluster.sh), in ssh's
# place:
#
#   mpirun --hostfile H --mca plm_rsh_agent ci/cluster-rsh.sh ...
#
# mpirun runs `cluster-rsh.sh HOST WORD...` as it would `ssh HOST WORD...`
# (it passes ssh's own options only to an agent named ssh); as sshd does,
# this joins the words into one shell command and runs it on HOST
# (ci/cluster.sh exec, in the cluster of CT_CLUSTER_STATE) with a login's
# environment, not mpirun's, so that a job needs the same -x flags here as
# on real hosts. CT_CLUSTER_STATE goes along, for the daemons that start
# others (Open MPI's tree spawn). Exit 255 on bad usage, as ssh's.
set -euo pipefail

if (($# < 2)) || [[ $1 == -* ]]; then
    echo "cluster-rsh.sh: usage: cluster-rsh.sh HOST COMMAND... (got: $*)" >&2
    exit 255
fi
host=$1
shift
home=$(getent passwd "$(id -un)" | cut -d: -f6)
exec "$(dirname "${BASH_SOURCE[0]}")/cluster.sh" exec "$host" \
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME="${home:-/}" USER="$(id -un)" LOGNAME="$(id -un)" SHELL=/bin/sh \
    CT_CLUSTER_STATE="${CT_CLUSTER_STATE:?cluster-rsh.sh: CT_CLUSTER_STATE names no cluster}" \
    sh -c "$*"
