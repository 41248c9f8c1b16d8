#!/usr/bin/env bash
# One data-parallel run under a launcher a cluster has, against the same run under ampactor-launch
# on one host: every rank's output must be the same, byte for byte. Exits 77 (ctest: skipped) with
# the reason where the launcher cannot run here.
# Usage: run-under.sh hosts|mpirun|srun|torchrun LAUNCH WORKER OUT
#   hosts:  ampactor-launch --nnodes 2 on two network-namespace hosts named as Debian names them
#   mpirun: Open MPI's mpirun -np 2, on this host and on two namespace hosts (netns-rsh.sh)
#   srun: srun -n 2 on a one-node Slurm started here, and srun -N 2 on a two-node one whose nodes
#     are namespace hosts (slurm-hosts.sh)
#   torchrun: PyTorch's, from PyPI into OUT/../torch-venv, in each of its modes, a restart, two
#     hosts (static and c10d), and --nnodes 1:2 losing a host
#   lost-host: 4 sharded ranks on 2 namespace hosts, host 0's link cut mid-run; host 1's 2 ranks
#     resume from their own disk (shards and buddies' replicas), re-sharded 4 -> 2, as
#     ampactor-ckpt reshard would; prints the figures bench/distributed/README.md shows
set -uo pipefail
mode=$1 launch=$2 worker=$3 out=$4
here=$(cd "$(dirname "$0")" && pwd)
skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }
rm -rf "$out" && mkdir -p "$out/one" "$out/run" || fail "cannot make $out"
args=(--path pipeline --model mlp --steps 8 --staleness 1 --swap --inf-at 1:5 --timeout-ms 30000)

# The reference: two ranks on this host.
"$launch" --nproc 2 --master-port 0 -- "$worker" --out "$out/one" "${args[@]}" >"$out/one.log" 2>&1 ||
  fail "the reference run failed: $(cat "$out/one.log")"
# A port free now, for the launchers that need one named.
port=$("$launch" --nproc 1 --master-port 0 -- sh -c 'echo $MASTER_PORT')

