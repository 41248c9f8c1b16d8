#!/usr/bin/env bash
# A lost host, measured (bench/distributed/README.md, "A lost host"), 4 sharded ranks on 2
# network-namespace hosts (tests/hosts):
#  1. tests/hosts/run-under.sh lost-host, RUNS times: from a cut link to every rank's exit on each
#     side, from the restart to the survivors' first resumed step, the steps lost;
#  2. save_run with replicas against without (shard_replicas off), a save every iteration, in
#     PAIRS alternating pairs (a pair's ratio swings by a fifth on this VM), the model wide
#     enough for 7 MB shards.
# Usage (root): bench/distributed/lost_host.sh [BUILD] [JSON] [RUNS] [PAIRS]
#   (build, bench/results/data/results-lost-host.json, 5, 9)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build} json=${2:-bench/results/data/results-lost-host.json} runs=${3:-5} pairs=${4:-9}
launch=$PWD/$build/tools/ampactor-launch worker=$PWD/$build/tests/ampactor-dist-worker
hosts=$PWD/tests/hosts/netns-hosts.sh
out=$PWD/$build/bench-lost-host
rm -rf "$out" && mkdir -p "$out"
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

: >"$out/figures"
for i in $(seq "$runs"); do
  line=$(tests/hosts/run-under.sh lost-host "$launch" "$worker" "$out/run" | grep '^lost-host: cut')
  echo "$line"
  echo "$line" | sed 's/.*exit \([0-9.]*\) s (host 0), \([0-9.]*\) s (host 1); restart to first resumed step \([0-9.]*\) s; save at [0-9]*, \([0-9]*\) steps.*/\1 \2 \3 \4/' >>"$out/figures"
done

name=save$$
trap '"$hosts" down $name' EXIT
"$hosts" up $name 2 >/dev/null
addr0=$("$hosts" addr $name 0)
save_ms() {  # save_ms REPLICAS: the mean save over the 4 ranks, in ms
  local port
  port=$("$launch" --nproc 1 --master-port 0 -- sh -c 'echo $MASTER_PORT')
  rm -rf "$out/save" && mkdir -p "$out/save/A" "$out/save/B" "$out/save/o"
  for h in 0 1; do
    (cd "$out/save/$([ $h = 0 ] && echo A || echo B)" &&
      "$hosts" exec $name $h "$launch" --nnodes 2 --node-rank $h --nproc 2 --master-addr "$addr0" \
        --master-port "$port" -- "$worker" --out "$out/save/o" --path pipeline --model mlp \
        --width 1024 --shard --fused --adam --staleness 0 --steps 12 --save-every 1 \
        --time-saves --replicas "$1" --ckpt ckpt) 2>"$out/save/log$h" &
  done
  wait
  cat "$out/save/log0" "$out/save/log1" | sed -n 's/^save-time rank [0-9]*: \([0-9]*\) saves, \([0-9.]*\) ms/\1 \2/p' |
    awk '{ n += $1; t += $2 } END { printf "%.3f\n", t / n }'
}
: >"$out/saves"
for i in $(seq "$pairs"); do
  if [ $((i % 2)) = 1 ]; then off=$(save_ms off); on=$(save_ms auto); else on=$(save_ms auto); off=$(save_ms off); fi
  echo "save: unreplicated $off ms, replicated $on ms"
  echo "$off $on" >>"$out/saves"
done
shard=$(stat -c %s "$out/save/B/ckpt".step*.rank2-of-4 | head -1)

python3 - "$out/figures" "$out/saves" "$json" "$shard" <<'PY'
import json, statistics, sys
fig = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
saves = [list(map(float, l.split())) for l in open(sys.argv[2]) if l.strip()]
med = lambda xs: statistics.median(xs)
out = {
    "timeout_s": 3.0,
    "runs": len(fig),
    "save_pairs": len(saves),
    "cut_to_exit_host0_s": med([f[0] for f in fig]),
    "cut_to_exit_host1_s": med([f[1] for f in fig]),
    "cut_to_exit_worst_s": max(max(f[0], f[1]) for f in fig),
    "restart_to_first_step_s": med([f[2] for f in fig]),
    "restart_to_first_step_worst_s": max(f[2] for f in fig),
    "steps_lost_worst": max(f[3] for f in fig),
    "save_interval": 5,
    "save_unreplicated_ms": med([s[0] for s in saves]),
    "save_replicated_ms": med([s[1] for s in saves]),
    "save_ratio": med([s[1] / s[0] for s in saves]),
    "save_ratios": [round(s[1] / s[0], 3) for s in saves],
    "shard_bytes": int(sys.argv[4]),
}
json.dump(out, open(sys.argv[3], "w"), indent=1)
print(json.dumps(out, indent=1))
PY
