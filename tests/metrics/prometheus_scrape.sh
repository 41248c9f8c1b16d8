#!/usr/bin/env bash
# Usage: prometheus_scrape.sh RUN_EXE WORK_DIR - a real Prometheus server (Debian's prometheus)
# scrapes a running training's endpoint every second; its query API must see
# ampactor_iterations_total advance. Skipped (exit 77, with the reason) where the server is not
# installed or does not start.
set -u
run=$1 work=$2
command -v prometheus >/dev/null || { echo "skipped: no prometheus server (apt install prometheus)"; exit 77; }
command -v curl >/dev/null || { echo "skipped: no curl"; exit 77; }
rm -rf "$work" && mkdir -p "$work" || exit 1
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; }
trap cleanup EXIT

# The training: 600 iterations, 50 ms apart (about 30 s), serving on a free port.
"$run" --iterations 600 --sleep-ms 50 --prometheus 127.0.0.1:0 --port-file "$work/port" \
    >"$work/run.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
if [ ! -s "$work/port" ]; then
    grep -q "sink is not built" "$work/run.log" && { echo "skipped: $(cat "$work/run.log")"; exit 77; }
    echo "the run never said its port:"; cat "$work/run.log"; exit 1
fi
port=$(cat "$work/port")

web=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$work/prometheus.yml" <<YML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: ampactor
    static_configs:
      - targets: ['127.0.0.1:$port']
YML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
    --web.listen-address="127.0.0.1:$web" >"$work/prometheus.log" 2>&1 &
pids+=($!)

query() {
    curl -s --max-time 5 "http://127.0.0.1:$web/api/v1/query?query=ampactor_iterations_total" |
        python3 -c 'import json,sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["value"][1] if r else "")' 2>/dev/null
}
first=""
deadline=$((SECONDS + 60))
while [ $SECONDS -lt $deadline ]; do
    if ! kill -0 "${pids[1]}" 2>/dev/null; then
        echo "skipped: prometheus did not start: $(tail -n1 "$work/prometheus.log")"
        exit 77
    fi
    v=$(query)
    if [ -n "$v" ]; then
        if [ -z "$first" ]; then
            first=$v
        elif python3 -c "import sys; sys.exit(not float('$v') > float('$first'))"; then
            echo "prometheus scraped ampactor_iterations_total $first, then $v"
            exit 0
        fi
    fi
    sleep 1
done
echo "prometheus never saw ampactor_iterations_total advance (first: '${first}')"
tail -n5 "$work/prometheus.log"
exit 1
