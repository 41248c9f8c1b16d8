#!/usr/bin/env bash
# Fake "real hosts" for multi-host tests: each host is a network namespace with
# its own eth0 address, /etc/hosts and hostname, all joined by one bridge.
# Usage: netns-hosts.sh up NAME N | exec NAME I CMD... | addr NAME I
#        | cut NAME I | heal NAME I | down NAME | check
# Hosts are NAME-0..NAME-(N-1); `check` exits 77 (ctest skip) when unusable.
set -uo pipefail

prog=netns-hosts
netns_dir=/run/netns

die() { echo "$prog: $*" >&2; exit "${rc:-1}"; }

usage() {
    cat >&2 <<EOF
usage: $0 up NAME N          create hosts NAME-0..NAME-(N-1), print "host addr" lines
       $0 exec NAME I CMD... run CMD on host NAME-I (hostname NAME-I)
       $0 addr NAME I        print host NAME-I's address
       $0 cut NAME I         unplug host NAME-I from the bridge
       $0 heal NAME I        plug it back
       $0 down NAME          remove the group (idempotent)
       $0 check              exit 0 if usable here, else print why and exit 77
EOF
    exit 2
}

# NAME ends up in hostnames and namespace names: keep it a plain DNS label.
check_name() {
    [[ $1 =~ ^[A-Za-z0-9]([A-Za-z0-9-]{0,39})$ ]] || die "bad group name '$1' (letters, digits, '-'; at most 40)"
}
check_index() {
    if ! [[ $1 =~ ^(0|[1-9][0-9]{0,2})$ ]] || (( $1 > 252 )); then
        die "bad host index '$1' (0..252)"
    fi
}

# Second octet from the group name, so parallel groups usually differ. Groups
# are isolated from each other anyway (one bridge namespace each), so a clash
# is harmless; it only keeps addresses distinct in logs.
subnet() {
    local crc
    crc=$(printf '%s' "$1" | cksum) || return 1
    echo "10.$(( 100 + ${crc%% *} % 151 ))"
}

addr_of() { echo "$(subnet "$1").0.$(( $2 + 1 ))"; }

# The bridge lives in its own namespace, so the root namespace's interfaces,
# routes and firewall (docker's FORWARD DROP, br_netfilter) never see this traffic.
bridge_ns() { echo "$1-br"; }