case $mode in
  hosts)
    "$here/netns-hosts.sh" check || exit 77
    name=amp$$
    trap '"$here/netns-hosts.sh" down $name' EXIT
    "$here/netns-hosts.sh" up $name 2 >/dev/null || fail "the hosts could not be made"
    addr0=$("$here/netns-hosts.sh" addr $name 0)
    on() {  # on HOST: that host's ampactor-launch, node rank HOST of 2
      "$here/netns-hosts.sh" exec $name "$1" "$launch" --nnodes 2 --node-rank "$1" --nproc 1 \
        --master-addr "$addr0" --master-port "$port" -- "$worker" --out "$out/run" "${args[@]}"
    }
    on 0 >"$out/run.log" 2>&1 &
    on 1 >"$out/run1.log" 2>&1
    b=$?
    wait $! || fail "host 0's ranks failed: $(cat "$out/run.log" "$out/run1.log")"
    [ $b -eq 0 ] || fail "host 1's ranks failed: $(cat "$out/run1.log")"
    # Each host's name maps to 127.0.1.1: the address that reaches MASTER_ADDR is used, and said.
    cat "$out/run1.log" >>"$out/run.log"
    grep -q "resolves to 127.0.1.1 (loopback), so gloo uses 10\." "$out/run.log" ||
      fail "no word of the loopback name: $(cat "$out/run.log")"
    # gloo told to use loopback while MASTER_ADDR is another host: refused at once, by name.
    start=$SECONDS
    GLOO_SOCKET_IFNAME=lo on 0 >"$out/lo0.log" 2>&1 &
    GLOO_SOCKET_IFNAME=lo on 1 >"$out/lo1.log" 2>&1 && fail "a loopback device was taken"
    wait $! && fail "a loopback device was taken"
    cat "$out/lo0.log" "$out/lo1.log" >"$out/lo.log"
    [ "$(grep -c "GLOO_SOCKET_IFNAME=lo is a loopback interface, while MASTER_ADDR $addr0 is not" \
      "$out/lo.log")" -eq 2 ] || fail "the loopback device was not refused by name: $(cat "$out/lo.log")"
    # Far below the ranks' 30 s timeout.
    [ $((SECONDS - start)) -lt 15 ] || fail "the refusal took $((SECONDS - start)) s"
    ;;
  mpirun)
    command -v mpirun >/dev/null || skip "mpirun is not installed (apt-get install openmpi-bin)"
    root=(); [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
    mpirun "${root[@]}" --oversubscribe -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
      "$worker" --out "$out/run" "${args[@]}" >"$out/run.log" 2>&1 ||
      fail "mpirun failed: $(cat "$out/run.log")"
    # Two hosts as Debian names them, one rank each: mpirun on host 0 reaches host 1 through
    # netns-rsh.sh (its "ssh"), and MASTER_ADDR must be named: without it, refused at once.
    if "$here/netns-hosts.sh" check >/dev/null; then
      name=mp$$
      trap '"$here/netns-hosts.sh" down $name' EXIT
      "$here/netns-hosts.sh" up $name 2 >/dev/null || fail "the hosts could not be made"
      addr0=$("$here/netns-hosts.sh" addr $name 0)
      mkdir -p "$out/two"
      two() {
        NETNS_RSH_GROUP=$name "$here/netns-hosts.sh" exec $name 0 mpirun "${root[@]}" \
          --mca plm_rsh_agent "$here/netns-rsh.sh" --mca plm_rsh_no_tree_spawn 1 \
          --host $name-0:1,$name-1:1 -np 2 -x NETNS_RSH_GROUP "$@" "$worker" --out "$out/two" \
          "${args[@]}"
      }
      two -x MASTER_ADDR="$addr0" -x MASTER_PORT="$port" >"$out/two.log" 2>&1 ||
        fail "mpirun on two hosts failed: $(cat "$out/two.log")"
      for r in 0 1; do
        cmp -s "$out/one/rank$r.txt" "$out/two/rank$r.txt" ||
          fail "mpirun on two hosts: rank $r differs from one host's"
      done
      start=$SECONDS
      two >"$out/noaddr.log" 2>&1 && fail "two hosts without MASTER_ADDR ran"
      grep -q "and MASTER_ADDR is not set: name rank 0's host" "$out/noaddr.log" ||
        fail "no word of MASTER_ADDR: $(cat "$out/noaddr.log")"
      [ $((SECONDS - start)) -lt 15 ] || fail "the refusal took $((SECONDS - start)) s"
    else
      echo "mpirun on two hosts skipped: $("$here/netns-hosts.sh" check)"
    fi
    ;;
  srun)
    slurm=$here/slurm-one-node.sh hosts=$here/slurm-hosts.sh
    "$slurm" check || exit 77
    # Both clusters stopped (and the namespace hosts removed) however this ends; a signal too.
    trap '"$slurm" stop "$out/slurm" >/dev/null 2>&1; "$hosts" stop "$out/slurm2" >/dev/null 2>&1' EXIT
    trap 'exit 1' INT TERM
    "$slurm" start "$out/slurm" >"$out/slurm.log" 2>&1 ||
      { [ $? -eq 77 ] && skip "$(tail -1 "$out/slurm.log")"; fail "Slurm did not start: $(cat "$out/slurm.log")"; }
    # No MASTER_ADDR or MASTER_PORT: the first host of the step and a port from the job id.
    timeout -k 5 45 "$slurm" run "$out/slurm" srun -n 2 "$worker" --out "$out/run" "${args[@]}" \
      >"$out/run.log" 2>&1 || fail "srun failed: $(cat "$out/run.log")"
    "$slurm" stop "$out/slurm" >/dev/null 2>&1  # two cores: one cluster at a time
    # Two hosts as Debian names them, one rank each: slurmctld and a slurmd on host 0, a slurmd
    # on host 1, srun on host 0. Rank 0's host is the step's first by name, 127.0.1.1 on itself.
    mkdir -p "$out/two"
    if ! why=$("$hosts" check); then
      echo "srun on two hosts skipped: ${why#slurm-hosts: }"
    elif ! SLURM_ONE_NODE_TIMEOUT=20 "$hosts" start "$out/slurm2" 2 >"$out/slurm2.log" 2>&1; then
      why=$(grep -m1 '^slurm-hosts: ' "$out/slurm2.log" || tail -1 "$out/slurm2.log")
      echo "srun on two hosts skipped: ${why#slurm-hosts: } (see $out/slurm2.log)"
    else
      timeout -k 5 45 "$hosts" run "$out/slurm2" srun -N 2 -n 2 --ntasks-per-node 1 "$worker" \
        --out "$out/two" "${args[@]}" >"$out/two.log" 2>&1 ||
        fail "srun on two hosts failed: $(cat "$out/two.log")"
      for r in 0 1; do
        cmp -s "$out/one/rank$r.txt" "$out/two/rank$r.txt" ||
          fail "srun on two hosts: rank $r differs from one host's"
      done
      echo "srun on two hosts: both ranks equal one host's, byte for byte"
    fi
    ;;
  torchrun)
    venv=$(dirname "$out")/torch-venv
    "$here/torch-venv.sh" "$venv" >"$out/venv.log" 2>&1 || skip "$(tail -1 "$out/venv.log")"
    torchrun=$(tail -1 "$out/venv.log")
    # torchrun's own default (OMP_NUM_THREADS=1 for several workers), which rank 0 must say.
    unset OMP_NUM_THREADS
    under() {  # under NAME TORCHRUN-ARGS... -- WORKER-ARGS...: one run into OUT/NAME
      local name=$1; shift
      local opts=(); while [ "$1" != -- ]; do opts+=("$1"); shift; done; shift
      mkdir -p "$out/$name"
      "$torchrun" "${opts[@]}" --nproc-per-node 2 --no-python "$worker" --out "$out/$name" "$@" \
        >"$out/$name.log" 2>&1
    }
    same() {  # same NAME [FROM]: NAME's ranks equal one host's, from line FROM on
      for r in 0 1; do
        cmp -s <(tail -n +"${2:-1}" "$out/one/rank$r.txt") "$out/$1/rank$r.txt" ||
          fail "$1: rank $r differs from one host's: $(cat "$out/$1.log")"
      done
    }
    p2=$("$launch" --nproc 1 --master-port 0 -- sh -c 'echo $MASTER_PORT')
    under standalone --standalone -- "${args[@]}" || fail "--standalone: $(cat "$out/standalone.log")"
    same standalone
    under static --nnodes 1 --node-rank 0 --master-addr 127.0.0.1 --master-port "$port" -- \
      "${args[@]}" || fail "static: $(cat "$out/static.log")"
    same static
    under c10d --nnodes 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:"$p2" -- "${args[@]}" ||
      fail "c10d: $(cat "$out/c10d.log")"
    same c10d
    # No rendezvous options at all: torchrun's own 127.0.0.1:29500.
    under default -- "${args[@]}" || fail "default: $(cat "$out/default.log")"
    same default
    grep -q "OMP_NUM_THREADS=1 (torchrun's default for 2 workers a node)" "$out/standalone.log" ||
      fail "no word of torchrun's thread count: $(cat "$out/standalone.log")"
    # A rank's error reaches torchrun's summary instead of a bare exit code.
    under thrown --standalone -- "${args[@]}" --throw-at 1:5 && fail "a thrown step job passed"
    grep -q "rank 1 failed: its step job in iteration 5 threw" "$out/thrown.log" ||
      fail "torchrun's summary lacks the reason: $(cat "$out/thrown.log")"
    # A restart: rank 1 SIGKILLed at iteration 5 of attempt 0; attempt 1 resumes the save at 3.
    mkdir -p "$out/restart"
    "$torchrun" --standalone --max-restarts 1 --nproc-per-node 2 --no-python sh -c \
      'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then set -- "$@" --die-at 1:5; fi; exec "$@"' \
      sh "$worker" --out "$out/restart" "${args[@]}" --save-at 3 --resume-any \
      --ckpt "$out/restart/ckpt" >"$out/restart.log" 2>&1 || fail "the restart: $(cat "$out/restart.log")"
    same restart 5
    # Two hosts as Debian names them, one rank each, static rendezvous on host 0's address.
    if "$here/netns-hosts.sh" check >/dev/null; then
      name=tr$$
      trap '"$here/netns-hosts.sh" down $name' EXIT
      "$here/netns-hosts.sh" up $name 2 >/dev/null || fail "the hosts could not be made"
      addr0=$("$here/netns-hosts.sh" addr $name 0)
      mkdir -p "$out/two"
      node() {
        "$here/netns-hosts.sh" exec $name "$1" "$torchrun" --nnodes 2 --node-rank "$1" \
          --nproc-per-node 1 --master-addr "$addr0" --master-port "$port" --no-python \
          "$worker" --out "$out/two" "${args[@]}"
      }
      node 0 >"$out/two0.log" 2>&1 &
      node 1 >"$out/two1.log" 2>&1 || fail "two hosts: $(cat "$out/two0.log" "$out/two1.log")"
      wait $! || fail "two hosts, host 0: $(cat "$out/two0.log")"
      same two
      # c10d rendezvous at host 0's name, as clusters name it: MASTER_ADDR is then that name,
      # 127.0.1.1 on host 0 itself, where gloo must take the address the other host reaches.
      mkdir -p "$out/rdzv"
      rdzv() {
        "$here/netns-hosts.sh" exec $name "$1" "$torchrun" --nnodes 2 --nproc-per-node 1 \
          --rdzv-backend c10d --rdzv-endpoint $name-0:"$p2" --no-python "$worker" \
          --out "$out/rdzv" "${args[@]}"
      }
      rdzv 0 >"$out/rdzv0.log" 2>&1 &
      rdzv 1 >"$out/rdzv1.log" 2>&1 || fail "c10d, two hosts: $(cat "$out/rdzv0.log" "$out/rdzv1.log")"
      wait $! || fail "c10d, two hosts, host 0: $(cat "$out/rdzv0.log")"
      same rdzv
      grep -q "so gloo uses $addr0, the address other hosts reach this one at" "$out/rdzv0.log" ||
        fail "host 0 took no outward address: $(cat "$out/rdzv0.log")"
      # --nnodes 1:2, host 1's link cut mid-run: host 0's agent restarts its rank alone, which
      # resumes from its own disk (its shard and host 1's replica), re-sharded 2 -> 1, as
      # ampactor-ckpt reshard would. The restarted attempt first copies the save it will resume.
      sharded=(--path pipeline --model mlp --shard --fused --adam --staleness 0 --steps 100
        --save-every 5 --timeout-ms 3000)
      mkdir -p "$out/el/A" "$out/el/B" "$out/el/o" "$out/el/ref" "$out/el/ref-o"
      elastic() {
        (cd "$out/el/$2" && exec "$here/netns-hosts.sh" exec $name "$1" "$torchrun" --nnodes 1:2 \
          --nproc-per-node 1 --max-restarts 1 --rdzv-backend c10d --rdzv-endpoint $name-0:"$p2" \
          --rdzv-conf last_call_timeout=1 --no-python sh -c \
          'if [ "$TORCHELASTIC_RESTART_COUNT" = 1 ]; then mkdir -p snap && cp ckpt* snap/; fi; exec "$@"' \
          sh "$worker" --out "$out/el/o" "${sharded[@]}" --step-ms 50 --resume-any --ckpt ckpt)
      }
      "$here/netns-hosts.sh" heal $name 1
      elastic 0 A >"$out/el0.log" 2>&1 & pid0=$!
      elastic 1 B >"$out/el1.log" 2>&1 & pid1=$!
      saved() { sed -n 's/^ *"step": \([0-9]*\),*/\1/p' "$out/el/A/ckpt" 2>/dev/null; }
      for _ in $(seq 600); do [ "$(saved)" ] && [ "$(saved)" -ge 14 ] && break; sleep 0.1; done
      [ "$(saved)" ] && [ "$(saved)" -ge 14 ] || fail "no save on host 0: $(cat "$out/el0.log")"
      "$here/netns-hosts.sh" cut $name 1 || fail "the link could not be cut"
      wait $pid0 || fail "host 0 did not resume alone: $(cat "$out/el0.log")"
      kill $pid1 2>/dev/null  # host 1's agent waits for a store it cannot reach
      step=$(sed -n 's/^ *"step": \([0-9]*\),*/\1/p' "$out/el/A/snap/ckpt")
      "$(dirname "$launch")/ampactor-ckpt" reshard "$out/el/A/snap/ckpt" --world 1 \
        "$out/el/ref/ckpt" >"$out/el/reshard.log" 2>&1 || fail "reshard: $(cat "$out/el/reshard.log")"
      "$launch" --nproc 1 --master-port 0 -- "$worker" --out "$out/el/ref-o" "${sharded[@]}" \
        --resume --ckpt "$out/el/ref/ckpt" >"$out/el/ref.log" 2>&1 ||
        fail "the reference run: $(cat "$out/el/ref.log")"
      cmp -s "$out/el/ref-o/rank0.txt" "$out/el/o/rank0.txt" ||
        fail "the restarted rank differs from ampactor-ckpt reshard's run"
      [ "$(head -1 "$out/el/o/rank0.txt" | cut -d' ' -f1)" = $((step + 1)) ] ||
        fail "the restart did not resume after the last save (step $step)"
      echo "torchrun --nnodes 1:2: host 1 cut after the save at $step; host 0 resumed alone"
    else
      echo "torchrun on two hosts skipped: $("$here/netns-hosts.sh" check)"
    fi
    ;;
  lost-host)
    "$here/netns-hosts.sh" check || exit 77
    name=lost$$
    trap '"$here/netns-hosts.sh" down $name' EXIT
    "$here/netns-hosts.sh" up $name 2 >/dev/null || fail "the hosts could not be made"
    addr0=$("$here/netns-hosts.sh" addr $name 0)
    ckpt_tool=$(dirname "$launch")/ampactor-ckpt
    sharded=(--path pipeline --model mlp --shard --fused --adam --staleness 0 --steps 200
      --save-every 5 --timeout-ms 3000)
    mkdir -p "$out/A" "$out/B" "$out/ref" "$out/cut" "$out/resumed" "$out/reference"
    now() { date +%s.%N; }
    # Each host in a folder of its own, standing for its disk; the same relative path on both.
    node() {  # node HOST: that host's 2 ranks of the 4
      (cd "$out/$([ "$1" = 0 ] && echo A || echo B)" &&
        exec "$here/netns-hosts.sh" exec $name "$1" "$launch" --nnodes 2 --node-rank "$1" \
          --nproc 2 --master-addr "$addr0" --master-port "$port" --grace 5 -- \
          "$worker" --out "$out/cut" "${sharded[@]}" --step-ms 50 --ckpt ckpt)
    }
    node 0 >"$out/cut0.log" 2>&1 & pid0=$!
    node 1 >"$out/cut1.log" 2>&1 & pid1=$!
    saved() { sed -n 's/^ *"step": \([0-9]*\),*/\1/p' "$out/B/ckpt" 2>/dev/null; }
    for _ in $(seq 600); do [ "$(saved)" ] && [ "$(saved)" -ge 14 ] && break; sleep 0.1; done
    [ "$(saved)" ] && [ "$(saved)" -ge 14 ] || fail "no save on host 1: $(cat "$out/cut1.log")"
    "$here/netns-hosts.sh" cut $name 0 || fail "the link could not be cut"
    cut_at=$(now)
    wait $pid1; ended1=$(now)
    wait $pid0; ended0=$(now)
    step=$(saved)
    last=$(tail -1 "$out/cut/rank2.txt" | cut -d' ' -f1)
    # The reference: the survivors' disk re-sharded by the offline tool, before the restart saves.
    "$ckpt_tool" reshard "$out/B/ckpt" --world 2 "$out/ref/ckpt" >"$out/reshard.log" 2>&1 ||
      fail "ampactor-ckpt reshard: $(cat "$out/reshard.log")"
    restart_at=$(now)
    (cd "$out/B" && "$here/netns-hosts.sh" exec $name 1 "$launch" --nproc 2 --master-port 0 -- \
      "$worker" --out "$out/resumed" "${sharded[@]}" --resume-any --ckpt ckpt) \
      >"$out/resumed.log" 2>&1 & pid=$!
    for _ in $(seq 600); do [ -s "$out/resumed/rank0.txt" ] && break; sleep 0.05; done
    first_step=$(now)
    wait $pid || fail "the survivors did not resume: $(cat "$out/resumed.log")"
    "$launch" --nproc 2 --master-port 0 -- "$worker" --out "$out/reference" "${sharded[@]}" \
      --resume --ckpt "$out/ref/ckpt" >"$out/reference.log" 2>&1 ||
      fail "the reference run: $(cat "$out/reference.log")"
    for r in 0 1; do
      cmp -s "$out/reference/rank$r.txt" "$out/resumed/rank$r.txt" ||
        fail "rank $r's resumed run differs from ampactor-ckpt reshard's"
    done
    [ "$(head -1 "$out/resumed/rank0.txt" | cut -d' ' -f1)" = $((step + 1)) ] ||
      fail "the survivors did not resume after the last save (step $step)"
    lost=$((last - step))
    [ $lost -le 5 ] || fail "$lost steps lost, more than the save interval (5)"
    awk -v c="$cut_at" -v e0="$ended0" -v e1="$ended1" -v r="$restart_at" -v f="$first_step" \
      -v s="$step" -v l="$lost" 'BEGIN { printf "lost-host: cut to exit %.1f s (host 0), %.1f s (host 1); restart to first resumed step %.1f s; save at %d, %d steps lost (timeout 3 s)\n", e0 - c, e1 - c, f - r, s, l }'
    ;;
  *) echo "usage: $0 hosts|mpirun|srun|torchrun|lost-host LAUNCH WORKER OUT" >&2; exit 2 ;;
esac
[ "$mode" = torchrun ] || [ "$mode" = lost-host ] || for r in 0 1; do
  cmp -s "$out/one/rank$r.txt" "$out/run/rank$r.txt" ||
    fail "rank $r differs from one host's: $(diff "$out/one/rank$r.txt" "$out/run/rank$r.txt" | head -5)"
done
echo "$mode: both ranks equal one host's, byte for byte"
