#!/usr/bin/env bash
# The README's test command: installs the Debian packages, builds, and runs the whole
# test suite (unit + property tests, multi-process MPI tests on tcp and shm, end-to-end
# runs of daemons and trainers). .ci/run runs exactly this. Same build dir and type as
# deploy/demo.sh, so running one after the other rebuilds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh

build_dir=${SHARDMIX_BUILD_DIR:-build}
jobs=${SHARDMIX_JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${SHARDMIX_CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$jobs"
# Multi-process tests take a resource lock in CMake, so -j only overlaps the cheap ones.
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 900
