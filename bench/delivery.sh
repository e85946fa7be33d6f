#!/usr/bin/env bash
# Delivery benchmark (issue: first working ShardMix). In one run, on one dataset:
#   - ShardMix delivered samples/s and GB/s, 4 daemons + 4 trainers, per provider, with
#     shuffle.exchange_fraction 0 (every sample from local RAM) and 1 (global shuffle,
#     3/4 of the samples read from peers with fi_read);
#   - the baselines measured in the same run: memcpy of the same bytes (1 and 2 threads)
#     and raw fi_read of the same size distribution on the same provider (4 ranks).
# Three ShardMix variants: Q=0 with trainers copying every sample out of shared memory
# (--touch copy, as a trainer staging data for a GPU would), compared with memcpy of the
# same bytes; Q=1 with copying trainers (what such a trainer sees); and Q=1 with trainers
# that take the zero-copy views without reading them (--touch none): delivery alone, the
# like-for-like comparison with raw fi_read, whose bytes also land in memory nobody reads
# (on 2 cores the copying trainers' memcpy competes with the fabric for CPU). An epoch's aggregate rate is all
# trainers' bytes over the wall-clock span from the first trainer's start to the last
# one's end. Figures are medians over epochs 1..E-1 (epoch 0 includes connection set-up)
# and over --repeat runs, with min and max.
#
#   bash bench/delivery.sh [--quick] [--providers "tcp shm"] [--repeat 3] [--samples 16384]
# Env: SHARDMIX_BUILD_DIR (default build/, configure it Release), SHARDMIX_BENCH_DIR
# (dataset cache, default /tmp/shardmix-bench). Writes bench/results/delivery-latest.json
# and prints a Markdown table.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

samples=16384 median_kib=112 epochs=4 repeat=3 providers="tcp shm" fi_seconds=3
quick_sizes() { samples=4096 epochs=3 repeat=1 fi_seconds=1; }
bench_parse_args quick:quick_sizes providers repeat samples -- "$@"
bench_check_positive_ints repeat samples
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
    echo "== raw fi_read, $provider, 4 ranks, qd 8 (run $((r + 1))/$repeat)"
    bench_fabric_read 4 "$provider" --median-kib "$median_kib" --lognormal-sigma 0.5 --count 2048 \
      --seconds "$fi_seconds" --seed "$r" >"$work/f.txt" 2>&1 || { cat "$work/f.txt"; exit 1; }
    grep -v '^JSON ' "$work/f.txt" | tail -4
    bench_json_lines "\"provider_run\": \"$provider\"" <"$work/f.txt" >>"$raw"
    # Q=0 copy: local delivery vs memcpy. Q=1 copy: what a copying trainer sees. Q=1 none:
    # delivery alone (views not read), the like-for-like comparison with raw fi_read, whose
    # bytes also land in memory nobody reads.
    for variant in "0 copy" "1 copy" "1 none"; do
      read -r q touch <<<"$variant"
      echo "== ShardMix, $provider, exchange_fraction $q, touch $touch, 4 daemons + 4 trainers (run $((r + 1))/$repeat)"
      sm_write_config "$work/c.toml" dataset.path="$data" batch.size=32 shuffle.seed=$((r + 1)) \
        shuffle.exchange_fraction="$q" fabric.provider="$provider" service.prefetch=8 log.level=warn
      bench_launch_or_die "$work/s.txt" "$work/d.log" --nodes 4 --config "$work/c.toml" -- \
        "$build/tools/shardmix-consume" --epochs "$epochs" --touch "$touch" --json
      bench_json_lines "\"bench\": \"shardmix\", \"provider\": \"$provider\", \"q\": $q, \"touch\": \"$touch\", \"run\": $r" \
        <"$work/s.txt" >>"$raw"
    done
  done
done

