#!/usr/bin/env bash
# Slow shared storage. A dataset twice the total cache capacity is served by a
# slow shared file system (bench/slowfs: FUSE, per-read latency + a bandwidth cap; see
# docs/decisions/0027), and in one run this script measures:
#   bound      the storage's own rate for the bytes that must come from it: N threads
#              (N = nodes x service.loader_threads, ShardMix's read parallelism) read a
#              random subset of the files as large as the cold bytes, in random order;
#              bound samples/s = samples per epoch / (cold bytes / that rate);
#   shardmix   4 daemons + 4 trainers (deploy/launch.sh, tcp), cache.capacity = half the
#              dataset over the nodes, dataset.path on the slow mount, --epochs epochs,
#              ordered (shuffle.window = 0) and opportunistic (--window);
#   torch      PyTorch's DataLoader over the same files on the same mount: 4 ranks, each a
#              DistributedSampler + DataLoader with W workers, for each W in --workers
#              (the best setting is the baseline);
# plus a check that the mount applies its latency and bandwidth cap (printed, not fatal).
# The page cache is dropped before every phase (root). An epoch's rate is all trainers'
# samples over the span from the first trainer's start to the last one's end; figures are
# medians over the middle epochs 1..E-2 of --repeat runs, with min-max: epoch 0 includes
# start-up, and the last can look faster than storage allows when read-ahead crossed into
# it (bench/storage_report.py), so both are reported apart.
# Ratios: ShardMix / bound (target >= 0.8) and ShardMix / DataLoader (target >= total /
# cold bytes).
#
#   bash bench/storage.sh [--quick] [--samples N] [--median-kib K] [--epochs E] [--repeat R]
#                         [--latency-ms 2] [--bandwidth-mbps 200] [--window 256]
#                         [--workers "2 4"] [--loader-threads 4] [--no-shardmix] [--no-torch]
#                         [--no-drop-caches] [--set SECTION.KEY=VALUE ...]
# --set: an extra shardmixd config override for the ShardMix runs (repeatable), e.g.
# --set service.cold_readahead_batches=16; the JSON records them.
# --quick: 2,048 samples, workers "2", 1 run (about a minute; written to storage-quick.json).
# Writes bench/results/storage-latest.json (bench/storage_report.py prints its tables
# again) and prints Markdown tables; a run with --no-shardmix, --no-torch or --set writes
# storage-partial.json instead, so that only a complete run replaces the figures. Needs shardmix-slowfs (libfuse3-dev at configure
# time), /dev/fuse, fusermount3 (fuse3) and torch for /usr/bin/python3 (python3-torch).
# Env: SHARDMIX_BUILD_DIR (default build/, Release), SHARDMIX_BENCH_DIR (dataset cache and
# the last run's raw lines, storage-last-raw.jsonl; default /tmp/shardmix-bench),
# SHARDMIX_TORCH_PYTHON (default /usr/bin/python3). Exit: 0 when every phase ran, 1 if
# one failed (the others are still reported), 2 usage error.
set -euo pipefail

SM_PROG=storage
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

command_line="bash bench/storage.sh${*:+ $*}"
samples=8192 median_kib=112 classes=1000 epochs=4 repeat=1 latency_ms=2 bandwidth_mbps=200
window=256 workers="2 4" loader_threads=4 nodes=4 batch=32 prefetch=8
run_shardmix=1 run_torch=1 drop=1 out=storage-latest
sets=()
quick_sizes() { samples=2048 workers=2 repeat=1 out=storage-quick; }
bench_parse_args quick:quick_sizes samples median-kib epochs repeat latency-ms bandwidth-mbps window workers \
  loader-threads no-shardmix:run_shardmix=0 no-torch:run_torch=0 no-drop-caches:drop=0 "set[]=sets" -- "$@"
