#!/usr/bin/env bash
# End-to-end test of model checkpoint absorption (docs/decisions/0053, 0056) through the
# client API (shardmix-ckpt: Client::save, wait_durable, load, list) against real daemons.
# Cases, each judged by bytes compared with cmp and by the daemons' checkpoint.dir:
#   killed    a trainer SIGKILLed right after save returned: the version still becomes
#             durable (wait_durable from a new process), its file holds the saved bytes,
#             and load returns them; shardmix-stat counts the save, the drained bytes and
#             the pool chunks the version holds;
#   broken    without checkpoint.dir a save is refused naming the key; checkpoint.dir
#             cannot be created at start (a regular file is in its way): the
#             daemons refuse to start, naming it; it breaks while serving (replaced by a
#             file): save still returns (the bytes are in RAM), wait_durable fails naming
#             the checkpoint and the directory, load still returns the bytes from RAM; once
#             the directory is back, the drain's retry makes the kept copy durable;
#   owner     a daemon SIGKILLed right after its trainer's save returned, its checkpoint.dir
#             broken so that it never drained the version (docs/decisions/0059): the peer
#             daemon held the replica in its RAM (its shardmix-stat figure), takes it over
#             once its failure detector finds the owner dead (fault.peer_death = degrade,
#             mpirun --enable-recovery), drains it once the directory works, and the file
#             holds the saved bytes; a new job loads them from the file (checksum checked);
#   restart   the job is stopped and started again with another world size (1 daemon
#             instead of 2) and then with the same one: every rank's last durable version
#             loads, with the bytes saved; a torn leftover (a crashed drain's temporary file
#             of a newer version) is never listed or loaded;
#   full      (not in the default set: ctest e2e_checkpoint_full) checkpoint.dir on a 1 MiB
#             tmpfs: a 2 MiB save still returns (RAM and replica), wait_durable fails naming
#             the checkpoint, the directory and ENOSPC, load serves the RAM copy; once the
#             tmpfs is grown the drain's retry makes the kept copy durable. Needs root for the
#             mount (exits 77, ctest's skip, where it cannot mount);
#   python    (not in the default set: tests/python registers it where the module is
#             built) tests/python/test_checkpoints.py as both trainer ranks: the binding's
#             save/wait_durable/load/list and shardmix.torch.save/load.
# Every wait is bounded; no check depends on how long something took.
#   tests/e2e/checkpoint_e2e.sh [CASE...]      (default: all cases)
set -euo pipefail
SM_PROG=checkpoint_e2e
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

e2e_direct_daemons_init
full_mount=""
sm_before_tmp_cleanup() {
  e2e_kill_daemons
  if [[ -n $full_mount ]]; then umount "$full_mount" 2>/dev/null || umount -l "$full_mount" 2>/dev/null || true; fi
}
e2e_init checkpoint shardmix-ckpt shardmix-stat
ckpt=$(sm_find_exe shardmix-ckpt)
stat=$(sm_find_exe shardmix-stat)
e2e_gen_dataset 200 4 4 9

CASE=setup
fail() { e2e_fail_with_logs "$CASE: $*"; }

