#!/usr/bin/env bash
# Data stall benchmark (target: stall < 1% at 80% of the peak), DS-Analyzer's method (Mohan et al., VLDB 2021):
# a trainer spends a fixed compute time per batch; it runs once fed by the loader and once
# fed by synthetic in-memory batches of the same size; the difference in epoch time is
# stall, reported as a fraction of the fed epoch's time. The compute is a sleep (a GPU's
# compute does not use the host CPU; on this 2-core machine a busy loop would take the
# daemons' and workers' CPU and measure something else). Both trainers copy every sample's
# bytes out of the loader's memory (staging for a GPU), in the synthetic run too.
#
# In one run: ShardMix's peak (4 daemons + 4 trainers, tcp on lo, exchange_fraction 1,
# no compute), then for compute rates that need 50%, 80% and 100% of that peak (compute
# per batch = batch / (fraction x peak / 4 trainers)): ShardMix fed, the DataLoader fed
# (bench/stall_torch.py: DistributedSampler + DataLoader over the same files, page cache
# warm; the worker count among --workers with the best rate at no compute), and the
# synthetic reference of each. An epoch's time is the span from the first rank's start to
# the last one's end. Epoch 0 is left out (ShardMix: connection set-up, first touch of the
# staging pages; DataLoader: its persistent workers start). Target: ShardMix stall < 1% when compute needs 80% of its peak.
#
#   bash bench/stall.sh [--quick] [--out FILE.json] [--epochs 4] [--workers "1 2"] [--prefetch 8]
# --prefetch: ShardMix's service.prefetch (batches staged ahead per trainer).
# Full: 16,384 samples (median 112 KiB), 4 epochs per run (3 measured);
# --quick: 4,096 samples, 2 epochs.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

samples=16384 median_kib=112 epochs=4 workers="1 2" fractions="0.5 0.8 1.0" out=$repo/bench/results/stall-latest.json
prefetch=8
quick_sizes() { samples=4096 epochs=2; }
bench_parse_args quick:quick_sizes out epochs workers prefetch -- "$@"
bench_check_positive_ints epochs prefetch
for w in $workers; do sm_is_uint "$w" || sm_die "--workers: '$w' is not a worker count" 2; done
bench_require_built server/shardmixd tools/shardmix-consume tools/shardmix-gen
bench_require_torch
data=$(bench_sample_dataset "$samples" "$median_kib")
bench_workdir stall
raw=$work/raw.jsonl
: >"$raw"
bench_sample_list "$data" "$work/list"
read -r total_bytes _ < <(bench_sample_bytes "$data")
batch=32
batches_per_trainer=$(((samples / 4 + batch - 1) / batch))
batch_bytes=$((total_bytes * batch / samples))
sm_write_config "$work/c.toml" dataset.path="$data" batch.size="$batch" shuffle.exchange_fraction=1 fabric.provider=tcp \
  service.prefetch="$prefetch" log.level=warn
# tag_rows KIND EXTRA-JSON < program output: its JSON lines as raw rows.
tag_rows() { bench_json_lines "\"kind\": \"$1\", $2" >>"$raw"; }
shardmix_run() {  # compute_ms kind extra-json
  echo "== ShardMix, compute $1 ms per batch ($2)"
  bench_launch_or_die "$work/s.txt" "$work/d.log" --nodes 4 --config "$work/c.toml" -- \
    "$build/tools/shardmix-consume" --epochs "$epochs" --touch copy --compute-ms "$1" --json
  tag_rows "$2" "$3" <"$work/s.txt"
}

loadavg_start=$(bench_loadavg)
shardmix_run 0 peak '"loader": "shardmix", "run": 0, "fraction": null'
peak=$(PYTHONPATH=$bench_dir python3 -c '
import json, sys, costs_report as cr
rows = [json.loads(l) for l in open(sys.argv[1])]
print(cr.summarize_stall(rows)["shardmix_peak_samples_per_s"]["median"])' "$raw")
echo "ShardMix peak: $peak samples/s"

# The DataLoader's best worker count (>= 1, page cache warm: one read of the files first).
cat "$data"/*/* >/dev/null
best_workers="" best_rate=0
for w in $workers; do
  echo "== DataLoader, $w workers, no compute"
  "$torch_python" "$bench_dir/stall_torch.py" --root "$data" --list "$work/list" --workers "$w" --epochs 2 >"$work/t.txt"
  rate=$(PYTHONPATH=$bench_dir python3 -c '
import sys, benchlib
last = [r for r in benchlib.json_lines(sys.argv[1]) if r["epoch"] == 1]
print(sum(r["samples"] for r in last) / benchlib.epoch_span(last))' "$work/t.txt")
  echo "   $rate samples/s"
  tag_rows torch_probe "\"loader\": \"dataloader\", \"run\": $w, \"fraction\": null, \"config\": \"$w workers\"" <"$work/t.txt"
  if python3 -c "import sys; sys.exit(0 if $rate > $best_rate else 1)"; then best_workers=$w best_rate=$rate; fi
done
echo "DataLoader best: $best_workers workers ($best_rate samples/s)"

for f in $fractions; do
  compute_ms=$(python3 -c "print(f'{$batch / ($f * $peak / 4) * 1000:.4f}')")
  echo "{\"kind\": \"compute\", \"fraction\": $f, \"compute_ms\": $compute_ms}" >>"$raw"
  shardmix_run "$compute_ms" fed "\"loader\": \"shardmix\", \"run\": 0, \"fraction\": $f"
  echo "== synthetic trainer (C++), compute $compute_ms ms, $batches_per_trainer batches of $batch_bytes bytes"
  bench_mpirun 4 "$build/tools/shardmix-consume" --synthetic-batches "$batches_per_trainer" \
    --synthetic-batch-bytes "$batch_bytes" --touch copy --compute-ms "$compute_ms" --epochs "$epochs" --json \
    >"$work/y.txt" 2>&1 || { cat "$work/y.txt"; exit 1; }
  tag_rows synthetic "\"loader\": \"shardmix\", \"run\": 0, \"fraction\": $f, \"samples\": 0" <"$work/y.txt"
  echo "== DataLoader ($best_workers workers), compute $compute_ms ms"
  "$torch_python" "$bench_dir/stall_torch.py" --root "$data" --list "$work/list" --workers "$best_workers" \
    --epochs "$epochs" --compute-ms "$compute_ms" >"$work/t.txt"
  tag_rows fed "\"loader\": \"dataloader\", \"run\": 0, \"fraction\": $f, \"config\": \"$best_workers workers, warm cache\"" <"$work/t.txt"
  echo "== synthetic trainer (Python), compute $compute_ms ms"
  "$torch_python" "$bench_dir/stall_torch.py" --synthetic-batches "$batches_per_trainer" --synthetic-batch-bytes "$batch_bytes" \
    --epochs "$epochs" --compute-ms "$compute_ms" >"$work/t.txt"
  tag_rows synthetic "\"loader\": \"dataloader\", \"run\": 0, \"fraction\": $f" <"$work/t.txt"
done
echo "{\"kind\": \"conditions\", \"prefetch\": $prefetch, \"dataset\": \"$samples samples, median $median_kib KiB\", \"loadavg_start\": \"$loadavg_start\", \"loadavg_end\": \"$(bench_loadavg)\", \"epochs\": $epochs}" >>"$raw"
PYTHONPATH=$bench_dir python3 "$bench_dir/costs_report.py" stall "$raw" "$out"
