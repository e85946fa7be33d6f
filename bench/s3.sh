#!/usr/bin/env bash
# Object storage (docs/s3.md). The local S3 server (deploy/s3-local.sh) behind a proxy that
# adds --delay-ms to every request (tests/e2e/s3_fault_proxy.py), as an object store's round
# trip does, and verifies every request's SigV4 signature (the run fails if one is refused);
# the same --samples samples uploaded with shardmix-gen in each of --formats: folder (an
# object a sample) and webdataset (tar shards of --samples-per-shard). For each repeat, each
# format and each storage.s3.concurrency C in --concurrency, in the same run:
#   raw    the store's GET rate at C: shardmix-bench-s3-get GETs every object once, whole, C
#          in flight, through the same client and nothing else (the bound), as samples/s;
#   load   ShardMix's initial load at C: 1 daemon whose cache holds the whole dataset; the
#          rate is the daemon's "loaded N samples ... in T s" (scan and start-up excluded);
#   cold   ShardMix's cold tier at C: 1 daemon and 1 trainer, cache.capacity = 1/20 of the
#          dataset, so 95% of an epoch's samples are cold reads; rate = the trainer's epoch;
# and PyTorch's DataLoader with boto3 (bench/s3_torch.py: an object a sample for folder,
# whole shards streamed for webdataset) for each worker count in --workers; its best in the
# same repeat and format is the baseline. Targets, at every C and in every repeat:
# load >= 0.8 x raw, and load >= 5 x the DataLoader's best.
#
#   bash bench/s3.sh [--quick] [--samples 1000] [--median-kib 16] [--delay-ms 20]
#                    [--formats "folder webdataset"] [--samples-per-shard 32]
#                    [--concurrency "16 64"] [--workers "4 8 16 32"] [--repeat 3]
#                    [--daemon-set "KEY=VALUE ..."]
# --daemon-set: config keys for the daemons of every load and cold run, for before/after
# comparisons (storage.s3.merge_max=0: a GET per sample, as before merged GETs).
# --quick: 300 samples, concurrency 16, workers 4, one repeat (written to s3-quick.json).
# Writes bench/results/s3-latest.json and prints a Markdown table (min-max over repeats).
# Needs shardmixd, shardmix-consume, shardmix-gen and shardmix-bench-s3-get built, node and
# npm (the local server), python3-boto3 and torch for /usr/bin/python3. Env:
# SHARDMIX_BUILD_DIR, SHARDMIX_TORCH_PYTHON. Exit: 0 when every phase ran, 1 if one failed,
# 2 usage error.
set -euo pipefail
SM_PROG=s3.sh
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

samples=1000 median_kib=16 delay_ms=20 formats="folder webdataset" samples_per_shard=32
concurrency="16 64" workers="4 8 16 32" repeat=3 daemon_set="" out=s3-latest
# shellcheck disable=SC2317  # called by bench_parse_args
quick_sizes() { samples=300 concurrency=16 workers=4 repeat=1 out=s3-quick; }
bench_parse_args quick:quick_sizes samples median-kib delay-ms formats samples-per-shard concurrency workers \
  repeat daemon-set -- "$@"
bench_check_positive_ints samples samples_per_shard repeat
bench_check_numbers median_kib delay_ms
for f in $formats; do [[ $f == folder || $f == webdataset ]] || sm_die "--formats: '$f' is not folder or webdataset" 2; done
bench_require_built server/shardmixd tools/shardmix-consume tools/shardmix-gen bench/shardmix-bench-s3-get
bench_require_torch
"$torch_python" -c 'import boto3' 2>/dev/null || sm_die "boto3 not found for $torch_python (python3-boto3)"

bench_workdir s3
# shellcheck disable=SC2317  # called by deploy/lib.sh's exit trap
sm_before_tmp_cleanup() { sm_s3_local_stop; }
sm_s3_local_start "$work/s3"
sm_s3_proxy_start "$work" --delay-ms "$delay_ms" --stats "$work/proxy.json" \
  --verify-sigv4 "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY"
