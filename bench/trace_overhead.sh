#!/usr/bin/env bash
# What the sample-journey trace costs (telemetry.trace_dir, docs/telemetry.md): the same
# lockstep delivery job (N daemons + N trainers, global shuffle Q = 1, trainers taking the
# zero-copy views without reading them, so delivery alone is measured and any tracing cost
# shows most) run --pairs times with tracing at full detail (trace_sample_fraction 1) and
# without, alternating (on-off, then off-on, so a drifting machine load falls on both
# sides). A run's rate is the whole-span rate of bench/delivery.sh (docs/decisions/0050:
# all trainers' bytes of epochs 1..E-1 over the span from the first batch of epoch 1 to
# the last batch of epoch E-1); the trace files are written at exit, outside the span.
# Prints each pair's rates, the median of the pairs' ratios traced / untraced, and the
# median rates; the target is a ratio of at least 0.97 (at most 3% cost). On a shared
# machine the pairs' ratios scatter by more than 3%, so the run first measures the
# recording itself (shardmix-bench-trace-record: the trace points of one batch in a loop,
# off and on) and reports what that adds per second of the measured delivery rate, as a
# share of one core: a bound that load does not blur.
#
#   bash bench/trace_overhead.sh [--quick] [--pairs 5] [--samples 16384] [--epochs 4] [--nodes 4]
#                                [--provider tcp] [--out bench/results/trace-overhead-latest.json]
# Env: SHARDMIX_BUILD_DIR (default build/, Release), SHARDMIX_BENCH_DIR (dataset cache).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

samples=16384 median_kib=112 epochs=4 pairs=5 nodes=4 provider=tcp
out=$repo/bench/results/trace-overhead-latest.json
quick_sizes() { samples=4096 epochs=3 pairs=2; }
bench_parse_args quick:quick_sizes pairs samples epochs nodes provider out -- "$@"
bench_check_positive_ints pairs samples epochs nodes
((epochs >= 2)) || sm_die "--epochs must be at least 2 (epoch 0 is a warm-up), got $epochs" 2
bench_require_built server/shardmixd tools/shardmix-consume tools/shardmix-gen bench/shardmix-bench-trace-record
data=$(bench_sample_dataset "$samples" "$median_kib")
bench_workdir trace-overhead
raw=$work/raw.jsonl
: >"$raw"

run_one() { # PAIR TRACED(0|1)
  local pair=$1 traced=$2 settings=()
  ((traced)) && settings=(telemetry.trace_dir="$work/trace-$pair" telemetry.trace_sample_fraction=1)
  sm_write_config "$work/c.toml" dataset.path="$data" batch.size=32 shuffle.seed=$((pair + 1)) \
    shuffle.exchange_fraction=1 fabric.provider="$provider" service.prefetch=8 log.level=warn "${settings[@]}"
  echo "== pair $((pair + 1))/$pairs, tracing $( ((traced)) && echo on || echo off)"
  bench_launch_or_die "$work/s.txt" "$work/d.log" --nodes "$nodes" --config "$work/c.toml" -- \
    "$build/tools/shardmix-consume" --epochs "$epochs" --touch none --json --lockstep
  bench_json_lines "\"pair\": $pair, \"traced\": $traced, \"run\": \"$pair-$traced\"" <"$work/s.txt" >>"$raw"
  if ((traced)); then
    du -sh "$work/trace-$pair" | sed 's/^/   trace files: /'
    rm -rf -- "$work/trace-$pair"
  fi
}

echo "== recording cost per batch (shardmix-bench-trace-record)"
"$build/bench/shardmix-bench-trace-record" --batches 40000 --batch-size 32 --peers $((nodes - 1)) | tee "$work/r.txt"
bench_json_lines <"$work/r.txt" >"$work/record.jsonl"
echo "load before: $(bench_loadavg)"
for ((p = 0; p < pairs; p++)); do
  if ((p % 2 == 0)); then run_one "$p" 1; run_one "$p" 0; else run_one "$p" 0; run_one "$p" 1; fi
done
echo "load after: $(bench_loadavg)"
python3 "$bench_dir/trace_overhead_report.py" "$raw" "$out" --samples "$samples" --nodes "$nodes" \
  --provider "$provider" --record "$work/record.jsonl"
