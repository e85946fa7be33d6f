#!/usr/bin/env bash
# End-to-end fault test: a trainer process is SIGKILLed in the middle of an epoch.
# Expected: its daemon notices, frees the trainer's slots and keeps serving; the other
# trainers finish every epoch undisturbed; the same rank started again receives its whole
# epochs; the daemons shut down cleanly. Judged by check_traces.py (exactly once per
# epoch over the survivors and the restarted rank, bytes verified on disk). Reclaimed: the
# daemons' open descriptors return to their count before the trainers (the killed
# trainer's socket closed; its staging is freed or the restarted rank could not get whole
# epochs), and nothing named shardmix appears in /dev/shm (the regions are memfds).
#   tests/e2e/trainer_killed.sh [tcp|shm]
set -euo pipefail
SM_PROG=trainer_killed
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

provider=${1:-tcp}
nodes=2 per_node=2 epochs=3 batch=8
trainers=$((nodes * per_node))
e2e_init killed
e2e_gen_dataset 800 8 16 3
sm_write_config "$tmp/c.toml" dataset.path="$tmp/data" batch.size="$batch" shuffle.seed=77 \
  fabric.provider="$provider" service.trainers_per_node="$per_node" service.prefetch=3

# The "trainer command" runs once per rank under launch.sh's mpirun; only rank 0 acts,
# starting the four trainers as plain processes so one can be killed without mpirun
# tearing the others down.
cat >"$tmp/driver.sh" <<'DRIVER'
#!/usr/bin/env bash
set -euo pipefail
[[ ${OMPI_COMM_WORLD_RANK:-0} == 0 ]] || exit 0
consume=$1 tmp=$2 trainers=$3 epochs=$4
# Through env (which execs), so that $! is the trainer itself and not a subshell: killing
# a subshell would leave the real trainer running, still connected.
run() { env SHARDMIX_RANK="$1" SHARDMIX_WORLD_SIZE="$trainers" "$consume" --epochs "$epochs" "${@:2}"; }
# What the daemons hold before any trainer connects: Unix-socket descriptors per daemon
# (one per trainer connection comes and goes; the fabric's TCP connections to peers open
# lazily and are not counted) and the names in /dev/shm (memfds have none).
daemon_pids=$(sed -n 's/^pid\.[0-9]*=//p' "$SHARDMIX_RUN_DIR/ready")
fd_count() {
  find "/proc/$1/fd" -mindepth 1 -maxdepth 1 -lname 'socket:*' -printf '%l\n' 2>/dev/null |
    sed 's/^socket:\[\([0-9]*\)\]$/\1/' | grep -Fxc -f <(awk 'NR > 1 { print $7 }' /proc/net/unix) || true
}
declare -A fds_before
for d in $daemon_pids; do fds_before[$d]=$(fd_count "$d"); done
shm_before=$(ls -A /dev/shm 2>/dev/null | sort || true)
pids=()
for r in 0 2 3; do
  env SHARDMIX_RANK="$r" SHARDMIX_WORLD_SIZE="$trainers" "$consume" --epochs "$epochs" --trace "$tmp/trace" \
    --compute-ms 2 >"$tmp/rank$r.out" 2>&1 &
  pids+=($!)
done
# Rank 1 computes slowly, so it is surely mid-epoch when it is killed.
env SHARDMIX_RANK=1 SHARDMIX_WORLD_SIZE="$trainers" "$consume" --epochs "$epochs" \
  --trace "$tmp/killed-trace" --compute-ms 20 >"$tmp/killed.out" 2>&1 &
victim=$!
sleep 0.5
if ! kill -0 "$victim" 2>/dev/null; then echo "driver: the victim finished before it could be killed" >&2; exit 1; fi
kill -KILL "$victim"
wait "$victim" 2>/dev/null || true
echo "driver: killed trainer rank 1 mid-epoch (SIGKILL, 0.5 s into a ~2 s epoch)"
# The same rank comes back and consumes all epochs.
run 1 --trace "$tmp/trace" >"$tmp/rank1.out" 2>&1
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$tmp"/rank*.out
# Reclaimed: once the daemons have handled the hang-ups (bounded wait), each holds as
# many descriptors as before the trainers came, the killed one's included.
for d in $daemon_pids; do
  for ((i = 0; i < 100; i++)); do
    (($(fd_count "$d") <= fds_before[$d])) && break
    sleep 0.1
  done
  now=$(fd_count "$d")
  if ((now > fds_before[$d])); then
    echo "driver: daemon pid $d holds $now Unix sockets, ${fds_before[$d]} before the trainers" >&2
    rc=1
  else
    echo "driver: daemon pid $d: $now Unix sockets, as before the trainers (${fds_before[$d]})"
  fi
done
shm_after=$(ls -A /dev/shm 2>/dev/null | sort || true)
if [[ $(comm -13 <(printf '%s\n' "$shm_before") <(printf '%s\n' "$shm_after") | grep -ci shardmix || true) != 0 ]]; then
  echo "driver: new shardmix names in /dev/shm" >&2
  rc=1
fi
exit "$rc"
DRIVER

e2e_launch_or_die 200 "$tmp/daemons.log" --nodes "$nodes" --config "$tmp/c.toml" --trainers-per-node "$per_node" \
  -- bash "$tmp/driver.sh" "$consume" "$tmp" "$trainers" "$epochs"
grep -q "trainer rank 1 .*\(disconnected\|connection lost\)" "$tmp/daemons.log" ||
  sm_die "the daemon did not notice the killed trainer" 1
"$python" "$SM_E2E/check_traces.py" "$tmp/trace" --dataset "$tmp/data" --epochs "$epochs" \
  --trainers "$trainers" --trainers-per-node "$per_node" --batch-size "$batch" --expect-peer
clean=$(grep -c "bytes read from peers" "$tmp/daemons.log" || true)
((clean == nodes)) || sm_die "only $clean of $nodes daemons exited cleanly" 1
echo "trainer_killed: PASS (killed rank 1 mid-epoch; survivors and the restarted rank got every sample exactly once; the daemons' descriptors back to their count)"
