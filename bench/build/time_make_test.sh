#!/bin/sh
# How long a clean `make test` takes: clones REV (default HEAD) of this repository into a fresh
# folder, runs `make test` there, and writes the wall-clock seconds of the whole, of the build and
# of ctest as JSON. The Debian packages must be installed already (make's deps step then does
# nothing), so the figure is the build and the tests alone.
# Usage: bench/build/time_make_test.sh [REV] [OUT.json]
set -eu
rev=${1:-HEAD}
out=${2:-/dev/stdout}
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$src" "$work/repo"
cd "$work/repo"
git checkout -q "$rev"
commit=$(git rev-parse --short HEAD)
t0=$(date +%s)
make build >"$work/build.log" 2>&1
t1=$(date +%s)
(cd build && ctest --output-on-failure -j "$(nproc)" -LE slow) >"$work/ctest.log" 2>&1 || {
  tail -40 "$work/ctest.log" >&2
  exit 1
}
t2=$(date +%s)
summary=$(grep -E '^[0-9]+% tests passed' "$work/ctest.log")
skipped=$(grep -c '(Skipped)' "$work/ctest.log" || true)
cat >"$out" <<JSON
{"commit": "$commit", "cores": $(nproc), "make_test_s": $((t2 - t0)), "build_s": $((t1 - t0)),
 "ctest_s": $((t2 - t1)), "ctest": "$summary", "skipped": $skipped}
JSON
