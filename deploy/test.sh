#!/usr/bin/env bash
# The README's test command: installs the Debian packages, builds, and runs the whole
# test suite. .ci/run runs exactly this. Stages, in this order (docs/decisions/0012):
#
#   release  Release build (gcc) of everything; ctest runs it all: unit and property
#            tests, multi-process MPI tests on tcp and shm, end-to-end runs of daemons and
#            trainers, the Python binding's tests (label python), and one replay of every
#            fuzz target's corpus. The sanitizer stages do not build the Python module
#            (docs/decisions/0020). Same build dir and type
#            as deploy/demo.sh, so running one after the other rebuilds nothing.
#   asan     clang-14, AddressSanitizer + UndefinedBehaviorSanitizer (SHARDMIX_FUZZ=ON, so the
#            fuzz stage reuses this build; libFuzzer coverage only in the fuzzed libraries):
#            every test of the release stage (unit, fuzz corpus replays, MPI, end-to-end:
#            their daemons and trainers are built with the sanitizers too) but the two soak
#            tests, whose RSS bounds ASan's quarantine breaks by design, and the tests that
#            run no compiled code of ours (labels script and docs: checkers, lint, README
#            fixtures). Two ctest calls (labels unit and sim, then the rest with slow
#            unwinding for the Open MPI leak suppressions); the second runs even when the
#            first fails. Any report fails its test.
#   tsan     gcc, ThreadSanitizer: the C++ unit and property tests (label cxx, one binary:
#            among them an in-process cluster with the Asio service thread, trainer threads
#            and a fetcher), but the two that bound RSS growth. Only that binary is built. The
#            rest of label unit (script checks, Python checkers, corpus replays) has no
#            threads of ours and runs in the other stages; Open MPI is not built for TSan, so
#            the MPI and end-to-end tests stay out of this stage.
#   fuzz     every libFuzzer target for SHARDMIX_FUZZ_SECONDS (default 20) from its
#            generated seeds and tests/fuzz/corpus/<name>/, two at a time.
#
# Every build goes through ccache when it is installed (SHARDMIX_CCACHE=0: not), with paths
# hashed relative to the checkout, so a fresh clone of a tree built before compiles only
# what changed (docs/decisions/0060).
# SHARDMIX_TEST_STAGES=release,asan,tsan,fuzz (the default) picks stages, e.g.
# SHARDMIX_TEST_STAGES=asan,fuzz. Build dirs: $SHARDMIX_BUILD_DIR (default build) and
# <that>-asan, <that>-tsan. Sanitizer suppressions (each with its reason) are in
# tests/sanitizers/. Each stage prints its wall time and how many tests it ran and skipped.
# A skipped test fails its stage unless tests/skip-allowlist.txt names it with the reason
# (run_ctest below); the release stage also fails if the Python module cannot be built
# (SHARDMIX_REQUIRE_PYTHON), since its tests would otherwise not be registered at all.
set -euo pipefail
cd "$(dirname "$0")/.."

stages=${SHARDMIX_TEST_STAGES:-release,asan,tsan,fuzz}
for stage in ${stages//,/ }; do
  case $stage in
    release | asan | tsan | fuzz) ;;
    *) echo "test.sh: unknown stage '$stage' in SHARDMIX_TEST_STAGES (known: release,asan,tsan,fuzz)" >&2; exit 2 ;;
  esac
done
want() { [[ ,$stages, == *,$1,* ]]; }

bash deploy/install-deps.sh
# shellcheck source=deploy/lib.sh
source deploy/lib.sh
# ccache, when installed (install-deps.sh installs it), caches the three builds' compiles:
# a second run, or a fresh clone of a tree built before, compiles only what changed
# (docs/decisions/0060). SHARDMIX_CCACHE=0 builds without it.
sm_use_ccache
echo "test.sh: compiler cache: $SM_CCACHE"

