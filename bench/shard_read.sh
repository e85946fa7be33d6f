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
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(dirname -- "$here")
# shellcheck source=deploy/lib.sh
source "$repo/deploy/lib.sh"

build=${SHARDMIX_BUILD_DIR:-$repo/build}
data_root=${SHARDMIX_BENCH_DIR:-/tmp/shardmix-bench}
command_line="bash bench/shard_read.sh${*:+ $*}"
format=webdataset dataset_samples=4096 per_shard=256 median_kib=112 samples=2048 threads=8
open_shards=64 repeat=3 latency_ms=2 open_latency_ms=1 bandwidth_mbps=0
value() {
  (($# >= 2)) || sm_die "$1 needs a value" 2
  printf '%s' "$2"
}
while (($#)); do
  case $1 in
    --format) format=$(value "$@"); shift 2 ;;
    --dataset-samples) dataset_samples=$(value "$@"); shift 2 ;;
    --samples-per-shard) per_shard=$(value "$@"); shift 2 ;;
    --median-kib) median_kib=$(value "$@"); shift 2 ;;
    --samples) samples=$(value "$@"); shift 2 ;;
    --threads) threads=$(value "$@"); shift 2 ;;
    --open-shards) open_shards=$(value "$@"); shift 2 ;;
    --repeat) repeat=$(value "$@"); shift 2 ;;
    --latency-ms) latency_ms=$(value "$@"); shift 2 ;;
    --open-latency-ms) open_latency_ms=$(value "$@"); shift 2 ;;
    --bandwidth-mbps) bandwidth_mbps=$(value "$@"); shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed -E 's/^# ?//'; exit 0 ;;
    *) sm_die "unknown option '$1' (see --help)" 2 ;;
  esac
done
[[ $format == webdataset || $format == tfrecord ]] || sm_die "--format must be webdataset or tfrecord" 2
for v in dataset_samples per_shard samples threads open_shards repeat; do
  sm_is_uint "${!v}" && ((${!v} > 0)) || sm_die "--${v//_/-} must be a positive integer" 2
done
for v in "$median_kib" "$latency_ms" "$open_latency_ms" "$bandwidth_mbps"; do
  [[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] || sm_die "'$v' is not a number" 2
done

slowfs=$build/bench/slowfs/shardmix-slowfs
bench=$build/bench/shardmix-bench-shard-read
[[ -x $slowfs ]] || sm_die "$slowfs missing: install libfuse3-dev (deploy/install-deps.sh), re-run cmake, build" 2
for tool in "$bench" "$build/tools/shardmix-gen"; do
  [[ -x $tool ]] || sm_die "$tool missing; build first (cmake --build $build)" 2
done
[[ -e /dev/fuse ]] || sm_die "/dev/fuse missing: FUSE is not available here" 2
command -v fusermount3 >/dev/null 2>&1 || sm_die "fusermount3 missing: install fuse3 (deploy/install-deps.sh)" 2

data=$data_root/shards-$format-$dataset_samples-$per_shard-${median_kib}k
if [[ ! -f $data/.complete ]]; then
  rm -rf -- "$data"
  mkdir -p -- "$data_root"
  "$build/tools/shardmix-gen" --out "$data" --format "$format" --samples "$dataset_samples" \
    --samples-per-shard "$per_shard" --median-kib "$median_kib" --classes 100 --seed 1 --quiet
  : >"$data/.complete"  # hidden: not a shard
fi

work=$(mktemp -d /tmp/smx-shard-read.XXXXXX)
mnt=$work/mnt
mkdir -p -- "$mnt"
slowfs_pid=""
cleanup() {
  set +e
  if [[ -n $slowfs_pid ]]; then
    if mountpoint -q -- "$mnt"; then
      fusermount3 -u -- "$mnt" 2>/dev/null || { sleep 1; fusermount3 -u -- "$mnt" 2>/dev/null; } ||
        fusermount3 -uz -- "$mnt" 2>/dev/null || sm_warn "could not unmount $mnt"
    fi
    local i
    for ((i = 0; i < 50; i++)); do kill -0 "$slowfs_pid" 2>/dev/null || break; sleep 0.1; done
    kill "$slowfs_pid" 2>/dev/null
    wait "$slowfs_pid" 2>/dev/null
    slowfs_pid=""
  fi
  rm -rf -- "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$slowfs" --latency-ms "$latency_ms" --open-latency-ms "$open_latency_ms" --bandwidth-mbps "$bandwidth_mbps" \
  --stats "$work/fs.json" "$data" "$mnt" -f -o max_threads=128 >"$work/slowfs.log" 2>&1 &
slowfs_pid=$!
for ((i = 0; i < 100; i++)); do
  mountpoint -q -- "$mnt" && break
  kill -0 "$slowfs_pid" 2>/dev/null || break
  sleep 0.05
done
mountpoint -q -- "$mnt" || { cat -- "$work/slowfs.log" >&2; sm_die "shardmix-slowfs did not mount $mnt" 1; }

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
sm_log "dataset $data ($format, $per_shard samples per shard) on slowfs: ${latency_ms} ms per read," \
  "${open_latency_ms} ms per open, bandwidth cap ${bandwidth_mbps} MB/s (0 = none); load $load_before"
status=0
"$bench" --dataset "$mnt" --format "$format" --samples "$samples" --threads "$threads" \
  --open-shards "$open_shards" --repeat "$repeat" --json >"$work/out.txt" || status=$?
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
grep -v '^JSON ' "$work/out.txt" || true
# Unmount first: slowfs writes its counts at unmount.
fusermount3 -u -- "$mnt" 2>/dev/null || true
for ((i = 0; i < 100; i++)); do kill -0 "$slowfs_pid" 2>/dev/null || break; sleep 0.05; done
wait "$slowfs_pid" 2>/dev/null || true
slowfs_pid=""
((status == 0)) || sm_die "shardmix-bench-shard-read failed (exit $status)" 1
fs_line=$(cat -- "$work/fs.json" 2>/dev/null || echo '{}')
sm_log "slowfs served: $fs_line; load before $load_before, after $load_after"

mkdir -p -- "$repo/bench/results"
# A non-default capacity gets its own file, so that it does not replace the default's figures.
suffix=""
((open_shards == 64)) || suffix=-open$open_shards
out=$repo/bench/results/shard-read-$format$suffix-latest.json
python3 - "$work/out.txt" "$fs_line" "$command_line" "$load_before" "$load_after" "$latency_ms" \
  "$open_latency_ms" "$bandwidth_mbps" >"$out" <<'EOF'
import json, sys, datetime
lines = [json.loads(l[5:]) for l in open(sys.argv[1]) if l.startswith("JSON ")]
print(json.dumps({
    "measured_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "command": sys.argv[3],
    "loadavg_before": sys.argv[4], "loadavg_after": sys.argv[5],
    "slowfs": {"latency_ms": float(sys.argv[6]), "open_latency_ms": float(sys.argv[7]),
               "bandwidth_mbps": float(sys.argv[8]), "served": json.loads(sys.argv[2])},
    "runs": [l for l in lines if l.get("kind") == "run"],
    "summary": next((l for l in lines if l.get("kind") == "summary"), None),
}, indent=1))
EOF
sm_log "wrote $out"
