#!/usr/bin/env bash
# The simulator and shardmix-whatif against real jobs on this machine, in one run:
#   1. bench/calibrate.sh -> a calibration file ([sim] keys) for this machine;
#   2. real jobs (deploy/launch.sh, provider tcp on lo, 1 trainer per daemon, batch 32,
#      trainers shardmix-consume --touch copy --compute-ms C, telemetry.stats_file):
#        q0     4 daemons, Q = 0, cache.capacity = the dataset / 4 + 5 % (everything resident)
#        q1     4 daemons, Q = 1, the same capacity                (whatif's input)
#        cold   4 daemons, Q = 1, dataset at twice the nodes' capacity (capacity = dataset / 8)
#        n2     2 daemons, Q = 1, q1's capacity per node
#        half   4 daemons, Q = 1, half q1's capacity
#   3. predictions: q0, q1, cold by shardmix-sim from the calibration alone (the job record of
#      each run gives the dataset and the config); n2 and half by shardmix-whatif from q1's
#      stats file (--nodes 2; --set cache.capacity=half);
#   4. a table: measured / predicted samples/s, ratio, within +-25 % (the criterion), with
#      stall and tier fractions side by side; bench/results/whatif-latest.json.
# Rates are samples over the span of epochs 1..E-1 (epoch 0 includes connection set-up),
# from the stats file, in both the jobs and the simulator. The trainers are not held in
# step: shardmix-consume runs without --lockstep here (each trainer paces itself with
# --compute-ms, as in bench/stall.sh), while the simulator models DDP lockstep.
#
#   bash bench/whatif_check.sh [--samples 16384] [--median-kib 16] [--epochs 5] [--compute-ms 16]
#                              [--out bench/results/whatif-latest.json]
# Env: SHARDMIX_BUILD_DIR (default build/), SHARDMIX_BENCH_DIR (dataset cache, default
# /tmp/shardmix-bench). Exit 0 when every comparison is within the bound, 1 when one is not
# or a run failed, 2 usage error.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

samples=16384 median_kib=16 epochs=5 compute_ms=16 batch=32 out=$repo/bench/results/whatif-latest.json
bench_parse_args samples median-kib epochs compute-ms out -- "$@"
bench_check_positive_ints samples epochs
bench_check_numbers median_kib compute_ms
bench_require_built server/shardmixd tools/shardmix-consume tools/shardmix-gen sim/shardmix-sim sim/shardmix-whatif
data=$(bench_sample_dataset "$samples" "$median_kib")
bench_workdir whatif
read -r total_bytes _ < <(bench_sample_bytes "$data")
cap_fit=$((total_bytes / 4 + total_bytes / 80))
cap_cold=$((total_bytes / 8))
cap_half=$((cap_fit / 2))
load_start=$(bench_loadavg)
echo "whatif_check: $data ($samples samples, $total_bytes bytes); capacities: fit $cap_fit, cold $cap_cold, half $cap_half; load $load_start"

echo "== calibration"
bash "$bench_dir/calibrate.sh" --dataset "$data" --out "$work/calibration.toml" --nodes 4 --provider tcp --batch "$batch" \
  --compute-ms "$compute_ms"

# run NAME NODES Q CAPACITY: one real job, its stats file at $work/stats-NAME.jsonl.
run() {
  local name=$1 nodes=$2 q=$3 capacity=$4
  sm_write_config "$work/$name.toml" dataset.path="$data" batch.size="$batch" shuffle.seed=1 shuffle.exchange_fraction="$q" \
    cache.capacity="$capacity" fabric.provider=tcp fabric.interface=lo service.prefetch=8 \
    telemetry.stats_file="$work/stats-$name.jsonl" log.level=warn
  echo "== job $name: $nodes daemons x 1 trainer, Q $q, cache.capacity $capacity (load $(bench_loadavg))"
  FI_TCP_IFACE=lo bench_launch_or_die "$work/s-$name.txt" "$work/d-$name.log" --timeout 300 --nodes "$nodes" \
    --trainers-per-node 1 --config "$work/$name.toml" -- \
    "$build/tools/shardmix-consume" --epochs "$epochs" --touch copy --compute-ms "$compute_ms" --json
  [[ -s $work/stats-$name.jsonl ]] || sm_die "job $name wrote no stats file ($work/stats-$name.jsonl)" 1
}
run q0 4 0 "$cap_fit"
run q1 4 1 "$cap_fit"
run cold 4 1 "$cap_cold"
run n2 2 1 "$cap_fit"
run half 4 1 "$cap_half"

echo "== predictions"
# shardmix-sim on a run's job record, with the calibration only (nothing fitted).
for name in q0 q1 cold; do
  mapfile -t args < <(python3 - "$work/stats-$name.jsonl" <<'PY'
import json, sys
job = json.loads(open(sys.argv[1]).readline())["job"]
print("--nodes"); print(job["nodes"]); print("--trainers-per-node"); print(job["trainers_per_node"])
print("--samples"); print(job["samples"]); print("--median-kib"); print(job["median_sample_bytes"] / 1024)
for k, v in list(job["config"].items()) + [("sim.size_sigma", job["ln_size_sigma"]), ("sim.classes", job["classes"])]:
    print("--set"); print(f"{k}={v}")
PY
  )
  "$build/sim/shardmix-sim" "${args[@]}" --epochs 3 --config "$work/calibration.toml" --json >"$work/p-$name.json"
