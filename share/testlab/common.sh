# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are for the scripts that source this file
# Shared by share/testlab/build, start and stop (sourced, not run): the lab's versions, names,
# ports and addresses, and small helpers. See docs/testcluster.md, "The version lab".

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
LAB_DIR=${LAB_DIR:-/var/lib/slurm-gpu-lab}
# The versions the lab builds, in order; `build`, `start` and `stop` take a subset.
LAB_VERSIONS=(24.11 26.05)
# One bridge for every lab: the controllers run on its host address, the compute hosts in
# network namespaces behind veth pairs on it. Nothing leaves the machine.
BRIDGE=sglab0
BRIDGE_ADDR=10.250.0.1
BRIDGE_PREFIX=24
# Compute hosts per lab, each with GPUS virtual GPUs.
NODES_PER_LAB=3
GPUS=4
GPU_TYPE=a100
# What a root needs from its suite's archive.
ROOT_PACKAGES=(slurm-wlm slurmdbd slurm-client munge mariadb-server libslurm-perl
    libslurmdb-perl procps iproute2 python3 python3-venv ca-certificates sudo)
# Where the project lives inside each root, installed as a site would.
PROJECT_VENV=/opt/slurm-gpu
REPORTSEFF_VENV=/opt/reportseff
LAB_USERS=(labuser1 labuser2)

say() { printf 'testlab: %s\n' "$*"; }
warn() { printf 'testlab: WARNING: %s\n' "$*" >&2; }
die() {
    printf 'testlab: ERROR: %s\n' "$*" >&2
    exit 1
}

[[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap, chroot, namespaces, daemons)"

# lab_select VERSION: set the variables of one lab.
#   SUITE (Debian suite of its root), ROOT, CLUSTER, PORT_DIGIT (x817 slurmctld, x818 slurmd,
#   x819 slurmdbd, x306 MariaDB, x825 the tests' SMTP sink), NODE_PREFIX (node names
#   PREFIX1..3), NET_DIGIT (node addresses 10.250.0.<NET_DIGIT>1..3), NODES (array).
lab_select() {
    case $1 in
    24.11) SUITE=trixie PORT_DIGIT=7 NODE_PREFIX=t NET_DIGIT=1 ;;
    26.05) SUITE=sid PORT_DIGIT=8 NODE_PREFIX=s NET_DIGIT=2 ;;
    *) die "unknown lab version '$1' (known: ${LAB_VERSIONS[*]})" ;;
    esac
    VERSION=$1
    ROOT=$LAB_DIR/$VERSION/root
    STAMPS=$LAB_DIR/$VERSION/stamps
    CLUSTER=lab${VERSION//./}
    CTLD_PORT=${PORT_DIGIT}817
    SLURMD_PORT=${PORT_DIGIT}818
    DBD_PORT=${PORT_DIGIT}819
    DB_PORT=${PORT_DIGIT}306
    SMTP_PORT=${PORT_DIGIT}825
    NODES=()
    local i
    for ((i = 1; i <= NODES_PER_LAB; i++)); do NODES+=("$NODE_PREFIX$i"); done
}

# node_addr NODE: the compute host's address on the bridge.
node_addr() { printf '10.250.0.%s%s' "$NET_DIGIT" "${1#"$NODE_PREFIX"}"; }
# node_netns NODE: the network namespace of a compute host (ip netns name).
node_netns() { printf 'sglab-%s' "$1"; }
# node_veth NODE: the host end of its veth pair, on the bridge.
node_veth() { printf 'sglv-%s' "$1"; }

# in_root CMD...: run CMD in the root with a clean environment.
in_root() {
    chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root \
        DEBIAN_FRONTEND=noninteractive "$@"
}

# versions_from_args ARGS...: the lab versions named (all of them when none is).
versions_from_args() {
    if [[ $# -eq 0 ]]; then
        printf '%s\n' "${LAB_VERSIONS[@]}"
    else
        printf '%s\n' "$@"
    fi
}

# pid_of FILE: the pid in a pid file of the root (FILE relative to the root), or nothing.
pid_of() {
    local file=$ROOT$1
    if [[ -s $file ]]; then tr -dc '0-9' <"$file"; fi
}

# root_pid_alive PID: PID runs, chrooted into this lab's root (so a stale pid file whose
# number now belongs to another process is never taken for ours).
root_pid_alive() {
    local pid=$1
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null &&
        [[ $(readlink "/proc/$pid/root" 2>/dev/null) == "$ROOT" ]]
}
