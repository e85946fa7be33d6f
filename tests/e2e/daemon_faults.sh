#!/usr/bin/env bash
# End-to-end fault tests of the daemons (docs/operations.md "Faults"). Each case
# provokes one fault on a 2-daemon job on this machine and checks what everyone sees:
#   load       SIGTERM while the daemons load (inject.load_delay makes the load long):
#              both exit 0 without serving; no socket, ready or token file is left.
#   epoch      SIGTERM while trainers are mid-epoch: daemons exit 0; each trainer fails
#              with the daemon's reason ("shutting down"), not a hang; the run dir is
#              empty. Before that, while serving: a trainer with another job's token and
#              a process of another user (setpriv, uid 65534) are refused.
#   killed     SIGKILL of both daemons mid-epoch: the trainers fail ("lost the
#              connection"), not hang; the leftovers (sockets, ready, token) are found
#              and removed by the next start in the same run dir, which then serves an
#              epoch exactly as planned.
#   peer_dead  SIGKILL of daemon 1 while daemon 0's trainer reads only local samples
#              (shuffle.exchange_fraction = 0, so only the heartbeat can notice): within
#              fault.peer_timeout (3 s) daemon 0 names rank 1 to its trainer and exits 1.
#   peer_hung  SIGSTOP of daemon 1 (a hung node): after fault.peer_timeout (2 s) daemon 0
#              names rank 1 to its trainer and exits 1.
#   peer_dead_degrade  3 daemons, fault.peer_death = degrade: SIGKILL of daemon 2 while the
#              trainers are in epoch 1..; trainers 0 and 1 finish every epoch, and their
#              traces equal those of a fault-free reference run of the same job (same plan,
#              W = 0: every planned sample once, in planned order, same bytes; the reference
#              is checked against the files), some of rank 2's samples came from storage,
#              the survivors log degraded mode naming rank 2 (and never call a live rank
#              dead), report it in their Prometheus files (shardmix_degraded_peers 1), and
#              exit 0 on SIGTERM without the barrier that would wait for rank 2.
#   peer_hung_degrade  the same with SIGSTOP of daemon 2 (a hung node): found by
#              fault.peer_timeout (3 s); its reads in flight never complete; trainer 2
#              gets no keepalive from its stopped daemon and fails naming it after its
#              receive timeout (8 s here), while the survivors' trainers, with the same
#              timeout, wait out the slow batches around the fault.
# The peer cases run mpirun with --enable-recovery: without it Open MPI's mpirun itself
# kills the whole job about a second after a rank dies (measured; docs/operations.md),
# and the survivor's own detection is what is under test here.
# Every wait is bounded; no check depends on how long something took.
#   tests/e2e/daemon_faults.sh [CASE...]      (default: all cases)
set -euo pipefail
SM_PROG=daemon_faults
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

e2e_direct_daemons_init
trainer_pids=()
sm_before_tmp_cleanup() {
  local p
  for p in "${trainer_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  e2e_kill_daemons
}
e2e_init faults
e2e_gen_dataset 800 8 8 5

fail() { e2e_fail_with_logs "$CASE: $*"; }
# wait_until SECONDS WHAT COMMAND...: polls COMMAND every 0.1 s; fails naming WHAT.
wait_until() {
  local limit=$1 what=$2 i
  shift 2
  for ((i = 0; i < limit * 10; i++)); do
    if "$@"; then return 0; fi
    sleep 0.1
  done
  fail "timed out after $limit s waiting for $what"
}
has() { grep -q -- "$2" "$1" 2>/dev/null; }
gone() { ! kill -0 "$1" 2>/dev/null; }
both_past_epoch_0() { has "$tmp/t0.log" "epoch 0:" && has "$tmp/t1.log" "epoch 0:"; }
# count_at_least FILE PATTERN N: FILE has at least N lines matching PATTERN.
count_at_least() {
  local n
  n=$(grep -c -- "$2" "$1" 2>/dev/null || true)
  ((${n:-0} >= $3))
}

