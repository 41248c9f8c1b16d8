#!/usr/bin/env bash
# Usage: tensorboard_readback.sh RUN_EXE VENV_DIR WORK_DIR - TensorBoard from PyPI (in a venv
# made on first use; skipped, exit 77, where PyPI cannot be reached) reads the event files of a
# real run and compares each value with the keeper's trace of that run.
set -u
run=$1 venv=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
# The venv script's exit status (77: skip) is kept: a pipe inside $(...) would lose it.
out=$("$here/../hosts/tensorboard-venv.sh" "$venv")
rc=$?
py=$(printf '%s\n' "$out" | tail -n1)
if [ "$rc" -ne 0 ]; then echo "$py"; exit "$rc"; fi
rm -rf "$work" && mkdir -p "$work" || exit 1
for staleness in 0 1; do
    timeout 120 "$run" --iterations 20 --staleness "$staleness" --tensorboard "$work/tb$staleness" \
        --trace "$work/trace$staleness.jsonl"
    rc=$?  # 77: the TensorBoard sink is not built
    [ "$rc" -eq 0 ] || exit "$rc"
    timeout 120 "$py" -W ignore "$here/tensorboard_readback.py" "$work/tb$staleness" \
        "$work/trace$staleness.jsonl" 20 || exit 1
done
