#!/usr/bin/env bash
# End-to-end telemetry test: 2 daemons (tcp) + 4 trainers (shardmix-consume --json) for 3
# epochs, with rank 1's peer reads delayed so that trainers really stall. Then:
#  - the stats file (telemetry.stats_file, rank 0) has one complete JSON line per epoch
#    whose samples, bytes, tiers and trainer stall agree with what the trainers counted;
#  - the Prometheus textfiles (telemetry.prometheus_file, one per daemon, final state at
#    exit) parse, and their totals agree with the trainers' too;
#  - shardmix-stat, run by trainer rank 0 while the daemons serve, prints a summary and
#    Prometheus text that parses.
#
#   tests/e2e/telemetry_e2e.sh
#
# Builds nothing: shardmixd, shardmix-consume, shardmix-gen, shardmix-stat come from
# $SHARDMIX_BUILD_DIR (default <repo>/build). SHARDMIX_E2E_KEEP=1 keeps the temp dir.
set -euo pipefail

SM_PROG=telemetry_e2e
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

nodes=2
per_node=2
epochs=3
e2e_init tele shardmix-stat
stat=$(sm_find_exe shardmix-stat)

e2e_gen_dataset 600 10 16 3
sm_write_config "$tmp/job.toml" dataset.path="$tmp/data" batch.size=8 shuffle.seed=11 fabric.provider=tcp \
  fabric.interface=lo service.trainers_per_node="$per_node" inject.slow_peer_rank=1 inject.slow_peer_delay=5ms \
  telemetry.stats_file="$tmp/stats-{job}.jsonl" telemetry.prometheus_file="$tmp/node{rank}.prom" \
  telemetry.interval=1s

# The trainer: consume, and on rank 0 also ask its daemon for statistics while it serves.
cat >"$tmp/trainer.sh" <<EOF
#!/usr/bin/env bash
set -euo pipefail
"$consume" --epochs $epochs --json --touch none
if [[ \${OMPI_COMM_WORLD_RANK:-0} == 0 ]]; then
  "$stat" >"$tmp/stat.txt"
  "$stat" --prometheus >"$tmp/stat.prom"
fi
EOF
chmod +x "$tmp/trainer.sh"

sm_section "run: $nodes daemons, $((nodes * per_node)) trainers, $epochs epochs"
rc=0
e2e_launch 240 "$tmp/daemons.log" --nodes "$nodes" --config "$tmp/job.toml" \
  -- "$tmp/trainer.sh" >"$tmp/trainers.log" 2>&1 || rc=$?
if ((rc != 0)); then
  tail -n 30 "$tmp/trainers.log" "$tmp/daemons.log" >&2 || true
  sm_die "launch.sh failed with exit code $rc"
fi

sm_section "check"
# Rank 0 logs the load's skew across nodes and one summary line per epoch of the job.
grep -q '\[rank 0\]\[daemon\] all 2 nodes loaded .* slowest node [01] ' "$tmp/daemons.log" ||
  sm_die "no load skew line from rank 0 in $tmp/daemons.log"
n=$(grep -c '\[rank 0\]\[telemetry\] epoch [0-9]*: 600 samples' "$tmp/daemons.log" || true)
((n == epochs)) || sm_die "rank 0 logged $n epoch summaries, expected $epochs"
"$python" "$SM_E2E/check_telemetry.py" --trainers-log "$tmp/trainers.log" --stats "$tmp"/stats-*.jsonl \
  --prom "$tmp"/node*.prom --stat-text "$tmp/stat.txt" --stat-prom "$tmp/stat.prom" \
  --epochs "$epochs" --trainers $((nodes * per_node)) --nodes "$nodes" --samples 600