proxy=$SM_S3_PROXY_URL
declare -A dataset_bytes=()
for f in $formats; do
  gen_args=()
  [[ $f == folder ]] || gen_args=(--format "$f" --samples-per-shard "$samples_per_shard")
  "$build/tools/shardmix-gen" --out "s3://$SHARDMIX_S3_BUCKET/$f" --local-copy "$work/$f" --samples "$samples" \
    --classes 10 --median-kib "$median_kib" --seed 1 --quiet "${gen_args[@]}" >/dev/null
  dataset_bytes[$f]=$(find "$work/$f" -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%.0f", s }')
  sm_log "$f: $samples samples in $(find "$work/$f" -type f | wc -l) objects, ${dataset_bytes[$f]} bytes"
done
sm_log "$delay_ms ms added per request, signatures verified ($proxy)${daemon_set:+; daemons with $daemon_set}"
read -r -a daemon_keys <<<"$daemon_set"

raw_lines=$work/raw.jsonl
: >"$raw_lines"
failed=0
# row JSON_FIELDS: one result line, tagged with the repeat and the format.
row() { echo "{\"run\":$run,\"format\":\"$format\",$1}" >>"$raw_lines"; }
# shardmix_run C CAPACITY PHASE: 1 daemon + 1 trainer (1 epoch) at concurrency C.
shardmix_run() {
  local c=$1 capacity=$2 readahead=$((2 * $1 / 16 + 4)) name=$format-$3-$1-$run extra=()
  [[ $format == folder ]] || extra=(dataset.format="$format")
  sm_write_config "$work/$name.toml" dataset.path="s3://$SHARDMIX_S3_BUCKET/$format" batch.size=16 \
    cache.capacity="$capacity" fabric.provider=tcp fabric.interface=lo service.trainers_per_node=1 \
    service.cold_readahead_batches="$readahead" service.staging_bytes_per_trainer=256MiB log.level=info \
    storage.s3.endpoint="$proxy" storage.s3.concurrency="$c" "${extra[@]}" "${daemon_keys[@]}"
  bench_launch "$work/$name.out" "$work/$name.log" --timeout 600 --nodes 1 \
    --config "$work/$name.toml" --trainers-per-node 1 -- "$build/tools/shardmix-consume" --epochs 1
}
for ((run = 1; run <= repeat; run++)); do
  for format in $formats; do
    for c in $concurrency; do
      sm_log "run $run, $format, concurrency $c: raw GETs"
      if "$build/bench/shardmix-bench-s3-get" --url "s3://$SHARDMIX_S3_BUCKET/$format" --endpoint "$proxy" \
        --concurrency "$c" >"$work/raw.out"; then
        row "$(sed -n 's/^JSON {\(.*\)}$/"phase":"raw","samples":'"$samples"',\1/p' "$work/raw.out")"
      else
        failed=1
      fi
      sm_log "run $run, $format, concurrency $c: initial load"
      if shardmix_run "$c" 0 load; then
        row "$(sed -nE 's/.*\[rank 0\]\[daemon\] loaded ([0-9]+) samples, [0-9.]+ MB in ([0-9.]+) s.*/"phase":"load","concurrency":'"$c"',"samples":\1,"seconds":\2/p' \
          "$work/$format-load-$c-$run.log" | head -n 1)"
      else
        failed=1
      fi
      sm_log "run $run, $format, concurrency $c: cold tier"
      if shardmix_run "$c" $((dataset_bytes[$format] / 20)) cold; then
        row "$(sed -nE 's/^rank 0 epoch 0: ([0-9]+) samples in [0-9]+ batches, ([0-9.]+) s.*storage ([0-9]+);.*/"phase":"cold","concurrency":'"$c"',"samples":\1,"seconds":\2,"storage":\3/p' \
          "$work/$format-cold-$c-$run.out")"
      else
        failed=1
      fi
    done
    for w in $workers; do
      sm_log "run $run, $format: DataLoader + boto3, $w workers"
      if "$torch_python" -W ignore::UserWarning "$bench_dir/s3_torch.py" --url "s3://$SHARDMIX_S3_BUCKET/$format" \
        --format "$format" --endpoint "$proxy" --workers "$w" >"$work/torch.out"; then
        row "$(sed -n 's/^JSON {\(.*\)}$/"phase":"torch",\1/p' "$work/torch.out")"
      else
        failed=1
      fi
    done
  done
done
# Every request of the run was signed right: the proxy verified them and refused none.
python3 - "$work/proxy.json" <<'PY' || failed=1
import json, sys
c = json.load(open(sys.argv[1]))
bad = {k: c[k] for k in ("sigv4_mismatch", "sigv4_unknown_key", "sigv4_unsigned") if c[k]}
if c["sigv4_verified"] == 0 or bad:
    sys.exit("s3.sh: the proxy verified %d signatures and refused %s" % (c["sigv4_verified"], bad))
print("s3.sh: the proxy verified %d request signatures and refused none" % c["sigv4_verified"], file=sys.stderr)
PY

BENCH_DIR=$bench_dir python3 - "$raw_lines" "$bench_dir/results/$out.json" "$samples" "$delay_ms" "$samples_per_shard" <<'PY'
import json, os, sys
sys.path.insert(0, os.environ.get("BENCH_DIR", "bench"))
from benchlib import machine, utc_now
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:  # every rate over its whole span: samples delivered / seconds from first request to last byte
    r["samples_per_s"] = round(r["samples"] / r["seconds"], 1)
def rate(phase, run, fmt, c=None):
    return next((r["samples_per_s"] for r in rows if r["phase"] == phase and r["run"] == run and r["format"] == fmt
                 and r.get("concurrency") == c), None)
def ratio(a, b):
    return round(a / b, 2) if a and b else None
runs = sorted({r["run"] for r in rows})
per_run, table = [], []
for fmt in dict.fromkeys(r["format"] for r in rows):
    for run in runs:
        torch = [r for r in rows if r["phase"] == "torch" and r["run"] == run and r["format"] == fmt]
        best = max(torch, key=lambda r: r["samples_per_s"], default=None)
        for c in sorted({r["concurrency"] for r in rows if "concurrency" in r and r["format"] == fmt}):
            raw, load, cold = (rate(p, run, fmt, c) for p in ("raw", "load", "cold"))
            per_run.append({"run": run, "format": fmt, "concurrency": c, "raw": raw, "load": load, "cold": cold,
                            "load_over_raw": ratio(load, raw), "cold_over_raw": ratio(cold, raw),
                            "torch_best": best and best["samples_per_s"], "torch_best_workers": best and best["workers"],
                            "torch_all": {r["workers"]: r["samples_per_s"] for r in torch},
                            "load_over_torch_best": ratio(load, best and best["samples_per_s"])})
def spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return str(xs[0]) if len(xs) == 1 else "%s-%s" % (min(xs), max(xs))
def met(xs, bound):
    return "yes" if xs and all(x is not None and x >= bound for x in xs) else "no"
for fmt in dict.fromkeys(p["format"] for p in per_run):
    for c in dict.fromkeys(p["concurrency"] for p in per_run if p["format"] == fmt):
        sel = [p for p in per_run if p["format"] == fmt and p["concurrency"] == c]
        col = lambda k: [p[k] for p in sel]
        table.append({"format": fmt, "concurrency": c, **{k: spread(col(k)) for k in (
            "raw", "load", "load_over_raw", "cold", "cold_over_raw", "torch_best", "load_over_torch_best")},
            "torch_best_workers": sorted({w for w in col("torch_best_workers") if w}),
            "load_over_raw_met": met(col("load_over_raw"), 0.8), "load_over_torch_met": met(col("load_over_torch_best"), 5)})
result = {"benchmark": "s3", "date": utc_now(), "machine": machine(), "samples": int(sys.argv[3]),
          "delay_ms": float(sys.argv[4]), "samples_per_shard": int(sys.argv[5]), "repeats": len(runs),
          "per_run": per_run, "table": table, "raw": rows}
with open(sys.argv[2], "w") as f:
    json.dump(result, f, indent=1)
print("Samples per second, min-max over %d run(s); DataLoader best = its best worker count in the same run:\n" % len(runs))
print("| format | C | raw GET | initial load | load / raw | cold tier | cold / raw | DataLoader best (workers) "
      "| load / DataLoader best | >= 0.8 raw every run | >= 5x DataLoader every run |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for t in table:
    print("| {format} | {concurrency} | {raw} | {load} | {load_over_raw} | {cold} | {cold_over_raw} | {torch_best} ({w}) "
          "| {load_over_torch_best} | {load_over_raw_met} | {load_over_torch_met} |".format(
              w=", ".join(map(str, t["torch_best_workers"])), **t))
print("\nEach run (load / raw, load / DataLoader best): " + "; ".join(
    "%s C=%d run %d: %s, %s" % (p["format"], p["concurrency"], p["run"], p["load_over_raw"], p["load_over_torch_best"])
    for p in per_run))
print("DataLoader by workers: " + "; ".join("%s run %d: %s" % (p["format"], p["run"], p["torch_all"])
                                         for p in per_run if p["concurrency"] == per_run[0]["concurrency"]))
print(f"\n{int(sys.argv[3])} samples, {sys.argv[4]} ms added per request; {machine()}; written to {sys.argv[2]}")
PY
exit "$failed"
