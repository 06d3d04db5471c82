#!/usr/bin/env bash
# Installs every system package ct needs to build, test and run its demo on
# Debian 12 (Ubuntu works too). Safe to run again: packages already installed
# are skipped, and with nothing missing it only asks dpkg and returns.
#
#   bash ci/setup.sh            build, test and demo dependencies
#   bash ci/setup.sh --bench    also python3-torch, the benchmarks' peer
set -euo pipefail

usage() {
    sed -n '2,8s/^# \{0,1\}//p' "$0"
}

packages=(
    build-essential cmake pkg-config git # toolchain
    clang clang-format                   # second compiler of the CI matrix, formatting
    libopenblas-dev                      # matmul (cblas)
    libzmq3-dev                          # store and RPC (dist/, dist_autograd/)
    libopenmpi-dev openmpi-bin           # mpi collectives backend, mpirun
    libcjson-dev                         # checkpoint metadata
    libxxhash-dev                        # checkpoint checksums
    zlib1g-dev                           # examples read the gzipped data sets
    dataset-fashion-mnist                # /usr/share/datasets/fashion-mnist
    gnuplot-nox                          # charts of metrics files (ctplot, --plot)
    fortunes                             # the GPT example's corpus, /usr/share/games/fortunes
)

for arg in "$@"; do
    case $arg in
    --bench) packages+=(python3-torch) ;;
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

if ((${#missing[@]} == 0)); then
    echo "ci/setup.sh: all ${#packages[@]} packages already installed; nothing to do"
    exit 0
fi

as_root=()
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
