#!/bin/sh
# Packaging cannot rot unseen: installs this build into a fresh prefix, then builds and runs
# examples/ against it with find_package (MODE install), or builds and runs them with ampactor as
# a subproject (MODE subproject, which compiles the libraries again: the slow half).
# Usage: package-test.sh MODE BUILD_DIR SOURCE_DIR WORK_DIR [PREFIX_PATH]
set -eu
mode=$1 build=$2 src=$3 work=$4 prefix_path=${5:-}
rm -rf "$work"
mkdir -p "$work"
if [ "$mode" = subproject ]; then
  echo "== add_subdirectory(ampactor)"
  cmake -S "$src/examples" -B "$work/sub" -DAMPACTOR_SOURCE_DIR="$src" \
    -DCMAKE_PREFIX_PATH="$prefix_path" >"$work/sub-configure.log" 2>&1
  # A subproject builds no tests, benches, demo or tools, and leaves the build type alone, saying
  # that none means no optimisation.
  ! grep -q "tests=ON\|bench=ON" "$work/sub-configure.log"
  grep -q "the parent project sets no CMAKE_BUILD_TYPE" "$work/sub-configure.log"
  cmake --build "$work/sub" -j 2 >"$work/sub-build.log"
  test ! -e "$work/sub/ampactor/demo" && test ! -e "$work/sub/ampactor/tests"
  "$work/sub/local_scaler"
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
    >"$work/dp.log"
  cat "$work/dp.log"
  [ "$(grep -c '1 step(s) skipped' "$work/dp.log")" -eq 2 ]
  [ "$(sed 's/.*parameter sum //' "$work/dp.log" | sort -u | wc -l)" -eq 1 ]
fi

echo "== the link line without CMake (doc/reference/cmake-options.md)"
if [ -d /usr/include/torch/csrc/api/include ]; then
  PREFIX="$work/prefix"
  g++ -std=c++17 -O1 "$src/examples/async_steps.cpp" -o "$work/async_steps-bare" \
    -I$PREFIX/include -I/usr/include/torch/csrc/api/include \
    -L$PREFIX/lib -lampactor_trace -lampactor_actors -lampactor_checkpoint -lampactor_messages \
    -lampactor_keeper -lampactor_scaler -lampactor_optim -lampactor_kernels -lampactor_core \
    -lcaf_core -ltorch -ltorch_cpu -lc10 -fopenmp -pthread
  "$work/async_steps-bare" "$work/run-bare.jsonl"
else
  echo "skipped: the README's line is for Debian's LibTorch (/usr/include/torch)"
fi