# start_daemons NODES RUN_DIR CHECKPOINT_DIR: NODES daemons, one trainer each, ready.
start_daemons() {
  start_daemons_in_background "$@"
  e2e_wait_ready "$2" "$tmp/daemons.log" || fail "the daemons did not become ready"
}
# Config keys (KEY=VALUE) in $extra_config and mpirun arguments in $extra_mpirun are added.
extra_config=()
extra_mpirun=()
start_daemons_in_background() {
  local nodes=$1 run_dir=$2 dir=$3
  world=$nodes
  sm_write_config "$tmp/c.toml" dataset.path="$tmp/data" batch.size=8 fabric.provider=tcp \
    service.trainers_per_node=1 service.run_dir="$run_dir" checkpoint.dir="$dir" checkpoint.capacity=64MiB \
    cache.capacity=256MiB "${extra_config[@]}"
  : >"$tmp/daemons.log"
  e2e_start_daemons "$nodes" "$tmp/c.toml" "$tmp/daemons.log" "${extra_mpirun[@]}"
  current_run_dir=$run_dir
}
stop_daemons() {
  e2e_kill_daemons
  wait "$E2E_MPIRUN_PID" 2>/dev/null || true
  E2E_MPIRUN_PID=""
}
# as_rank RANK shardmix-ckpt ARGS...: one trainer rank's command, bounded; its output in $out.
as_rank() {
  local rank=$1
  shift
  rc=0
  out=$(env SHARDMIX_RUN_DIR="$current_run_dir" SHARDMIX_RANK="$rank" SHARDMIX_WORLD_SIZE="$world" \
    SHARDMIX_CONNECT_TIMEOUT=60 timeout 60 "$ckpt" "$@" 2>&1) || rc=$?
}
# payload FILE SEED KIB: deterministic bytes.
payload() { head -c "$(($3 * 1024))" < <(yes "$2 checkpoint payload" | tr -d '\n') >"$1"; }
# loads_as RANK NAME FILE: load of NAME returns exactly FILE's bytes.
loads_as() {
  as_rank "$1" load "$2" --out "$tmp/loaded"
  ((rc == 0)) || fail "load $2 failed: $out"
  cmp -s "$tmp/loaded" "$3" || fail "load $2 returned other bytes than $3 ($out)"
}

# drained_later DIR FILE WHEN: rank 0's model@1, kept in RAM while the drain failed, becomes
# durable (wait_durable retried for up to 30 s) with FILE's bytes in DIR.
drained_later() {
  local i
  for ((i = 0; i < 30; i++)); do
    as_rank 0 wait model
    ((rc == 0)) && break
    sleep 1
  done
  ((rc == 0)) || fail "the RAM copy was not drained $3: $out"
  cmp -s <(tail -c +25 "$1/model/v1.smxckpt") "$2" || fail "the late drain wrote other bytes"
}

case_killed() {
  local dir=$tmp/killed-ckpt
  start_daemons 2 "$tmp/run-killed" "$dir"
  payload "$tmp/k1" one 3000
  # checkpoint.capacity comes out of the cache's budget (cache.capacity = 256MiB here).
  grep -q "the cache arena is limited to cache.capacity - checkpoint.capacity = $(((256 - 64) << 20)) bytes" \
    "$tmp/daemons.log" || fail "the daemons did not take checkpoint.capacity out of cache.capacity"
  as_rank 0 save rank0 --file "$tmp/k1" --kill-after-save
  ((rc == 137)) || fail "the trainer was to kill itself right after save returned (exit 137), exit $rc: $out"
  as_rank 0 wait rank0
  ((rc == 0)) || fail "wait_durable after the trainer was killed: $out"
  [[ -f $dir/rank0/v1.smxckpt ]] || fail "no $dir/rank0/v1.smxckpt after wait_durable returned"
  # The file is the 24-byte header and the bytes the trainer saved.
  cmp -s <(tail -c +25 "$dir/rank0/v1.smxckpt") "$tmp/k1" || fail "the drained file does not hold the saved bytes"
  loads_as 1 rank0 "$tmp/k1"
  as_rank 1 list
  [[ $out == *"rank0@1"* ]] || fail "list does not show rank0@1: $out"
  # Telemetry: node 0 counts the one save and the bytes drained (file header excluded).
  out=$("$stat" --run-dir "$current_run_dir" --daemon 0 --prometheus) || fail "shardmix-stat failed: $out"
  [[ $out == *'shardmix_checkpoint_saves_total{node="0"} 1'* ]] || fail "saves not counted: $out"
  [[ $out == *"shardmix_checkpoint_drained_bytes_total{node=\"0\"} $((3000 * 1024))"* ]] ||
    fail "drained bytes not counted: $out"
  out=$("$stat" --run-dir "$current_run_dir" --daemon 0) || fail "shardmix-stat failed: $out"
  [[ $out == *"checkpoints: "*"1 saves"* ]] || fail "shardmix-stat's summary has no checkpoint line: $out"
  # The checkpoint pool (decision 0068): the one version, 3000 KiB, holds two 2 MiB chunks of
  # reused pages; nothing overflowed into fresh pages.
  [[ $out == *"checkpoint pool: 4.2 of "*"1 versions in reused pages, 0 overflows"* ]] ||
    fail "shardmix-stat's summary has no checkpoint pool line with 1 pooled version: $out"
  out=$("$stat" --run-dir "$current_run_dir" --daemon 0 --prometheus) || fail "shardmix-stat failed: $out"
  [[ $out == *"shardmix_checkpoint_pool_in_use_bytes{node=\"0\"} $((2 * (2 << 20)))"* ]] ||
    fail "pool bytes in use not counted: $out"
  [[ $out == *'shardmix_checkpoint_pool_buffers_total{node="0"} 1'* ]] || fail "pooled version not counted: $out"
  [[ $out == *'shardmix_checkpoint_pool_overflows_total{node="0"} 0'* ]] || fail "an overflow was counted: $out"
  stop_daemons
  echo "checkpoint_e2e: killed: PASS (saved by a trainer SIGKILLed right after save returned; durable and loadable)"
}

