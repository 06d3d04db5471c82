#!/usr/bin/env bash
# Installs every system package ct needs to build, test and run its demo on
# Debian 12 (Ubuntu works too). Safe to run again: packages already installed
# are skipped, and with nothing missing it only asks dpkg (and, with --bench,
# the venv's Python) and returns.
#
#   bash ci/setup.sh            build, test and demo dependencies
#   bash ci/setup.sh --bench    also the benchmarks' PyTorch peers: Debian's
#                               python3-torch (1.13) and, in bench/.venv, the
#                               current torch from PyPI (a 5 GB download)
#   bash ci/setup.sh --torchrun also Debian's python3-torch, for the tests
#                               that run torchrun (206 MB to download, 870
#                               MB installed: left out of the default set,
#                               which CI's 15 minutes hold)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() {
    sed -n '2,14s/^# \{0,1\}//p' "$0"
}

packages=(
    build-essential cmake pkg-config git # toolchain
    clang clang-format                   # second compiler of the CI matrix, formatting
    libopenblas-dev                      # matmul (cblas)
    libzmq3-dev                          # store and RPC (dist/, dist_autograd/)
    libopenmpi-dev openmpi-bin           # mpi collectives backend, mpirun
    libgloo-dev                          # gloo collectives backend (TCP, across machines)
    libcjson-dev                         # checkpoint metadata
    libxxhash-dev                        # checkpoint checksums
    zlib1g-dev                           # examples read the gzipped data sets
    dataset-fashion-mnist                # /usr/share/datasets/fashion-mnist
    gnuplot-nox                          # charts of metrics files (ctplot, --plot)
    fortunes                             # the GPT example's corpus, /usr/share/games/fortunes
    debhelper help2man                   # ci/test.sh builds the Debian packages (debian/)
    python3                              # ci/figures.py checks the figures the docs quote
    iproute2                             # ip and tc: the test cluster (ci/cluster.sh)
    slurmd slurmctld slurm-client        # test_slurm: srun and sbatch on daemons of its own
)

bench=false
for arg in "$@"; do
    case $arg in
    --bench)
        packages+=(python3-torch python3-venv)
        bench=true
        ;;
    --torchrun)
        packages+=(python3-torch)
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    *)
        echo "ci/setup.sh: unknown argument '$arg'" >&2
        usage >&2
        exit 2
        ;;
    esac
done

# One dpkg-query for all of them; it names unknown packages on stderr and
# exits 1, which only means they are missing.
declare -A installed=()
while read -r name _ ok state; do
    if [[ "$ok $state" == "ok installed" ]]; then
        installed[$name]=1
    fi
done < <(dpkg-query -W -f='${Package} ${Status}\n' "${packages[@]}" 2>/dev/null || true)
missing=()
for p in "${packages[@]}"; do
    [[ -n ${installed[$p]:-} ]] || missing+=("$p")
done

# The current PyTorch release, the benchmarks' anchor, comes from PyPI into
# a venv of Debian's Python: pip must not write into the site-packages that
# python3-torch lives in.
bench_venv() {
    local venv=$root/bench/.venv
    local check=(-c 'import torch, numpy, safetensors; print(torch.__version__)')
    if [[ -x $venv/bin/python ]] && "$venv/bin/python" "${check[@]}" >/dev/null 2>&1; then
        echo "ci/setup.sh: $venv already has torch, numpy and safetensors; nothing to do"
        return 0
    fi
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q torch numpy safetensors
    echo "ci/setup.sh: installed torch $("$venv/bin/python" "${check[@]}"), numpy and" \
        "safetensors in $venv"
}

# Installs the missing packages with apt-get, through sudo unless root.
install_missing() {
    local as_root=() apt
    if ((EUID != 0)); then
        if ! command -v sudo >/dev/null; then
            echo "ci/setup.sh: missing packages: ${missing[*]}" >&2
            echo "ci/setup.sh: run this script as root, or install sudo" >&2
            exit 1
        fi
        as_root=(sudo)
    fi
    # sudo resets the environment, so DEBIAN_FRONTEND goes through env.
    apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q)
    "${apt[@]}" update
    "${apt[@]}" install -y --no-install-recommends "${missing[@]}"
    echo "ci/setup.sh: installed ${#missing[@]} missing package(s): ${missing[*]}"
}

if ((${#missing[@]} == 0)); then
    echo "ci/setup.sh: all ${#packages[@]} packages already installed"
else
    install_missing
fi
if $bench; then
    bench_venv
fi
