#!/bin/sh
# Packaging cannot rot unseen: installs this build into a fresh prefix, then builds and runs
# examples/ against it with find_package (MODE install), or builds and runs them with ampactor as
# a subproject (MODE subproject, which compiles the libraries again: the slow half), or builds the
# .deb and checks it has what a Debian -dev package has (MODE deb; exit 77, skipped, without dpkg).
# Usage: package-test.sh MODE BUILD_DIR SOURCE_DIR WORK_DIR [PREFIX_PATH]
set -eu
mode=$1 build=$2 src=$3 work=$4 prefix_path=${5:-}
rm -rf "$work"
mkdir -p "$work"
if [ "$mode" = deb ]; then
  for tool in cpack dpkg-deb dpkg-architecture pkg-config; do
    command -v $tool >/dev/null || { echo "skipped: $tool not found"; exit 77; }
  done
  cpack --config "$build/CPackConfig.cmake" -B "$work" >"$work/cpack.log"
  deb=$(ls "$work"/libampactor-dev_*.deb)
  dpkg-deb -c "$deb" | awk '{ print $6 }' | sed 's|^\./||; s|/$||' >"$work/contents"
  dpkg-deb -x "$deb" "$work/root"
  root=$work/root arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
  has() { grep -qx "$1" "$work/contents" || { echo "the .deb lacks $1" >&2; exit 1; }; }

  echo "== /usr/share/doc/libampactor-dev"
  has usr/share/doc/libampactor-dev/copyright
  has usr/share/doc/libampactor-dev/changelog.gz
  doc=$root/usr/share/doc/libampactor-dev
  grep -q '^Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' \
    "$doc/copyright"
  gzip -dc "$doc/changelog.gz" | cmp - "$src/CHANGELOG.md"

  echo "== usr/lib/$arch"
  has "usr/lib/$arch/libampactor_core.a"
  has "usr/lib/$arch/cmake/ampactor/ampactorConfig.cmake"
  has "usr/lib/$arch/pkgconfig/ampactor.pc"
  # Multiarch: usr/lib holds the triplet's folder and nothing else.
  if grep "^usr/lib/" "$work/contents" | grep -v "^usr/lib/$arch\(/\|$\)"; then
    echo "the .deb installs the above outside usr/lib/$arch" >&2
    exit 1
  fi

  echo "== pkg-config, the prefix moved to $root/usr"
  export PKG_CONFIG_PATH="$root/usr/lib/$arch/pkgconfig"
  pkg-config --validate ampactor
  [ "$(pkg-config --modversion ampactor)" = "$(dpkg-deb -f "$deb" Version)" ]
  flags=$(pkg-config --define-variable=prefix="$root/usr" --cflags --libs ampactor)
  echo "$flags"
  inc= libdir= libs=0
  for f in $flags; do
    case $f in
      -I*) inc=${f#-I} ;;
      -L*) libdir=${f#-L} ;;
      -l*) libs=$((libs + 1))
           [ -f "$libdir/lib${f#-l}.a" ] || [ -f "$libdir/lib${f#-l}.so" ] ||
             { echo "$f: no lib${f#-l} in '$libdir'" >&2; exit 1; } ;;
    esac
  done
  [ -f "$inc/ampactor/actors/grad_scaler.h" ] || { echo "-I$inc: no grad_scaler.h" >&2; exit 1; }
  [ "$libs" -gt 0 ]

  echo "== find_package(ampactor) from $root/usr"
  mkdir "$work/find"
  cat >"$work/find/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(find_deb CXX)
find_package(ampactor CONFIG REQUIRED)
get_target_property(lib ampactor::core IMPORTED_LOCATION_RELEASE)
get_target_property(inc ampactor::core INTERFACE_INCLUDE_DIRECTORIES)
message(STATUS "found ${ampactor_DIR} lib=${lib} inc=${inc}")
CMAKE
  cmake -S "$work/find" -B "$work/find/build" -DCMAKE_PREFIX_PATH="$root/usr;$prefix_path" \
    >"$work/find.log"
  usr=$root/usr lib=$root/usr/lib/$arch
  grep -q "found $lib/cmake/ampactor lib=$lib/libampactor_core.a inc=$usr/include\(;$usr/include\)*\$" \
    "$work/find.log" || { cat "$work/find.log" >&2; exit 1; }
  exit 0
