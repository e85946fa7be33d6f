#!/usr/bin/env bash
# End-to-end test of the sample-journey trace (telemetry.trace_dir, docs/telemetry.md):
# 2 daemons (tcp) + 4 trainers (shardmix-consume --trace) for 2 epochs, with a cache too
# small for the dataset so that peer reads and storage reads both happen. Then
# shardmix-trace merge joins the 6 trace files and check_timeline.py audits the merged
# trace against the trainers' CSVs: every delivered sample held exactly once per epoch,
# every wait before its hold, no overlaps on a track, peer and storage reads matching the
# samples the trainers got from peers and storage, counters sane. A second run with
# telemetry.trace_sample_fraction = 0.5 checks that the daemons and the trainers keep the
# same batches and nothing else. shardmix-report --timeline draws the first run's trace.
#
#   tests/e2e/trace_e2e.sh
#
# Builds nothing: shardmixd, shardmix-consume, shardmix-gen, shardmix-trace and
# shardmix-report come from $SHARDMIX_BUILD_DIR (default <repo>/build).
# SHARDMIX_E2E_KEEP=1 keeps the temp dir.
set -euo pipefail
SM_PROG=trace_e2e
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

e2e_init trace
nodes=2 per_node=2 epochs=2
trainers=$((nodes * per_node))
merge=$(sm_find_exe shardmix-trace)
report=$(sm_find_exe shardmix-report)
e2e_gen_dataset 600 10 16 7

run_traced() { # NAME SAMPLE_FRACTION [CHECK_TIMELINE_ARG...]
  local name=$1 fraction=$2
  shift 2
  # 4 MiB of cache per node for 11 MB of samples: about a quarter of them are cold (storage).
  # 1 MiB of staging per trainer holds the largest batch (8 x 75 KB) but not the 12 batches
  # the scheduler stages ahead (prefetch 4 + cold read-ahead 8), so staging waits happen.
  sm_write_config "$tmp/$name.toml" dataset.path="$tmp/data" batch.size=8 shuffle.seed=3 fabric.provider=tcp \
    fabric.interface=lo service.trainers_per_node="$per_node" cache.capacity=4MiB \
    service.staging_bytes_per_trainer=1MiB \
    telemetry.trace_dir="$tmp/$name-trace" telemetry.trace_sample_fraction="$fraction"
  sm_section "$name: $nodes daemons, $trainers trainers, $epochs epochs, trace_sample_fraction $fraction"
  e2e_launch_or_die 240 "$tmp/$name-daemons.log" --nodes "$nodes" --config "$tmp/$name.toml" \
    -- "$consume" --epochs "$epochs" --trace "$tmp/$name-csv"
  local files
  files=$(find "$tmp/$name-trace" -name '*.json' | wc -l)
  ((files == nodes + trainers)) || sm_die "$name: expected $((nodes + trainers)) trace files, found $files" 1
  "$merge" merge "$tmp/$name-trace" "$tmp/$name-merged.json"
  e2e_python "$SM_E2E/check_timeline.py" "$tmp/$name-merged.json" "$tmp/$name-csv" --epochs "$epochs" \
    --trainers "$trainers" --nodes "$nodes" --sample-fraction "$fraction" "$@"
}

run_traced full 1 --expect-staging-waits
# Exactly once in the trainers' own view too (the trace adds nothing to delivery).
"$python" "$SM_E2E/check_traces.py" "$tmp/full-csv" --dataset "$tmp/data" --epochs "$epochs" \
  --trainers "$trainers" --trainers-per-node "$per_node" --batch-size 8 --expect-peer --allow-storage
run_traced sampled 0.5

sm_section "timeline PNG (python3-matplotlib, installed by deploy/install-deps.sh)"
"$report" --timeline "$tmp/full-merged.json" "$tmp/timeline.png"
[[ $(head -c 4 "$tmp/timeline.png" | tail -c 3) == PNG ]] || sm_die "shardmix-report --timeline wrote no PNG" 1
sm_log "PASS"
