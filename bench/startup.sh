#!/usr/bin/env bash
# Start-up benchmark: time from mpirun to every trainer's first batch for
# 16,384 and 1,000,000 small samples (folder layout, median 2 KiB, log-normal sigma 0.5),
# 4 daemons (tcp on lo) + 4 trainers, page cache dropped before every run. The phases are
# the daemons' own "startup:" log lines (server/startup_report.h); the launch before them
# and the trainers after them are measured here on the same monotonic clock. In the same
# run, with the page cache dropped too, the disk's own read rate of the same files: a
# parallel open + pread of every file (shardmix-bench-storage-read, 16 threads = 4 nodes x
# service.loader_threads). Target: 1M samples under 10 s plus the time to read the bytes.
#
#   bash bench/startup.sh [--quick] [--out FILE.json] [--repeat 3] [--sizes "16384 1000000"]
# --quick: one run per size. Datasets are generated once under $SHARDMIX_BENCH_DIR
# (default /tmp/shardmix-bench; the 1M one takes ~2.4 GB and ~2.5 minutes) and reused.
# Needs root for drop_caches (without it: a warning, and warm-cache figures).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

repeat=3 sizes="16384 1000000" median_kib=2 out=$repo/bench/results/startup-latest.json read_threads=16
bench_parse_args quick:repeat=1 out repeat sizes -- "$@"
bench_check_positive_ints repeat
for n in $sizes; do
  if ! sm_is_uint "$n" || ((10#$n == 0)); then sm_die "--sizes: '$n' is not a sample count" 2; fi
done
bench_require_built server/shardmixd tools/shardmix-consume tools/shardmix-gen bench/shardmix-bench-storage-read
drop_caches() {
  bench_drop_page_cache || sm_warn "cannot drop the page cache (not root?): figures are warm-cache"
}
monotonic() { python3 -c 'import time; print(f"{time.monotonic():.6f}")'; }
bench_workdir startup
raw=$work/raw.jsonl
: >"$raw"
mkdir -p "$data_root"

for n in $sizes; do
  data=$data_root/startup-$n-${median_kib}k
  list=$data_root/startup-$n-${median_kib}k.list
  if ! bench_dataset_cached "$data"; then
    avail_kb=$(df -Pk "$data_root" | awk 'NR==2 {print $4}')
    need_kb=$((n * (median_kib + 4) + 1048576))  # bytes + a block per file + 1 GB spare
    ((avail_kb > need_kb)) || sm_die "$n samples need ~$((need_kb / 1048576)) GB free in $data_root" 1
    rm -f -- "$list"
  fi
  bench_dataset "$data" --samples "$n" --classes 1000 --median-kib "$median_kib"
  if [[ ! -f $list ]]; then
    bench_sample_list "$data" "$list.tmp" && mv "$list.tmp" "$list"
  fi
  sm_write_config "$work/c.toml" dataset.path="$data" batch.size=32 shuffle.exchange_fraction=1 fabric.provider=tcp \
    log.level=info
  for ((r = 0; r < repeat; r++)); do
    echo "== disk read of the same files, $read_threads threads, page cache dropped ($n samples, run $((r + 1))/$repeat)"
    drop_caches
    "$build/bench/shardmix-bench-storage-read" --dir "$data" --list "$list" --threads "$read_threads" --seed "$r" --json \
      >"$work/read.txt"
    grep -v '^JSON ' "$work/read.txt" | tail -2
    PYTHONPATH=$bench_dir python3 - "$work/read.txt" "$n" "$read_threads" >>"$raw" <<'PY'
import json, sys
import benchlib
j = benchlib.json_lines(sys.argv[1])[-1]
mbps = j.get("mbps", j.get("MBps", j.get("bytes", 0) / j.get("seconds", 1) / 1e6))
print(json.dumps({"kind": "disk_read", "samples": int(sys.argv[2]), "threads": int(sys.argv[3]), "mbps": mbps, "raw": j}))
PY
    echo "== ShardMix start-up, $n samples, 4 daemons + 4 trainers, page cache dropped (run $((r + 1))/$repeat)"
    drop_caches
    loadavg=$(bench_loadavg)
    t0=$(monotonic)
    bench_launch_or_die "$work/s.txt" "$work/d.log" --nodes 4 --config "$work/c.toml" -- \
      "$build/tools/shardmix-consume" --first-batch-only --touch none
    PYTHONPATH=$bench_dir python3 - "$work/d.log" "$work/s.txt" "$t0" "$n" "$median_kib" "$loadavg" >>"$raw" <<'PY'
import json, re, sys
import benchlib
import costs_report as cr
log_text = open(sys.argv[1]).read()
startup = cr.daemon_reports(log_text, "startup")
memory = cr.daemon_reports(log_text, "memory")
firsts = benchlib.json_lines(sys.argv[2])
if len(startup) != 4 or len(firsts) != 4:
    sys.exit(f"startup.sh: expected 4 startup lines and 4 first batches, got {len(startup)} and {len(firsts)}")
m = re.search(r"catalog: (\d+) samples, \d+ classes, ([0-9.]+) MB", log_text)
total_bytes = float(m.group(2)) * 1e6
run = cr.startup_run(float(sys.argv[3]), startup, firsts, total_bytes)
run.update({"kind": "startup", "samples": int(sys.argv[4]), "bytes": total_bytes, "median_kib": int(sys.argv[5]),
            "loadavg": sys.argv[6], "daemon_phases": startup,
            "catalog_bytes_per_sample": memory[0]["catalog_bytes"] / memory[0]["samples"]})
print(json.dumps(run))
p = run["phases"]
print(f"total {run['total']:.2f} s: " + ", ".join(f"{k} {v:.2f}" for k, v in p.items()), file=sys.stderr)
PY
  done
done
PYTHONPATH=$bench_dir python3 "$bench_dir/costs_report.py" startup "$raw" "$out"
