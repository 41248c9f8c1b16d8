#!/usr/bin/env bash
# The ThreadSanitizer gate: the keeper, messages, actors, pipeline and fused-optimizer suites
# built with -fsanitize=thread and run against a CAF 0.17.6 built with it too. Debian's
# libcaf_core is not instrumented, so TSan cannot see the release/acquire pairs of CAF's mailboxes
# and would report every message hand-off as a race; an instrumented build of the same version
# (same headers, same ABI) is loaded in its place with LD_LIBRARY_PATH. Any report fails the gate.
#
# Usage: scripts/tsan-gate.sh   (BUILD=build-tsan by default; CAF's source comes from Debian's
# source archive, checked against its published sha256, built once and kept in $BUILD/caf)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-tsan}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
CAF_LIB=$BUILD/caf/lib
CAF_SHA256=e2bf5bd243f08bb7d8adde197cfe3e6d71314ed3378fe0692f8932f4c3b3928c

if [ ! -f "$CAF_LIB/libcaf_core.so.0.17.6" ]; then
  echo "tsan-gate: building CAF 0.17.6 (libcaf_core) with ThreadSanitizer"
  src=$BUILD/caf/src
  mkdir -p "$src/lists/partial" "$src/dl"
  # A private source list: the system's apt configuration stays as it is.
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
    "http://deb.debian.org/debian bookworm main" >"$src/src.list"
  apt_opts=(-o "Dir::Etc::SourceList=$src/src.list" -o Dir::Etc::SourceParts=/nonexistent
    -o "Dir::State::Lists=$src/lists")
  apt-get "${apt_opts[@]}" update -qq
  # Only the upstream tarball is needed (Debian's packaging part may be missing on a mirror).
  (cd "$src/dl" && apt-get "${apt_opts[@]}" source --download-only -qq actor-framework \
    >"$src/download.log" 2>&1) || true
  tarball=$src/dl/actor-framework_0.17.6.orig.tar.gz
  echo "$CAF_SHA256  $tarball" | sha256sum -c --quiet
  tar xzf "$tarball" -C "$src"
  cmake -S "$src/actor-framework-0.17.6" -B "$src/build" -DCMAKE_BUILD_TYPE=Release \
    -DCAF_NO_EXAMPLES=yes -DCAF_NO_UNIT_TESTS=yes -DCAF_NO_OPENSSL=yes -DCAF_NO_TOOLS=yes \
    -DCAF_NO_PYTHON=yes -DCAF_NO_OPENCL=yes \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -g1" >"$src/configure.log"
  cmake --build "$src/build" -j "$JOBS" --target libcaf_core_shared >"$src/build.log"
  mkdir -p "$CAF_LIB"
  cp -a "$src/build/lib/"libcaf_core.so* "$CAF_LIB/"
fi

cmake -S . -B "$BUILD/project" -DCMAKE_BUILD_TYPE=Release -DAMPACTOR_SANITIZE=thread \
  -DAMPACTOR_CUDA=OFF -DAMPACTOR_BENCH=OFF >/dev/null
# The fused optimizers' worker pool is threads without CAF: its suite needs no instrumented CAF.
caf_suites=(ampactor-tests-keeper ampactor-tests-messages ampactor-tests-actors ampactor-tests-pipeline
  ampactor-tests-metrics)
suites=("${caf_suites[@]}" ampactor-tests-optim)
cmake --build "$BUILD/project" -j "$JOBS" --target "${suites[@]}"

export LD_LIBRARY_PATH=$CAF_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export TSAN_OPTIONS="suppressions=$PWD/tests/support/tsan.supp exitcode=66 history_size=4 ${TSAN_OPTIONS:-}"
status=0
for s in "${suites[@]}"; do
  exe=$BUILD/project/tests/$s
  # ldd's output taken whole first: `ldd | grep -q` under pipefail fails when grep exits early.
  deps=$(ldd "$exe")
  if [[ " ${caf_suites[*]} " == *" $s "* ]] && ! grep -q "$CAF_LIB/libcaf_core" <<<"$deps"; then
    echo "tsan-gate: $s does not load the instrumented CAF" >&2
    exit 1
  fi
  log=$BUILD/$s.log
  start=$SECONDS
  if "$exe" >"$log" 2>&1; then rc=0; else rc=$?; fi
  reports=$(grep -c "WARNING: ThreadSanitizer" "$log" || true)
  echo "tsan-gate: $s: exit $rc, $reports report(s), $((SECONDS - start)) s (log: $log)"
  if [ "$rc" -ne 0 ] || [ "$reports" -ne 0 ]; then
    status=1
    grep -m 3 -A 30 "WARNING: ThreadSanitizer" "$log" || tail -30 "$log"
  fi
done
exit $status
