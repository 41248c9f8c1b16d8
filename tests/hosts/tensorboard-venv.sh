#!/usr/bin/env bash
# Usage: tensorboard-venv.sh DIR - make (or reuse) a Python venv at DIR with TensorBoard from
# PyPI. Prints the venv's python on the last line. Exits 77 (ctest skip) with a one-line reason
# when PyPI cannot be reached or the install fails, 2 on bad usage.
set -u
PIP_LIMIT=300 # seconds for one pip command: a registry slower than that is skipped

if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
dir=$1
skip() { echo "tensorboard-venv: $*"; exit 77; }

mkdir -p "$(dirname "$dir")" || skip "cannot create the parent of $dir"
exec 9>"$dir.lock" || skip "cannot write $dir.lock"
flock 9

py=$dir/bin/python
reader='from tensorboard.backend.event_processing import event_accumulator'
works() { [ -x "$py" ] && "$py" -W ignore -c "$reader" >/dev/null 2>&1; }
if works; then
    echo "$py"
    exit 0
fi
if [ ! -x "$py" ]; then
    python3 -m venv "$dir" >/dev/null 2>&1 || skip "python3 -m venv $dir failed (python3-venv missing?)"
fi
log=$dir/tensorboard-venv.log
: >"$log"
pip_() {
    timeout "$PIP_LIMIT" "$py" -m pip --disable-pip-version-check --no-input \
        --timeout 30 --retries 2 "$@" >>"$log" 2>&1
}
why() { grep -m1 -E '^ERROR' "$log" || tail -n1 "$log"; }
pip_ index versions tensorboard --retries 0 || skip "PyPI cannot be reached: $(why)"
pip_ install tensorboard || skip "pip install tensorboard failed: $(why)"
works || skip "tensorboard's reader does not import: $("$py" -W ignore -c "$reader" 2>&1 | tail -n1)"
echo "$py"
