#!/usr/bin/env bash
# shellcheck disable=SC2317  # (whole file) functions run from traps
# The main job, start to finish on one machine:
#   1. install the Debian packages (deploy/install-deps.sh)
#   2. configure and build into build/ (Ninja, Release)
#   3. generate the demo dataset once (4,096 samples, 100 classes, median 112 KiB)
#   4. run 4 shardmixd daemons + their trainers (shardmix-consume, 2 epochs, traced)
#   5. check the traces: every sample exactly once per epoch, bytes verified on disk
# Idempotent: a second run rebuilds incrementally and reuses the dataset.
#
# Environment:
#   SHARDMIX_DEMO_DIR        where the dataset, traces and logs go (default /tmp/shardmix-demo)
#   SHARDMIX_DEMO_SAMPLES    dataset size (default 4096)
#   SHARDMIX_DEMO_TRAINERS_PER_NODE  trainer ranks per node (default 1)
#   SHARDMIX_DEMO_PROVIDER   fabric provider override, e.g. shm (default: the config's, tcp)
#   SHARDMIX_DEMO_EPOCHS     epochs to run (default 2)
#   SHARDMIX_DEMO_FORMAT     folder (default), webdataset (tar shards) or tfrecord: the same
#                            samples packed into shards of 256 (docs/decisions/0018)
#   SHARDMIX_DEMO_SKIP_DEPS=1  skip step 1 (no root needed then)
#   SHARDMIX_DEMO_VERBOSE=1  show the configure and build output instead of logging it
#   SHARDMIX_BUILD_DIR       build dir (default <repo>/build)
set -euo pipefail

SM_PROG=demo
# shellcheck source=deploy/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '3,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi

demo_dir=${SHARDMIX_DEMO_DIR:-/tmp/shardmix-demo}
samples=${SHARDMIX_DEMO_SAMPLES:-4096}
classes=100
median_kib=112
data_seed=20240611
nodes=4
per_node=${SHARDMIX_DEMO_TRAINERS_PER_NODE:-1}
epochs=${SHARDMIX_DEMO_EPOCHS:-2}
format=${SHARDMIX_DEMO_FORMAT:-folder}
case $format in
  folder | webdataset | tfrecord) ;;
  *) sm_die "SHARDMIX_DEMO_FORMAT must be folder, webdataset or tfrecord, got '$format'" ;;
esac
batch=32
config=$SM_REPO/deploy/configs/demo.toml
build_dir=$(sm_build_dir)
logs=$demo_dir/logs
data=$demo_dir/data
trace=$demo_dir/trace
verbose=${SHARDMIX_DEMO_VERBOSE:-0}

