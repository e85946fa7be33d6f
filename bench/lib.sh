# shellcheck shell=bash
# Shared helpers of the benchmark scripts in bench/. Source it after `set -euo pipefail`;
# it sources deploy/lib.sh (sm_log, sm_die, sm_mpirun_init, sm_test_tmpdir, and
# sm_write_config for the daemons' TOML configs) and runs nothing else. The scripts' own
# names for what every one of them needs:
#
#   repo, bench_dir      the repository root and <repo>/bench
#   build                $SHARDMIX_BUILD_DIR or <repo>/build (Release): the binaries measured
#   data_root            $SHARDMIX_BENCH_DIR or /tmp/shardmix-bench: generated datasets
#   torch_python         $SHARDMIX_TORCH_PYTHON or /usr/bin/python3 (Debian's python3-torch)
#
#   bench_parse_args SPEC... -- "$@"        options, --help, usage errors (see below)
#   bench_usage                              the script's header comment, as --help prints it
#   bench_check_positive_ints VAR...         die unless each option value is an integer > 0
#   bench_check_uints VAR... / bench_check_numbers VAR...
#   bench_require_built PATH...              die unless BUILD/PATH (e.g. tools/shardmix-gen) is built
#   bench_require_root WHY / bench_require_torch / bench_require_slowfs
#   bench_dataset DIR GEN-OPTIONS...         generate a dataset once (shardmix-gen), reuse it after
#   bench_dataset_cached DIR                 true if DIR was generated completely
#   bench_sample_dataset SAMPLES KIB [fixed] the delivery benchmarks' dataset; prints its path
#   bench_sample_list DIR FILE               DIR's sample files, relative and sorted, into FILE
#   bench_sample_bytes DIR                   "TOTAL_BYTES FILES" of DIR's sample files
#   bench_workdir LABEL                      work=<fresh temp dir>, removed at exit (deploy/lib.sh)
#   bench_launch OUT DAEMON_LOG [--timeout S] LAUNCH-OPTIONS... -- TRAINER...
#   bench_launch_or_die (the same, exits 1 with the output on failure)
#   bench_mpirun RANKS COMMAND...            mpirun with the single-machine flags
#   bench_fabric_read RANKS PROVIDER ARGS... raw fi_read (shardmix-bench-fabric-read)
#   bench_mount_slowfs DATA MOUNT LOG OPTS... / bench_unmount_slowfs
#   bench_drop_page_cache                    sync + drop_caches; fails when not root
#   bench_loadavg                            the 1, 5, 15 minute load averages
#   bench_json_lines [FIELDS]                a program's 'JSON {...}' lines as raw rows
#   bench_json_escape / bench_failure_reason RC FILE...

SM_PROG=${SM_PROG:-$(basename -- "${BASH_SOURCE[1]:-$0}")}
# shellcheck source=deploy/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/../deploy/lib.sh"

# shellcheck disable=SC2034  # the scripts that source this file use them
{
  repo=$SM_REPO
  bench_dir=$repo/bench
  build=$(sm_build_dir)
  data_root=${SHARDMIX_BENCH_DIR:-/tmp/shardmix-bench}
  torch_python=${SHARDMIX_TORCH_PYTHON:-/usr/bin/python3}
}

# ---------------------------------------------------------------- arguments

# The header comment of the running script (every line after the shebang up to the first
# line that is not a comment), without the leading "# ": what --help prints.
bench_usage() {
  awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}