# Host namespaces of group NAME that exist now (NAME-<digits> only, so that
# group "t" never matches group "t-1"'s hosts "t-1-0").
group_hosts() {
    local ns
    for ns in "$netns_dir"/"$1"-*; do
        ns=${ns##*/}
        [[ $ns =~ ^$1-[0-9]+$ ]] && echo "$ns"
    done
}

do_down() {
    local name=$1 ns dir
    local -a pids
    for ns in $(group_hosts "$name") "$(bridge_ns "$name")"; do
        [[ -e $netns_dir/$ns ]] || continue
        # Leftover test processes would keep the namespace (and its address)
        # alive, invisible once the name is gone.
        mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
        (( ${#pids[@]} )) && kill -KILL "${pids[@]}" 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done
    for dir in /etc/netns/"$name"-*; do
        [[ ${dir##*/} =~ ^$name-[0-9]+$ ]] && rm -rf -- "$dir"
    done
    # /etc/netns itself stays: removing it could race a parallel `up`.
    return 0
}

# In `up`: run a step; on failure undo the whole group and report why.
step() {
    local what=$1 err
    shift
    if ! err=$("$@" 2>&1); then
        do_down "$up_name"
        die "up $up_name: $what failed: ${err//$'\n'/ }"
    fi
}

do_up() {
    up_name=$1
    local name=$1 n=$2 br i host net others
    check_name "$name"
    if ! [[ $n =~ ^[1-9][0-9]{0,2}$ ]] || (( n > 253 )); then
        die "bad host count '$n' (1..253)"
    fi
    [[ -f /etc/hosts ]] || die "up $name: /etc/hosts missing (ip netns exec bind-mounts over it)"
    do_down "$name"
    net=$(subnet "$name") || die "up $name: cksum failed"
    br=$(bridge_ns "$name")

    step "netns add $br" ip netns add "$br"
    step "bridge" ip -n "$br" link add br0 type bridge forward_delay 0 stp_state 0
    step "bridge up" ip -n "$br" link set br0 up
    # Bridged frames would go through this namespace's (empty) iptables; keep
    # that off in case something ever adds rules here.
    # shellcheck disable=SC2016
    ip netns exec "$br" sh -c 'for f in /proc/sys/net/bridge/bridge-nf-call-*; do [ -w "$f" ] && echo 0 >"$f"; done' 2>/dev/null

    for (( i = 0; i < n; i++ )); do
        host=$name-$i
        step "netns add $host" ip netns add "$host"
        # Both ends are created directly in their namespaces: nothing appears
        # in the root namespace, and the short names cannot collide there.
        step "veth for $host" ip link add name eth0 netns "$host" type veth peer name "h$i" netns "$br"
        step "attach $host" ip -n "$br" link set "h$i" master br0 up
        step "lo on $host" ip -n "$host" link set lo up
        step "address on $host" ip -n "$host" addr add "$net.0.$(( i + 1 ))/24" dev eth0
        step "eth0 on $host" ip -n "$host" link set eth0 up
    done

    # Debian's default hosts file (own name on 127.0.1.1), plus the peers.
    for (( i = 0; i < n; i++ )); do
        host=$name-$i
        others=""
        for (( j = 0; j < n; j++ )); do
            (( j == i )) || others+="$net.0.$(( j + 1 ))	$name-$j"$'\n'
        done
        step "mkdir /etc/netns/$host" mkdir -p "/etc/netns/$host"
        # shellcheck disable=SC2016
        step "hosts file for $host" sh -c 'cat >"$0"' "/etc/netns/$host/hosts" <<EOF
127.0.0.1	localhost
127.0.1.1	$host

# The following lines are desirable for IPv6 capable hosts
::1     localhost ip6-localhost ip6-loopback
ff02::1 ip6-allnodes
ff02::2 ip6-allrouters

${others%$'\n'}
EOF
    done

    for (( i = 0; i < n; i++ )); do
        echo "$name-$i $net.0.$(( i + 1 ))"
    done
}

# Link state of host I's port, on the bridge side: the host keeps its address
# and sockets, but nothing gets through, as with a lost machine.
do_link() {
    local name=$1 i=$2 state=$3
    check_name "$name"; check_index "$i"
    [[ -e $netns_dir/$name-$i ]] || die "no host $name-$i"
    ip -n "$(bridge_ns "$name")" link set "h$i" "$state" || die "cannot set $name-$i $state"
}

do_check() {
    local t=nh-check-$$ why="" err
    if (( EUID != 0 )); then why="not root"
    elif ! command -v ip >/dev/null; then why="ip (iproute2) not found"
    elif ! command -v unshare >/dev/null; then why="unshare (util-linux) not found"
    elif ! command -v hostname >/dev/null; then why="hostname not found"
    elif [[ ! -f /etc/hosts ]]; then why="/etc/hosts missing"
    elif ! err=$(ip netns add "$t" 2>&1); then why="cannot create a network namespace: $err"
    elif ! err=$(ip -n "$t" link add nhc0 type veth peer name nhc1 2>&1); then why="cannot create a veth pair: $err"
    elif ! err=$(ip -n "$t" link add nhcbr type bridge 2>&1); then why="cannot create a bridge: $err"
    elif ! err=$(ip netns exec "$t" unshare --uts sh -c 'hostname nh-check' 2>&1); then why="cannot set a hostname in a UTS namespace: $err"
    fi
    ip netns del "$t" 2>/dev/null
    if [[ -n $why ]]; then
        echo "$prog: unusable here: ${why//$'\n'/ }"
        exit 77
    fi
}

cmd=${1:-}
(( $# )) && shift
case $cmd in
    up)   (( $# == 2 )) || usage; do_up "$1" "$2" ;;
    down) (( $# == 1 )) || usage; check_name "$1"; do_down "$1" ;;
    addr) (( $# == 2 )) || usage; check_name "$1"; check_index "$2"; addr_of "$1" "$2" ;;
    cut)  (( $# == 2 )) || usage; do_link "$1" "$2" down ;;
    heal) (( $# == 2 )) || usage; do_link "$1" "$2" up ;;
    exec)
        (( $# >= 3 )) || usage
        # 125 for the harness's own errors, so CMD's status stays readable.
        rc=125
        check_name "$1"; check_index "$2"
        host=$1-$2
        [[ -e $netns_dir/$host ]] || die "no host $host"
        shift 2
        # ip netns exec and unshare exec in place, and sh execs CMD: the PID
        # the caller holds ends up being CMD itself, so signals reach it.
        # shellcheck disable=SC2016
        exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" || exit 125; exec "$@"' "$host" "$@"
        ;;
    check) (( $# == 0 )) || usage; do_check ;;
    *) usage ;;
esac
