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
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
build=${SHARDMIX_BUILD_DIR:-$repo/build}
data_root=${SHARDMIX_BENCH_DIR:-/tmp/shardmix-bench}
repeat=3 sizes="16384 1000000" median_kib=2 out=$repo/bench/results/startup-latest.json read_threads=16
while (($#)); do
  case $1 in
    --quick) repeat=1 ;;
    --out) out=$2; shift ;;
    --repeat) repeat=$2; shift ;;
    --sizes) sizes=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "startup.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
for tool in server/shardmixd tools/shardmix-consume tools/shardmix-gen bench/shardmix-bench-storage-read; do
  [[ -x $build/$tool ]] || { echo "startup.sh: $build/$tool missing; build first (cmake --build $build)" >&2; exit 2; }
done
drop_caches() {
  sync
  if ! echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then
    echo "startup.sh: cannot drop the page cache (not root?): figures are warm-cache" >&2
  fi
}
monotonic() { python3 -c 'import time; print(f"{time.monotonic():.6f}")'; }
work=$(mktemp -d /tmp/shardmix-startup.XXXXXX)
trap 'rm -rf "$work"' EXIT
raw=$work/raw.jsonl
: >"$raw"
mkdir -p "$data_root"

for n in $sizes; do
  data=$data_root/startup-$n-${median_kib}k
  list=$data_root/startup-$n-${median_kib}k.list
  if [[ ! -f $data/.complete ]]; then
    avail_kb=$(df -Pk "$data_root" | awk 'NR==2 {print $4}')
    need_kb=$((n * (median_kib + 4) + 1048576))  # bytes + a block per file + 1 GB spare
    ((avail_kb > need_kb)) || { echo "startup.sh: $n samples need ~$((need_kb / 1048576)) GB free in $data_root" >&2; exit 1; }
    rm -rf "$data" "$list"
    echo "== generating $n samples (median $median_kib KiB) in $data"
    "$build/tools/shardmix-gen" --out "$data" --samples "$n" --classes 1000 --median-kib "$median_kib" --seed 1 --force
    touch "$data/.complete"  # hidden: the scan skips it
  fi
  if [[ ! -f $list ]]; then
    (cd "$data" && find . -name '*.bin' -printf '%P\n') >"$list.tmp" && mv "$list.tmp" "$list"
  fi
  cat >"$work/c.toml" <<TOML
[dataset]
path = "$data"
[batch]
size = 32
[shuffle]
exchange_fraction = 1
[fabric]
provider = "tcp"
[log]
level = "info"
TOML
  for ((r = 0; r < repeat; r++)); do
    echo "== disk read of the same files, $read_threads threads, page cache dropped ($n samples, run $((r + 1))/$repeat)"
    drop_caches
    "$build/bench/shardmix-bench-storage-read" --dir "$data" --list "$list" --threads "$read_threads" --seed "$r" --json \
      >"$work/read.txt"
    grep -v '^JSON ' "$work/read.txt" | tail -2
    python3 - "$work/read.txt" "$n" "$read_threads" >>"$raw" <<'PY'
import json, sys
j = [json.loads(l[5:]) for l in open(sys.argv[1]) if l.startswith("JSON ")][-1]
mbps = j.get("mbps", j.get("MBps", j.get("bytes", 0) / j.get("seconds", 1) / 1e6))
print(json.dumps({"kind": "disk_read", "samples": int(sys.argv[2]), "threads": int(sys.argv[3]), "mbps": mbps, "raw": j}))
PY
    echo "== ShardMix start-up, $n samples, 4 daemons + 4 trainers, page cache dropped (run $((r + 1))/$repeat)"
    drop_caches
    loadavg=$(cut -d' ' -f1-3 /proc/loadavg)
    t0=$(monotonic)
    SHARDMIX_BUILD_DIR=$build bash "$repo/deploy/launch.sh" --nodes 4 --config "$work/c.toml" \
      --daemon-log "$work/d.log" -- "$build/tools/shardmix-consume" --first-batch-only --touch none \
      >"$work/s.txt" 2>&1 || { cat "$work/s.txt"; tail -20 "$work/d.log"; exit 1; }
    PYTHONPATH=$here python3 - "$work/d.log" "$work/s.txt" "$t0" "$n" "$median_kib" "$loadavg" >>"$raw" <<'PY'
import json, re, sys
import costs_report as cr
log_text = open(sys.argv[1]).read()
startup = cr.daemon_reports(log_text, "startup")
memory = cr.daemon_reports(log_text, "memory")
firsts = [json.loads(l[5:]) for l in open(sys.argv[2]) if l.startswith("JSON ")]
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
PYTHONPATH=$here python3 "$here/costs_report.py" startup "$raw" "$out"
