# shellcheck shell=bash
# Shared helpers for the ShardMix deploy and test scripts. Source it; it runs nothing.
#
#   SM_PROG      name used in messages (set it before sourcing, default: the caller's basename)
#   SM_REPO      repository root (this file lives in <repo>/deploy/)
#   sm_log / sm_warn / sm_die MSG [CODE]     messages on stderr, prefixed with SM_PROG
#   sm_section TITLE                          a short "== TITLE" header on stdout
#   sm_build_dir                              $SHARDMIX_BUILD_DIR or <repo>/build
#   sm_use_ccache                             SM_CMAKE_CACHE_ARGS, SM_CCACHE: ccache as the
#                                             compiler launcher when installed (SHARDMIX_CCACHE=0: off)
#   sm_find_exe NAME                          path of a ShardMix executable: build dir, then PATH
#   sm_mpirun_init                            fills SM_MPIRUN (command) and SM_MPIRUN_FLAGS (array)
#   sm_python                                 a python3 for the tools (prefers one with xxhash)
#   sm_is_uint STRING                         true if STRING is a decimal integer >= 0
#   sm_job_token                              a fresh per-job SHARDMIX_JOB_TOKEN (128 random bits)
#   sm_unexport_tool_vars                     keep the scripts' own SHARDMIX_* knobs out of
#                                             the environment of shardmixd and the trainers
#   sm_require_exes NAME...                   die unless every ShardMix executable is built
#   sm_test_tmpdir LABEL                      a test's temp dir in SM_TMP, removed on exit
#   sm_write_config FILE SECTION.KEY=VALUE... a TOML config file from key=value pairs
#   sm_netns_rx_bytes PREFIX NODES            bytes deploy/netns-cluster.sh's namespaces
#                                             received over their links so far

SM_PROG=${SM_PROG:-$(basename -- "${BASH_SOURCE[1]:-$0}")}
SM_REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)

sm_log() { printf '%s: %s\n' "$SM_PROG" "$*" >&2; }
sm_warn() { printf '%s: warning: %s\n' "$SM_PROG" "$*" >&2; }
sm_die() {
  printf '%s: error: %s\n' "$SM_PROG" "$1" >&2
  exit "${2:-1}"
}
sm_section() { printf '\n== %s\n' "$*"; }

sm_is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
# A fresh per-job token for SHARDMIX_JOB_TOKEN (docs/security.md): 128 random bits as hex.
sm_job_token() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }

sm_build_dir() { printf '%s\n' "${SHARDMIX_BUILD_DIR:-$SM_REPO/build}"; }

# A compiler cache for the builds of demo.sh and test.sh (docs/decisions/0060): when ccache
# is installed and SHARDMIX_CCACHE is not 0, fills SM_CMAKE_CACHE_ARGS with the CMake
# launcher flags and exports what lets a fresh clone in another folder hit the entries of
# this one: paths under the checkout are hashed relative to it (base_dir), and the build
# folder is not hashed (hash_dir; with debug info it would be). Every other ccache setting
# (cache folder, size) is the user's. Without ccache the flags clear the launcher (a build
# dir configured with it earlier would keep it): a plain build. SM_CCACHE says which.
sm_use_ccache() {
  local launcher=""
  if [[ ${SHARDMIX_CCACHE:-1} != 0 ]] && command -v ccache >/dev/null; then
    launcher=ccache
    export CCACHE_BASEDIR=$SM_REPO CCACHE_NOHASHDIR=1
  fi
  # shellcheck disable=SC2034  # used by the scripts that source this file
  SM_CCACHE=${launcher:-off}
  # shellcheck disable=SC2034  # likewise
  SM_CMAKE_CACHE_ARGS=("-DCMAKE_C_COMPILER_LAUNCHER=$launcher" "-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher")
}

# Prints the path of executable NAME (shardmixd, shardmix-consume, ...): first the CMake
# build dir (BUILD/server, BUILD/tools, BUILD), then PATH. Returns 1 if not found.
sm_find_exe() {
  local name=$1 build dir
  build=$(sm_build_dir)
  for dir in "$build/server" "$build/tools" "$build"; do
    if [[ -x $dir/$name && ! -d $dir/$name ]]; then
      printf '%s\n' "$dir/$name"
      return 0
    fi
  done
  command -v -- "$name" 2>/dev/null && return 0
  return 1
}

