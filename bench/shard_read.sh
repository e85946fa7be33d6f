#!/usr/bin/env bash
# What the shard descriptor cache (service.open_shard_files, docs/decisions/0037) buys on a
# slow shared file system. Generates a tar-shard (or TFRecord) dataset with shardmix-gen,
# serves it through bench/slowfs with a per-read latency and a per-open latency (a parallel
# file system's data and metadata round trips), and runs shardmix-bench-shard-read on the
# mount: N random samples read through read_sample() by T threads, cache off (an open per
# sample, the behaviour before the cache) and on, alternating, in the same run.
#
#   flock /tmp/shardmix-bench.lock bash bench/shard_read.sh [--format webdataset|tfrecord]
#       [--dataset-samples 4096] [--samples-per-shard 256] [--median-kib 112] [--samples 2048]
#       [--threads 8] [--open-shards 64] [--repeat 3] [--latency-ms 2] [--open-latency-ms 1]
#       [--bandwidth-mbps 0]
#
# --bandwidth-mbps 0 (default) leaves slowfs uncapped, so that latency, not a shared
# bandwidth cap, bounds both sides (a cap would hide what the opens cost once both hit it).
# Prints the benchmark's table and the mount's own counts (opens and reads it served, a
# check of the benchmark's figures), writes bench/results/shard-read-FORMAT-latest.json
# (shard-read-FORMAT-openN-latest.json with --open-shards N other than 64).
# Needs shardmix-slowfs (libfuse3-dev at configure time), /dev/fuse and fusermount3 (fuse3);
# run as root. Env: SHARDMIX_BUILD_DIR (default build/), SHARDMIX_BENCH_DIR (dataset cache,
# default /tmp/shardmix-bench). Exit: 0 ok, 1 a phase failed, 2 usage error.
set -euo pipefail

SM_PROG=shard-read
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

command_line="bash bench/shard_read.sh${*:+ $*}"
format=webdataset dataset_samples=4096 samples_per_shard=256 median_kib=112 samples=2048 threads=8
open_shards=64 repeat=3 latency_ms=2 open_latency_ms=1 bandwidth_mbps=0
bench_parse_args format dataset-samples samples-per-shard median-kib samples threads open-shards repeat latency-ms \
  open-latency-ms bandwidth-mbps -- "$@"
[[ $format == webdataset || $format == tfrecord ]] || sm_die "--format must be webdataset or tfrecord" 2
bench_check_positive_ints dataset_samples samples_per_shard samples threads open_shards repeat
bench_check_numbers median_kib latency_ms open_latency_ms bandwidth_mbps

bench_require_slowfs
bench_require_built bench/shardmix-bench-shard-read tools/shardmix-gen

data=$data_root/shards-$format-$dataset_samples-$samples_per_shard-${median_kib}k
bench_dataset "$data" --format "$format" --samples "$dataset_samples" --samples-per-shard "$samples_per_shard" \
  --median-kib "$median_kib" --classes 100

bench_workdir shard-read
mnt=$work/mnt
mkdir -p -- "$mnt"
# shellcheck disable=SC2317  # called by deploy/lib.sh's exit trap
sm_before_tmp_cleanup() { bench_unmount_slowfs; }

bench_mount_slowfs "$data" "$mnt" "$work/slowfs.log" --latency-ms "$latency_ms" --open-latency-ms "$open_latency_ms" \
  --bandwidth-mbps "$bandwidth_mbps" --stats "$work/fs.json"

load_before=$(bench_loadavg)
sm_log "dataset $data ($format, $samples_per_shard samples per shard) on slowfs: ${latency_ms} ms per read," \
  "${open_latency_ms} ms per open, bandwidth cap ${bandwidth_mbps} MB/s (0 = none); load $load_before"
status=0
"$build/bench/shardmix-bench-shard-read" --dataset "$mnt" --format "$format" --samples "$samples" --threads "$threads" \
  --open-shards "$open_shards" --repeat "$repeat" --json >"$work/out.txt" || status=$?
load_after=$(bench_loadavg)
grep -v '^JSON ' "$work/out.txt" || true
# Unmount first: slowfs writes its counts at unmount.
bench_unmount_slowfs
((status == 0)) || sm_die "shardmix-bench-shard-read failed (exit $status)" 1
fs_line=$(cat -- "$work/fs.json" 2>/dev/null || echo '{}')
sm_log "slowfs served: $fs_line; load before $load_before, after $load_after"

mkdir -p -- "$repo/bench/results"
# A non-default capacity gets its own file, so that it does not replace the default's figures.
suffix=""
((open_shards == 64)) || suffix=-open$open_shards
out=$repo/bench/results/shard-read-$format$suffix-latest.json
PYTHONPATH=$bench_dir python3 - "$work/out.txt" "$fs_line" "$command_line" "$load_before" "$load_after" "$latency_ms" \
  "$open_latency_ms" "$bandwidth_mbps" >"$out" <<'EOF'
import json, sys
import benchlib
lines = benchlib.json_lines(sys.argv[1])
print(json.dumps({
    "measured_utc": benchlib.utc_now(),
    "command": sys.argv[3],
    "loadavg_before": sys.argv[4], "loadavg_after": sys.argv[5],
    "slowfs": {"latency_ms": float(sys.argv[6]), "open_latency_ms": float(sys.argv[7]),
               "bandwidth_mbps": float(sys.argv[8]), "served": json.loads(sys.argv[2])},
    "runs": [l for l in lines if l.get("kind") == "run"],
    "summary": next((l for l in lines if l.get("kind") == "summary"), None),
}, indent=1))
EOF
sm_log "wrote $out"
