# shellcheck shell=bash
# The preamble and helpers every end-to-end test script shares (tests/e2e/*.sh,
# tests/python/run_python_tests.sh). Source it after `set -euo pipefail` and SM_PROG=...;
# it sources deploy/lib.sh (the sm_* helpers) and runs nothing itself.
#
#   SM_E2E                      this directory (check_traces.py and the other checkers)
#   e2e_init LABEL [EXE...]     dies unless shardmixd, shardmix-consume, shardmix-gen and every
#                               EXE are built; sets daemon, gen, consume (their paths), python
#                               (sm_python) and tmp (sm_test_tmpdir LABEL: removed on exit)
#   e2e_gen_dataset SAMPLES CLASSES MEDIAN_KIB SEED [ARG...]
#                               shardmix-gen's dataset in $tmp/data
#   e2e_launch LIMIT_S DAEMON_LOG LAUNCH_ARG... -- TRAINER...
#                               deploy/launch.sh under `timeout`; returns its exit status
#   e2e_launch_or_die ...       the same; a failure dies with the daemon log's last lines
#   e2e_direct_daemons_init     for scripts that run mpirun themselves (not launch.sh)
#   e2e_start_daemons NP CONFIG LOG [MPIRUN_ARG...] [-- DAEMON_ARG...]
#                               NP shardmixd ranks in the background; E2E_MPIRUN_PID
#   e2e_wait_ready RUN_DIR LOG  waits for rank 0's "ready:" line and RUN_DIR/ready
#   e2e_daemon_pid RUN_DIR RANK a running daemon's pid, from RUN_DIR/ready
#   e2e_fail_with_logs MESSAGE  the tails of $tmp/*.log, then dies with MESSAGE
#   e2e_kill_daemons            SIGKILL to the daemons of e2e_start_daemons and their mpirun
#   e2e_python ARG...           $python with this directory's modules importable (e2e_verdict.py)

SM_E2E=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=deploy/lib.sh
source "$SM_E2E/../../deploy/lib.sh"

e2e_init() {
  local label=$1
  shift
  sm_require_exes shardmixd shardmix-consume shardmix-gen "$@"
  # shellcheck disable=SC2034  # used by the scripts that source this file
  daemon=$(sm_find_exe shardmixd)
  gen=$(sm_find_exe shardmix-gen)
  # shellcheck disable=SC2034
  consume=$(sm_find_exe shardmix-consume)
  # shellcheck disable=SC2034
  python=$(sm_python) || sm_die "python3 not found"
  sm_test_tmpdir "$label"
  tmp=$SM_TMP
}

e2e_gen_dataset() {
  local samples=$1 classes=$2 median_kib=$3 seed=$4
  shift 4
  "$gen" --out "$tmp/data" --samples "$samples" --classes "$classes" --median-kib "$median_kib" \
    --seed "$seed" --quiet "$@"
}

# Our own deadline, below ctest's TIMEOUT, so that launch.sh's traps still stop the daemons
# (-k: SIGKILL if it has not finished 30 s after the SIGTERM).
e2e_launch() {
  local limit=$1 log=$2
  shift 2
  timeout -s TERM -k 30 "$limit" bash "$SM_REPO/deploy/launch.sh" --daemon-log "$log" "$@"
}
e2e_launch_or_die() {
  local limit=$1 log=$2 rc=0
  e2e_launch "$@" || rc=$?
  ((rc == 0)) && return 0
  ((rc == 124)) && sm_log "timed out after $limit s"
  tail -n 20 -- "$log" >&2 || true
  sm_die "launch.sh failed with exit code $rc (daemon log $log)" 1
}

# The scripts that start shardmixd with mpirun themselves: the script's own SHARDMIX_*
# knobs, a job token or a run dir of the caller's shell must not reach the daemons.
e2e_direct_daemons_init() {
  sm_mpirun_init
  sm_unexport_tool_vars
  unset SHARDMIX_JOB_TOKEN SHARDMIX_RUN_DIR
  E2E_MPIRUN_PID=""
}

e2e_start_daemons() {
  local np=$1 config=$2 log=$3 mpi_extra=() daemon_args=()
  shift 3
  while (($#)) && [[ $1 != -- ]]; do
    mpi_extra+=("$1")
    shift
  done
  if (($#)); then
    shift
    daemon_args=("$@")
  fi
  "$SM_MPIRUN" "${SM_MPIRUN_FLAGS[@]}" "${mpi_extra[@]}" -np "$np" "$daemon" --config "$config" \
    "${daemon_args[@]}" >>"$log" 2>&1 &
  E2E_MPIRUN_PID=$!
}

# The log line, not only the file: a stale ready file of a killed run must not count.
# Returns 1 (saying why) if mpirun exits first or 60 s pass.
e2e_wait_ready() {
  local run_dir=$1 log=$2 i
  for ((i = 0; i < 600; i++)); do
    grep -q "\[rank 0\]\[daemon\] ready: " "$log" 2>/dev/null && break
    if ! kill -0 "$E2E_MPIRUN_PID" 2>/dev/null; then
      sm_log "the daemons exited before they were ready"
      return 1
    fi
    sleep 0.1
  done
  ((i < 600)) || { sm_log "the daemons did not become ready within 60 s"; return 1; }
  [[ -f $run_dir/ready ]] || { sm_log "rank 0 said ready but $run_dir/ready does not exist"; return 1; }
}

e2e_daemon_pid() { sed -n "s/^pid\.$2=//p" "$1/ready"; }

# e2e_fail_with_logs MESSAGE: the last 15 lines of every $tmp/*.log, then dies with MESSAGE.
e2e_fail_with_logs() {
  local log
  for log in "$tmp"/*.log; do
    [[ -f $log ]] || continue
    echo "---- $log (last 15 lines)" >&2
    tail -n 15 "$log" >&2
  done
  sm_die "$1" 1
}

e2e_kill_daemons() {
  local p
  [[ -n ${E2E_MPIRUN_PID:-} ]] || return 0
  for p in $(pgrep -P "$E2E_MPIRUN_PID" 2>/dev/null || true); do kill -KILL "$p" 2>/dev/null || true; done
  kill -KILL "$E2E_MPIRUN_PID" 2>/dev/null || true
}

# No __pycache__ is written into the source tree.
e2e_python() { PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$SM_E2E${PYTHONPATH:+:$PYTHONPATH}" "$python" "$@"; }