fi
if [ "$mode" = subproject ]; then
  echo "== add_subdirectory(ampactor)"
  # Without the precompiled headers: every other build has them, and they would hide a file's
  # missing include (or a library's include of what it does not link), which clang builds hit.
  cmake -S "$src/examples" -B "$work/sub" -DAMPACTOR_SOURCE_DIR="$src" -DAMPACTOR_PCH=OFF \
    -DCMAKE_PREFIX_PATH="$prefix_path" >"$work/sub-configure.log" 2>&1
  # A subproject builds no tests, benches, demo or tools, and leaves the build type alone, saying
  # that none means no optimisation.
  ! grep -q "tests=ON\|bench=ON" "$work/sub-configure.log"
  grep -q "the parent project sets no CMAKE_BUILD_TYPE" "$work/sub-configure.log"
  cmake --build "$work/sub" -j 2 >"$work/sub-build.log"
  test ! -e "$work/sub/ampactor/demo" && test ! -e "$work/sub/ampactor/tests"
  "$work/sub/local_scaler"
  "$work/sub/first_pipeline"
  "$work/sub/watch_metrics" "$work/watch-sub"
  "$work/sub/caf_service"
  "$work/sub/async_steps" "$work/run-sub.jsonl"
  "$work/sub/checkpoint_resume" --steps 60 --every 20 --dir "$work/ckpt-sub" >"$work/ckpt-sub.log"
  tail -1 "$work/ckpt-sub.log"
  exit 0
fi
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
test -f "$work/prefix/lib/cmake/ampactor/ampactorConfig.cmake"

echo "== find_package(ampactor) from $work/prefix"
cmake -S "$src/examples" -B "$work/find" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix;$prefix_path" >"$work/find-configure.log"
cmake --build "$work/find" -j 2 >"$work/find-build.log"
"$work/find/local_scaler"
"$work/find/first_pipeline"
"$work/find/watch_metrics" "$work/watch"
test -s "$work/watch/metrics.csv" && ls "$work/watch/tensorboard/"events.out.tfevents.*
"$work/find/caf_service"
"$work/find/async_steps" "$work/run.jsonl"
"$work/prefix/bin/ampactor-replay" "$work/run.jsonl"  # the installed replay reads its trace
"$work/find/checkpoint_resume" --steps 60 --every 20 --dir "$work/ckpt" >"$work/ckpt-1.log"
tail -1 "$work/ckpt-1.log"
# A second run finds the finished run's checkpoint and resumes from it.
"$work/find/checkpoint_resume" --steps 80 --every 20 --dir "$work/ckpt" >"$work/ckpt-2.log"
grep "at step 60" "$work/ckpt-2.log"

