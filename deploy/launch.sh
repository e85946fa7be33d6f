#!/usr/bin/env bash
# shellcheck disable=SC2317  # (whole file) cleanup functions are called from traps
# Starts one shardmixd per node with mpirun, waits until they are ready, runs the
# trainers with mpirun, then stops the daemons. See --help.
set -euo pipefail

SM_PROG=launch
# shellcheck source=deploy/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<'EOF'
Usage: deploy/launch.sh --nodes N --config FILE [options] -- TRAINER-COMMAND [ARGS...]

Starts N shardmixd daemons (one per node, one MPI job), waits until they have loaded
the dataset and connected (RUN_DIR/ready), runs TRAINER-COMMAND as N*P MPI ranks with
SHARDMIX_RUN_DIR exported, then stops the daemons (SIGTERM; SIGKILL after 20 s).
Trainer rank R talks to the daemon of node R / P.

Options:
  --nodes N                 number of daemons (nodes)                       (required)
  --config FILE             shardmixd TOML config                            (required)
  --trainers-per-node P     trainer ranks per node; also passed to the daemons as
                            --set service.trainers_per_node=P. Default: what the
                            daemons report in the ready file (the config's value).
  --set SECTION.KEY=VALUE   config override for the daemons (repeatable)
  --daemon-log FILE         send the daemons' output to FILE instead of the terminal
                            (there it is prefixed with "[shardmixd] ")
  -h, --help                this text

Environment:
  SHARDMIX_JOB_TOKEN        token shared by this job's daemons and trainers (default:
                            128 random bits, generated here; see docs/security.md)
  SHARDMIX_RUN_DIR          run dir for sockets and the ready file (created if missing,
                            kept afterwards). Default: a private mktemp -d dir, removed
                            at the end. Keep the path short (unix socket paths < 108 B).
  SHARDMIX_READY_TIMEOUT    seconds to wait for the daemons to be ready (default 300)
  SHARDMIX_STOP_TIMEOUT     seconds between SIGTERM and SIGKILL at shutdown (default 20)
  SHARDMIX_BUILD_DIR        CMake build dir holding server/shardmixd, tools/shardmix-*
                            (default <repo>/build; PATH is searched next). Its server/
                            and tools/ dirs are put on the trainers' PATH.
  SHARDMIX_DAEMON_CMD       daemon command instead of shardmixd (split on whitespace;
                            receives --config FILE [--set k=v ...]), e.g. for tests
  SHARDMIX_MPIRUN           mpirun command (default mpirun)
  SHARDMIX_MPIRUN_FLAGS     flags for both mpiruns, replacing the single-machine default
                            "--allow-run-as-root --oversubscribe --bind-to none
                             --mca pml ob1 --mca btl self,vader"
  SHARDMIX_DAEMON_MPI_ARGS  extra mpirun args for the daemons (e.g. "--map-by ppr:1:node")
  SHARDMIX_TRAINER_MPI_ARGS extra mpirun args for the trainers (e.g. "--map-by ppr:4:node")
  The variables above (but SHARDMIX_RUN_DIR) are launch.sh's own and are not passed on;
  every other SHARDMIX_* (config overrides SHARDMIX_<SECTION>_<KEY>, SHARDMIX_LOG_LEVEL)
  and FI_* variable is exported to both jobs (mpirun -x).

Exit status: the trainers' status; 2 for a usage error; 3 if the daemons failed to
start, did not become ready in time, or died while the trainers ran (and the trainers
themselves exited 0); 130/143 if interrupted.

Example:
  deploy/launch.sh --nodes 4 --config deploy/configs/demo.toml --set fabric.provider=shm \
      -- shardmix-consume --epochs 2 --trace /tmp/trace
EOF
}