case_broken() {
  local blocker=$tmp/blocker dir=$tmp/blocker/ckpt
  # Without checkpoint.dir a save is refused, naming the key.
  start_daemons 2 "$tmp/run-off" ""
  payload "$tmp/b1" broken 512
  as_rank 0 save model --file "$tmp/b1"
  if ((rc == 0)) || [[ $out != *"checkpoint.dir is not set"* ]]; then
    fail "a save without checkpoint.dir: exit $rc: $out"
  fi
  stop_daemons
  echo "not a directory" >"$blocker"
  start_daemons_in_background 2 "$tmp/run-broken-start" "$dir"
  ! e2e_wait_ready "$current_run_dir" "$tmp/daemons.log" 2>/dev/null || fail "the daemons started with $dir impossible"
  wait "$E2E_MPIRUN_PID" 2>/dev/null || true
  E2E_MPIRUN_PID=""
  grep -q "checkpoint.dir $dir: cannot create it: Not a directory" "$tmp/daemons.log" ||
    fail "the daemons' refusal does not name checkpoint.dir $dir"
  rm "$blocker"
  start_daemons 2 "$tmp/run-broken" "$dir"
  # The directory breaks while serving: a file takes its place.
  rm -r "$dir"
  echo "not a directory" >"$dir"
  as_rank 0 save model --file "$tmp/b1"
  ((rc == 0)) || fail "save with a broken checkpoint.dir should return once in RAM: $out"
  as_rank 0 wait model
  ((rc != 0)) || fail "wait_durable succeeded although $dir cannot be created: $out"
  [[ $out == *"model@1"* && $out == *"$dir"* ]] || fail "the error does not name the checkpoint and $dir: $out"
  loads_as 0 model "$tmp/b1"
  # The directory is back: the drain's retry writes the kept RAM copy.
  rm "$dir"
  mkdir "$dir"
  drained_later "$dir" "$tmp/b1" "after $dir became possible"
  stop_daemons
  echo "checkpoint_e2e: broken: PASS (error names checkpoint and directory; RAM copy kept, loaded, drained later)"
}

# wait_for SECONDS WHAT COMMAND...: runs COMMAND every second until it succeeds.
wait_for() {
  local limit=$1 what=$2 i
  shift 2
  for ((i = 0; i < limit; i++)); do
    "$@" && return 0
    sleep 1
  done
  fail "timed out after $limit s waiting for $what"
}
holder_holds() {
  out=$("$stat" --run-dir "$current_run_dir" --daemon 1 --prometheus) || return 1
  [[ $out == *"shardmix_checkpoint_ram_bytes{node=\"1\"} $1"* ]]
}
durable_at_survivor() {
  as_rank 1 wait rank0
  ((rc == 0))
}

