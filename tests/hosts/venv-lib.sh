# Sourced by the venv scripts (torch-venv.sh, tensorboard-venv.sh): venv_open NAME DIR... checks
# the usage (one DIR), takes DIR's lock, and sets dir, py, log and the helpers skip (exit 77 with
# a one-line reason, ctest's skip), pip_ (one pip command, PIP_LIMIT seconds at most) and why (the
# log's first error). venv_make makes the venv where there is none yet and empties the log.
PIP_LIMIT=300 # seconds for one pip command: a registry slower than that is skipped

venv_open() {
    venv_name=$1
    shift
    if [ $# -ne 1 ] || [ -z "$1" ]; then
        echo "usage: $venv_name.sh DIR" >&2
        exit 2
    fi
    dir=$1
    mkdir -p "$(dirname "$dir")" || skip "cannot create the parent of $dir"
    exec 9>"$dir.lock" || skip "cannot write $dir.lock"
    flock 9
    py=$dir/bin/python
    log=$dir/$venv_name.log
}
skip() { echo "$venv_name: $*"; exit 77; }
venv_make() {
    if [ ! -x "$py" ]; then
        python3 -m venv "$dir" >/dev/null 2>&1 || skip "python3 -m venv $dir failed (python3-venv missing?)"
    fi
    : >"$log"
}
pip_() {
    timeout "$PIP_LIMIT" "$py" -m pip --disable-pip-version-check --no-input \
        --timeout 30 --retries 2 "$@" >>"$log" 2>&1
}
why() { grep -m1 -E '^ERROR' "$log" || tail -n1 "$log"; }