python3 - "$raw" "$repo/bench/results/delivery-latest.json" "$samples" "$median_kib" <<'PY'
import json, statistics, sys, datetime, platform, os
raw, out, samples, median_kib = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = [json.loads(l) for l in open(raw) if l.strip()]
memcpy = {r["threads"]: r for r in rows if r.get("bench") == "memcpy"}
result = {"date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "machine": f"{os.cpu_count()} cores, {platform.machine()}",
          "dataset": f"{samples} samples, median {median_kib} KiB (log-normal sigma 0.5)",
          "memcpy_gbps": {t: m["gbps_median"] for t, m in memcpy.items()}, "providers": {}}
def med(xs): return statistics.median(xs) if xs else float("nan")
for provider in sorted({r["provider"] for r in rows if r.get("bench") == "shardmix"}):
    fi = [r for r in rows if r.get("provider_run") == provider]
    fi_gbps = med([r.get("total_gbps", r.get("gbps", float("nan"))) for r in fi])
    entry = {"raw_fi_read_gbps": fi_gbps}
    for key, q, touch in (("q0", 0, "copy"), ("q1", 1, "copy"), ("q1_none", 1, "none")):
        per_epoch = {}
        for r in rows:
            if (r.get("bench") == "shardmix" and r["provider"] == provider and r["q"] == q
                    and r.get("touch") == touch and r["epoch"] > 0):
                per_epoch.setdefault((r["run"], r["epoch"]), []).append(r)
        agg_gbps, agg_sps, peer_gbps = [], [], []
        for ranks in per_epoch.values():
            # Wall-clock span over all trainers: first start to last end (monotonic clock,
            # same machine). Using each trainer's own duration would overstate the rate
            # when the trainers' epochs do not fully overlap.
            secs = max(x["t_end"] for x in ranks) - min(x["t_start"] for x in ranks)
            agg_gbps.append(sum(x["bytes"] for x in ranks) / secs / 1e9)
            agg_sps.append(sum(x["samples"] for x in ranks) / secs)
            peer_gbps.append(sum(x["peer_bytes"] for x in ranks) / secs / 1e9)
        entry[key] = {"gbps": med(agg_gbps), "gbps_min": min(agg_gbps, default=float("nan")),
                          "gbps_max": max(agg_gbps, default=float("nan")), "samples_per_s": med(agg_sps),
                          "peer_gbps": med(peer_gbps), "epochs_measured": len(agg_gbps)}
    entry["local_vs_memcpy_1t"] = entry["q0"]["gbps"] / result["memcpy_gbps"][1]
    entry["local_vs_memcpy_2t"] = entry["q0"]["gbps"] / result["memcpy_gbps"][2]
    entry["peer_vs_raw_fi_read"] = entry["q1_none"]["peer_gbps"] / fi_gbps
    entry["peer_copying_vs_raw_fi_read"] = entry["q1"]["peer_gbps"] / fi_gbps
    result["providers"][provider] = entry
os.makedirs(os.path.dirname(out), exist_ok=True)
json.dump(result, open(out, "w"), indent=2)
print(json.dumps(result, indent=2))
print()
print(f"Delivery, {result['dataset']}, 4 daemons + 4 trainers, {result['machine']}, {result['date']}")
print()
print("| provider | Q=0 local, copying GB/s | samples/s | Q=1 global, copying GB/s | peer part | Q=1 global, views only GB/s | peer part | memcpy 1t GB/s | memcpy 2t GB/s | raw fi_read GB/s | local / memcpy 1t | peer (views only) / raw fi_read | peer (copying) / raw fi_read |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for p, e in result["providers"].items():
    def rng(x): return f"{x['gbps']:.2f} ({x['gbps_min']:.2f}-{x['gbps_max']:.2f})"
    print(f"| {p} | {rng(e['q0'])} | {e['q0']['samples_per_s']:.0f} | {rng(e['q1'])} | {e['q1']['peer_gbps']:.2f} "
          f"| {rng(e['q1_none'])} | {e['q1_none']['peer_gbps']:.2f} "
          f"| {result['memcpy_gbps'][1]:.2f} | {result['memcpy_gbps'][2]:.2f} | {e['raw_fi_read_gbps']:.2f} "
          f"| {e['local_vs_memcpy_1t']:.0%} | {e['peer_vs_raw_fi_read']:.0%} | {e['peer_copying_vs_raw_fi_read']:.0%} |")
PY
