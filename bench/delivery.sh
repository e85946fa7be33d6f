#!/usr/bin/env bash
# Delivery benchmark (issue: first working ShardMix). In one run, on one dataset:
#   - ShardMix delivered samples/s and GB/s, N daemons + N trainers (--nodes, default 4),
#     per provider, with
#     shuffle.exchange_fraction 0 (every sample from local RAM) and 1 (global shuffle,
#     3/4 of the samples read from peers with fi_read);
#   - the baselines measured in the same run: memcpy of the same bytes (1 and 2 threads)
#     and raw fi_read of the same size distribution on the same provider (N ranks).
# Three ShardMix variants: Q=0 with trainers copying every sample out of shared memory
# (--touch copy, as a trainer staging data for a GPU would), compared with memcpy of the
# same bytes; Q=1 with copying trainers (what such a trainer sees); and Q=1 with trainers
# that take the zero-copy views without reading them (--touch none): delivery alone, the
# like-for-like comparison with raw fi_read, whose bytes also land in memory nobody reads
# (on 2 cores the copying trainers' memcpy competes with the fabric for CPU).
# Method (docs/decisions/0050): the trainers run with --lockstep, held in step by one
# MPI_Allreduce per batch as DDP's gradient all-reduce holds real trainers, and a run's
# rate is all trainers' bytes of epochs 1..E-1 (epoch 0 includes connection set-up) over
# the whole measured span: from the first trainer's first batch of epoch 1 to the last
# trainer's last batch of epoch E-1. Epochs should last >= 2 s each so that start-up and
# epoch boundaries do not dominate; the table flags shorter ones. Figures are medians over
# --repeat runs, with min and max. The same runs free-running (no collective: trainers
# drift apart) form a secondary table with the old per-epoch method (first start to last
# end of each epoch, median over epochs); --lockstep-only skips them.
#
#   bash bench/delivery.sh [--quick] [--providers "tcp shm"] [--repeat 3] [--samples 65536] [--epochs 4]
#                          [--nodes 4] [--lockstep-only] [--out bench/results/delivery-latest.json]
# Env: SHARDMIX_BUILD_DIR (default build/, configure it Release), SHARDMIX_BENCH_DIR
# (dataset cache, default /tmp/shardmix-bench). Writes --out (default
# bench/results/delivery-latest.json, the file docs/performance.md quotes) and prints the
# Markdown tables.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

# 65,536 x 112 KiB (7.3 GB, held in the daemons' RAM): long enough epochs for peer delivery.
samples=65536 median_kib=112 epochs=4 repeat=3 providers="tcp shm" fi_seconds=3 modes="lockstep free" nodes=4
out=$repo/bench/results/delivery-latest.json
quick_sizes() { samples=4096 epochs=3 repeat=1 fi_seconds=1; }
bench_parse_args quick:quick_sizes providers repeat samples epochs nodes lockstep-only:'modes=lockstep' out -- "$@"
bench_check_positive_ints repeat samples epochs nodes
((epochs >= 2)) || sm_die "--epochs must be at least 2 (epoch 0 is a warm-up), got $epochs" 2
bench_require_built server/shardmixd tools/shardmix-consume tools/shardmix-gen bench/shardmix-bench-memcpy \
  bench/shardmix-bench-fabric-read
data=$(bench_sample_dataset "$samples" "$median_kib")
bench_workdir delivery
raw=$work/raw.jsonl
: >"$raw"

echo "== memcpy of the same bytes"
for threads in 1 2; do
  "$build/bench/shardmix-bench-memcpy" --dataset "$data" --passes 5 --threads "$threads" | tee "$work/m.txt"
  bench_json_lines <"$work/m.txt" >>"$raw"
done

for provider in $providers; do
  for ((r = 0; r < repeat; r++)); do
    echo "== raw fi_read, $provider, $nodes ranks, qd 8 (run $((r + 1))/$repeat)"
    bench_fabric_read "$nodes" "$provider" --median-kib "$median_kib" --lognormal-sigma 0.5 --count 2048 \
      --seconds "$fi_seconds" --seed "$r" >"$work/f.txt" 2>&1 || { cat "$work/f.txt"; exit 1; }
    grep -v '^JSON ' "$work/f.txt" | tail -4
    bench_json_lines "\"provider_run\": \"$provider\"" <"$work/f.txt" >>"$raw"
    # Q=0 copy: local delivery vs memcpy. Q=1 copy: what a copying trainer sees. Q=1 none:
    # delivery alone (views not read), the like-for-like comparison with raw fi_read, whose
    # bytes also land in memory nobody reads.
    for mode in $modes; do
      mode_flag=()
      [[ $mode == lockstep ]] && mode_flag=(--lockstep)
      for variant in "0 copy" "1 copy" "1 none"; do
        read -r q touch <<<"$variant"
        echo "== ShardMix $mode, $provider, exchange_fraction $q, touch $touch, $nodes daemons + $nodes trainers (run $((r + 1))/$repeat)"
        sm_write_config "$work/c.toml" dataset.path="$data" batch.size=32 shuffle.seed=$((r + 1)) \
          shuffle.exchange_fraction="$q" fabric.provider="$provider" service.prefetch=8 log.level=warn
        bench_launch_or_die "$work/s.txt" "$work/d.log" --nodes "$nodes" --config "$work/c.toml" -- \
          "$build/tools/shardmix-consume" --epochs "$epochs" --touch "$touch" --json "${mode_flag[@]}"
        bench_json_lines "\"bench\": \"shardmix\", \"mode\": \"$mode\", \"provider\": \"$provider\", \"q\": $q, \"touch\": \"$touch\", \"run\": $r" \
          <"$work/s.txt" >>"$raw"
      done
    done
  done
done

python3 "$bench_dir/delivery_report.py" "$raw" "$out" "$samples" "$median_kib" "$nodes"
