#!/usr/bin/env bash
# Builds and checks ampactor on a GPU host that has nvcc, CMake, ninja and a PyTorch with CUDA but
# no Debian packages. CAF, doctest, nlohmann-json and CLI11 come as .deb files in $DEBS, made on a
# Debian 12 machine with:
#   mkdir -p .debs && (cd .debs && apt-get download libcaf-dev libcaf-core0.17 libcaf-io0.17 \
#     libcaf-openssl0.17 doctest-dev nlohmann-json3-dev libcli11-dev libgloo-dev)
# (libgloo-dev: gloo's headers, which ampactor::distributed needs and a PyTorch wheel lacks.)
#
# Usage: scripts/gpu-check.sh STEP...   (steps: env build ctest sanitize bench demo offload
# offload_long overlap gpt)
# The offload cases' tests run in ctest; the offload step runs the benchmark alone.
# Logs go to $LOGDIR (default $OUT, else /tmp/ampactor-gpu), one file per step.
# AMPACTOR_REQUIRE_GPU turns a GPU case that finds no GPU into a failure instead of a skip.
set -uo pipefail
export AMPACTOR_REQUIRE_GPU=1
DEBS=${DEBS:-.debs}
PREFIX=${PREFIX:-/tmp/ampactor-prefix}
BUILD=${BUILD:-build-gpu}
LOGDIR=${LOGDIR:-${OUT:-/tmp/ampactor-gpu}}
JOBS=${JOBS:-$(nproc)}
BENCHES=${BENCHES:-ampactor-benches}    # the bench targets to build (default: all of them)
TARGETS=${TARGETS:-all}                 # the other targets to build (ctest needs all)
CTEST_ARGS=${CTEST_ARGS:-}              # e.g. "-LE slow": leave the examples' rebuild out
SANITIZE_TIMEOUT=${SANITIZE_TIMEOUT:-600}  # seconds per suite and tool
mkdir -p "$LOGDIR"
status=0

step_env() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -2
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  cmake --version | head -1
  c++ --version | head -1
  nproc
}

step_build() {
  mkdir -p "$PREFIX"
  for f in "$DEBS"/*.deb; do dpkg -x "$f" "$PREFIX" || return 1; done
  local torch_prefix
  torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)') || return 1
  cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DAMPACTOR_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="75;90" -DCMAKE_PREFIX_PATH="$torch_prefix;$PREFIX/usr" || return 1
  local t0=$SECONDS
  # shellcheck disable=SC2086
  cmake --build "$BUILD" -j "$JOBS" --target $TARGETS || return 1
  # shellcheck disable=SC2086
  cmake --build "$BUILD" -j "$JOBS" --target $BENCHES || return 1
  echo "build: $((SECONDS - t0)) s on $JOBS cores"
}

step_ctest() {
  local rc=0
  # shellcheck disable=SC2086
  (cd "$BUILD" && ctest --output-on-failure -j "$JOBS" --timeout 300 $CTEST_ARGS \
    --output-junit gpu-junit.xml) ||
    rc=1
  sh scripts/ctest-summary.sh "$BUILD/gpu-junit.xml"
  echo "skipped (none of them may need a GPU):"
  grep -o '<testcase name="[^"]*"[^>]*status="notrun"' "$BUILD/gpu-junit.xml" |
    sed 's/<testcase name="\([^"]*\)".*/  \1/'
  return $rc
}

# Every CUDA suite: the kernels (raw launchers and CUDA tensors) and the pipeline's GPU offload.
# racecheck (shared-memory hazards inside kernels) runs on the kernel suite only: the offload
# cases launch no ampactor kernel (their grad move runs on the CPU), only torch's, under which
# racecheck needs minutes a case.
sanitize() {  # TOOL SUITE [ARGS...]
  local tool=$1 suite=$2
  shift 2
  echo "== compute-sanitizer --tool $tool $suite $*"
  timeout "$SANITIZE_TIMEOUT" compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$BUILD/tests/$suite" "$@"
}