# Two ranks of the data-parallel example through the installed launcher: the same parameters.
if [ -x "$work/find/data_parallel" ]; then
  "$work/prefix/bin/ampactor-launch" --nproc 2 --master-port 0 -- "$work/find/data_parallel" \
    --ckpt "$work/dp.pt" >"$work/dp.log"
  cat "$work/dp.log"
  [ "$(grep -c '1 step(s) skipped' "$work/dp.log")" -eq 2 ]
  [ "$(sed 's/.*parameter sum //' "$work/dp.log" | sort -u | wc -l)" -eq 1 ]
  # The sharded example: 40 steps saved, resumed to 60, against 60 in one go: the same weights.
  (cd "$work" && mkdir -p shard && cd shard &&
    "$work/prefix/bin/ampactor-launch" --nproc 2 --master-port 0 -- "$work/find/sharded_run" \
      --steps 40 >/dev/null &&
    "$work/prefix/bin/ampactor-launch" --nproc 2 --master-port 0 -- "$work/find/sharded_run" \
      --steps 60 --resume >"$work/shard-resumed.log" &&
    "$work/prefix/bin/ampactor-ckpt" check sharded_run.ckpt &&
    "$work/prefix/bin/ampactor-launch" --nproc 2 --master-port 0 -- "$work/find/sharded_run" \
      --steps 60 --ckpt one-go >"$work/shard-one-go.log")
  cat "$work/shard-resumed.log"
  grep -q "steps 40 to 60" "$work/shard-resumed.log"
  [ "$(sed 's/.*weight sum \([^,]*\),.*/\1/' "$work/shard-resumed.log" "$work/shard-one-go.log" |
      sort -u | wc -l)" -eq 1 ]
  # The guide's two-machine lines, rehearsed on loopback: two launchers (node ranks 0 and 1), each
  # in a folder of its own standing for its machine's disk, the same relative path on both. The
  # resume needs no shared disk; ampactor-ckpt checks once B's shard is copied beside A's.
  # A port free now: the one the launcher picks for a run of its own.
  port=$("$work/prefix/bin/ampactor-launch" --nproc 1 --master-port 0 -- sh -c 'echo $MASTER_PORT')
  two_nodes() {  # two_nodes ARGS...: node 0 in $work/A, node 1 in $work/B, both waited for
    (cd "$work/A" && "$work/prefix/bin/ampactor-launch" --nnodes 2 --node-rank 0 --nproc 1 \
      --master-addr 127.0.0.1 --master-port $port -- "$work/find/sharded_run" "$@" >>node0.log) &
    (cd "$work/B" && "$work/prefix/bin/ampactor-launch" --nnodes 2 --node-rank 1 --nproc 1 \
      --master-addr 127.0.0.1 --master-port $port -- "$work/find/sharded_run" "$@" >>node1.log)
    b=$?
    wait $! || return 1
    return $b
  }
  mkdir -p "$work/A" "$work/B"
  two_nodes --steps 40 --ckpt run && two_nodes --steps 60 --resume --ckpt run
  ls "$work/A" "$work/B"
  grep -q "steps 40 to 60" "$work/A/node0.log"
  # Both nodes' weights, resumed, are those of the 60 steps in one go on one machine.
  [ "$(cat "$work/A/node0.log" "$work/B/node1.log" "$work/shard-one-go.log" |
      grep "to 60" | sed 's/.*weight sum \([^,]*\),.*/\1/' | sort -u | wc -l)" -eq 1 ]
  cp "$work/B"/run.step*.rank1-of-2 "$work/A/"
  "$work/prefix/bin/ampactor-ckpt" check "$work/A/run"
fi

echo "== the link line without CMake (doc/reference/cmake-options.md)"
# Only for a build against Debian's LibTorch: another one's libraries do not link with its headers.
if [ -d /usr/include/torch/csrc/api/include ] &&
  grep -q '^Torch_DIR:PATH=/usr/lib/' "$build/CMakeCache.txt"; then
  PREFIX="$work/prefix"
  # Compiled once, linked twice: the page's line, then ampactor.pc's libraries (their link order).
  g++ -std=c++17 -O1 -c "$src/examples/async_steps.cpp" -o "$work/async_steps.o" \
    -I$PREFIX/include -I/usr/include/torch/csrc/api/include
  g++ "$work/async_steps.o" -o "$work/async_steps-bare" \
    -L$PREFIX/lib -lampactor_trace -lampactor_run -lampactor_pipeline -lampactor_actors \
    -lampactor_checkpoint -lampactor_messages \
    -lampactor_keeper -lampactor_scaler -lampactor_optim -lampactor_kernels -lampactor_core \
    -lcaf_core -ltorch -ltorch_cpu -lc10 -fopenmp -pthread
  "$work/async_steps-bare" "$work/run-bare.jsonl"
  if command -v pkg-config >/dev/null; then
    echo "== pkg-config --libs ampactor (doc/build/debian-package.md)"
    libs=$(PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" pkg-config --libs ampactor)
    g++ "$work/async_steps.o" -o "$work/async_steps-pc" $libs \
      -lcaf_core -ltorch -ltorch_cpu -lc10 -fopenmp -pthread
    "$work/async_steps-pc" "$work/run-pc.jsonl"
  fi
else
  echo "skipped: the README's line is for a build against Debian's LibTorch (/usr/include/torch)"
fi
