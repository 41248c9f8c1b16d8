#!/usr/bin/env bash
# Usage: tensorboard-venv.sh DIR - make (or reuse) a Python venv at DIR with TensorBoard from
# PyPI. Prints the venv's python on the last line. Exits 77 (ctest skip) with a one-line reason
# when PyPI cannot be reached or the install fails, 2 on bad usage.
set -u
. "$(dirname "$0")/venv-lib.sh"
venv_open tensorboard-venv "$@"

reader='from tensorboard.backend.event_processing import event_accumulator'
works() { [ -x "$py" ] && "$py" -W ignore -c "$reader" >/dev/null 2>&1; }
if works; then
    echo "$py"
    exit 0
fi
venv_make
pip_ index versions tensorboard --retries 0 || skip "PyPI cannot be reached: $(why)"
pip_ install tensorboard || skip "pip install tensorboard failed: $(why)"
works || skip "tensorboard's reader does not import: $("$py" -W ignore -c "$reader" 2>&1 | tail -n1)"
echo "$py"
