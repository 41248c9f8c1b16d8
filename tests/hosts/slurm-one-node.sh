#!/usr/bin/env bash
# A private one-node Slurm cluster (slurmctld + slurmd + munged) for tests that
# launch programs with `srun`. Everything (config, key, state, logs, pids) lives
# in a state folder DIR, on free ports, so it never touches a system Slurm.
# Usage: slurm-one-node.sh check | start DIR | run DIR CMD... | stop DIR
# `check` and `start` exit 77 (ctest skip) when Slurm can't run here.
# slurm-hosts.sh sources this file for the same cluster on namespace hosts.
set -uo pipefail

prog=slurm-one-node
# Seconds to wait for the node to come up, and for each daemon to exit.
start_timeout=${SLURM_ONE_NODE_TIMEOUT:-30}
stop_timeout=10
# CPUs the node claims: more than a small CI machine has, so `srun -n 4`
# fits anywhere (config_overrides makes slurmd accept it).
node_cpus=${SLURM_ONE_NODE_CPUS:-8}
daemons=(slurmd slurmctld munged)
# The command prefix that runs a program on node I of the cluster in DIR (on_node DIR I
# sets it): none, every node is this host. slurm-hosts.sh puts each node on a host of its
# own, and takes those hosts down in `stopped DIR`, the last step of a stop.
on=()
on_node() { on=(); }
stopped() { :; }

die() { echo "$prog: $*" >&2; exit "${rc:-1}"; }

usage() {
    cat >&2 <<EOF
usage: $0 check            exit 0 if usable here, else print why and exit 77
       $0 start DIR        start the cluster with its state in DIR; prints
                           the SLURM_CONF export clients need
       $0 run DIR CMD...   run CMD (e.g. srun -n 2 prog) against that cluster
       $0 stop DIR         stop it (idempotent); DIR keeps the logs
EOF
    exit 2
}

# Prints why Slurm can't run here, if it can't.
unusable() {
    local b
    (( EUID == 0 )) || { echo "needs root (slurmd and munged run as root)"; return; }
    for b in slurmctld slurmd munged srun sinfo; do
        command -v "$b" >/dev/null 2>&1 ||
            { echo "$b not found (apt-get install slurmctld slurmd slurm-client)"; return; }
    done
}

cmd_check() {
    local why
    why=$(unusable)
    [[ -z $why ]] || { echo "$prog: $why"; exit 77; }
}

# Absolute, so that slurm.conf and pid files stay valid from any cwd.
state_dir() {
    [[ -n ${1:-} ]] || usage
    [[ -d $1 ]] || die "no folder $1"
    (cd -- "$1" && pwd -P)
}

# Ports bound by anything on this machine, one decimal number per line.
used_ports() {
    local f _sl local_addr _rest
    for f in /proc/net/tcp /proc/net/tcp6; do
        [[ -r $f ]] || continue
        while read -r _sl local_addr _rest; do
            [[ $local_addr == *:* ]] && echo $(( 16#${local_addr##*:} ))
        done < <(tail -n +2 "$f")
    done
}

# Two consecutive free ports, below the usual ephemeral range (32768+) so that
# outgoing connections don't take them between choosing and binding.
free_port_pair() {
    local used p i
    used=" $(used_ports | tr '\n' ' ') "
    for (( i = 0; i < 200; i++ )); do
        p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 12000 ))
        [[ $used == *" $p "* || $used == *" $((p + 1)) "* ]] || { echo "$p"; return 0; }
    done
    return 1
}

pid_of() { local p; read -r p 2>/dev/null < "$1/pids/$2" && echo "$p"; }

# True if pid file NAME (DAEMON or DAEMON@NODE) names a live process that is
# still DAEMON (pids get reused). A zombie counts as gone: an init that reaps
# slowly (seconds, in some containers) must not make stop wait for it.
alive() {
    local p stat
    p=$(pid_of "$1" "$2") || return 1
    read -r stat 2>/dev/null < "/proc/$p/stat" || return 1
    [[ $stat == "$p (${2%@*}) "[^ZX]* ]]
}

