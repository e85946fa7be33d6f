#!/usr/bin/env bash
# Soak: many short epochs against real daemons; their resident memory and open files stay
# flat. 2 daemons x 1 trainer; 6 rounds of 10 epochs, each round with new trainer
# processes (new connections, new mappings of the memfds, a catalog fetch), so per-epoch
# and per-connection leaks both accumulate. After round 1 (warm-up) each daemon's VmRSS
# (/proc/PID/status) may grow by at most 4 MiB in total, and its open descriptors
# (/proc/PID/fd) must be back to the warm-up count once the round's trainers are gone.
# A leaked mapping of a 3.6 MB arena per connection, a leaked socket per trainer or a
# per-epoch copy of anything sample-sized would break these bounds. It also prints
# RssAnon/RssShmem: over tcp the anonymous memory grows ~48 bytes per peer read inside
# libfabric 1.17's tcp;ofi_rxm (flat with net and shm; docs/operations.md), ~0.5 MB here.
#   tests/e2e/soak.sh [ROUNDS]
set -euo pipefail
SM_PROG=soak
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

rounds=${1:-6}
epochs_per_round=${SOAK_EPOCHS_PER_ROUND:-10}
rss_bound_kb=4096
e2e_direct_daemons_init
sm_before_tmp_cleanup() { e2e_kill_daemons; }
e2e_init soak
fail() {
  tail -n 20 "$tmp/daemons.log" >&2 || true
  sm_die "$*" 1
}
e2e_gen_dataset 800 8 8 7
run=$tmp/run
sm_write_config "$tmp/c.toml" dataset.path="$tmp/data" batch.size=8 fabric.provider=tcp \
  service.trainers_per_node=1 service.run_dir="$run"
e2e_start_daemons 2 "$tmp/c.toml" "$tmp/daemons.log"
e2e_wait_ready "$run" "$tmp/daemons.log" || fail "the daemons did not start"
pids=("$(e2e_daemon_pid "$run" 0)" "$(e2e_daemon_pid "$run" 1)")

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
fds() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 | wc -l; }
# disconnects N: both daemons logged N trainer disconnections in total (the round's
# trainers are gone from the daemons' point of view, not only from ours).
disconnects() { (($(grep -c "disconnected\|connection lost" "$tmp/daemons.log" || true) >= $1)); }

declare -A rss0 fd0 rss_max
for ((round = 1; round <= rounds; round++)); do
  first=$(((round - 1) * epochs_per_round))
  tp=()
  for r in 0 1; do
    env SHARDMIX_RUN_DIR="$run" SHARDMIX_RANK=$r SHARDMIX_WORLD_SIZE=2 timeout 300 "$consume" \
      --epochs "$epochs_per_round" --first-epoch "$first" >"$tmp/t$r.log" 2>&1 &
    tp+=($!)
  done
  for p in "${tp[@]}"; do wait "$p" || fail "a trainer failed in round $round: $(tail -n 1 "$tmp"/t*.log)"; done
  for ((i = 0; i < 300; i++)); do
    disconnects $((2 * round)) && break
    sleep 0.1
  done
  disconnects $((2 * round)) || fail "round $round: the daemons did not see both trainers leave within 30 s"
  line="round $round (epochs $first..$((first + epochs_per_round - 1))):"
  for d in 0 1; do
    pid=${pids[$d]}
    kill -0 "$pid" 2>/dev/null || fail "daemon $d died during the soak"
    r=$(rss_kb "$pid")
    f=$(fds "$pid")
    line+=" daemon $d VmRSS ${r} kB (anon $(awk '/^RssAnon:/ { print $2 }' "/proc/$pid/status"), shmem $(awk '/^RssShmem:/ { print $2 }' "/proc/$pid/status")), ${f} fds;"
    if ((round == 1)); then
      rss0[$d]=$r fd0[$d]=$f rss_max[$d]=$r
    else
      ((r > rss_max[$d])) && rss_max[$d]=$r
      # Descriptors close when the daemon handles the hang-up, which it has logged.
      ((f <= fd0[$d])) || fail "daemon $d: $f open fds after round $round, ${fd0[$d]} after the warm-up"
    fi
  done
  echo "$SM_PROG: $line"
done
for d in 0 1; do
  grown=$((rss_max[$d] - rss0[$d]))
  echo "$SM_PROG: daemon $d: VmRSS after warm-up ${rss0[$d]} kB, max growth over $(((rounds - 1) * epochs_per_round)) epochs ${grown} kB (bound ${rss_bound_kb} kB); fds ${fd0[$d]}"
  ((grown <= rss_bound_kb)) || fail "daemon $d: resident memory grew by $grown kB after the warm-up"
done
kill -TERM "${pids[@]}"
rc=0
wait "$E2E_MPIRUN_PID" || rc=$?
E2E_MPIRUN_PID=""
((rc == 0)) || fail "the daemons exited $rc after the soak"
echo "soak: PASS ($rounds rounds x $epochs_per_round epochs, memory and open files flat)"
