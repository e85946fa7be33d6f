#!/usr/bin/env bash
# The benchmark suite, in one run on one machine (docs/decisions/0028):
#   1. delivered throughput, 16,384 samples (median 112 KiB): ShardMix (1, 2, 4 daemons with
#      one trainer each; tcp and shm; shuffle.exchange_fraction 0 and 1) against the PyTorch
#      DataLoader (bench/torch_loader.py: num_workers 0/1/2 x default/concat collate, 1/2/4
#      ranks), a multi-threaded POSIX reader (shardmix-bench-posix-reader), each with the page
#      cache dropped before every epoch and warm, and the limits: single-thread memcpy,
#      raw fi_read on the same provider, P processes reading in place from their own memory;
#   2. small (4 KiB) and large (1 MiB) samples, 4 daemons: per-sample cost vs bandwidth;
#   3. bench/stall.sh, cost.sh, startup.sh when they exist (bench/README.md).
# Writes bench/results/latest.json, latest.md, latest-raw.jsonl and latest-*.png
# (bench/suite_report.py); --quick writes them to bench/results/quick/ instead.
#
#   bash bench/run.sh [--quick] [--out-dir DIR] [--reuse-parts]   # root (drop_caches); 17 min here (quick: 3)
# --reuse-parts: do not run stall.sh, cost.sh, startup.sh; merge their last full results
# (bench/results/<part>-latest.json) instead, e.g. to re-measure the throughput comparison
# alone. The report says which parts were reused.
# Env: SHARDMIX_BUILD_DIR (default build/, Release), SHARDMIX_BENCH_DIR (datasets, default
# /tmp/shardmix-bench), SHARDMIX_TORCH_PYTHON (default /usr/bin/python3).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

out_dir=""
quick=0
reuse_parts=0
command_line="bash bench/run.sh $*"
bench_parse_args quick:quick=1 out-dir reuse-parts:reuse_parts=1 -- "$@"
# A quick run must not replace the full run's figures docs/performance.md quotes.
[[ -n $out_dir ]] || { if ((quick)); then out_dir=$repo/bench/results/quick; else out_dir=$repo/bench/results; fi; }
bench_require_built server/shardmixd tools/shardmix-consume tools/shardmix-gen bench/shardmix-bench-memcpy \
  bench/shardmix-bench-fabric-read bench/shardmix-bench-posix-reader bench/shardmix-bench-inplace
bench_require_root "the cold-cache runs drop the page cache (/proc/sys/vm/drop_caches)"
bench_require_torch

# Sizes. Full: comparison 1 at the issue's 16,384 samples, 4 epochs per run (epoch 0 is the
# warm-up, 1..3 are measured); ShardMix and the limits it is held against are measured
# REPEAT times, interleaved (limits, then ShardMix, again), so that a ratio does not hinge
# on the load of one moment. Quick: a quarter of the samples, 1 and 4 nodes, 3 epochs
# (2 measured), one repetition.
if ((quick)); then
  samples=4096 epochs=3 repeat=1 nodes_list="1 4" providers="tcp shm" fi_seconds=1 passes=3
  small_samples=16384 large_samples=512 torch_configs_small="0:default 0:concat"
else
  samples=16384 epochs=4 repeat=3 nodes_list="1 2 4" providers="tcp shm" fi_seconds=3 passes=5
  small_samples=65536 large_samples=2048 torch_configs_small="0:default 0:concat 2:concat"
fi
torch_configs="0:default 0:concat 1:default 1:concat 2:default 2:concat"
posix_threads="4 16"
drop_cmd='sync; echo 3 > /proc/sys/vm/drop_caches'

# Same name and content as bench/delivery.sh's dataset, so the two share it.
mixed=$(bench_sample_dataset "$samples" 112)
small=$(bench_sample_dataset "$small_samples" 4 fixed)
large=$(bench_sample_dataset "$large_samples" 1024 fixed)