# Dies naming the first executable that is neither built nor on PATH.
sm_require_exes() {
  local exe
  for exe in "$@"; do
    sm_find_exe "$exe" >/dev/null || sm_die "$exe not found in $(sm_build_dir) or PATH; build it first"
  done
}

# One temp dir per test run, in SM_TMP: removed when the script exits, kept (and its path
# logged) with SHARDMIX_E2E_KEEP=1 for a post-mortem. INT and TERM exit with the usual
# codes so that the EXIT trap runs. A script that must undo more (network namespaces,
# stray processes) defines sm_before_tmp_cleanup; it runs first.
sm_test_tmpdir() {
  SM_TMP=$(mktemp -d "${TMPDIR:-/tmp}/shardmix-$1.XXXXXX")
  trap _sm_test_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}
_sm_test_cleanup() {
  if declare -F sm_before_tmp_cleanup >/dev/null; then sm_before_tmp_cleanup || true; fi
  if [[ ${SHARDMIX_E2E_KEEP:-0} == 1 ]]; then sm_log "kept $SM_TMP"; else rm -rf -- "$SM_TMP"; fi
}

# mpirun and the flags that work on the development machines (docs/performance.md).
# SHARDMIX_MPIRUN overrides the command; SHARDMIX_MPIRUN_FLAGS (split on whitespace)
# replaces the default flags, e.g. on a cluster: SHARDMIX_MPIRUN_FLAGS="--bind-to none".
sm_mpirun_init() {
  SM_MPIRUN=${SHARDMIX_MPIRUN:-mpirun}
  if [[ -n ${SHARDMIX_MPIRUN_FLAGS+set} ]]; then
    # shellcheck disable=SC2206,SC2034  # word splitting intended; used by the callers
    SM_MPIRUN_FLAGS=(${SHARDMIX_MPIRUN_FLAGS})
  else
    # shellcheck disable=SC2034  # used by the scripts that source this file
    SM_MPIRUN_FLAGS=(--allow-run-as-root --oversubscribe --bind-to none
                     --mca pml ob1 --mca btl 'self,vader')
  fi
  command -v -- "$SM_MPIRUN" >/dev/null 2>&1 ||
    sm_die "mpirun not found ('$SM_MPIRUN'); install openmpi-bin (deploy/install-deps.sh) or set SHARDMIX_MPIRUN"
}

# A python3 for check_traces.py: $SHARDMIX_PYTHON, else the first python3 that has the
# xxhash module (the Debian package python3-xxhash installs it for /usr/bin/python3),
# else any python3 (check_traces.py then falls back to libxxhash through ctypes).
sm_python() {
  local py
  if [[ -n ${SHARDMIX_PYTHON:-} ]]; then
    printf '%s\n' "$SHARDMIX_PYTHON"
    return 0
  fi
  for py in python3 /usr/bin/python3; do
    if command -v -- "$py" >/dev/null 2>&1 && "$py" -c 'import xxhash' >/dev/null 2>&1; then
      command -v -- "$py"
      return 0
    fi
  done
  command -v python3 2>/dev/null || command -v /usr/bin/python3 2>/dev/null || return 1
}

# The scripts' own SHARDMIX_* knobs. shardmixd reads SHARDMIX_<SECTION>_<KEY> as config
# overrides and rejects SHARDMIX_* names it does not know, so these must not reach it
# (mpirun hands the whole environment to ranks on the local node).
SM_TOOL_VARS_RE='^SHARDMIX_(BUILD_DIR|READY_TIMEOUT|STOP_TIMEOUT|DAEMON_CMD|MPIRUN|MPIRUN_FLAGS|DAEMON_MPI_ARGS|TRAINER_MPI_ARGS|PYTHON|E2E_[A-Z0-9_]*|DEMO_[A-Z0-9_]*)$'

# Removes the export attribute of those variables (their values stay readable here).
sm_unexport_tool_vars() {
  local name
  while IFS= read -r name; do
    [[ $name =~ $SM_TOOL_VARS_RE ]] && export -n "${name?}"
  done < <(compgen -e)
  return 0
}