# Prints the pids of processes (other than this one) with LINE in their
# environment; one grep over all of /proc, NUL-separated entries as lines.
pids_with_env() {
    local f p
    while read -r f; do
        p=${f#/proc/}; p=${p%/environ}
        (( p == $$ )) || echo "$p"
    done < <(grep -lzxF -- "$1" /proc/[0-9]*/environ 2>/dev/null)
}

# Leftovers of jobs. slurmstepd has an empty environment but keeps its slurmd's
# log open; srun clients and tasks carry the SLURM_CONF that `run` set (tasks
# also a job id; the shell that `run` started has neither srun nor a job id).
leftover_pids() {
    local dir=$1 f p fd comm
    while read -r f; do
        p=${f#/proc/}; p=${p%/comm}
        for fd in /proc/"$p"/fd/*; do
            [[ $(readlink "$fd" 2>/dev/null) == "$dir"/log/slurmd-*.log ]] && { echo "$p"; break; }
        done
    done < <(grep -lx slurmstepd /proc/[0-9]*/comm 2>/dev/null)
    for p in $(pids_with_env "SLURM_CONF=$dir/slurm.conf"); do
        read -r comm 2>/dev/null < "/proc/$p/comm" || continue
        if [[ $comm == srun ]] || grep -qz '^SLURM_JOB_ID=' "/proc/$p/environ" 2>/dev/null; then
            echo "$p"
        fi
    done
}

# SIGTERM, wait, then SIGKILL: state folders must be reusable right away.
stop_daemon() {
    local dir=$1 name=$2 p i
    if alive "$dir" "$name"; then
        p=$(pid_of "$dir" "$name")
        kill -TERM "$p" 2>/dev/null
        for (( i = 0; i < stop_timeout * 10; i++ )); do
            alive "$dir" "$name" || break
            sleep 0.1
        done
        if alive "$dir" "$name"; then
            echo "$prog: $name ($p) ignored SIGTERM for ${stop_timeout}s, killing it" >&2
            kill -KILL "$p" 2>/dev/null
            while alive "$dir" "$name"; do sleep 0.1; done
        fi
    fi
    rm -f -- "$dir/pids/$name"
}

stop_all() {
    local dir=$1 i p f left
    # Cancel jobs first, so slurmstepd kills its tasks itself.
    if alive "$dir" slurmctld; then
        on_node "$dir" 0
        SLURM_CONF=$dir/slurm.conf timeout 5 "${on[@]}" squeue -h -o %i 2>/dev/null |
            SLURM_CONF=$dir/slurm.conf xargs -r timeout 5 "${on[@]}" scancel 2>/dev/null
        for (( i = 0; i < 50; i++ )); do
            [[ -z $(leftover_pids "$dir") ]] && break
            sleep 0.1
        done
    fi
    left=$(leftover_pids "$dir")
    for p in $left; do kill -KILL "$p" 2>/dev/null; done
    for p in "${daemons[@]}"; do
        for f in "$dir/pids/$p" "$dir/pids/$p"@*; do
            [[ -e $f ]] && stop_daemon "$dir" "${f##*/}"
        done
    done
    # The munge socket may live in a short folder outside DIR (see start).
    if [[ -r $dir/munge/socket-dir ]]; then
        read -r p < "$dir/munge/socket-dir" && [[ $p == /tmp/$prog.* ]] && rm -rf -- "$p"
        rm -f -- "$dir/munge/socket-dir"
    fi
    stopped "$dir"
}

cmd_stop() {
    local dir
    [[ -n ${1:-} ]] || usage
    [[ -d $1 ]] || exit 0
    dir=$(state_dir "$1") || exit 1
    stop_all "$dir"
}

# On a failed start: say why, show the logs that tell more, undo, exit.
# Usage: fail DIR MESSAGE [LOG...]
fail() {
    local dir=$1 msg=$2 log
    shift 2
    echo "$prog: $msg" >&2
    for log in "$@"; do
        [[ -s $log ]] || continue
        echo "--- last lines of $log:" >&2
        tail -n 20 -- "$log" >&2
    done
    stop_all "$dir"
    exit "${rc:-1}"
}

# Runs a daemon in the foreground (-D/-F) but in the background of this
# script, in its own session, with no fd shared with the caller: ctest waits
# for the test's stdout to close, which would hang on an inherited one.
launch() {
    local dir=$1 name=$2 log=$3
    shift 3
    local p i comm
    setsid "$@" < /dev/null >> "$log" 2>&1 &
    p=$!
    # Until the exec, the child is still "bash" or "setsid"; `alive` checks the name.
    for (( i = 0; i < 50; i++ )); do
        read -r comm 2>/dev/null < "/proc/$p/comm" || break
        [[ $comm == "${name%@*}" ]] && break
        sleep 0.02
    done
    echo "$p" > "$dir/pids/$name"
}

start_munge() {
    local dir=$1 m=$1/munge sock_dir i
    if ! mkdir -p -- "$m" || ! chmod 755 -- "$m"; then
        fail "$dir" "cannot create $m"
    fi
    # A socket path must fit in sun_path (108 bytes); deep build folders don't.
    sock_dir=$m
    if (( ${#m} > 80 )); then
        sock_dir=$(mktemp -d "/tmp/$prog.XXXXXX") || fail "$dir" "mktemp failed"
        echo "$sock_dir" > "$m/socket-dir"
    fi
    munge_socket=$sock_dir/munged.socket
    # A fresh key per cluster: only our slurm daemons and clients share it.
    if [[ ! -s $m/munge.key ]]; then
        (umask 077 && head -c 1024 /dev/urandom > "$m/munge.key") ||
            fail "$dir" "cannot write $m/munge.key"
    fi
    : > "$m/munged.log"
    # --force: munged refuses root and loose folder permissions without it.
    launch "$dir" munged "$m/munged.log" munged --foreground --force \
        --socket="$munge_socket" --key-file="$m/munge.key" --pid-file="$m/munged.pid" \
        --log-file="$m/munged.log" --seed-file="$m/munged.seed"
    for (( i = 0; i < start_timeout * 10; i++ )); do
        [[ -S $munge_socket ]] && return 0
        alive "$dir" munged || fail "$dir" "munged exited" "$m/munged.log"
        sleep 0.1
    done
    fail "$dir" "munged made no socket in ${start_timeout}s" "$m/munged.log"
}

# Usage: write_conf DIR PORT NODE=ADDR...: slurmctld on the first node, a slurmd on each.
write_conf() {
    local dir=$1 port=$2 n names="" nodes=""
    shift 2
    for n in "$@"; do
        names+=${names:+,}${n%%=*}
        nodes+="NodeName=${n%%=*} NodeAddr=${n#*=} NodeHostname=${n%%=*} CPUs=$node_cpus State=UNKNOWN"$'\n'
    done
    # %n: each slurmd (one a node, all reading this file) has its own spool, pid and log.
    cat > "$dir/slurm.conf" <<EOF
# Test cluster written by $prog; all paths are inside this folder.
ClusterName=ampactortest
SlurmctldHost=${1%%=*}(${1#*=})
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups, no accounting: nothing outside this folder is needed.
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
InactiveLimit=0
KillWait=2
MinJobAge=10
${nodes}PartitionName=test Nodes=$names Default=YES MaxTime=INFINITE State=UP
EOF
}

# The first half of `start`: Slurm usable here (else exit 77), DIR made and cleared of an
# earlier run (a crash may have left daemons or jobs); sets dir to its absolute path.
new_state_dir() {
    local why
    why=$(unusable)
    [[ -z $why ]] || rc=77 die "$why"
    [[ -n ${1:-} ]] || usage
    mkdir -p -- "$1" || die "cannot create $1"
    dir=$(state_dir "$1") || exit 1
    stop_all "$dir"
    rm -rf -- "$dir/state" "$dir/spool" "$dir/run" "$dir/log" "$dir/pids"
    mkdir -p -- "$dir/state" "$dir/spool" "$dir/run" "$dir/log" "$dir/pids" ||
        die "cannot create folders in $dir"
}

# The second half: munged, slurmctld on the first node and a slurmd on each (where on_node
# says), then a wait until every node is idle. Usage: start_cluster DIR NODE=ADDR...
start_cluster() {
    local dir=$1 l=$1/log port i n f state
    shift
    start_munge "$dir"
    port=$(free_port_pair) || fail "$dir" "no free port pair in 20000-32000"
    write_conf "$dir" "$port" "$@"

    on_node "$dir" 0
    launch "$dir" slurmctld "$l/slurmctld.out" "${on[@]}" slurmctld -D -f "$dir/slurm.conf"
    for (( i = 0; i < $#; i++ )); do
        n=${*:i+1:1}; n=${n%%=*}
        # slurmd's spool (%n): made here, as slurmd looks for it (logging an error) first.
        mkdir -p -- "$dir/spool/$n"
        on_node "$dir" "$i"
        # -N: the node name is ours to choose; don't depend on the hostname lookup.
        launch "$dir" "slurmd@$n" "$l/slurmd-$n.out" "${on[@]}" slurmd -D -f "$dir/slurm.conf" -N "$n"
    done

    on_node "$dir" 0
    for (( i = 0; i < start_timeout * 5; i++ )); do
        for f in "$dir"/pids/slurm*; do
            f=${f##*/}
            alive "$dir" "$f" || fail "$dir" "$f exited" "$l/${f/@/-}".{out,log}
        done
        # One line per state: all nodes idle is exactly "idle".
        state=$(SLURM_CONF=$dir/slurm.conf timeout 5 "${on[@]}" sinfo -h -o %t 2>/dev/null)
        if [[ $state == idle ]]; then
            echo "export SLURM_CONF=$dir/slurm.conf"
            return 0
        fi
        sleep 0.2
    done
    fail "$dir" "nodes not idle after ${start_timeout}s (state '${state//$'\n'/ }')" "$l"/*
}

cmd_start() {
    local dir node
    new_state_dir "${1:-}"
    node=$(hostname -s 2>/dev/null || uname -n)
    start_cluster "$dir" "${node%%.*}=127.0.0.1"
}

cmd_run() {
    local dir v
    dir=$(state_dir "${1:-}") || exit 1
    shift
    (( $# > 0 )) || usage
    [[ -r $dir/slurm.conf ]] || die "no cluster in $dir (run start first)"
    # Variables from an enclosing allocation would point srun at a job of
    # another cluster (SLURM_JOB_ID) or change its options.
    for v in $(compgen -e); do
        case $v in SLURM_* | SRUN_* | SALLOC_* | SBATCH_* | SQUEUE_* | SINFO_*) unset "$v" ;; esac
    done
    on_node "$dir" 0
    SLURM_CONF=$dir/slurm.conf exec "${on[@]}" "$@"
}

# Sourced (by slurm-hosts.sh): the functions only.
[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0
case ${1:-} in
    check) cmd_check ;;
    start) cmd_start "${2:-}" ;;
    run) shift; cmd_run "$@" ;;
    stop) cmd_stop "${2:-}" ;;
    *) usage ;;
esac