# ---------------------------------------------------------------- arguments
nodes=""
config=""
tpn=""
daemon_log=""
sets=()
# value OPTION "$@": the value after OPTION, or a usage error if there is none.
value() {
  (($# >= 2)) || sm_die "$1 needs a value" 2
  printf '%s' "$2"
}
while (($#)); do
  case $1 in
    --nodes) nodes=$(value "$@"); shift 2 ;;
    --nodes=*) nodes=${1#*=}; shift ;;
    --config) config=$(value "$@"); shift 2 ;;
    --config=*) config=${1#*=}; shift ;;
    --trainers-per-node) tpn=$(value "$@"); shift 2 ;;
    --trainers-per-node=*) tpn=${1#*=}; shift ;;
    --set) sets+=("$(value "$@")"); shift 2 ;;
    --set=*) sets+=("${1#*=}"); shift ;;
    --daemon-log) daemon_log=$(value "$@"); shift 2 ;;
    --daemon-log=*) daemon_log=${1#*=}; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) usage >&2; sm_die "unknown argument '$1' (the trainer command goes after --)" 2 ;;
  esac
done
trainer_cmd=("$@")

[[ -n $nodes ]] || { usage >&2; sm_die "--nodes is required" 2; }
[[ -n $config ]] || { usage >&2; sm_die "--config is required" 2; }
((${#trainer_cmd[@]})) || { usage >&2; sm_die "no trainer command (put it after --)" 2; }
if ! sm_is_uint "$nodes" || ((10#$nodes == 0)); then
  sm_die "--nodes must be a positive integer, got '$nodes'" 2
fi
nodes=$((10#$nodes))
if [[ -n $tpn ]]; then
  if ! sm_is_uint "$tpn" || ((10#$tpn == 0)); then
    sm_die "--trainers-per-node must be a positive integer, got '$tpn'" 2
  fi
  tpn=$((10#$tpn))
fi
[[ -f $config && -r $config ]] || sm_die "config file '$config' not found or not readable" 2
config=$(cd -- "$(dirname -- "$config")" && pwd -P)/$(basename -- "$config")
for kv in "${sets[@]}"; do
  [[ $kv =~ ^[A-Za-z0-9_]+\.[A-Za-z0-9_.]+=.*$ ]] ||
    sm_die "--set '$kv' is not of the form section.key=value" 2
done
if [[ -n $tpn ]]; then sets+=("service.trainers_per_node=$tpn"); fi

ready_timeout=${SHARDMIX_READY_TIMEOUT:-300}
stop_timeout=${SHARDMIX_STOP_TIMEOUT:-20}
sm_is_uint "$ready_timeout" || sm_die "SHARDMIX_READY_TIMEOUT must be whole seconds, got '$ready_timeout'" 2
sm_is_uint "$stop_timeout" || sm_die "SHARDMIX_STOP_TIMEOUT must be whole seconds, got '$stop_timeout'" 2

sm_mpirun_init

if [[ -n ${SHARDMIX_DAEMON_CMD:-} ]]; then
  # shellcheck disable=SC2206  # a command line given as one string
  daemon_cmd=(${SHARDMIX_DAEMON_CMD})
else
  daemon_exe=$(sm_find_exe shardmixd) ||
    sm_die "shardmixd not found in $(sm_build_dir)/server or PATH; build it (cmake --build build) or set SHARDMIX_BUILD_DIR"
  daemon_cmd=("$daemon_exe")
fi
daemon_cmd+=(--config "$config")
for kv in "${sets[@]}"; do daemon_cmd+=(--set "$kv"); done

# The trainers find shardmix-consume and friends in the build dir without a full path.
build_dir=$(sm_build_dir)
for d in "$build_dir/tools" "$build_dir/server"; do
  if [[ -d $d ]]; then PATH="$d:$PATH"; fi
done
export PATH

# ---------------------------------------------------------------- process helpers
created_run_dir=""
daemon_pid=""    # the daemons' mpirun
trainer_pid=""   # the trainers' mpirun
daemon_children=""  # the daemons' mpirun's children: its ranks on this host
daemon_listed=""    # daemon pids on this host according to the ready file
trainer_children="" # the trainers' mpirun's children
caught_signal=""
watchdogs=()

now() { printf '%s\n' "${EPOCHREALTIME:-$(date +%s.%N)}"; }
elapsed_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# True while pid $1 exists and is not a zombie (exited, not yet reaped by a foreign parent).
running() {
  local stat state
  [[ -n $1 ]] && read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
  state=${stat##*) }
  [[ ${state:0:1} != Z ]]
}
# Pids of the children of pid $1 (an mpirun's ranks on this host), space-separated.
# Skips our own output filters (sed), which are children of the daemons' mpirun too.
children_of() {
  local pids pid comm stat ppid f
  if command -v pgrep >/dev/null 2>&1; then
    pids=$(pgrep -P "$1" 2>/dev/null || true)
  else
    pids=""
    for f in /proc/[0-9]*/stat; do
      read -r stat 2>/dev/null <"$f" || continue
      stat=${stat##*) }
      ppid=${stat#* }
      ppid=${ppid%% *}
      if [[ $ppid == "$1" ]]; then f=${f#/proc/}; pids+="${f%/stat} "; fi
    done
  fi
  for pid in $pids; do
    read -r comm 2>/dev/null <"/proc/$pid/comm" || continue
    [[ $comm == sed ]] || printf '%s ' "$pid"
  done
}
# Remembers the mpiruns' ranks on this host while the mpiruns live: if an mpirun dies
# abruptly (SIGKILL, or a second signal while it aborts), its ranks are stopped from here.
remember_ranks() {
  local c
  if running "$daemon_pid"; then
    c=$(children_of "$daemon_pid")
    if [[ -n $c ]]; then daemon_children=$c; fi
  fi
  if running "$trainer_pid"; then
    c=$(children_of "$trainer_pid")
    if [[ -n $c ]]; then trainer_children=$c; fi
  fi
  return 0
}
# Waits up to $2 seconds for pid $1 to exit; returns 0 if it did.
wait_gone() {
  local pid=$1 deadline
  deadline=$(($(date +%s) + $2))
  while running "$pid"; do
    (($(date +%s) >= deadline)) && return 1
    sleep 0.1
  done
  return 0
}

# stop_job WHAT MPIRUN_PID "RANK_PIDS" TIMEOUT: SIGTERM to mpirun (which forwards it to
# every rank), SIGKILL after TIMEOUT s; then any rank on this host that outlived mpirun
# gets SIGTERM, and SIGKILL 5 s later. Sets stop_rc to mpirun's exit status.
stop_job() {
  local what=$1 pid=$2 ranks=$3 timeout=$4 t0 r left="" forced=0
  stop_rc=0
  [[ -n $pid ]] || return 0
  t0=$(now)
  if running "$pid"; then
    sm_log "stopping $what (SIGTERM to mpirun pid $pid)"
    kill -TERM "$pid" 2>/dev/null
    if ! wait_gone "$pid" "$timeout"; then
      sm_warn "$what still running ${timeout} s after SIGTERM; sending SIGKILL to mpirun pid $pid and its ranks"
      kill -KILL "$pid" 2>/dev/null
      forced=1
    fi
  fi
  wait "$pid" 2>/dev/null || stop_rc=$?
  for r in $ranks; do
    if [[ " $left" != *" $r "* ]] && running "$r"; then left+="$r "; fi
  done
  if [[ -n $left ]]; then
    if ((forced)); then
      # shellcheck disable=SC2086  # one pid per word
      kill -KILL $left 2>/dev/null
    else
      sm_warn "$what: pid(s) ${left}still running after their mpirun exited; sending SIGTERM"
      # shellcheck disable=SC2086
      kill -TERM $left 2>/dev/null
      for r in $left; do
        if ! wait_gone "$r" 5; then
          sm_warn "$what: pid $r ignored SIGTERM; sending SIGKILL"
          kill -KILL "$r" 2>/dev/null
        fi
      done
    fi
  fi
  if ((!forced)) && [[ $what == daemons ]]; then
    sm_log "daemons stopped in $(elapsed_since "$t0") s (mpirun exit $stop_rc)"
  fi
  return 0
}

stop_trainers() {
  [[ -n $trainer_pid ]] || return 0
  stop_job trainers "$trainer_pid" "$trainer_children" 10
  trainer_pid=""
}
stop_daemons() {
  [[ -n $daemon_pid ]] || return 0
  # Open MPI's own kill path sends SIGCONT, waits odls_base_sigkill_timeout, and only then
  # SIGTERM: too slow and too blunt. Daemons on this host get SIGTERM straight away; their
  # mpirun exits by itself once every rank has. Daemons elsewhere get it through mpirun.
  local listed=${daemon_listed// /}
  if [[ -n $listed ]] && running "$daemon_pid"; then
    sm_log "stopping daemons (SIGTERM to daemon pid(s) ${daemon_listed% })"
    # shellcheck disable=SC2086  # one pid per word
    kill -TERM $daemon_listed 2>/dev/null
    wait_gone "$daemon_pid" "$stop_timeout" || true
  fi
  stop_job daemons "$daemon_pid" "$daemon_children $daemon_listed" "$stop_timeout"
  daemon_pid=""
}

# If this script dies without running its traps (SIGKILL, e.g. a test-runner timeout),
# a watchdog still stops the job: SIGTERM, then SIGKILL after the stop timeout; then it
# removes the run dir $2 if given.
start_watchdog() {
  local target=$1 remove_dir=${2:-} parent=$$
  (
    trap '' INT HUP  # but not TERM: cleanup() ends the watchdog with it
    while kill -0 "$parent" 2>/dev/null; do sleep 1; done
    if running "$target"; then
      ranks=$(children_of "$target")
      kill -TERM "$target" 2>/dev/null
      # shellcheck disable=SC2086  # one pid per word
      wait_gone "$target" "$stop_timeout" || kill -KILL "$target" $ranks 2>/dev/null
    fi
    if [[ -n $remove_dir ]]; then rm -rf -- "$remove_dir"; fi
  ) </dev/null >/dev/null 2>&1 &
  watchdogs+=("$!")
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM HUP
  set +e  # clean up as much as possible, whatever fails
  remember_ranks
  if [[ $caught_signal == INT ]]; then
    # A terminal's Ctrl-C reached both mpiruns too: let them wind down on their own
    # first (a second signal makes an aborting mpirun exit at once, leaving ranks).
    wait_gone "$trainer_pid" 3
    wait_gone "$daemon_pid" 3
  fi
  stop_trainers
  stop_daemons
  local w
  for w in "${watchdogs[@]}"; do kill "$w" 2>/dev/null; done
  if [[ -n $created_run_dir && -d $created_run_dir ]]; then
    rm -rf -- "$created_run_dir"
  fi
  exit "$status"
}
on_signal() {
  caught_signal=$1
  sm_log "caught SIG$1; shutting down"
  case $1 in INT) exit 130 ;; TERM) exit 143 ;; *) exit 129 ;; esac
}
trap cleanup EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP

# ---------------------------------------------------------------- run dir
if [[ -n ${SHARDMIX_RUN_DIR:-} ]]; then
  run_dir=$SHARDMIX_RUN_DIR
  mkdir -p -- "$run_dir"
  run_dir=$(cd -- "$run_dir" && pwd -P)
  if [[ -e $run_dir/ready ]]; then
    sm_warn "removing stale $run_dir/ready from an earlier run"
    rm -f -- "$run_dir/ready"
  fi
else
  umask_saved=$(umask)
  umask 077
  run_dir=$(mktemp -d "${TMPDIR:-/tmp}/shardmix.XXXXXX")
  umask "$umask_saved"
  chmod 0700 -- "$run_dir"
  created_run_dir=$run_dir
fi
sock_probe="$run_dir/d$((nodes - 1)).sock"
((${#sock_probe} < 108)) ||
  sm_die "run dir path too long for unix sockets (${#sock_probe} >= 108 bytes): $run_dir; set SHARDMIX_RUN_DIR to a shorter path" 2
export SHARDMIX_RUN_DIR=$run_dir
# One token for this job's daemons and trainers: a trainer of another job that finds these
# daemons' sockets is refused (docs/security.md). A caller's own token is kept.
SHARDMIX_JOB_TOKEN=${SHARDMIX_JOB_TOKEN:-$(sm_job_token)}
export SHARDMIX_JOB_TOKEN

# This script's own knobs stay here (shardmixd rejects SHARDMIX_* names it does not know).
sm_unexport_tool_vars
# Variables both jobs need on every node (mpirun passes the whole environment only to
# ranks on the local node).
export_args=()
while IFS= read -r name; do
  export_args+=(-x "$name")
done < <(compgen -e | grep -E '^(SHARDMIX_|FI_)' || true)

# When mpirun itself is told to stop, Open MPI sends SIGCONT, waits this many seconds,
# sends SIGTERM, waits again, then SIGKILL. The default of 1 s is short for daemons that
# drain (a barrier while their fabric keeps serving peers); 3 s each way is enough.
# shellcheck disable=SC2206  # extra mpirun args given as one string
daemon_mpi_args=(--mca odls_base_sigkill_timeout 3 ${SHARDMIX_DAEMON_MPI_ARGS:-})
# shellcheck disable=SC2206
trainer_mpi_args=(${SHARDMIX_TRAINER_MPI_ARGS:-})

# ---------------------------------------------------------------- daemons
sm_log "starting $nodes daemon(s): ${daemon_cmd[*]}"
sm_log "run dir $run_dir"
t_start=$(now)
if [[ -n $daemon_log ]]; then
  : >"$daemon_log" || sm_die "cannot write daemon log '$daemon_log'" 2
  sm_log "daemon output goes to $daemon_log"
  "$SM_MPIRUN" "${SM_MPIRUN_FLAGS[@]}" -np "$nodes" "${export_args[@]}" "${daemon_mpi_args[@]}" \
    "${daemon_cmd[@]}" </dev/null >>"$daemon_log" 2>&1 &
else
  # The prefixing filters ignore INT/TERM so that a Ctrl-C does not kill them first and
  # leave the daemons writing into a closed pipe (SIGPIPE) instead of shutting down.
  "$SM_MPIRUN" "${SM_MPIRUN_FLAGS[@]}" -np "$nodes" "${export_args[@]}" "${daemon_mpi_args[@]}" \
    "${daemon_cmd[@]}" </dev/null \
    > >(trap '' INT TERM; exec sed -u 's/^/[shardmixd] /') \
    2> >(trap '' INT TERM; exec sed -u 's/^/[shardmixd] /' >&2) &
fi
daemon_pid=$!
start_watchdog "$daemon_pid" "$created_run_dir"

# ---------------------------------------------------------------- wait for ready
deadline=$(($(date +%s) + ready_timeout))
while [[ ! -f $run_dir/ready ]]; do
  remember_ranks
  if ! running "$daemon_pid"; then
    rc=0
    wait "$daemon_pid" 2>/dev/null || rc=$?
    daemon_pid=""
    if [[ -n $daemon_log ]]; then
      sm_log "last lines of $daemon_log:"
      tail -n 20 -- "$daemon_log" | sed 's/^/  [shardmixd] /' >&2
    fi
    sm_die "the daemons' mpirun exited with code $rc before the daemons were ready" 3
  fi
  if (($(date +%s) >= deadline)); then
    sm_die "daemons not ready after ${ready_timeout} s (no $run_dir/ready); raise SHARDMIX_READY_TIMEOUT if loading is slow" 3
  fi
  sleep 0.1
done
remember_ranks

declare -A ready=()
while IFS='=' read -r key value; do
  [[ -n $key ]] && ready[$key]=$value
done <"$run_dir/ready"
this_host=$(hostname)
for ((r = 0; r < nodes; r++)); do
  pid=${ready[pid.$r]:-}
  host=${ready[host.$r]:-}
  if sm_is_uint "$pid" && [[ -z $host || $host == "$this_host" || $host == "${this_host%%.*}" ]]; then
    daemon_listed+="$pid "
  fi
done
ready_daemons=${ready[daemons]:-}
ready_tpn=${ready[trainers_per_node]:-}
if [[ -n $ready_daemons && $ready_daemons != "$nodes" ]]; then
  sm_die "ready file reports daemons=$ready_daemons but --nodes is $nodes" 3
fi
if [[ -z $tpn ]]; then
  if sm_is_uint "$ready_tpn" && ((10#$ready_tpn > 0)); then
    tpn=$((10#$ready_tpn))
  else
    sm_warn "ready file has no trainers_per_node; assuming 1"
    tpn=1
  fi
elif [[ -n $ready_tpn && $ready_tpn != "$tpn" ]]; then
  sm_die "daemons report trainers_per_node=$ready_tpn but --trainers-per-node is $tpn" 3
fi
hosts_list=$(for ((r = 0; r < nodes; r++)); do printf '%s\n' "${ready[host.$r]:-?}"; done | sort | uniq -c |
  awk '{ printf "%s%s x%s", (NR > 1 ? ", " : ""), $2, $1 }')
sm_log "daemons ready after $(elapsed_since "$t_start") s: $nodes daemon(s) on ${hosts_list:-?}"

# ---------------------------------------------------------------- trainers
ntrainers=$((nodes * tpn))
sm_log "starting $ntrainers trainer rank(s) ($tpn per node): ${trainer_cmd[*]}"
t_train=$(now)
"$SM_MPIRUN" "${SM_MPIRUN_FLAGS[@]}" -np "$ntrainers" "${export_args[@]}" "${trainer_mpi_args[@]}" \
  "${trainer_cmd[@]}" </dev/null &
trainer_pid=$!
start_watchdog "$trainer_pid"

daemons_died=0
while running "$trainer_pid"; do
  remember_ranks
  if ((!daemons_died)) && ! running "$daemon_pid"; then
    rc=0
    wait "$daemon_pid" 2>/dev/null || rc=$?
    daemons_died=1
    sm_warn "the daemons' mpirun exited (code $rc) while the trainers were running; stopping the trainers in 10 s"
    stop_job daemons "$daemon_pid" "$daemon_children $daemon_listed" 1  # any daemon rank left behind
    daemon_pid=""
    wait_gone "$trainer_pid" 10 || stop_trainers
    break
  fi
  sleep 0.2
done
trainer_rc=0
if [[ -n $trainer_pid ]]; then
  wait "$trainer_pid" 2>/dev/null || trainer_rc=$?
  stop_job trainers "$trainer_pid" "$trainer_children" 1  # any trainer rank left behind
  trainer_pid=""
else
  trainer_rc=$stop_rc
fi
sm_log "trainers finished in $(elapsed_since "$t_train") s with exit code $trainer_rc"

stop_daemons
if ((trainer_rc == 0 && daemons_died)); then
  sm_die "trainers exited 0 but the daemons died while they ran" 3
fi
# A daemon that crashes on its way out (after SIGTERM) is a bug, not a clean stop.
if ((trainer_rc == 0 && stop_rc != 0)); then
  sm_die "the daemons' mpirun exited with code $stop_rc after SIGTERM (a daemon did not exit cleanly)" 3
fi
exit "$trainer_rc"
