#!/bin/sh
# ctest: a short run of ampactor-bench-overlap over every mode and both workloads (the figures
# mean nothing at this size), so the benchmark's code paths keep working. Usage: BENCH JSON
set -eu
bench=$1 json=$2
"$bench" --quick --workload all --json "$json" > "$json.out"
for key in '"mlp"' '"embed"' control_async_over_sync async_in_cache matmul_in_core_cache \
  exact_scale_wait_share async_defer_swap control_defer_swap_over_sync sync_pipeline_step_ms \
  async_fused_defer_swap defer_swap_over_forward_backward \
  '"setup"' '"blas"' '"intra_op"' '"inter_op"' OPENBLAS_NUM_THREADS; do
  grep -q "$key" "$json" || { echo "missing $key in $json"; exit 1; }
done
# Bad options are refused with a message and a non-zero exit.
if "$bench" --workload nope > "$json.err" 2>&1; then
  echo "--workload nope was accepted"
  exit 1
fi
grep -q "workload" "$json.err" || { echo "no message for --workload nope"; exit 1; }
if "$bench" --balance nope > "$json.err" 2>&1; then
  echo "--balance nope was accepted"
  exit 1
fi
grep -q "balance" "$json.err" || { echo "no message for --balance nope"; exit 1; }
echo "ok"
