#!/usr/bin/env bash
# Metadata per node: real daemons against the simulator, for the same job. 4 daemons + 4
# trainers (one per node) over N small samples in TFRecord shards (default 10,000,000,
# median 64 bytes, 65,536 per shard), one epoch at exchange_fraction 1. The daemons report
# node_metadata_bytes (catalog + placement + the most scheduler state sampled while
# serving) in their "metadata:" line at a clean exit, and their start-up phases in their
# "startup:" line; shardmix-sim reports metadata_bytes_per_node_max for the same nodes,
# trainers, samples, batch size and shard layout (sim.samples_per_shard). Prints both, the
# ratio (the target: within 10%), the start-up phases, and writes
# bench/results/metadata-latest.json.
#
#   bash bench/metadata.sh [--samples 10000000] [--metadata global|owner] [--out FILE.json]
# --metadata owner: both sides run owner-side metadata (decision 0063): the daemons with
# dataset.placement = spread and dataset.metadata = owner, the simulator with spread; each
# node then holds its own share's entries and O(P) tables. Default global (every node the
# whole catalog and placement); the result file is metadata-latest.json or
# metadata-owner-latest.json.
# The dataset is generated once under $SHARDMIX_BENCH_DIR (default /tmp/shardmix-bench;
# 10 M samples take ~0.7 GB and ~25 s) and reused. Memory: each daemon holds the global
# catalog and placement (~45 bytes a sample), the simulator once more.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

samples=10000000 per_shard=65536 median_kib=0.0625 sigma=0.3 nodes=4 batch=32 metadata=global out=
bench_parse_args samples metadata out -- "$@"
bench_check_positive_ints samples
case $metadata in
  global) placement=() ;;
  owner) placement=(dataset.placement=spread dataset.metadata=owner) ;;
  *) sm_die "--metadata must be global or owner, got '$metadata'" 2 ;;
esac
if [[ -z $out ]]; then
  out=$repo/bench/results/metadata-latest.json
  [[ $metadata == global ]] || out=$repo/bench/results/metadata-$metadata-latest.json
fi
bench_require_built server/shardmixd tools/shardmix-consume tools/shardmix-gen sim/shardmix-sim
bench_workdir metadata
data=$data_root/metadata-$samples-tfrecord
bench_dataset "$data" --samples "$samples" --classes 1000 --median-kib "$median_kib" --sigma "$sigma" \
  --format tfrecord --samples-per-shard "$per_shard"
sm_write_config "$work/c.toml" dataset.path="$data" dataset.format=tfrecord batch.size="$batch" \
  shuffle.exchange_fraction=1 fabric.provider=tcp log.level=info "${placement[@]}"
loadavg=$(bench_loadavg)
echo "== real job: $nodes daemons + $nodes trainers, $samples samples, one epoch (load average $loadavg)"
bench_launch_or_die "$work/t.txt" "$work/d.log" --nodes "$nodes" --config "$work/c.toml" -- \
  "$build/tools/shardmix-consume" --epochs 1 --touch none
echo "== simulator: the same job (dataset.metadata = $metadata)"
sim_placement=()
[[ $metadata == global ]] || sim_placement=(--set dataset.placement=spread)
"$build/sim/shardmix-sim" --nodes "$nodes" --trainers-per-node 1 --samples "$samples" --median-kib "$median_kib" \
  --epochs 1 --set "batch.size=$batch" --set shuffle.exchange_fraction=1 --set "sim.size_sigma=$sigma" \
  --set "sim.samples_per_shard=$per_shard" "${sim_placement[@]}" --json >"$work/sim.json"
PYTHONPATH=$bench_dir python3 - "$work/d.log" "$work/sim.json" "$out" "$samples" "$loadavg" "$metadata" <<'PY'
import json, sys, time
import costs_report as cr
log_text = open(sys.argv[1]).read()
metadata = cr.daemon_reports(log_text, "metadata")
startup = cr.daemon_reports(log_text, "startup")
sim = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
nodes = sim["nodes"]
if len(metadata) != nodes or len(startup) != nodes:
    sys.exit(f"metadata.sh: expected {nodes} metadata: and startup: lines, got {len(metadata)} and {len(startup)}")
real_max = max(m["metadata_bytes"] for m in metadata.values())
sim_max = sim["metadata_bytes_per_node_max"]
ratio = sim_max / real_max
within = abs(ratio - 1) <= 0.10
result = {
    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "loadavg": sys.argv[5], "samples": int(sys.argv[4]),
    "nodes": nodes, "metadata": sys.argv[6], "daemon_metadata": metadata, "daemon_startup": startup,
    "daemon_metadata_bytes_max": real_max, "sim_metadata_bytes_per_node_max": sim_max,
    "sim_breakdown": sim["metadata_bytes_breakdown"], "sim_exactly_once": sim["exactly_once"],
    "sim_startup_s": sim["startup_s"], "ratio_sim_over_daemons": ratio, "within_10_percent": within,
}
with open(sys.argv[3], "w") as f:
    json.dump(result, f, indent=1)
print(f"| what | daemons (max over {nodes}) | simulator | sim / daemons |")
print("|---|---:|---:|---:|")
worst = max(metadata.values(), key=lambda m: m["metadata_bytes"])
for key, sim_key in (("catalog_bytes", "catalog"), ("placement_bytes", "placement"), ("scheduler_bytes_max", "schedulers")):
    s = sim["metadata_bytes_breakdown"][sim_key]
    print(f"| {sim_key} | {worst[key]:,.0f} | {s:,.0f} | {s / worst[key]:.3f} |")
print(f"| **metadata per node** | {real_max:,.0f} | {sim_max:,.0f} | {ratio:.3f} ({'within' if within else 'NOT within'} 10%) |")
phases = [k for k in startup[0] if k not in ("rank", "t_begin", "t_end")]
print("\nstart-up per daemon (s): " + "; ".join(
    f"rank {r}: " + ", ".join(f"{k} {s[k]:.2f}" for k in phases) for r, s in sorted(startup.items())))
print(f"simulator exactly_once {sim['exactly_once']}, modelled start-up {sim['startup_modelled_s']:.2f} s "
      f"+ setup {sim['setup_wall_s']:.2f} s; wrote {sys.argv[3]}")
PY