build_dir=${SHARDMIX_BUILD_DIR:-build}
jobs=${SHARDMIX_JOBS:-$(nproc)}
repo=$(pwd -P)
summary=()
current_stage=""
stage_start=0
begin_stage() {
  current_stage=$1
  stage_start=$SECONDS
  echo
  echo "==================== test stage: $1 ===================="
}
end_stage() {
  local took=$((SECONDS - stage_start))
  local tally="$stage_ran tests run, $stage_skipped skipped"
  summary+=("$current_stage: $((took / 60)) min $((took % 60)) s, $tally")
  echo "==================== test stage $current_stage passed in $((took / 60)) min $((took % 60)) s: $tally ===================="
  current_stage=""
  stage_ran=0
  stage_skipped=0
}

# Every ctest call goes through run_ctest: it keeps the output, adds what ran and what was
# skipped to the stage's tally, and fails (after ctest's own verdict) when a test was
# skipped that tests/skip-allowlist.txt does not name, or when the call ran no test at all.
# A skipped test is not a passed one: without this, a test that quietly stopped running
# (a missing tool, running as root) would leave CI green.
stage_ran=0
stage_skipped=0
allowed_skips=$(sed -e 's/#.*//' tests/skip-allowlist.txt | awk 'NF {print $1}')
run_ctest() {
  local log rc=0 total skipped name bad=()
  log=$(mktemp)
  ctest "$@" 2>&1 | tee "$log" || rc=$?
  total=$(sed -n 's/.* tests failed out of \([0-9][0-9]*\)$/\1/p' "$log" | tail -n 1)
  mapfile -t skipped < <(sed -n 's/^[[:space:]]*[0-9][0-9]* - \(.*\) (\(Skipped\|Disabled\|Not Run\))$/\1/p' "$log")
  rm -f "$log"
  if [[ -z $total || $total -eq 0 ]]; then
    echo "test.sh: ctest $* ran no test" >&2
    return 1
  fi
  stage_ran=$((stage_ran + total - ${#skipped[@]}))
  stage_skipped=$((stage_skipped + ${#skipped[@]}))
  for name in "${skipped[@]}"; do
    grep -qxF -- "$name" <<<"$allowed_skips" || bad+=("$name")
  done
  if ((${#bad[@]} > 0)); then
    echo "test.sh: skipped, and not in tests/skip-allowlist.txt (a skipped test is not a passed one): ${bad[*]}" >&2
    ((rc != 0)) || rc=1
  fi
  return "$rc"
}
on_exit() {
  local rc=$?
  if [[ -n $current_stage ]]; then
    local took=$((SECONDS - stage_start))
    echo "==================== test stage $current_stage FAILED after $((took / 60)) min $((took % 60)) s (exit $rc) ====================" >&2
  fi
}
trap on_exit EXIT

# ---------------------------------------------------------------- release
if want release; then
  begin_stage release
  # shellcheck disable=SC2086  # SHARDMIX_CMAKE_ARGS is a list of arguments
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDMIX_REQUIRE_PYTHON=ON "${SM_CMAKE_CACHE_ARGS[@]}" \
    ${SHARDMIX_CMAKE_ARGS:-}
  cmake --build "$build_dir" -j "$jobs"
  # The end-to-end and Python-in-a-job tests are RUN_SERIAL in CMake, so -j only overlaps
  # the cheap ones (unit, the 4-rank MPI tests).
  run_ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 900
  end_stage
fi

# Sanitizer builds: -O1 with line tables only (readable stacks, a fraction of -g's build
# time), no benchmarks, and no program that no test runs (CMakeLists.txt; decision 0057).
sanitizer_flags=(-DCMAKE_BUILD_TYPE=Debug -DSHARDMIX_BUILD_BENCH=OFF "${SM_CMAKE_CACHE_ARGS[@]}")
symbolizer=""
[[ -x /usr/bin/llvm-symbolizer-14 ]] && symbolizer=":external_symbolizer_path=/usr/bin/llvm-symbolizer-14"
asan_options="detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1$symbolizer"
export LSAN_OPTIONS="suppressions=$repo/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1$symbolizer"
export TSAN_OPTIONS="suppressions=$repo/tests/sanitizers/tsan.supp:second_deadlock_stack=1:history_size=4$symbolizer"

configure_asan() {
  cmake -S . -B "$build_dir-asan" -G Ninja "${sanitizer_flags[@]}" \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    "-DCMAKE_C_FLAGS_DEBUG=-O1 -gline-tables-only" "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" \
    -DSHARDMIX_FUZZ=ON "$@"
}

# ---------------------------------------------------------------- asan
if want asan; then
  begin_stage asan
  configure_asan
  cmake --build "$build_dir-asan" -j "$jobs"
  # Left out: the two soak tests, which bound the growth of resident memory: ASan keeps
  # freed blocks in its quarantine (up to 256 MiB), so RSS grows by design there (measured:
  # +5 MB per round of 10 epochs, open files flat). Leaks are LeakSanitizer's job in this
  # stage; the bounds hold in the release stage.
  soak='^(ServiceTest[.]SoakManyEpochsKeepsMemoryAndOpenFilesFlat|e2e_soak)$'
  # The unit and simulator tests (no MPI) with ASan's fast unwinding: slow unwinding on every
  # malloc made the rotation property test take 95 of its 120 s under load, and each
  # simulator test 40 to 80 times its release time (measured).
  # Both calls run even if the first fails, so one CI run shows every failure of the stage.
  asan_rc=0
  ASAN_OPTIONS=$asan_options run_ctest --test-dir "$build_dir-asan" --output-on-failure -j "$jobs" --timeout 900 \
    -L '^(unit|sim)$' -LE 'fuzzing|script' -E "$soak" || asan_rc=$?
  # Everything else runs processes under Open MPI, which leaves what MPI_Init allocates for
  # process exit (tests/sanitizers/lsan.supp). Matching those suppressions needs whole
  # stacks through Open MPI, which has no frame pointers (slow unwinding), and its plugins
  # still loaded at exit (no dlclose).
  ASAN_OPTIONS="$asan_options:fast_unwind_on_malloc=0" OMPI_MCA_mca_base_component_disable_dlclose=1 \
    run_ctest --test-dir "$build_dir-asan" --output-on-failure -j "$jobs" --timeout 900 -LE 'fuzzing|unit|sim|docs' -E "$soak" ||
    asan_rc=$?
  ((asan_rc == 0)) || exit "$asan_rc"
  end_stage
fi

# ---------------------------------------------------------------- tsan
if want tsan; then
  begin_stage tsan
  cmake -S . -B "$build_dir-tsan" -G Ninja "${sanitizer_flags[@]}" \
    -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ \
    "-DCMAKE_C_FLAGS_DEBUG=-O1 -g1" "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" \
    -DSHARDMIX_SANITIZE=thread
  # Only the unit test binary: building the daemon, the tools and the MPI tests with TSan
  # would cost this stage's build time for tests it does not run.
  cmake --build "$build_dir-tsan" -j "$jobs" --target shardmix_unit_tests
  # Label cxx only (no mpirun). Left out: the tests that bound the daemon's RSS growth,
  # which TSan's shadow memory multiplies several times over.
  run_ctest --test-dir "$build_dir-tsan" --output-on-failure -j "$jobs" --timeout 900 -L cxx \
    -E '^ServiceTest[.](ATrainerThatDoesNotReadItsRepliesIsThrottled|SoakManyEpochsKeepsMemoryAndOpenFilesFlat)$'
  end_stage
fi

# ---------------------------------------------------------------- fuzz
if want fuzz; then
  begin_stage fuzz
  configure_asan -DSHARDMIX_FUZZ_SECONDS="${SHARDMIX_FUZZ_SECONDS:-20}"
  cmake --build "$build_dir-asan" -j "$jobs" --target shardmix_fuzzers
  ASAN_OPTIONS=$asan_options run_ctest --test-dir "$build_dir-asan" --output-on-failure -j "$jobs" -L fuzzing
  end_stage
fi

echo
echo "test.sh: every stage passed (${stages}):"
printf '  %s\n' "${summary[@]}"
