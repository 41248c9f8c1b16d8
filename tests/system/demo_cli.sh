#!/bin/sh
# ampactor-demo from the command line: bad options are refused with a message and a non-zero
# exit, and a short run of every mode writes its outputs, with the injected overflow skipped
# exactly once in each scaled mode and never in the others (no burst: --spike-length 0).
set -u
demo=$1
out=$2
fail() { echo "FAIL: $*"; exit 1; }

refused() {  # refused "what the message must say" args...
  want=$1
  shift
  msg=$("$demo" "$@" 2>&1) && fail "ampactor-demo $* exited 0"
  echo "$msg" | grep -q -- "$want" || fail "ampactor-demo $*: no '$want' in: $msg"
}
refused "--steps" --steps 0
refused "--mode" --mode fp8
refused "--device" --device tpu
refused "outside" --steps 10 --overflow-at 10
refused "--workers" --workers 0.5
refused "the burst" --steps 10 --spike-at 8 --spike-length 4
refused "--spike-factor" --spike-factor 0
refused "--behind-ms" --behind-ms -1
refused "no such directory" --steps 2 --text-dir /nonexistent --out "$out/bad"
refused "unknown option\|not expected\|--bogus" --bogus

rm -rf "$out"
"$demo" --steps 8 --batch 256 --probe-every 2 --overflow-at 3 --spike-length 0 --out "$out" \
  --trace "$out/t.jsonl" >"$out.log" 2>&1 || { cat "$out.log"; fail "short run failed"; }
for m in fp32 fp16-noscale fp16-sync fp16-overlap fp16-async fp16-async-lagged \
  fp16-async-lagged-behind fp16-roundpipe fp16-deepspeed; do
  [ "$(wc -l <"$out/$m.csv")" -eq 9 ] || fail "$m.csv should have a header and 8 rows"
  [ "$(wc -l <"$out/$m.probe.csv")" -eq 5 ] || fail "$m.probe.csv should have a header and 4 rows (0, 2, 4, 6)"
  skipped=$(awk -F, 'NR > 1 { s += $4 } END { print s + 0 }' "$out/$m.csv")
  case $m in
    fp32 | fp16-noscale) want=0 ;;
    *) want=1 ;;
  esac
  [ "$skipped" -eq "$want" ] || fail "$m skipped $skipped steps, expected $want"
done
for m in fp16-sync fp16-overlap fp16-async fp16-async-lagged fp16-async-lagged-behind fp16-roundpipe \
  fp16-deepspeed; do
  [ -s "$out/t.$m.jsonl" ] || fail "no trace for $m"
done
# The overlapped backward trains as the synchronous pipeline, bit for bit (the CSVs' last
# column is each iteration's time).
[ "$(cut -d, -f1-4 "$out/fp16-sync.csv")" = "$(cut -d, -f1-4 "$out/fp16-overlap.csv")" ] ||
  fail "fp16-overlap's losses, scales or skips differ from fp16-sync's"
cmp "$out/fp16-sync.probe.csv" "$out/fp16-overlap.probe.csv" ||
  fail "fp16-overlap's eval losses differ from fp16-sync's"
[ -s "$out/summary.csv" ] || fail "no summary.csv"
# The demo checks it too, and says so; the final eval losses agree as well.
grep -q "the pipeline's case: fp16-overlap ends at fp16-sync's eval loss, losses, scales and skips, bit for bit" \
  "$out.log" || fail "the demo did not report fp16-overlap equal to fp16-sync bit for bit"
[ "$(grep '^fp16-sync,' "$out/summary.csv" | cut -d, -f2-8)" = \
  "$(grep '^fp16-overlap,' "$out/summary.csv" | cut -d, -f2-8)" ] ||
  fail "fp16-overlap's summary (eval loss, skips, final scale) differs from fp16-sync's"
# Every scaled run's per-iteration metrics: a record per iteration, the injected overflow skipped.
for m in fp16-sync fp16-overlap fp16-async fp16-deepspeed; do
  [ "$(wc -l <"$out/metrics/$m.jsonl")" -eq 8 ] || fail "metrics/$m.jsonl should have 8 records"
  grep -q '"k":3,.*"skipped":true' "$out/metrics/$m.jsonl" || fail "metrics/$m.jsonl: iteration 3 not skipped"
done
if [ -d "$out/tensorboard" ]; then
  ls "$out/tensorboard/fp16-overlap/"events.out.tfevents.* >/dev/null || fail "no TensorBoard events for fp16-overlap"
fi

# Data parallel, where the build has ampactor::distributed: 2 ranks skip what one process skips.
if "$demo" --help | grep -q -- "--nproc"; then
  refused "has no scaler" --nproc 2 --mode fp32,fp16-sync
  refused "--nproc" --nproc 1
  refused "fp16-overlap" --nproc 2 --mode fp16-overlap
  rm -rf "$out.dp"
  "$demo" --nproc 2 --steps 8 --batch 256 --probe-every 0 --overflow-at 3 --spike-length 0 \
    --out "$out.dp" >"$out.dp.log" 2>&1 || { cat "$out.dp.log"; fail "--nproc 2 failed"; }
  for m in fp16-sync fp16-async; do
    grep -q "^$m .* 1 *1  yes$" "$out.dp.log" || { cat "$out.dp.log"; fail "$m: not 1 skip in both runs, alike on every rank"; }
    [ "$(wc -l <"$out.dp/dp/rank1/$m.csv")" -eq 9 ] || fail "rank 1's $m.csv should have 8 rows"
  done
fi
echo "demo CLI: ok"