if ! sm_is_uint "$samples" || ((10#$samples == 0)); then
  sm_die "SHARDMIX_DEMO_SAMPLES must be a positive integer, got '$samples'"
fi
if ! sm_is_uint "$epochs" || ((10#$epochs == 0)); then
  sm_die "SHARDMIX_DEMO_EPOCHS must be a positive integer, got '$epochs'"
fi
if ! sm_is_uint "$per_node" || ((10#$per_node == 0)); then
  sm_die "SHARDMIX_DEMO_TRAINERS_PER_NODE must be a positive integer, got '$per_node'"
fi
trainers=$((nodes * per_node))
mkdir -p -- "$logs"

# Runs "$@" with its output in log file $1 (shown when it fails, or always if verbose).
logged() {
  local log=$1
  shift
  if [[ $verbose == 1 ]]; then
    "$@" 2>&1 | tee "$log"
    return "${PIPESTATUS[0]}"
  fi
  if ! "$@" >"$log" 2>&1; then
    sm_log "failed: $*"
    tail -n 40 -- "$log" | sed 's/^/  | /' >&2
    sm_log "full log: $log"
    return 1
  fi
}

# ---------------------------------------------------------------- 1. dependencies
sm_section "1/5 dependencies"
if [[ ${SHARDMIX_DEMO_SKIP_DEPS:-0} == 1 ]]; then
  echo "skipped (SHARDMIX_DEMO_SKIP_DEPS=1)"
else
  bash "$SM_REPO/deploy/install-deps.sh"
fi

# ---------------------------------------------------------------- 2. build
sm_section "2/5 build (Release, $build_dir)"
t0=$SECONDS
# The same compiler launcher as deploy/test.sh's release stage, so that neither rebuilds
# the other's build dir.
sm_use_ccache
if [[ -f $build_dir/CMakeCache.txt ]]; then
  # Reconfigure with the generator the build dir already has.
  logged "$logs/configure.log" cmake -S "$SM_REPO" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "${SM_CMAKE_CACHE_ARGS[@]}"
else
  logged "$logs/configure.log" cmake -S "$SM_REPO" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    "${SM_CMAKE_CACHE_ARGS[@]}"
fi
logged "$logs/build.log" cmake --build "$build_dir" -j 2
for exe in shardmixd shardmix-consume shardmix-gen; do
  sm_find_exe "$exe" >/dev/null || sm_die "the build did not produce $exe (see $logs/build.log)"
done
gen=$(sm_find_exe shardmix-gen)
consume=$(sm_find_exe shardmix-consume)
echo "built in $((SECONDS - t0)) s: $(sm_find_exe shardmixd), $consume, $gen"

# ---------------------------------------------------------------- 3. dataset
sm_section "3/5 dataset ($data)"
stamp="samples=$samples classes=$classes median_kib=$median_kib seed=$data_seed format=$format"
if [[ -d $data && -f $demo_dir/data.stamp && $(<"$demo_dir/data.stamp") == "$stamp" ]]; then
  echo "reusing $samples samples ($(du -sh -- "$data" | cut -f1)); delete $demo_dir/data.stamp to regenerate"
else
  rm -rf -- "$data" "$data.partial" "$demo_dir/data.stamp"
  t0=$SECONDS
  "$gen" --out "$data.partial" --samples "$samples" --classes "$classes" \
    --median-kib "$median_kib" --seed "$data_seed" --quiet --format "$format" --samples-per-shard 256
  mv -- "$data.partial" "$data"
  printf '%s\n' "$stamp" >"$demo_dir/data.stamp"
  echo "generated $samples samples in $classes classes ($(du -sh -- "$data" | cut -f1)) in $((SECONDS - t0)) s"
fi

# ---------------------------------------------------------------- 4. run
# Rank 0 writes one JSON line per epoch of the whole job (telemetry.stats_file).
stats=$logs/stats.jsonl
rm -f -- "$stats"
sets=(--set "dataset.path=$data" --set "batch.size=$batch" --set "batch.drop_last=false"
      --set "telemetry.stats_file=$stats" --set "dataset.format=$format")
check_format=(--format "$format")
if [[ $format == tfrecord ]]; then
  sets+=(--set "dataset.label_feature=label")  # shardmix-gen's Examples carry it
  check_format+=(--label-feature label)
fi
provider_note="provider from $(basename -- "$config")"
if [[ -n ${SHARDMIX_DEMO_PROVIDER:-} ]]; then
  sets+=(--set "fabric.provider=$SHARDMIX_DEMO_PROVIDER")
  provider_note="provider $SHARDMIX_DEMO_PROVIDER"
  [[ $SHARDMIX_DEMO_PROVIDER == tcp ]] || sets+=(--set "fabric.interface=")
fi
sm_section "4/5 run: $nodes daemons, $trainers trainers, $epochs epochs ($provider_note)"
rm -rf -- "$trace"
json_flag=()
if "$consume" --help 2>/dev/null | grep -q -- '--json'; then json_flag=(--json); fi
echo "daemon log: $logs/daemons.log"
# The output filters ignore Ctrl-C so that launch.sh can still report while it stops
# the daemons.
set +e
bash "$SM_REPO/deploy/launch.sh" --nodes "$nodes" --config "$config" --trainers-per-node "$per_node" \
  "${sets[@]}" --daemon-log "$logs/daemons.log" \
  -- "$consume" --epochs "$epochs" --trace "$trace" "${json_flag[@]}" 2>&1 |
  (trap '' INT; exec tee "$logs/trainers.log") |
  (trap '' INT; exec grep --line-buffered -v '^JSON ')
rc=${PIPESTATUS[0]}
set -e
if ((rc != 0)); then
  sm_log "the run failed (exit $rc); last daemon log lines:"
  tail -n 25 -- "$logs/daemons.log" 2>/dev/null | sed 's/^/  | /' >&2
  exit "$rc"
fi
python=$(sm_python) || sm_die "python3 not found"
"$python" - "$logs/trainers.log" <<'EOF' || true
# Aggregate the trainers' per-epoch JSON lines: all ranks run at once, so an epoch takes
# as long as its slowest rank.
import collections, json, sys
epochs = collections.defaultdict(list)
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    if line.startswith("JSON "):
        try:
            r = json.loads(line[5:])
            epochs[r["epoch"]].append(r)
        except (ValueError, KeyError):
            pass
for e in sorted(epochs):
    rs = epochs[e]
    n = sum(r["samples"] for r in rs)
    b = sum(r["bytes"] for r in rs)
    t = max(r["seconds"] for r in rs) or float("nan")
    local = sum(r.get("local_samples", 0) for r in rs)
    peer = sum(r.get("peer_samples", 0) for r in rs)
    print("epoch %d, all %d trainers: %d samples, %.2f GB in %.2f s = %.0f samples/s, "
          "%.2f GB/s (local %d, peer %d)" % (e, len(rs), n, b / 1e9, t, n / t, b / t / 1e9,
                                             local, peer))
EOF

# The job's own statistics (rank 0's stats file), and plots of them when matplotlib is there.
if [[ -s $stats ]]; then
  echo "job statistics ($stats):"
  if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
    /usr/bin/python3 "$SM_REPO/tools/shardmix-report" "$stats" --out "$logs/stats.png" | sed 's/^/  /'
  else
    sed 's/^/  /' "$stats"
  fi
fi

# ---------------------------------------------------------------- 5. verify
sm_section "5/5 verify: exactly once, bytes checked against the files"
"$python" "$SM_REPO/tests/e2e/check_traces.py" "$trace" --dataset "$data" --epochs "$epochs" \
  --trainers "$trainers" --trainers-per-node "$per_node" --batch-size "$batch" \
  --json "$logs/verdict.json" "${check_format[@]}"
echo "traces: $trace   verdict: $logs/verdict.json"