done
"$build/sim/shardmix-whatif" "$work/stats-q1.jsonl" --calibration "$work/calibration.toml" --nodes 2
"$build/sim/shardmix-whatif" "$work/stats-q1.jsonl" --calibration "$work/calibration.toml" --nodes 2 --json >"$work/p-n2.json"
"$build/sim/shardmix-whatif" "$work/stats-q1.jsonl" --calibration "$work/calibration.toml" \
  --set "cache.capacity=$cap_half" --json >"$work/p-half.json"

python3 - "$work" "$out" "$load_start" "$compute_ms" "$epochs" <<'PY'
import json, sys, datetime, platform
work, out, load_start, compute_ms, epochs = sys.argv[1:6]

def measured(name):
    rows = [json.loads(l) for l in open(f"{work}/stats-{name}.jsonl") if l.strip()]
    job = rows[0]["job"]
    ep = [r for r in rows[1:] if r["complete"] and r["epoch"] >= 1]
    sec = sum(r["seconds"] for r in ep); n = sum(r["samples"] for r in ep)
    return job, {"samples_per_s": n / sec,
                 "stall_fraction": sum(r["stall_seconds"] for r in ep) / sum(r["seconds"] * r["trainers_reporting"] for r in ep),
                 "tier_local": sum(r["local_samples"] for r in ep) / n, "tier_peer": sum(r["peer_samples"] for r in ep) / n,
                 "tier_storage": sum(r["storage_samples"] for r in ep) / n, "epochs": len(ep),
                 "epoch_seconds": [round(r["seconds"], 3) for r in ep]}

def simulated(name):
    r = json.loads(open(f"{work}/p-{name}.json").read().splitlines()[-1])
    if "predicted" in r:  # shardmix-whatif
        return r["predicted"], "shardmix-whatif (from q1)", r["predicted_exactly_once"]
    ep = [e for e in r["epochs"] if e["epoch"] >= 1]
    sec = sum(e["sim_s"] for e in ep); n = sum(e["samples"] for e in ep)
    f = {"samples_per_s": n / sec, "stall_fraction": sum(e["stall_fraction"] * e["sim_s"] for e in ep) / sec}
    for t in ("tier_local", "tier_peer", "tier_storage"):
        f[t] = sum(e[t] * e["samples"] for e in ep) / n
    return f, "shardmix-sim (calibration)", r["exactly_once"]

labels = {"q0": "4 x 1, Q=0", "q1": "4 x 1, Q=1", "cold": "4 x 1, Q=1, dataset 2x capacity",
          "n2": "2 x 1, Q=1 (whatif 4->2 nodes)", "half": "4 x 1, Q=1, half capacity (whatif)"}
rows = []
for name in ("q0", "q1", "cold", "n2", "half"):
    job, m = measured(name)
    p, by, exact = simulated(name)
    ratio = p["samples_per_s"] / m["samples_per_s"]
    rows.append({"run": name, "label": labels[name], "predicted_by": by, "measured": m, "predicted": p,
                 "ratio": ratio, "within_25pct": abs(ratio - 1) <= 0.25, "exactly_once": exact,
                 "cache_capacity": int(job["config"]["cache.capacity"]), "nodes": job["nodes"]})
cal = open(f"{work}/calibration.toml").read()
print("\n| run | predicted by | measured samples/s | predicted samples/s | ratio | within +-25% | stall m/p | local m/p | peer m/p | storage m/p |")
print("| --- | --- | ---: | ---: | ---: | --- | --- | --- | --- | --- |")
for r in rows:
    m, p = r["measured"], r["predicted"]
    print(f"| {r['label']} | {r['predicted_by']} | {m['samples_per_s']:.0f} | {p['samples_per_s']:.0f} | {r['ratio']:.2f} | "
          f"{'yes' if r['within_25pct'] else 'NO'} | {m['stall_fraction']:.3f}/{p['stall_fraction']:.3f} | "
          f"{m['tier_local']:.3f}/{p['tier_local']:.3f} | {m['tier_peer']:.3f}/{p['tier_peer']:.3f} | "
          f"{m['tier_storage']:.3f}/{p['tier_storage']:.3f} |")
load_end = " ".join(open("/proc/loadavg").read().split()[:3])
res = {"bench": "whatif_check", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "host": platform.node(), "load_start": load_start, "load_end": load_end, "compute_ms": float(compute_ms),
       "epochs": int(epochs), "calibration": cal, "rows": rows,
       "all_within_25pct": all(r["within_25pct"] for r in rows)}
json.dump(res, open(out, "w"), indent=1)
print(f"\nload {load_start} -> {load_end}; all within +-25%: {res['all_within_25pct']}; wrote {out}")
sys.exit(0 if res["all_within_25pct"] else 1)
PY
