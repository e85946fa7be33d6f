#!/usr/bin/env bash
# Object storage (docs/s3.md). The local S3 server (deploy/s3-local.sh) behind a proxy that
# adds --delay-ms to every request (tests/e2e/s3_fault_proxy.py), as an object store's round
# trip does; a folder dataset of --samples objects uploaded with shardmix-gen. For each
# storage.s3.concurrency C in --concurrency, in the same run:
#   raw    the store's GET rate at C: shardmix-bench-s3-get GETs every object once, C in
#          flight, through the same client and nothing else (the bound);
#   load   ShardMix's initial load at C: 1 daemon whose cache holds the whole dataset; the
#          rate is the daemon's "loaded N samples ... in T s" (scan and start-up excluded);
#   cold   ShardMix's cold tier at C: 1 daemon and 1 trainer, cache.capacity = 1/20 of the
#          dataset, so 95% of an epoch's samples are cold reads; rate = the trainer's epoch;
# and PyTorch's DataLoader with boto3 (bench/s3_torch.py) for each worker count in
# --workers; its best is the baseline. Targets: load >= 0.8 x raw at the same C, and
# load >= 5 x the DataLoader's best.
#
#   bash bench/s3.sh [--quick] [--samples 1000] [--median-kib 16] [--delay-ms 20]
#                    [--concurrency "1 4 16 64"] [--workers "1 2 4 8 16"]
# --quick: 300 samples, concurrency "4 16", workers "4" (written to s3-quick.json).
# Writes bench/results/s3-latest.json and prints a Markdown table. Needs shardmixd,
# shardmix-consume, shardmix-gen and shardmix-bench-s3-get built, node and npm (the local
# server), python3-boto3 and torch for /usr/bin/python3. Env: SHARDMIX_BUILD_DIR,
# SHARDMIX_TORCH_PYTHON. Exit: 0 when every phase ran, 1 if one failed, 2 usage error.
set -euo pipefail
SM_PROG=s3.sh
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

samples=1000 median_kib=16 delay_ms=20 concurrency="1 4 16 64" workers="1 2 4 8 16" out=s3-latest
# shellcheck disable=SC2317  # called by bench_parse_args
quick_sizes() { samples=300 concurrency="4 16" workers=4 out=s3-quick; }
bench_parse_args quick:quick_sizes samples median-kib delay-ms concurrency workers -- "$@"
bench_check_positive_ints samples
bench_check_numbers median_kib delay_ms
bench_require_built server/shardmixd tools/shardmix-consume tools/shardmix-gen bench/shardmix-bench-s3-get
bench_require_torch
"$torch_python" -c 'import boto3' 2>/dev/null || sm_die "boto3 not found for $torch_python (python3-boto3)"

bench_workdir s3
# shellcheck disable=SC2317  # called by deploy/lib.sh's exit trap
sm_before_tmp_cleanup() { sm_s3_local_stop; }
sm_s3_local_start "$work/s3"
sm_s3_proxy_start "$work" --delay-ms "$delay_ms"
proxy=$SM_S3_PROXY_URL
url=s3://$SHARDMIX_S3_BUCKET/data
"$build/tools/shardmix-gen" --out "$url" --local-copy "$work/data" --samples "$samples" --classes 10 \
  --median-kib "$median_kib" --seed 1 --quiet >/dev/null
read -r dataset_bytes _ < <(bench_sample_bytes "$work/data")
sm_log "$samples objects, $dataset_bytes bytes at $url; $delay_ms ms added per request ($proxy)"