case_owner() {
  local dir=$tmp/owner-ckpt owner_pid
  extra_config=(fault.peer_death=degrade fault.peer_timeout=3s)
  extra_mpirun=(--enable-recovery)  # else mpirun ends the whole job when daemon 0 dies
  start_daemons 2 "$tmp/run-owner" "$dir"
  extra_config=()
  extra_mpirun=()
  grep -q "a save returns once a peer daemon holds a copy" "$tmp/daemons.log" ||
    fail "the daemons do not say that saves are replicated"
  owner_pid=$(e2e_daemon_pid "$current_run_dir" 0)
  [[ -n $owner_pid ]] || fail "no pid of daemon 0 in $current_run_dir/ready"
  # Neither daemon can drain: only RAM copies exist when the owner dies.
  rm -r "$dir"
  echo "not a directory" >"$dir"
  payload "$tmp/o1" owner 2500
  as_rank 0 save rank0 --file "$tmp/o1"
  ((rc == 0)) || fail "save rank0: $out"
  kill -KILL "$owner_pid"
  # The copy was in daemon 1's RAM when the save returned (the only other place it can be).
  holder_holds $((2500 * 1024)) || fail "daemon 1 does not hold the $((2500 * 1024))-byte replica: $out"
  wait_for 60 "daemon 1 to take over daemon 0's checkpoint" \
    grep -q "\[rank 1\]\[daemon\] checkpoints: daemon rank 0 died; the 1 version(s) not yet durable" "$tmp/daemons.log"
  rm "$dir"
  mkdir "$dir"
  wait_for 60 "daemon 1 to drain rank0@1" durable_at_survivor
  cmp -s <(tail -c +25 "$dir/rank0/v1.smxckpt") "$tmp/o1" || fail "the holder's drain wrote other bytes"
  loads_as 1 rank0 "$tmp/o1"
  stop_daemons
  # A new job reads the holder's file, checking its length and CRC32C.
  start_daemons 1 "$tmp/run-owner-b" "$dir"
  loads_as 0 rank0 "$tmp/o1"
  stop_daemons
  echo "checkpoint_e2e: owner: PASS (daemon SIGKILLed right after save returned; its replica holder drained the version)"
}

case_restart() {
  local dir=$tmp/restart-ckpt
  start_daemons 2 "$tmp/run-restart-a" "$dir"
  payload "$tmp/r0v1" r0v1 700
  payload "$tmp/r0v2" r0v2 900
  payload "$tmp/r1v1" r1v1 400
  as_rank 0 save rank0 --file "$tmp/r0v1"
  ((rc == 0)) || fail "save rank0 v1: $out"
  as_rank 0 save rank0 --file "$tmp/r0v2"
  [[ $out == "saved rank0@2"* ]] || fail "the second save of rank0 is not version 2: $out"
  as_rank 1 save rank1 --file "$tmp/r1v1"
  ((rc == 0)) || fail "save rank1: $out"
  as_rank 0 wait rank0
  ((rc == 0)) || fail "wait rank0: $out"
  as_rank 1 wait rank1
  ((rc == 0)) || fail "wait rank1: $out"
  stop_daemons
  # What a drain killed mid-write leaves: a hidden temporary file of a newer version.
  head -c 100 /dev/urandom >"$dir/rank0/.v3.smxckpt.tmp-4242"
  # Another world size: one daemon, one trainer, loads both old ranks' checkpoints.
  start_daemons 1 "$tmp/run-restart-b" "$dir"
  loads_as 0 rank0 "$tmp/r0v2"
  loads_as 0 rank1 "$tmp/r1v1"
  as_rank 0 list
  [[ $out == *"rank0@2"* && $out == *"rank1@1"* ]] || fail "list after the restart: $out"
  [[ $out != *"@3"* ]] || fail "the torn version 3 is listed: $out"
  stop_daemons
  # The same world size again: each rank loads its own.
  start_daemons 2 "$tmp/run-restart-c" "$dir"
  loads_as 0 rank0 "$tmp/r0v2"
  loads_as 1 rank1 "$tmp/r1v1"
  # The next save continues the numbering after the durable versions.
  as_rank 1 save rank1 --file "$tmp/r0v1"
  [[ $out == "saved rank1@2"* ]] || fail "a save after the restart is not version 2: $out"
  stop_daemons
  echo "checkpoint_e2e: restart: PASS (world size 2 -> 1 -> 2; last durable versions loaded; torn leftover never seen)"
}