bench_workdir suite
raw=$work/raw.jsonl
: >"$raw"
# keep PREFIX < FILE: the 'JSON {...}' lines of FILE, each with PREFIX's fields added.
# The load average when the lines are kept goes with them (the machine is shared).
rep=0  # the repetition the kept lines belong to
keep() { bench_json_lines "\"loadavg\": \"$(bench_loadavg)\", \"rep\": $rep, $1" >>"$raw"; }
log() { echo "== [$(date -u +%H:%M:%S), load $(bench_loadavg)] $*"; }
# What was measured and when, taken now: the report is written after the run's own output
# files have changed the tree.
run_commit=$(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
[[ -z $(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null) ]] || run_commit+=" (uncommitted changes)"
echo "{\"phase_loadavg\": \"$(bench_loadavg)\", \"phase\": \"start\", \"utc\": \"$(date -u '+%Y-%m-%d %H:%M UTC')\", \"commit\": \"$run_commit\"}" >>"$raw"

# limits DATASET TAG COUNT SIZES_ARGS: memcpy (1 thread), in-place reading with P processes,
# raw fi_read with P ranks on each provider, each rank exposing COUNT chunks of SIZES_ARGS
# (about 256 MB per rank: enough to defeat the CPU caches, small enough to register fast).
limits() {
  local data=$1 tag=$2 count=$3; shift 3
  log "$tag: memcpy, 1 thread"
  "$build/bench/shardmix-bench-memcpy" --dataset "$data" --passes "$passes" --threads 1 | keep "\"dataset\": \"$tag\""
  for p in $nodes_list; do
    log "$tag: in-place copy, $p process(es)"
    "$build/bench/shardmix-bench-inplace" --dataset "$data" --processes "$p" --passes "$passes" \
      | keep "\"dataset\": \"$tag\""
  done
  for provider in $providers; do
    for p in $nodes_list; do
      ((p >= 2)) || continue
      log "$tag: raw fi_read, $provider, $p ranks, qd 8"
      bench_fabric_read "$p" "$provider" "$@" --count "$count" --seconds "$fi_seconds" --seed 1 \
        >"$work/f.txt" 2>&1 || { cat "$work/f.txt"; exit 1; }
      keep "\"dataset\": \"$tag\", \"provider_run\": \"$provider\"" <"$work/f.txt"
    done
  done
}

# posix DATASET TAG: the POSIX reader, every thread count, dropped and warm.
posix() {
  local data=$1 tag=$2 threads cache flag
  for threads in $posix_threads; do
    for cache in dropped warm; do
      flag=(); [[ $cache == dropped ]] && flag=(--drop-caches)
      log "$tag: POSIX reader, $threads threads, page cache $cache"
      "$build/bench/shardmix-bench-posix-reader" --dataset "$data" --threads "$threads" --epochs "$epochs" "${flag[@]}" \
        | keep "\"dataset\": \"$tag\""
    done
  done
}

# torch DATASET TAG WORLD CONFIGS CACHE...: the DataLoader ranks.
torch_runs() {
  local data=$1 tag=$2 world=$3 configs=$4 cache flag; shift 4
  for cache in "$@"; do
    flag=(); [[ $cache == dropped ]] && flag=(--drop-caches)
    log "$tag: DataLoader, $world rank(s), configs '$configs', page cache $cache"
    "$torch_python" "$bench_dir/torch_loader.py" --root "$data" --world "$world" --configs "$configs" \
      --epochs "$epochs" "${flag[@]}" | keep "\"dataset\": \"$tag\""
  done
}

# shardmix DATASET TAG PROVIDER NODES Q TOUCH CACHE: one launch, NODES daemons + NODES
# trainers, EPOCHS epochs. CACHE=dropped: every trainer drops the page cache after each
# epoch (shardmix-consume --between-epochs), while the daemons keep running.
shardmix() {
  local data=$1 tag=$2 provider=$3 nodes=$4 q=$5 touch=$6 cache=$7 hook=()
  [[ $cache == dropped ]] && hook=(--between-epochs "$drop_cmd")
  log "$tag: ShardMix, $provider, $nodes daemon(s) + $nodes trainer(s), Q=$q, touch $touch, page cache $cache"
  sm_write_config "$work/c.toml" dataset.path="$data" batch.size=32 shuffle.seed=$((rep + 1)) shuffle.exchange_fraction="$q" \
    fabric.provider="$provider" service.prefetch=8 log.level=warn
  FI_TCP_IFACE=lo bench_launch_or_die "$work/s.txt" "$work/d.log" --nodes "$nodes" --config "$work/c.toml" -- \
    "$build/tools/shardmix-consume" --epochs "$epochs" --touch "$touch" --json "${hook[@]}"
  keep "\"bench\": \"shardmix\", \"dataset\": \"$tag\", \"provider\": \"$provider\", \"nodes\": $nodes, \"q\": $q, \"touch\": \"$touch\", \"cache\": \"$cache\"" <"$work/s.txt"
}

# ---- comparison 1: delivered throughput, mixed sizes
posix "$mixed" mixed
for n in $nodes_list; do
  torch_runs "$mixed" mixed "$n" "$torch_configs" dropped warm
done
for ((rep = 0; rep < repeat; rep++)); do
  log "repetition $((rep + 1))/$repeat of the limits and ShardMix"
  limits "$mixed" mixed 2048 --median-kib 112 --lognormal-sigma 0.5
  for provider in $providers; do
    for n in $nodes_list; do
      # Q=0: local delivery (trainers copy each sample out, as memcpy and in-place do). Q=1:
      # global shuffle, copying trainers, and views only (delivery alone, as raw fi_read).
      # With one node Q has nothing to exchange: Q=0 only.
      shardmix "$mixed" mixed "$provider" "$n" 0 copy warm
      shardmix "$mixed" mixed "$provider" "$n" 0 copy dropped
      if ((n > 1)); then
        shardmix "$mixed" mixed "$provider" "$n" 1 copy warm
        shardmix "$mixed" mixed "$provider" "$n" 1 copy dropped
        shardmix "$mixed" mixed "$provider" "$n" 1 none warm
      fi
    done
  done
done
rep=0

# ---- comparison 3: small and large samples, 4 daemons (the largest node count), warm
big_n=${nodes_list##* }
for spec in "small 4" "large 1024"; do
  read -r tag kib <<<"$spec"
  data=$small; [[ $tag == large ]] && data=$large
  # The limits at the largest node count only (limits reads nodes_list).
  limits_nodes=$nodes_list; nodes_list=$big_n
  count=2048; [[ $tag == large ]] && count=256
  limits "$data" "$tag" "$count" --sizes-kib "$kib"
  # The POSIX reader's larger thread count only: the per-file cost is what this shows.
  log "$tag: POSIX reader, ${posix_threads##* } threads, page cache warm"
  "$build/bench/shardmix-bench-posix-reader" --dataset "$data" --threads "${posix_threads##* }" --epochs "$epochs" \
    | keep "\"dataset\": \"$tag\""
  torch_runs "$data" "$tag" "$big_n" "$torch_configs_small" warm
  for provider in $providers; do
    shardmix "$data" "$tag" "$provider" "$big_n" 0 copy warm
    shardmix "$data" "$tag" "$provider" "$big_n" 1 copy warm
  done
  nodes_list=$limits_nodes
done

# ---- the stall, cost and start-up parts, when present on this branch
parts=()
for part in stall cost startup; do
  if ((reuse_parts)); then
    saved=$repo/bench/results/$part-latest.json
    if [[ -f $saved ]]; then
      log "bench/$part.sh not run: merging its last results, $saved"
      parts+=(--part "$part=$saved" --reused "$part")
    else
      sm_warn "--reuse-parts but $saved does not exist; its section is left out"
      parts+=(--part-absent "$part")
    fi
  elif [[ -f $bench_dir/$part.sh ]]; then
    log "bench/$part.sh"
    q=(); ((quick)) && q=(--quick)
    if bash "$bench_dir/$part.sh" "${q[@]}" --out "$work/$part.json"; then
      parts+=(--part "$part=$work/$part.json")
    else
      sm_warn "bench/$part.sh failed; its section is left out"
      parts+=(--part-failed "$part")
    fi
  else
    log "bench/$part.sh absent: skipped"
    parts+=(--part-absent "$part")
  fi
done

echo "{\"phase_loadavg\": \"$(bench_loadavg)\", \"phase\": \"end\"}" >>"$raw"
mkdir -p "$out_dir"
cp "$raw" "$out_dir/latest-raw.jsonl"
/usr/bin/python3 "$bench_dir/suite_report.py" --raw "$raw" --out-dir "$out_dir" --command "$command_line" \
  --quick "$quick" --samples "$samples" --small-samples "$small_samples" --large-samples "$large_samples" \
  --epochs "$epochs" --repeat "$repeat" --repo "$repo" "${parts[@]}"