bench_check_positive_ints samples repeat loader_threads
bench_check_uints epochs window
bench_check_numbers median_kib latency_ms bandwidth_mbps
if [[ $out == storage-latest ]] && ((!run_shardmix || !run_torch || ${#sets[@]})); then out=storage-partial; fi
((epochs >= 3)) || sm_die "--epochs must be at least 3 (the first and the last are not measured)" 2
for w in $workers; do sm_is_uint "$w" || sm_die "--workers: '$w' is not a worker count" 2; done

reader=$build/bench/shardmix-bench-storage-read
bench_require_slowfs
bench_require_built bench/shardmix-bench-storage-read tools/shardmix-gen
if ((run_shardmix)); then bench_require_built server/shardmixd tools/shardmix-consume; fi
if ((run_torch)); then bench_require_torch; fi
if ((drop)) && [[ ! -w /proc/sys/vm/drop_caches ]]; then
  sm_warn "cannot write /proc/sys/vm/drop_caches (not root?): the page cache is not dropped between phases"
  drop=0
fi

# ---------------------------------------------------------------- dataset
data=$data_root/storage-$samples-${median_kib}k
bench_dataset "$data" --samples "$samples" --classes "$classes" --median-kib "$median_kib"
bench_workdir storage
mnt=$work/mnt
mkdir -p -- "$mnt"
# shellcheck disable=SC2317  # called by deploy/lib.sh's exit trap
sm_before_tmp_cleanup() { bench_unmount_slowfs; }
trap 'exit 129' HUP

bench_sample_list "$data" "$work/files.txt"
read -r total_bytes nfiles < <(bench_sample_bytes "$data")
((nfiles == samples)) || sm_die "$data holds $nfiles sample files, expected $samples; remove it and re-run" 1
capacity=$((total_bytes / (2 * nodes)))  # per node: the nodes together cache half the dataset
cold_expected=$((total_bytes - nodes * capacity))
raw=$work/raw.jsonl
: >"$raw"
drop_caches() { if ((drop)); then bench_drop_page_cache; fi; }
# mount_slowfs PHASE: serves $data at $mnt through slowfs; its stats line goes to $work/fs-PHASE.json.
mount_slowfs() {
  rm -f -- "$work/fs-$1.json"
  bench_mount_slowfs "$data" "$mnt" "$work/slowfs.log" --latency-ms "$latency_ms" --bandwidth-mbps "$bandwidth_mbps" \
    --stats "$work/fs-$1.json"
}
# record PHASE: after unmount, the mount's stats as a raw line.
record_fs() {
  local phase=$1
  if [[ -s $work/fs-$phase.json ]]; then
    sed "s/^{/{\"kind\": \"slowfs\", \"phase\": \"$phase\", /" "$work/fs-$phase.json" >>"$raw"
  fi
}
failures=0
sm_log "dataset $data: $samples samples, $total_bytes bytes; cache.capacity $capacity bytes per node x $nodes;" \
  "cold bytes expected $cold_expected; slowfs ${latency_ms} ms per read, ${bandwidth_mbps} MB/s; load $(bench_loadavg)"

# ---------------------------------------------------------------- slowfs check
sm_section "slowfs check: latency (1 thread, 4 KiB reads) and bandwidth cap (16 threads, whole files)"
drop_caches
mount_slowfs check
"$reader" --dir "$mnt" --list "$work/files.txt" --threads 1 --read-bytes 4096 --bytes $((4096 * 200)) --seed 7 \
  --json >"$work/r.txt"
grep -v '^JSON ' "$work/r.txt"
bench_json_lines "\"kind\": \"check_latency\", \"load\": \"$(bench_loadavg)\"" <"$work/r.txt" >>"$raw"
"$reader" --dir "$mnt" --list "$work/files.txt" --threads 16 --bytes $((total_bytes / 4)) --seed 8 \
  --json >"$work/r.txt"
grep -v '^JSON ' "$work/r.txt"
bench_json_lines "\"kind\": \"check_bandwidth\", \"load\": \"$(bench_loadavg)\"" <"$work/r.txt" >>"$raw"
bench_unmount_slowfs
record_fs check

# ---------------------------------------------------------------- the runs
readers=$((nodes * loader_threads))
for ((r = 0; r < repeat; r++)); do
  sm_section "storage bound: $readers threads read $cold_expected cold bytes in random order (run $((r + 1))/$repeat, load $(bench_loadavg))"
  drop_caches
  mount_slowfs "bound-$r"
  load_before=$(bench_loadavg)
  if "$reader" --dir "$mnt" --list "$work/files.txt" --threads "$readers" --bytes "$cold_expected" \
      --seed $((100 + r)) --json >"$work/r.txt" 2>&1; then
    grep -v '^JSON ' "$work/r.txt"
    bench_json_lines "\"kind\": \"bound\", \"run\": $r, \"load\": \"$load_before\"" <"$work/r.txt" >>"$raw"
  else
    cat "$work/r.txt"; failures=$((failures + 1))
  fi
  bench_unmount_slowfs
  record_fs "bound-$r"

  if ((run_shardmix)); then
    for w in 0 "$window"; do
      mode=ordered; ((w > 0)) && mode=opportunistic
      sm_section "ShardMix, $mode (shuffle.window $w), $nodes daemons + $nodes trainers, tcp (run $((r + 1))/$repeat, load $(bench_loadavg))"
      sm_write_config "$work/c.toml" dataset.path="$mnt" batch.size="$batch" shuffle.seed=$((r + 1)) \
        shuffle.exchange_fraction=1.0 shuffle.window="$w" cache.capacity="$capacity" fabric.provider=tcp \
        fabric.interface=lo service.prefetch="$prefetch" service.loader_threads="$loader_threads" \
        telemetry.stats_file="$work/stats-$mode-$r.jsonl" log.level=info
      drop_caches
      mount_slowfs "shardmix-$mode-$r"
      load_before=$(bench_loadavg)
      rc=0
      FI_TCP_IFACE=lo bench_launch "$work/s.txt" "$work/d.log" --timeout 900 --nodes "$nodes" --config "$work/c.toml" \
        --trainers-per-node 1 "${sets[@]}" -- "$build/tools/shardmix-consume" --epochs "$epochs" --touch copy --json \
        || rc=$?
      bench_unmount_slowfs
      record_fs "shardmix-$mode-$r"
      grep -E '^rank [0-9]+ epoch' "$work/s.txt" || true
      if ((rc != 0)); then
        why=$(bench_failure_reason "$rc" "$work/d.log" "$work/s.txt")
        sm_warn "ShardMix $mode run $r failed (exit $rc): $why"
        printf '{"kind": "failed", "bench": "shardmix", "mode": "%s", "window": %d, "run": %d, "error": "%s"}\n' \
          "$mode" "$w" "$r" "$why" >>"$raw"
        failures=$((failures + 1))
        continue
      fi
      bench_json_lines "\"kind\": \"epoch\", \"bench\": \"shardmix\", \"mode\": \"$mode\", \"window\": $w, \"run\": $r, \"load\": \"$load_before\"" <"$work/s.txt" >>"$raw"
      # The daemons' own figures: each logs its cold samples and bytes at start (exact, the
      # resident set is static) and the bytes its storage readers read at exit.
      python3 - "$work/d.log" "$mode" "$r" >>"$raw" <<'PY'
import json, re, sys
text = open(sys.argv[1], errors="replace").read()
cold = [(int(a), int(b)) for a, b in re.findall(r"(\d+) cold samples \((\d+) bytes\) are read from storage", text)]
read = [(int(a), int(b)) for a, b in re.findall(r"storage: (\d+) cold reads, (\d+) bytes read from storage", text)]
print(json.dumps({"kind": "shardmix_cold", "mode": sys.argv[2], "run": int(sys.argv[3]), "daemons_reporting": len(cold),
                  "cold_samples": sum(a for a, _ in cold), "cold_bytes": sum(b for _, b in cold),
                  "storage_reads": sum(a for a, _ in read), "storage_read_bytes": sum(b for _, b in read),
                  "daemons_reporting_reads": len(read)}))
PY
      if [[ -s $work/stats-$mode-$r.jsonl ]]; then
        # The job record line ({"job": ...}) is not an epoch: left out.
        grep -v '^{"job"' "$work/stats-$mode-$r.jsonl" |
          sed "s/^{/{\"kind\": \"telemetry\", \"mode\": \"$mode\", \"run\": $r, /" >>"$raw"
      fi
    done
  fi

  if ((run_torch)); then
    for nw in $workers; do
      sm_section "PyTorch DataLoader, $nodes ranks x $nw workers, DistributedSampler (run $((r + 1))/$repeat, load $(bench_loadavg))"
      drop_caches
      mount_slowfs "torch-$nw-$r"
      load_before=$(bench_loadavg)
      rc=0
      timeout -s TERM -k 20 900 "$torch_python" "$bench_dir/storage_torch.py" --root "$mnt" --list "$work/files.txt" \
        --world "$nodes" --workers "$nw" --epochs "$epochs" --batch "$batch" --seed $((r + 1)) \
        >"$work/t.txt" 2>&1 || rc=$?
      bench_unmount_slowfs
      record_fs "torch-$nw-$r"
      if ((rc != 0)); then
        tail -n 20 "$work/t.txt" >&2
        why=$(grep -v '^JSON ' "$work/t.txt" | tail -n 1 | bench_json_escape)
        printf '{"kind": "failed", "bench": "torch", "workers": %d, "run": %d, "error": "%s"}\n' "$nw" "$r" "$why" >>"$raw"
        failures=$((failures + 1))
        continue
      fi
      bench_json_lines "\"kind\": \"epoch\", \"run\": $r, \"load\": \"$load_before\"" <"$work/t.txt" >>"$raw"
      PYTHONPATH=$bench_dir "$torch_python" - "$work/t.txt" <<'PY'
import sys
import benchlib
rows = benchlib.json_lines(sys.argv[1])
for e in sorted({r["epoch"] for r in rows}):
    rs = [r for r in rows if r["epoch"] == e]
    span = benchlib.epoch_span(rs)
    print(f"epoch {e}: {sum(r['samples'] for r in rs)} samples in {span:.2f} s, "
          f"{sum(r['samples'] for r in rs) / span:.0f} samples/s, {sum(r['bytes'] for r in rs) / span / 1e6:.0f} MB/s")
PY
    done
  fi
done

mkdir -p -- "$data_root" "$repo/bench/results"
cp -- "$raw" "$data_root/storage-last-raw.jsonl"
python3 "$bench_dir/storage_report.py" --raw "$raw" --out "$repo/bench/results/$out.json" \
  --meta "$(printf '{"command": "%s", "samples": %d, "median_kib": %s, "total_bytes": %d, "capacity_per_node": %d, "nodes": %d, "cold_bytes_expected": %d, "latency_ms": %s, "bandwidth_mbps": %s, "loader_threads": %d, "readers": %d, "epochs": %d, "repeat": %d, "batch": %d, "prefetch": %d, "window": %d, "load_end": "%s", "shardmix_sets": "%s", "date": "%s"}' \
    "$command_line" "$samples" "$median_kib" "$total_bytes" "$capacity" "$nodes" "$cold_expected" "$latency_ms" \
    "$bandwidth_mbps" "$loader_threads" "$readers" "$epochs" "$repeat" "$batch" "$prefetch" "$window" "$(bench_loadavg)" \
    "${sets[*]}" "$(date -u '+%Y-%m-%d %H:%M UTC')")"
((failures == 0)) || { sm_warn "$failures phase(s) failed; see above"; exit 1; }