# bench_parse_args SPEC... -- ARGS...: parses ARGS by SPEC, in order (so that a later option
# wins over an earlier --quick). Each SPEC word is one option:
#   NAME          --NAME VALUE (or --NAME=VALUE) sets the variable NAME, dashes as underscores
#   NAME=VAR      the same, into VAR
#   NAME[]=ARRAY  repeatable: appends "--NAME" "VALUE" to ARRAY (passed on as they came)
#   NAME:CODE     a flag: --NAME runs CODE (one word: an assignment or a function name)
# -h/--help prints bench_usage and exits 0; anything else is a usage error (exit 2).
bench_parse_args() {
  local -A value_var=() array_var=() flag_code=()
  local spec
  while (($#)); do
    spec=$1
    shift
    [[ $spec == -- ]] && break
    case $spec in
      *:*) flag_code[${spec%%:*}]=${spec#*:} ;;
      *'[]='*) array_var[${spec%%\[\]=*}]=${spec#*\[\]=} ;;
      *=*) value_var[${spec%%=*}]=${spec#*=} ;;
      *) value_var[$spec]=${spec//-/_} ;;
    esac
  done
  local arg name value have_value
  while (($#)); do
    arg=$1
    shift
    case $arg in
      -h|--help) bench_usage; exit 0 ;;
      --*=*) name=${arg%%=*} value=${arg#*=} have_value=1 ;;
      --*) name=$arg have_value=0 ;;
      *) sm_die "unexpected argument '$arg' (see --help)" 2 ;;
    esac
    name=${name#--}
    if [[ -n ${flag_code[$name]+set} ]]; then
      ((!have_value)) || sm_die "--$name takes no value" 2
      eval "${flag_code[$name]}"
      continue
    fi
    [[ -n ${value_var[$name]+set} || -n ${array_var[$name]+set} ]] || sm_die "unknown option '--$name' (see --help)" 2
    if ((!have_value)); then
      (($#)) || sm_die "--$name needs a value" 2
      value=$1
      shift
    fi
    if [[ -n ${value_var[$name]+set} ]]; then
      printf -v "${value_var[$name]}" '%s' "$value"
    else
      local -n bench_parse_args_array=${array_var[$name]}
      bench_parse_args_array+=("--$name" "$value")
      unset -n bench_parse_args_array
    fi
  done
}

# Each VAR names an option's value (--VAR with dashes): dies unless it is an integer > 0,
# and rewrites it in base 10 (so that "08" is not read as octal later).
bench_check_positive_ints() {
  local var
  for var in "$@"; do
    if ! sm_is_uint "${!var}" || ((10#${!var} == 0)); then
      sm_die "--${var//_/-} must be a positive integer, got '${!var}'" 2
    fi
    printf -v "$var" '%d' "$((10#${!var}))"
  done
}
# The same for integers >= 0.
bench_check_uints() {
  local var
  for var in "$@"; do
    sm_is_uint "${!var}" || sm_die "--${var//_/-} must be a non-negative integer, got '${!var}'" 2
    printf -v "$var" '%d' "$((10#${!var}))"
  done
}
# The same for decimal numbers >= 0 (e.g. milliseconds, KiB), left as written.
bench_check_numbers() {
  local var
  for var in "$@"; do
    [[ ${!var} =~ ^[0-9]+(\.[0-9]+)?$ ]] || sm_die "--${var//_/-} must be a number, got '${!var}'" 2
  done
}

# ---------------------------------------------------------------- what must be there

# Dies naming the first of BUILD/PATH... that is not built. The benchmarks run this build's
# binaries only (not sm_find_exe's PATH fallback): a figure must say which code it measured.
bench_require_built() {
  local path
  for path in "$@"; do
    [[ -x $build/$path && ! -d $build/$path ]] || sm_die "$build/$path missing; build first (cmake --build $build)" 2
  done
}

bench_require_root() {
  (($(id -u) == 0)) || sm_die "needs root: $1" 2
}

# bench_shmem_huge_pages SETTING: the kernel's transparent huge page setting for shared
# memory, which decides whether the checkpoint pool's MADV_HUGEPAGE takes effect
# (docs/operations.md, "Huge pages"). An empty SETTING leaves it alone; else it must be one
# the kernel lists, is set now (root) and the machine's own is put back when the script
# exits (call it before bench_workdir's cleanup is armed, or from sm_before_tmp_cleanup).
# Sets bench_shmem_huge_pages_in_use to what is in effect ("" when the kernel has none).
bench_shmem_huge_pages_knob=/sys/kernel/mm/transparent_hugepage/shmem_enabled
bench_shmem_huge_pages_original=
bench_shmem_huge_pages_in_use=
# shellcheck disable=SC2034  # bench_shmem_huge_pages_in_use is read by the scripts that source this
bench_shmem_huge_pages() {
  local want=$1 knob=$bench_shmem_huge_pages_knob
  if [[ -z $want ]]; then
    [[ -r $knob ]] && bench_shmem_huge_pages_in_use=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$knob")
    return 0
  fi
  bench_require_root "setting $knob"
  [[ -w $knob ]] || sm_die "$knob is not there or not writable: this kernel has no huge pages for shared memory" 2
  grep -qw -- "$want" "$knob" || sm_die "--shmem-huge-pages: '$want' is not one of: $(tr -d '[]' <"$knob")" 2
  bench_shmem_huge_pages_original=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$knob")
  echo "$want" >"$knob"
  bench_shmem_huge_pages_in_use=$want
}
# Puts the machine's own setting back (for sm_before_tmp_cleanup); a no-op if unchanged.
bench_shmem_huge_pages_restore() {
  [[ -n $bench_shmem_huge_pages_original ]] || return 0
  echo "$bench_shmem_huge_pages_original" >"$bench_shmem_huge_pages_knob"
  bench_shmem_huge_pages_original=
}

bench_require_torch() {
  "$torch_python" -c 'import torch' >/dev/null 2>&1 ||
    sm_die "$torch_python cannot import torch: install python3-torch (deploy/install-deps.sh) or set SHARDMIX_TORCH_PYTHON" 2
}

# shardmix-slowfs (bench/slowfs, built only when libfuse3-dev was there at configure time)
# and what it needs to mount.
bench_require_slowfs() {
  [[ -x $build/bench/slowfs/shardmix-slowfs ]] ||
    sm_die "$build/bench/slowfs/shardmix-slowfs missing: install libfuse3-dev (deploy/install-deps.sh), re-run cmake, build" 2
  [[ -e /dev/fuse ]] || sm_die "/dev/fuse missing: FUSE is not available here" 2
  command -v fusermount3 >/dev/null 2>&1 || sm_die "fusermount3 missing: install fuse3 (deploy/install-deps.sh)" 2
}

# ---------------------------------------------------------------- datasets

# A generated dataset is complete once DIR/.complete exists (hidden: the catalog scan skips
# it), so that a generation cut short is redone instead of measured.
bench_dataset_cached() { [[ -f $1/.complete ]]; }

# bench_dataset DIR SHARDMIX-GEN-OPTIONS...: generates DIR once (shardmix-gen --out DIR
# --seed 1 --quiet OPTIONS) and reuses it afterwards.
bench_dataset() {
  local dir=$1
  shift
  bench_dataset_cached "$dir" && return 0
  rm -rf -- "$dir"
  mkdir -p -- "$(dirname -- "$dir")"
  sm_log "generating $dir ($*)"
  # Explicit: a caller's $(...) does not inherit set -e, and a dataset a failed run left
  # behind must not be marked complete.
  "$build/tools/shardmix-gen" --out "$dir" --seed 1 --quiet "$@" >&2 || sm_die "shardmix-gen could not write $dir" 1
  : >"$dir/.complete"
}

# bench_sample_dataset SAMPLES MEDIAN_KIB [fixed]: the folder dataset the delivery, suite,
# cost and stall benchmarks share: SAMPLES samples in 1,000 class folders, median MEDIAN_KIB
# KiB, log-normal sigma 0.5 (with "fixed": every sample MEDIAN_KIB KiB). Prints its path.
bench_sample_dataset() {
  local samples=$1 median_kib=$2 dir=$data_root/data-$1-$2k sigma=0.5
  if [[ ${3-} == fixed ]]; then dir+=-fixed sigma=0; fi
  bench_dataset "$dir" --samples "$samples" --classes 1000 --median-kib "$median_kib" --sigma "$sigma" || return
  printf '%s\n' "$dir"
}

# DIR's sample files (*.bin), relative to DIR, in byte order, one a line, into FILE.
bench_sample_list() {
  (cd -- "$1" && find . -name '*.bin' -printf '%P\n' | LC_ALL=C sort) >"$2"
}

# "TOTAL_BYTES FILES" of DIR's sample files (*.bin).
bench_sample_bytes() {
  find "$1" -name '*.bin' -printf '%s\n' | awk '{ s += $1; n++ } END { printf "%.0f %d\n", s, n }'
}

# ---------------------------------------------------------------- running things

# work=<a fresh temp dir>, removed when the script exits (deploy/lib.sh's sm_test_tmpdir:
# SHARDMIX_E2E_KEEP=1 keeps it; a script with more to undo defines sm_before_tmp_cleanup).
bench_workdir() {
  sm_test_tmpdir "$1"
  # shellcheck disable=SC2034  # the scripts' work dir
  work=$SM_TMP
}

# bench_launch OUT DAEMON_LOG [--timeout SECONDS] LAUNCH-OPTIONS... -- TRAINER-COMMAND...:
# deploy/launch.sh with this build's daemons; the trainers' output goes to OUT, the
# daemons' to DAEMON_LOG. --timeout stops a job that hangs (SIGTERM, SIGKILL 20 s later).
# Returns launch.sh's status. Variables set before the call (FI_TCP_IFACE=lo bench_launch
# ...) reach the daemons and the trainers.
bench_launch() {
  local out=$1 daemon_log=$2
  local -a limit=()
  shift 2
  if [[ ${1-} == --timeout ]]; then
    limit=(timeout -s TERM -k 20 "$2")
    shift 2
  fi
  # SHARDMIX_BENCH_DIR and SHARDMIX_TORCH_PYTHON are the benchmarks' own knobs (exported
  # for the scripts run.sh starts): shardmixd rejects SHARDMIX_* names it does not know, and
  # launch.sh passes every SHARDMIX_* but its own on to it.
  "${limit[@]}" env -u SHARDMIX_BENCH_DIR -u SHARDMIX_TORCH_PYTHON SHARDMIX_BUILD_DIR="$build" \
    bash "$repo/deploy/launch.sh" --daemon-log "$daemon_log" "$@" >"$out" 2>&1
}

# The same, but a failed job ends the script (exit 1) after showing the trainers' output
# and the end of the daemons' log.
bench_launch_or_die() {
  local rc=0
  bench_launch "$@" || rc=$?
  ((rc == 0)) && return 0
  cat -- "$1" >&2
  tail -n 40 -- "$2" >&2 2>/dev/null || true
  sm_die "deploy/launch.sh failed (exit $rc); the trainers' output and the daemons' log are above" 1
}

# bench_mpirun RANKS COMMAND...: COMMAND as RANKS MPI ranks, with the flags of
# sm_mpirun_init (SHARDMIX_MPIRUN, SHARDMIX_MPIRUN_FLAGS).
bench_mpirun() {
  [[ -n ${SM_MPIRUN-} ]] || sm_mpirun_init
  local ranks=$1
  shift
  "$SM_MPIRUN" "${SM_MPIRUN_FLAGS[@]}" -np "$ranks" "$@"
}

# bench_fabric_read RANKS PROVIDER ARGS...: raw fi_read between RANKS ranks on PROVIDER
# (tcp: over lo), qd 8, the baseline ShardMix's peer delivery is held against.
bench_fabric_read() {
  local ranks=$1 provider=$2
  local -a iface=()
  shift 2
  [[ $provider == tcp ]] && iface=(--interface lo)
  FI_TCP_IFACE=lo bench_mpirun "$ranks" "$build/bench/shardmix-bench-fabric-read" --provider "$provider" \
    "${iface[@]}" --qd 8 "$@"
}

# bench_mount_slowfs DATA MOUNT LOG SLOWFS-OPTIONS...: serves DATA at MOUNT through
# shardmix-slowfs (in the background, its output in LOG) and waits until it is mounted.
bench_slowfs_pid=""
bench_slowfs_mount=""
bench_mount_slowfs() {
  local data=$1 mnt=$2 log=$3 i
  shift 3
  "$build/bench/slowfs/shardmix-slowfs" "$@" "$data" "$mnt" -f -o max_threads=128 >"$log" 2>&1 &
  bench_slowfs_pid=$!
  bench_slowfs_mount=$mnt
  for ((i = 0; i < 100; i++)); do
    mountpoint -q -- "$mnt" && return 0
    kill -0 "$bench_slowfs_pid" 2>/dev/null || break
    sleep 0.05
  done
  cat -- "$log" >&2
  sm_die "shardmix-slowfs did not mount $mnt" 1
}

# Unmounts the slowfs mount (retried, then lazily) and waits for slowfs to exit: it writes
# its --stats file at unmount. Does nothing when none is mounted.
bench_unmount_slowfs() {
  [[ -n $bench_slowfs_pid ]] || return 0
  local mnt=$bench_slowfs_mount i
  if mountpoint -q -- "$mnt"; then
    fusermount3 -u -- "$mnt" 2>/dev/null || { sleep 1; fusermount3 -u -- "$mnt" 2>/dev/null; } ||
      fusermount3 -uz -- "$mnt" 2>/dev/null || sm_warn "could not unmount $mnt"
  fi
  for ((i = 0; i < 50; i++)); do kill -0 "$bench_slowfs_pid" 2>/dev/null || break; sleep 0.1; done
  kill "$bench_slowfs_pid" 2>/dev/null || true
  wait "$bench_slowfs_pid" 2>/dev/null || true
  bench_slowfs_pid=""
}

# Drops the page cache (the next read comes from the disk). Returns 1 when it cannot (not root).
bench_drop_page_cache() {
  sync
  { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null
}

# ---------------------------------------------------------------- results

bench_loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# bench_json_lines [FIELDS] < PROGRAM-OUTPUT: the program's 'JSON {...}' lines as raw JSON
# rows, with FIELDS ('"key": value, ...') put first. Fails when there is none, so that a
# program that printed no figure stops the benchmark instead of leaving a gap.
bench_json_lines() {
  BENCH_FIELDS=${1-} awk '
    index($0, "JSON {") == 1 {
      f = ENVIRON["BENCH_FIELDS"]
      print "{" (f == "" ? "" : f ", ") substr($0, 7)
      n++
    }
    END { exit n == 0 }'
}

# stdin as the inside of a JSON string (backslashes and quotes escaped), cut to 400 characters.
bench_json_escape() { sed 's/\\/\\\\/g; s/"/\\"/g' | cut -c1-400; }

# bench_failure_reason RC FILE...: why a launch failed, for the results: the first error
# line of FILEs (daemon log, trainers' output), JSON-escaped, else "launch.sh exit code RC".
bench_failure_reason() {
  local rc=$1 why
  shift
  why=$({ grep -h -E ' E \[rank|error' "$@" 2>/dev/null || true; } | head -n 1 | bench_json_escape)
  printf '%s\n' "${why:-launch.sh exit code $rc}"
}