# start_daemons RUN_DIR [mpirun args...] -- [--set k=v...]: $world daemons in the background.
start_daemons() {
  local run_dir=$1
  shift
  sm_write_config "$tmp/c.toml" dataset.path="$tmp/data" batch.size=8 fabric.provider=tcp \
    service.trainers_per_node=1 service.run_dir="$run_dir"
  e2e_start_daemons "$world" "$tmp/c.toml" "$tmp/daemons.log" "$@"
  mpirun_pid=$E2E_MPIRUN_PID
}
wait_ready() { e2e_wait_ready "$1" "$tmp/daemons.log" || fail "the daemons did not become ready"; }
daemon_pid() { e2e_daemon_pid "$@"; }
# start_two_busy_trainers RUN_DIR: trainers 0 and 1 (pids t0, t1) running 1000 epochs, and
# past epoch 0 when this returns.
start_two_busy_trainers() {
  start_trainer "$1" 0 t0 --epochs 1000 --compute-ms 5
  t0=$!
  start_trainer "$1" 1 t1 --epochs 1000 --compute-ms 5
  t1=$!
  wait_until 60 "both trainers past epoch 0" both_past_epoch_0
}
# both_trainers_fail_saying WHY PATTERN: trainers 0 and 1 (pids t0, t1) exit non-zero, and
# trainer R's log matches PATTERN with {R} replaced by R (its error names its own daemon).
both_trainers_fail_saying() {
  local why=$1 pattern r pids=("$t0" "$t1")
  for r in 0 1; do
    pattern=${2//\{R\}/$r}
    wait_exit "${pids[r]}" 60 "trainer $r ($why)"
    ((rc != 0)) || fail "trainer $r exited 0 although $why"
    has "$tmp/t$r.log" "$pattern" || fail "trainer $r's error does not say '$pattern' ($why)"
  done
}
# start_trainer RUN_DIR RANK NAME [consume args...]
start_trainer() {
  local run_dir=$1 rank=$2 name=$3
  shift 3
  env SHARDMIX_RUN_DIR="$run_dir" SHARDMIX_RANK="$rank" SHARDMIX_WORLD_SIZE="$world" SHARDMIX_CONNECT_TIMEOUT=60 \
    "$consume" "$@" >"$tmp/$name.log" 2>&1 &
  trainer_pids+=($!)
}
# wait_exit PID SECONDS WHAT: waits for PID to end; sets $rc to its exit status.
wait_exit() {
  wait_until "$2" "$3 to exit" gone "$1"
  rc=0
  wait "$1" 2>/dev/null || rc=$?
}
run_dir_empty() {
  local left
  left=$(find "$1" -mindepth 1 -maxdepth 1 2>/dev/null | sort | tr '\n' ' ')
  [[ -z $left ]] || fail "run dir $1 not clean after the daemons exited: $left"
}
world=2  # daemons, one trainer each
reset() {
  world=2
  mpirun_pid=""
  E2E_MPIRUN_PID=""
  trainer_pids=()
  rm -f -- "$tmp"/*.log
}

case_load() {
  local run=$tmp/rl p
  # 400 samples per daemon, one loader thread, 20 ms each: a load of ~8 s.
  start_daemons "$run" -- --set service.loader_threads=1 --set inject.load_delay=20ms
  wait_until 60 "both daemons loading" count_at_least "$tmp/daemons.log" "\[loader\] loading: " 2
  for p in $(pgrep -P "$mpirun_pid" -x shardmixd); do kill -TERM "$p"; done
  wait_exit "$mpirun_pid" 60 "mpirun (daemons stopped while loading)"
  ((rc == 0)) || fail "the daemons stopped during the load exited $rc, expected 0"
  [[ $(grep -c "stopped during loading" "$tmp/daemons.log") == 2 ]] || fail "not both daemons said 'stopped during loading'"
  grep -q "stopped after [0-9]* of 400" "$tmp/daemons.log" || fail "the load was not interrupted (no 'stopped after N of 400')"
  has "$tmp/daemons.log" "ready:" && fail "the daemons became ready although stopped during the load"
  run_dir_empty "$run"
}

case_epoch() {
  local run=$tmp/re t0 t1
  start_daemons "$run"
  wait_ready "$run"
  start_two_busy_trainers "$run"
  # Another job's trainer (its own SHARDMIX_JOB_TOKEN) finds these sockets: refused.
  rc=0
  env SHARDMIX_RUN_DIR="$run" SHARDMIX_RANK=0 SHARDMIX_WORLD_SIZE=2 SHARDMIX_JOB_TOKEN=another-job \
    timeout 60 "$consume" --epochs 1 >"$tmp/other-job.log" 2>&1 || rc=$?
  ((rc != 0 && rc != 124)) || fail "a trainer with another job's token was not refused (exit $rc)"
  has "$tmp/other-job.log" "belongs to another job (job token mismatch" || fail "no token error for another job's trainer"
  # Another user: the 0700 run dir and the 0600 socket keep it out.
  # setpriv is util-linux's, on every Debian system: without it this check would not run.
  command -v setpriv >/dev/null 2>&1 || fail "setpriv (util-linux) not found: cannot check that another user is refused"
  rc=0
  timeout 60 setpriv --reuid=65534 --regid=65534 --clear-groups env SHARDMIX_RUN_DIR="$run" SHARDMIX_RANK=0 \
    SHARDMIX_WORLD_SIZE=2 "$consume" --epochs 1 --daemon 0 >"$tmp/other-user.log" 2>&1 || rc=$?
  ((rc != 0 && rc != 124)) || fail "a process of uid 65534 was not refused (exit $rc)"
  has "$tmp/other-user.log" "Permission denied" || fail "uid 65534 was refused without 'Permission denied'"
  kill -TERM "$(daemon_pid "$run" 0)" "$(daemon_pid "$run" 1)"
  wait_exit "$mpirun_pid" 60 "mpirun (daemons stopped mid-epoch)"
  ((rc == 0)) || fail "the daemons stopped mid-epoch exited $rc, expected 0"
  both_trainers_fail_saying "their daemons were stopped mid-epoch" \
    "daemon of node {R} is shutting down (it received a stop signal)"
  run_dir_empty "$run"
}

case_killed() {
  local run=$tmp/rk t0 t1 f
  start_daemons "$run"
  wait_ready "$run"
  start_two_busy_trainers "$run"
  kill -KILL "$(daemon_pid "$run" 0)" "$(daemon_pid "$run" 1)"
  both_trainers_fail_saying "their daemons were SIGKILLed" "lost the connection to the daemon of node {R}"
  wait_exit "$mpirun_pid" 60 "mpirun (daemons SIGKILLed)"
  for f in d0.sock d1.sock ready token; do
    [[ -e $run/$f ]] || fail "expected a leftover $f after SIGKILL (the test provokes nothing otherwise)"
  done
  # The next start in the same run dir finds and removes the leftovers, then serves.
  : >"$tmp/daemons.log"
  trainer_pids=()
  start_daemons "$run"
  wait_ready "$run"
  has "$tmp/daemons.log" "removing stale $run/ready and token" || fail "the stale ready/token files were not reported"
  [[ $(grep -c "removing stale socket" "$tmp/daemons.log") == 2 ]] || fail "not both stale sockets were reported"
  start_trainer "$run" 0 r0 --epochs 1 --trace "$tmp/trace"
  t0=$!
  start_trainer "$run" 1 r1 --epochs 1 --trace "$tmp/trace"
  t1=$!
  wait_exit "$t0" 120 "trainer 0 after the restart"
  ((rc == 0)) || fail "trainer 0 failed after the restart (exit $rc)"
  wait_exit "$t1" 120 "trainer 1 after the restart"
  ((rc == 0)) || fail "trainer 1 failed after the restart (exit $rc)"
  # Exactly once, bytes as on disk: the restarted job is a normal job.
  "$python" "$SM_E2E/check_traces.py" "$tmp/trace" --dataset "$tmp/data" --epochs 1 --trainers 2 \
    --trainers-per-node 1 --batch-size 8 || fail "the restarted job's trace is wrong"
  kill -TERM "$(daemon_pid "$run" 0)" "$(daemon_pid "$run" 1)"
  wait_exit "$mpirun_pid" 60 "mpirun (restarted daemons)"
  ((rc == 0)) || fail "the restarted daemons exited $rc"
  run_dir_empty "$run"
}

# peer_case SIGNAL EXPECTED-REASON [--set ...]: daemon 1 gets SIGNAL; daemon 0 must stop
# its trainer with an error naming rank 1, and exit 1.
peer_case() {
  local signal=$1 reason=$2 run=$tmp/rp t0 t1
  shift 2
  start_daemons "$run" --enable-recovery -- --set shuffle.exchange_fraction=0 "$@"
  wait_ready "$run"
  start_two_busy_trainers "$run"
  local d0 d1
  d0=$(daemon_pid "$run" 0)
  d1=$(daemon_pid "$run" 1)
  kill "-$signal" "$d1"
  wait_exit "$t0" 60 "trainer 0 (its daemon's peer got SIG$signal)"
  ((rc != 0)) || fail "trainer 0 exited 0"
  has "$tmp/t0.log" "daemon rank 1 (host .*) is dead or unreachable: $reason" ||
    fail "trainer 0's error does not name daemon rank 1 with '$reason'"
  echo "$SM_PROG: $CASE: trainer 0 got: $(grep -o 'daemon rank 1 .*' "$tmp/t0.log" | head -n 1)"
  wait_until 60 "daemon 0 to exit" gone "$d0"
  has "$tmp/daemons.log" "\[rank 0\]\[daemon\] exiting with status 1: daemon rank 1 failed" ||
    fail "daemon 0 did not exit naming rank 1"
  [[ -e $run/d0.sock ]] && fail "daemon 0 left its socket"
  kill -KILL "$d1" 2>/dev/null || true
  wait_exit "$t1" 60 "trainer 1 (its daemon is gone)"
  wait_exit "$mpirun_pid" 60 "mpirun"
  # Not asserted: under --enable-recovery Open MPI 4.1's mpirun exited 0 here although
  # rank 0 exited 1 and rank 1 was killed (docs/operations.md warns about it).
  echo "$SM_PROG: $CASE: mpirun --enable-recovery exited $rc"
  return 0
}
# tcp;ofi_rxm on loopback: a heartbeat to a SIGKILLed peer whose connection was idle
# neither completes nor fails (measured), so the timeout finds it; a read in flight when the
# connection breaks fails at once. Either way rank 1 must be named within the bound.
case_peer_dead() {
  peer_case KILL "\(a heartbeat read failed\|a sample read failed\|no answer to a heartbeat read for 3\)" \
    --set fault.peer_timeout=3s
}
case_peer_hung() { peer_case STOP "no answer to a heartbeat read for 2" --set fault.peer_timeout=2s; }

# run_three RUN_DIR TRACE_DIR: a 3-daemon job with 3 trainers of $epochs epochs, tracing;
# leaves the trainers' pids in t[0..2] and the daemons running.
epochs=8
run_three() {
  local run=$1 trace=$2 r
  shift 2
  world=3
  start_daemons "$run" --enable-recovery -- --set fault.peer_death=degrade --set fault.peer_timeout=3s "$@"
  wait_ready "$run"
  t=()
  # A short receive timeout: the survivors' trainers must not mistake the slow batches
  # around the fault for a silent daemon (their daemons send keepalives), while trainer 2
  # of a stopped daemon must give up (decision 0036).
  for r in 0 1 2; do
    SHARDMIX_RECEIVE_TIMEOUT=8 start_trainer "$run" "$r" "t$r" --epochs "$epochs" --compute-ms 20 --trace "$trace"
    t+=($!)
  done
}
# degrade_case SIGNAL: the reference run, then the same job with daemon 2 sent SIGNAL
# (KILL: a dead process; STOP: a hung node, whose reads in flight never complete).
degrade_case() {
  local signal=$1 ref=$tmp/rref run=$tmp/rdeg d0 d1 d2 r
  # The reference: the same job without a fault (its traces are checked against the files).
  run_three "$ref" "$tmp/trace-ref"
  for r in 0 1 2; do
    wait_exit "${t[$r]}" 120 "reference trainer $r"
    ((rc == 0)) || fail "reference trainer $r failed (exit $rc)"
  done
  "$python" "$SM_E2E/check_traces.py" "$tmp/trace-ref" --dataset "$tmp/data" --epochs "$epochs" --trainers 3 \
    --trainers-per-node 1 --batch-size 8 || fail "the reference run's trace is wrong"
  kill -TERM "$(daemon_pid "$ref" 0)" "$(daemon_pid "$ref" 1)" "$(daemon_pid "$ref" 2)"
  wait_exit "$mpirun_pid" 60 "mpirun (reference daemons)"
  ((rc == 0)) || fail "the reference daemons exited $rc"
  : >"$tmp/daemons.log"
  # The degraded run: daemon 2 dies while the trainers are past epoch 0.
  run_three "$run" "$tmp/trace-deg" --set "telemetry.prometheus_file=$tmp/deg{rank}.prom"
  wait_until 60 "trainer 0 past epoch 0" has "$tmp/t0.log" "epoch 0:"
  d0=$(daemon_pid "$run" 0)
  d1=$(daemon_pid "$run" 1)
  d2=$(daemon_pid "$run" 2)
  has "$tmp/t0.log" "epoch $((epochs - 1)):" && fail "trainer 0 finished before the fault (make the epochs slower)"
  kill -"$signal" "$d2"
  for r in 0 1; do
    wait_exit "${t[$r]}" 120 "surviving trainer $r"
    ((rc == 0)) || fail "surviving trainer $r failed (exit $rc): $(tail -n 2 "$tmp/t$r.log")"
  done
  if [[ $signal == KILL ]]; then
    wait_exit "${t[2]}" 60 "trainer 2 (its daemon was killed)"
    ((rc != 0)) || fail "trainer 2 exited 0 although its daemon was killed"
  else
    # Its daemon is stopped, not dead: no keepalive comes, and trainer 2 gives up after
    # its receive timeout naming the daemon (decision 0036).
    wait_exit "${t[2]}" 60 "trainer 2 (its daemon is stopped)"
    ((rc != 0)) || fail "trainer 2 exited 0 although its daemon was stopped"
    has "$tmp/t2.log" "the daemon of node 2 (.*d2.sock) sent nothing for 8 s, not even its keepalive" ||
      fail "trainer 2's error does not name its silent daemon: $(tail -n 2 "$tmp/t2.log")"
  fi
  has "$tmp/daemons.log" "daemon rank 2 (host .*) is dead or unreachable: .*degraded mode" ||
    fail "no survivor logged degraded mode naming daemon rank 2"
  [[ $(grep -c "\]\[daemon\] daemon rank 2 (host .*) is dead or unreachable: .*degraded mode" "$tmp/daemons.log") -le 2 ]] ||
    fail "degraded mode logged more than once per survivor"
  # Every sample planned for trainers 0 and 1: once, in planned order, same bytes as the
  # reference (the same plan); some of rank 2's came from storage.
  "$python" - "$tmp/trace-ref" "$tmp/trace-deg" "$CASE" <<'PY' || fail "the survivors' traces differ from the plan"
import csv, sys
ref_dir, deg_dir, case = sys.argv[1:4]
storage_from_dead = 0
for r in (0, 1):
    def rows(d):
        with open("%s/rank-%d.csv" % (d, r)) as f:
            return list(csv.DictReader(f))
    ref, deg = rows(ref_dir), rows(deg_dir)
    key = lambda x: (x["epoch"], x["batch"], x["position"], x["sample_id"], x["bytes"], x["xxh64"])
    if len(ref) != len(deg):
        sys.exit("rank %d: %d samples delivered, %d planned" % (r, len(deg), len(ref)))
    for i, (a, b) in enumerate(zip(ref, deg)):
        if key(a) != key(b):
            # The whole rows: tier and owner say which path delivered the wrong sample.
            sys.exit("rank %d row %d: got %s, planned %s" % (r, i, dict(b), dict(a)))
    storage_from_dead += sum(1 for x in deg if x["tier"] == "storage" and x["owner"] == "2")
if storage_from_dead == 0:
    sys.exit("no sample of the dead rank 2 was read from storage: the fault did not hit a read")
print("daemon_faults: %s: %d samples of rank 2 came from storage; traces equal the plan"
      % (case, storage_from_dead))
PY
  kill -TERM "$d0" "$d1"
  wait_until 60 "the surviving daemons to exit" gone "$d0"
  wait_until 60 "the surviving daemons to exit" gone "$d1"
  [[ $(grep -c "exiting with status 0 in degraded mode: daemon rank 2 died" "$tmp/daemons.log") == 2 ]] ||
    fail "not both survivors exited in degraded mode naming rank 2"
  # The bug this case caught once: reads to the dead rank stalled those between survivors
  # until one declared the other, live, dead (decision 0032).
  has "$tmp/daemons.log" "daemon rank [01] (host .*) is dead or unreachable" && fail "a live daemon was declared dead"
  for r in 0 1; do
    has "$tmp/deg$r.prom" "^shardmix_degraded_peers{.*} 1$" || fail "daemon $r's Prometheus file lacks shardmix_degraded_peers 1"
    grep -q "^shardmix_dead_peer_storage_samples_total{.*} [1-9]" "$tmp/deg$r.prom" ||
      fail "daemon $r's Prometheus file counts no sample read from storage for the dead peer"
  done
  [[ $signal == KILL ]] || kill -KILL "$d2"  # the hung daemon never leaves by itself
  wait_exit "$mpirun_pid" 60 "mpirun"
  echo "$SM_PROG: $CASE: mpirun --enable-recovery exited $rc"
}
case_peer_dead_degrade() { degrade_case KILL; }
case_peer_hung_degrade() { degrade_case STOP; }

cases=("$@")
((${#cases[@]})) || cases=(load epoch killed peer_dead peer_hung peer_dead_degrade peer_hung_degrade)
for CASE in "${cases[@]}"; do
  declare -F "case_$CASE" >/dev/null || sm_die "unknown case '$CASE'" 2
  reset
  : >"$tmp/daemons.log"
  "case_$CASE"
  echo "$SM_PROG: $CASE: PASS"
done
echo "daemon_faults: PASS (${cases[*]})"
