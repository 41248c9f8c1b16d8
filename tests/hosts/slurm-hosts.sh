#!/usr/bin/env bash
# A private Slurm cluster on N network-namespace hosts (netns-hosts.sh), for tests
# that run `srun -N 2` as on a real cluster: slurmctld on host 0, a slurmd on each
# host, all from one slurm.conf written as slurm-one-node.sh writes it (this script
# is that one with each node on a host of its own). munged stays in this
# namespace: its socket is a file, which every host's processes reach.
# Usage: slurm-hosts.sh check | start DIR N | run DIR CMD... | stop DIR
# `run` runs CMD on host 0; `check` and `start` exit 77 (ctest skip) when Slurm or
# the namespace hosts can't be had here. `stop` takes the hosts down too.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=slurm-one-node.sh
. "$here/slurm-one-node.sh"
prog=slurm-hosts
netns=$here/netns-hosts.sh

usage() {
    cat >&2 <<EOF
usage: $0 check            exit 0 if usable here, else print why and exit 77
       $0 start DIR N      make hosts and start the cluster with its state in
                           DIR; prints the SLURM_CONF export clients need
       $0 run DIR CMD...   run CMD (e.g. srun -N 2 prog) on host 0
       $0 stop DIR         stop it and remove the hosts (idempotent)
EOF
    exit 2
}

# The host group is named in DIR/group, so that `run` and `stop` find it later.
group_of() { local g; read -r g 2>/dev/null < "$1/group" && echo "$g"; }

# Node I is host I: daemons and clients run there, so that each slurmd sees its own
# hostname and address, and srun reaches them over the bridge as over a network.
on_node() {
    local g
    g=$(group_of "$1") || g=none
    # shellcheck disable=SC2034  # slurm-one-node.sh's functions run "${on[@]}" CMD
    on=("$netns" exec "$g" "$2")
}

stopped() {
    local g
    g=$(group_of "$1") || return 0
    "$netns" down "$g"
    rm -f -- "$1/group" "$1/hosts"
}

cmd_check() {
    local why
    why=$(unusable)
    [[ -z $why ]] || { echo "$prog: $why"; exit 77; }
    why=$("$netns" check) || { echo "$prog: ${why#netns-hosts: }"; exit 77; }
}

cmd_start() {
    local dir n=${2:-} why g h a nodes=()
    [[ $n =~ ^[1-9]$ ]] || usage
    why=$("$netns" check) || rc=77 die "${why#netns-hosts: }"
    # Also stops an earlier run's cluster and takes its hosts down.
    new_state_dir "${1:-}"
    # Short and unique among this machine's namespaces; also the node names' prefix.
    g=sl$$
    "$netns" up "$g" "$n" > "$dir/hosts" 2> "$dir/log/hosts.log" ||
        fail "$dir" "the hosts could not be made" "$dir/log/hosts.log"
    echo "$g" > "$dir/group"
    while read -r h a; do nodes+=("$h=$a"); done < "$dir/hosts"
    (( ${#nodes[@]} == n )) || fail "$dir" "netns-hosts.sh made ${#nodes[@]} hosts, not $n"
    # ip netns exec mounts a fresh /sys, with nothing on /sys/fs/cgroup: slurmd's
    # autodetection fails there. Named, cgroup/v1 loads; proctrack/pgid never uses it.
    echo CgroupPlugin=cgroup/v1 > "$dir/cgroup.conf"
    start_cluster "$dir" "${nodes[@]}"
}

case ${1:-} in
    check) cmd_check ;;
    start) cmd_start "${2:-}" "${3:-}" ;;
    run) shift; cmd_run "$@" ;;
    stop) cmd_stop "${2:-}" ;;
    *) usage ;;
esac