# Writes FILE as a TOML config from SECTION.KEY=VALUE arguments, each section's keys under
# one [SECTION] header in the order the sections first appear (TOML does not allow a
# section twice). VALUE is written bare when it is an integer, a decimal or true/false, and
# as a quoted string otherwise ("5ms", paths, "lo"), so a string that looks like a number
# cannot be written; no key needs one today.
sm_write_config() {
  local file=$1 arg key section value
  local -a sections=()
  local -A section_lines=()
  shift
  for arg in "$@"; do
    [[ $arg == *.*=* ]] || sm_die "sm_write_config: '$arg' is not SECTION.KEY=VALUE" 2
    key=${arg%%=*}
    value=${arg#*=}
    section=${key%%.*}
    key=${key#*.}
    if [[ ! $value =~ ^-?[0-9]+([.][0-9]+)?$ && $value != true && $value != false ]]; then
      value=${value//\\/\\\\}
      value=\"${value//\"/\\\"}\"
    fi
    [[ -n ${section_lines[$section]+set} ]] || sections+=("$section")
    section_lines[$section]+="$key = $value"$'\n'
  done
  {
    for section in "${sections[@]}"; do
      printf '[%s]\n%s' "$section" "${section_lines[$section]}"
    done
  } >"$file"
}

# The host-side end of namespace i's link is PREFIXh<i> (deploy/netns-cluster.sh): what it
# transmitted is what the namespace received.
sm_netns_rx_bytes() {
  local prefix=$1 nodes=$2 i total=0 b
  for ((i = 0; i < nodes; i++)); do
    b=$(<"/sys/class/net/${prefix}h$i/statistics/tx_bytes")
    total=$((total + b))
  done
  echo "$total"
}

# The local S3 server of the S3 tests and benchmark (deploy/s3-local.sh), and the fault /
# latency proxy in front of it (tests/e2e/s3_fault_proxy.py).
#   sm_s3_local_start STATE_DIR       starts the server; exports what s3-local.sh start
#                                     prints (AWS_ENDPOINT_URL, AWS_REGION, the keys,
#                                     SHARDMIX_S3_BUCKET, S3_LOCAL_STATE)
#   sm_s3_proxy_start WORK_DIR ARG... (re)starts the proxy with ARG...; sets SM_S3_PROXY_URL
#   sm_s3_local_stop                  stops both (for sm_before_tmp_cleanup)
SM_S3_PROXY_PID=""
sm_s3_local_start() {
  local printed
  printed=$(bash "$SM_REPO/deploy/s3-local.sh" start "$1") || sm_die "deploy/s3-local.sh start failed"
  set -a
  eval "$printed"
  set +a
}
sm_s3_proxy_start() {
  local work=$1 i
  shift
  if [[ -n $SM_S3_PROXY_PID ]]; then
    kill "$SM_S3_PROXY_PID" 2>/dev/null || true
    wait "$SM_S3_PROXY_PID" 2>/dev/null || true
  fi
  rm -f "$work/s3-proxy.port"
  python3 "$SM_REPO/tests/e2e/s3_fault_proxy.py" --upstream "$AWS_ENDPOINT_URL" --port-file "$work/s3-proxy.port" "$@" &
  SM_S3_PROXY_PID=$!
  for ((i = 0; i < 100; i++)); do [[ -s $work/s3-proxy.port ]] && break; sleep 0.1; done
  [[ -s $work/s3-proxy.port ]] || sm_die "the S3 proxy did not start"
  # shellcheck disable=SC2034  # used by the scripts that source this file
  SM_S3_PROXY_URL=http://127.0.0.1:$(cat "$work/s3-proxy.port")
}
sm_s3_local_stop() {
  [[ -z $SM_S3_PROXY_PID ]] || kill "$SM_S3_PROXY_PID" 2>/dev/null || true
  [[ -z ${S3_LOCAL_STATE:-} || ! -d $S3_LOCAL_STATE ]] || bash "$SM_REPO/deploy/s3-local.sh" stop "$S3_LOCAL_STATE" || true
}
