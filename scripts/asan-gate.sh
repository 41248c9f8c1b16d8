#!/usr/bin/env bash
# The AddressSanitizer+UBSan gate: the whole suite built with clang and
# -fsanitize=address,undefined and run by ctest (any report fails it), then each libFuzzer target
# in fuzz/ run for FUZZ_SECONDS from its seed corpus (a crash, a sanitizer report or a broken
# invariant fails it; the input is kept in $BUILD/fuzz-findings).
#
# Usage: scripts/asan-gate.sh   (BUILD=build-asan, FUZZ_SECONDS=60 by default; FUZZ_SECONDS=0 skips
# the fuzzing, a longer FUZZ_SECONDS fuzzes longer and keeps growing $BUILD/fuzz-corpus; FUZZ_SEED
# pins libFuzzer's seed, random by default: each run explores inputs the last did not, and a
# failing input is kept whatever the seed)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-asan}
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
SRC=$PWD

# -O1 -g1: the optimisation the sanitizers recommend, and line tables, enough to name lines in
# reports (full debug info of the torch headers costs compile time and disk). AMPACTOR_PCH: the
# suites share one precompiled header, as with GCC (clang takes it: every suite has its flags);
# a suite's file then compiles in half the time.
CXX=${ASAN_CXX:-clang++} cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DAMPACTOR_PCH=ON \
  -DAMPACTOR_SANITIZE=address,undefined -DAMPACTOR_FUZZ=ON -DAMPACTOR_CUDA=OFF \
  -DAMPACTOR_BENCH=OFF -DAMPACTOR_INSTALL=OFF ${ASAN_CMAKE_ARGS:-} >/dev/null
start=$SECONDS
cmake --build "$BUILD" -j "$JOBS"
echo "asan-gate: built in $((SECONDS - start)) s"

# Leaks are not checked: CAF 0.17 and LibTorch keep singletons alive past exit.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1 ${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$SRC/tests/support/ubsan.supp ${UBSAN_OPTIONS:-}"
start=$SECONDS
# The launchers' cases (tests/hosts: the same ranks under torchrun, mpirun, srun and on namespace
# hosts) are make test's and test-slow's: here they would fetch PyTorch again and double CI's
# longest stage; the library code they run is in the suites above (load_run's re-shard included).
(cd "$BUILD" && ctest --output-on-failure -j "$JOBS" --timeout 900 -E '^launchers\.')
echo "asan-gate: suite passed in $((SECONDS - start)) s"

[ "$FUZZ_SECONDS" -gt 0 ] || exit 0
mkdir -p "$BUILD/fuzz-findings"
fuzz() {
  local target=$1
  shift
  local corpus=$BUILD/fuzz-corpus/$target
  mkdir -p "$corpus"
  echo "asan-gate: fuzzing $target for $FUZZ_SECONDS s"
  # The first folder is the corpus the run grows; the others are read-only seeds.
  "$BUILD/fuzz/$target" -max_total_time="$FUZZ_SECONDS" -seed="${FUZZ_SEED:-0}" -timeout=20 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$BUILD/fuzz-findings/$target-" "$corpus" "$@" \
    >"$BUILD/$target.log" 2>&1 ||
    {
      tail -60 "$BUILD/$target.log"
      echo "asan-gate: $target found a failing input (in $BUILD/fuzz-findings)" >&2
      return 1
    }
  grep -E "^INFO: Seed:|^stat::number_of_executed_units|^stat::new_units_added|DONE" "$BUILD/$target.log" || true
}
fuzz ampactor-fuzz-trace -dict="$SRC/fuzz/trace.dict" "$SRC/tests/traces" "$SRC/fuzz/corpus/trace"
fuzz ampactor-fuzz-checkpoint -dict="$SRC/fuzz/checkpoint.dict" "$SRC/fuzz/corpus/checkpoint"