raw_lines=$work/raw.jsonl
: >"$raw_lines"
failed=0
# shardmix_run C CAPACITY LABEL: 1 daemon + 1 trainer (1 epoch) at concurrency C.
shardmix_run() {
  local c=$1 capacity=$2 label=$3 readahead=$((2 * $1 / 16 + 4))
  sm_write_config "$work/$label-$c.toml" dataset.path="$url" dataset.format=folder batch.size=16 \
    cache.capacity="$capacity" fabric.provider=tcp fabric.interface=lo service.trainers_per_node=1 \
    service.cold_readahead_batches="$readahead" service.staging_bytes_per_trainer=256MiB log.level=info \
    storage.s3.endpoint="$proxy" storage.s3.concurrency="$c"
  bench_launch "$work/$label-$c.out" "$work/$label-$c.log" --timeout 600 --nodes 1 \
    --config "$work/$label-$c.toml" --trainers-per-node 1 -- "$build/tools/shardmix-consume" --epochs 1
}
for c in $concurrency; do
  sm_log "concurrency $c: raw GETs"
  if "$build/bench/shardmix-bench-s3-get" --url "$url" --endpoint "$proxy" --concurrency "$c" >"$work/raw-$c.out"; then
    sed -n 's/^JSON {/{"phase":"raw",/p' "$work/raw-$c.out" >>"$raw_lines"
  else
    failed=1
  fi
  sm_log "concurrency $c: initial load"
  if shardmix_run "$c" 0 load; then
    sed -nE 's/.*\[rank 0\]\[daemon\] loaded ([0-9]+) samples, [0-9.]+ MB in ([0-9.]+) s.*/{"phase":"load","concurrency":'"$c"',"objects":\1,"seconds":\2}/p' \
      "$work/load-$c.log" | head -n 1 >>"$raw_lines"
  else
    failed=1
  fi
  sm_log "concurrency $c: cold tier"
  if shardmix_run "$c" $((dataset_bytes / 20)) cold; then
    sed -nE 's/^rank 0 epoch 0: ([0-9]+) samples in [0-9]+ batches, ([0-9.]+) s.*storage ([0-9]+);.*/{"phase":"cold","concurrency":'"$c"',"objects":\1,"seconds":\2,"storage":\3}/p' \
      "$work/cold-$c.out" >>"$raw_lines"
  else
    failed=1
  fi
done
for w in $workers; do
  sm_log "DataLoader + boto3, $w workers"
  if "$torch_python" "$bench_dir/s3_torch.py" --url "$url" --endpoint "$proxy" --workers "$w" >"$work/torch-$w.out"; then
    sed -n 's/^JSON {/{"phase":"torch",/p' "$work/torch-$w.out" >>"$raw_lines"
  else
    failed=1
  fi
done

BENCH_DIR=$bench_dir python3 - "$raw_lines" "$bench_dir/results/$out.json" "$samples" "$dataset_bytes" "$delay_ms" <<'PY'
import json, os, sys
sys.path.insert(0, os.environ.get("BENCH_DIR", "bench"))
from benchlib import machine, utc_now
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    r.setdefault("objects_per_s", round(r["objects"] / r["seconds"], 1))
best_torch = max((r for r in rows if r["phase"] == "torch"), key=lambda r: r["objects_per_s"], default=None)
table = []
for c in sorted({r["concurrency"] for r in rows if "concurrency" in r}):
    get = {p: next((r for r in rows if r["phase"] == p and r.get("concurrency") == c), None) for p in ("raw", "load", "cold")}
    rate = {p: (get[p]["objects_per_s"] if get[p] else None) for p in get}
    table.append({"concurrency": c, **{p + "_objects_per_s": rate[p] for p in rate},
                  "load_over_raw": round(rate["load"] / rate["raw"], 2) if rate["load"] and rate["raw"] else None,
                  "cold_over_raw": round(rate["cold"] / rate["raw"], 2) if rate["cold"] and rate["raw"] else None,
                  "load_over_torch_best": round(rate["load"] / best_torch["objects_per_s"], 1)
                  if rate["load"] and best_torch else None})
result = {"benchmark": "s3", "date": utc_now(), "machine": machine(), "samples": int(sys.argv[3]),
          "dataset_bytes": int(sys.argv[4]), "delay_ms": float(sys.argv[5]),
          "torch_best": best_torch, "table": table, "raw": rows}
with open(sys.argv[2], "w") as f:
    json.dump(result, f, indent=1)
print("| concurrency | raw GET/s | initial load/s | load / raw | cold tier/s | cold / raw | load / DataLoader best |")
print("|---|---|---|---|---|---|---|")
for t in table:
    print("| {concurrency} | {raw_objects_per_s} | {load_objects_per_s} | {load_over_raw} | {cold_objects_per_s} | "
          "{cold_over_raw} | {load_over_torch_best} |".format(**t))
if best_torch:
    print(f"\nDataLoader + boto3 best: {best_torch['objects_per_s']} objects/s with {best_torch['workers']} workers "
          f"(all: {', '.join(str(r['workers']) + ': ' + str(r['objects_per_s']) for r in rows if r['phase'] == 'torch')})")
print(f"\n{int(sys.argv[3])} objects, {int(sys.argv[4])} bytes, {sys.argv[5]} ms added per request; {machine()}; "
      f"written to {sys.argv[2]}")
PY
exit "$failed"