case_python() {
  local dir=$tmp/python-ckpt build py rank pids=() failed=0
  build=$(sm_build_dir)
  py=${SHARDMIX_PYTHON:-python3}
  [[ -d $build/python/shardmix ]] || fail "$build/python/shardmix not built (cmake --build $build)"
  start_daemons 2 "$tmp/run-python" "$dir"
  for rank in 0 1; do
    env SHARDMIX_RUN_DIR="$current_run_dir" SHARDMIX_RANK="$rank" SHARDMIX_WORLD_SIZE="$world"       SHARDMIX_CONNECT_TIMEOUT=60 PYTHONPATH="$build/python" PYTHONDONTWRITEBYTECODE=1       timeout 120 "$py" "$SM_E2E/../python/test_checkpoints.py" "$dir" >"$tmp/python-$rank.log" 2>&1 &
    pids+=($!)
  done
  for rank in 0 1; do wait "${pids[rank]}" || failed=1; done
  cat "$tmp"/python-*.log
  ((failed == 0)) || fail "tests/python/test_checkpoints.py failed"
  stop_daemons
  echo "checkpoint_e2e: python: PASS"
}

case_full() {
  local mnt=$tmp/full dir=$tmp/full/ckpt
  mkdir -p "$mnt"
  if (($(id -u) != 0)) || ! mount -t tmpfs -o size=1m shardmix-full "$mnt" 2>/dev/null; then
    sm_log "SKIP: full: cannot mount a tmpfs here (needs root)"
    exit 77
  fi
  full_mount=$mnt
  start_daemons 2 "$tmp/run-full" "$dir"
  payload "$tmp/f1" full 2048
  as_rank 0 save model --file "$tmp/f1"
  ((rc == 0)) || fail "save onto a full checkpoint.dir should return once in RAM and the replica: $out"
  as_rank 0 wait model
  ((rc != 0)) || fail "wait_durable succeeded although $dir holds 1 MiB and the version is 2 MiB: $out"
  [[ $out == *"model@1"* && $out == *"$dir"* && $out == *"No space left on device"* ]] ||
    fail "the error does not name the checkpoint, $dir and ENOSPC: $out"
  loads_as 1 model "$tmp/f1"
  [[ -z $(find "$dir" -name '.*tmp*' 2>/dev/null) ]] || fail "a failed drain left its temporary file in $dir"
  # Room again: the drain's retry writes the kept RAM copy.
  mount -o remount,size=16m "$mnt" || fail "could not grow the tmpfs at $mnt"
  drained_later "$dir" "$tmp/f1" "once $dir had room"
  stop_daemons
  umount "$mnt" && full_mount=""
  echo "checkpoint_e2e: full: PASS (ENOSPC named with checkpoint and directory; RAM copy kept, loaded, drained later)"
}

cases=("$@")
((${#cases[@]})) || cases=(killed broken owner restart)
for CASE in "${cases[@]}"; do
  declare -F "case_$CASE" >/dev/null || sm_die "unknown case $CASE (killed, broken, owner, restart, full, python)" 2
  "case_$CASE"
done
echo "checkpoint_e2e: PASS (${cases[*]})"