step_sanitize() {
  local rc=0 offload='--test-case=offload*'
  sanitize memcheck ampactor-tests-pipeline "$offload" || rc=1
  sanitize synccheck ampactor-tests-pipeline "$offload" || rc=1
  sanitize memcheck ampactor-tests-cuda || rc=1
  sanitize racecheck ampactor-tests-cuda || rc=1
  sanitize synccheck ampactor-tests-cuda || rc=1
  return $rc
}

step_bench() {
  "$BUILD/bench/ampactor-bench-kernels" --gpu-only --json "$LOGDIR/bench-kernels-gpu.json"
}

step_demo() {
  "$BUILD/demo/ampactor-demo" --device cuda --out /tmp/ampactor-demo &&
    cp /tmp/ampactor-demo/summary.csv "$LOGDIR/demo-summary.csv"
}

# The offload bench four times: micro-batches matched to LibTorch's step (staleness 1's best
# case), and one long backward (overlap_backward's: the step hides behind it) over 4 layers, then
# the long-backward shapes below.
step_offload() {
  local b=$BUILD/bench/ampactor-bench-offload
  "$b" --json "$LOGDIR/bench-offload.json" &&
    "$b" --micro 1 --batch 131072 --iters 6 --json "$LOGDIR/bench-offload-long-backward.json" &&
    step_offload_long
}

# The long-backward shapes alone (overlap_backward's), 16 layers of 2048 and 64 of 1024: the same
# parameters, so the same step, but a last bucket a quarter as large.
step_offload_long() {
  local b=$BUILD/bench/ampactor-bench-offload
  "$b" --micro 1 --batch 131072 --iters 6 --layers 16 --width 2048 \
    --json "$LOGDIR/bench-offload-long-backward-16.json" &&
    "$b" --micro 1 --batch 131072 --iters 6 --layers 64 --width 1024 \
      --json "$LOGDIR/bench-offload-long-backward-64.json"
}

# overlap_backward with the model on the GPU: its cases, and memcheck over them.
step_overlap() {
  "$BUILD/tests/ampactor-tests-pipeline" --test-case='offload? overlap*' &&
    sanitize memcheck ampactor-tests-pipeline '--test-case=offload? overlap*'
}

# The small GPT three ways against PyTorch (bench/gpt/gpt_torch.py), on the project's own text.
step_gpt() {
  local dir=$LOGDIR/gpt text=/tmp/ampactor-gpt-text.txt
  mkdir -p "$dir"
  # shellcheck disable=SC2046
  cat README.md CHANGELOG.md $(find doc demo bench -name '*.md' | LC_ALL=C sort) >"$text"
  python3 bench/gpt/gpt_torch.py --text "$text" --out "$dir" &&
    "$BUILD/bench/ampactor-bench-gpt" --text "$text" --out "$dir" &&
    python3 bench/gpt/gpt_torch.py --compare "$dir" || return 1
  # With deterministic kernels a run repeats itself bit for bit, and overlap_backward is offload's.
  local a=$dir/deterministic-a b=$dir/deterministic-b
  mkdir -p "$a" "$b"
  "$BUILD/bench/ampactor-bench-gpt" --text "$text" --out "$a" --deterministic \
    --mode offload,offload-overlap &&
    "$BUILD/bench/ampactor-bench-gpt" --text "$text" --out "$b" --deterministic \
      --mode offload-overlap,offload || return 1
  local rc=0 x
  for x in "$a/offload-overlap.csv" "$b/offload.csv" "$b/offload-overlap.csv"; do
    if cmp -s "$a/offload.csv" "$x"; then
      echo "deterministic: $x equals $a/offload.csv (every loss, scale and skip)"
    else
      echo "deterministic: $x DIFFERS from $a/offload.csv"
      rc=1
    fi
  done
  return $rc
}

for s in "$@"; do
  echo "### $s"
  t0=$SECONDS
  if "step_$s" >"$LOGDIR/$s.log" 2>&1; then
    echo "### $s ok ($((SECONDS - t0)) s)"
  else
    echo "### $s FAILED ($((SECONDS - t0)) s)"
    status=1
    tail -40 "$LOGDIR/$s.log"
    [ "$s" = build ] && break
  fi
  tail -5 "$LOGDIR/$s.log"
done
exit $status
