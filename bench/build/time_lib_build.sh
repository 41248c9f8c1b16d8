#!/bin/sh
# How long a clean build of the libraries and the demo takes (the part of every build that CI
# repeats: make test, the subproject test, the TSan and ASan gates): clones REV (default HEAD) into
# a fresh folder, builds the targets ampactor_actors, ampactor_distributed and ampactor-demo with
# -j JOBS (default 2), and prints the wall time and each target's summed compile seconds (a
# compiler launcher times every file). The Debian packages must be installed already.
# Usage: bench/build/time_lib_build.sh [REV]
set -eu
rev=${1:-HEAD}
jobs=${JOBS:-2}
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$src" "$work/repo"
git -C "$work/repo" checkout -q "$rev"
cat >"$work/time.sh" <<'LAUNCHER'
#!/bin/sh
s=$(date +%s.%N)
"$@" || exit $?
out= prev=
for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done
echo "$(echo "$(date +%s.%N) - $s" | bc) $out" >>"$TIMES"
LAUNCHER
chmod +x "$work/time.sh"
cmake -S "$work/repo" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER_LAUNCHER="$work/time.sh" >/dev/null
t0=$(date +%s)
TIMES=$work/times.txt cmake --build "$work/build" -j "$jobs" --target ampactor_actors \
  ampactor_distributed ampactor-demo >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
echo "$(git -C "$work/repo" rev-parse --short HEAD): $(($(date +%s) - t0)) s wall, -j $jobs"
awk '{ split($2, p, "/"); t = p[2]; sub(/\.dir$/, "", t); s[t] += $1; all += $1 }
     END { for (k in s) printf "  %-30s %6.1f s\n", k, s[k]; printf "  %-30s %6.1f s\n", "(all files)", all }' \
  "$work/times.txt" | sort
