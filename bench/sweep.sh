#!/usr/bin/env bash
# Entropy versus locality on an emulated cluster. 4 daemons, each in its own
# network namespace linked to a bridge at 1 Gbit/s each way (deploy/netns-cluster.sh),
# 4 trainers (one per node, in the root namespace, --compute-ms per batch), 3 epochs per
# run, traced. Two scenarios:
#   grid       Q (shuffle.exchange_fraction) x W (shuffle.window) on the shaped links;
#   slow peer  Q = 1, W in the same set, daemon rank 1's fetches completing late
#              (inject.slow_peer_*), links unshaped so that the delay is the one limit;
#              plus the same without the delay (W = 0) as the reference.
# Per (scenario, Q, W): throughput (all trainers' samples over the wall-clock span from the
# first trainer's epoch start to the last one's end), trainer stall time (waiting for the
# next batch, shardmix-consume's stall_seconds), bytes on the links, and every metric of
# shardmix-entropy (label entropy mean/p5, order entropy, randomization level, affinity,
# locality fractions, network bytes per sample). Medians over epochs >= 1 of --repeat runs
# (epoch 0 warms up), with min and max.
#
#   bash bench/sweep.sh [--quick] [--repeat R] [--samples N] [--compute-ms MS]
#                       [--qs "0 0.1 0.25 0.5 1"] [--ws "0 64 1024"] [--rate 1gbit]
#                       [--slow-delay 100ms] [--no-slow-peer] [--keep-cluster]
# Writes bench/results/sweep-latest.json and sweep-latest.png (--quick: 2048 samples, 1 run
# per point, written to sweep-quick.* instead) and prints the tables (python3
# bench/sweep_report.py prints them again from the JSON). Needs root (network namespaces),
# iproute2 and python3-matplotlib (deploy/install-deps.sh). Env: SHARDMIX_BUILD_DIR
# (default build/, configure it Release), SHARDMIX_BENCH_DIR (dataset cache and the last
# run's raw lines, sweep-last-raw.jsonl; default /tmp/shardmix-bench). Exit status: 0 if
# every point ran, 1 if one failed (the others are still reported), 2 usage error.
set -euo pipefail

SM_PROG=sweep
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

command_line="bash bench/sweep.sh${*:+ $*}"
samples=4096 classes=16 median_kib=112 batch=32 prefetch=4 epochs=3 repeat=3 compute_ms=10
qs="0 0.1 0.25 0.5 1" ws="0 64 1024" rate=1gbit slow_rank=1 slow_delay=100ms slow=1 keep_cluster=0
nodes=4 prefix=smx out=sweep-latest
quick_sizes() { samples=2048 repeat=1 out=sweep-quick; }
bench_parse_args quick:quick_sizes repeat samples compute-ms qs ws rate slow-delay no-slow-peer:slow=0 \
  keep-cluster:keep_cluster=1 -- "$@"
bench_check_positive_ints repeat samples
bench_check_numbers compute_ms
for q in $qs; do [[ $q =~ ^(0|1|0?\.[0-9]+|1\.0+)$ ]] || sm_die "--qs: '$q' is not in 0..1" 2; done
for w in $ws; do sm_is_uint "$w" || sm_die "--ws: '$w' is not a window size" 2; done

bench_require_built server/shardmixd tools/shardmix-consume tools/shardmix-gen tools/shardmix-entropy
bench_require_root "the network namespaces (deploy/netns-cluster.sh)"
# A python3 with matplotlib (Debian's python3-matplotlib is for /usr/bin/python3).
python=""
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import matplotlib' >/dev/null 2>&1; then python=$py; break; fi
done
[[ -n $python ]] || sm_die "no python3 with matplotlib; install python3-matplotlib (deploy/install-deps.sh)" 2

cluster=$repo/deploy/netns-cluster.sh
data=$data_root/sweep-$samples-${median_kib}k-c$classes
bench_dataset "$data" --samples "$samples" --classes "$classes" --median-kib "$median_kib"
bench_workdir sweep
# shellcheck disable=SC2317  # called by deploy/lib.sh's exit trap
sm_before_tmp_cleanup() {
  if ((!keep_cluster)); then bash "$cluster" down "$nodes" --prefix "$prefix" >/dev/null 2>&1 || true; fi
}
raw=$work/raw.jsonl
: >"$raw"

wire_bytes() { sm_netns_rx_bytes "$prefix" "$nodes"; }

failures=0
# run_point SCENARIO Q W RUN SLOW_RANK SLOW_DELAY LINK_RATE
run_point() {
  local scenario=$1 q=$2 w=$3 r=$4 srank=$5 sdelay=$6 link=$7
  local tag="$scenario q=$q w=$w run=$r"
  local trace=$work/trace
  rm -rf -- "$trace"
  sm_write_config "$work/c.toml" dataset.path="$data" dataset.placement=sorted batch.size="$batch" \
    shuffle.seed=$((r + 1)) shuffle.exchange_fraction="$q" shuffle.window="$w" fabric.provider=tcp \
    fabric.netns="$prefix{rank}" fabric.interface="${prefix}eth" service.prefetch="$prefetch" \
    inject.slow_peer_rank="$srank" inject.slow_peer_delay="$sdelay" log.level=info
  local before after rc=0 t0
  before=$(wire_bytes)
  t0=$SECONDS
  bench_launch "$work/s.txt" "$work/d.log" --timeout 600 --nodes "$nodes" --config "$work/c.toml" \
    --trainers-per-node 1 -- \
    "$build/tools/shardmix-consume" --epochs "$epochs" --trace "$trace" --json --compute-ms "$compute_ms" || rc=$?
  after=$(wire_bytes)
  local head
  head="\"scenario\": \"$scenario\", \"q\": $q, \"w\": $w, \"run\": $r, \"slow_peer_rank\": $srank, \"slow_peer_delay\": \"$sdelay\", \"link_rate\": \"$link\""
  if ((rc != 0)); then
    local why
    why=$(bench_failure_reason "$rc" "$work/d.log" "$work/s.txt")
    sm_warn "$tag failed (exit $rc): $why"
    printf '{"kind": "failed", %s, "exit": %d, "error": "%s"}\n' "$head" "$rc" "$why" >>"$raw"
    failures=$((failures + 1))
    return 0
  fi
  bench_json_lines "\"kind\": \"trainer\", $head" <"$work/s.txt" >>"$raw"
  "$build/tools/shardmix-entropy" "$trace" --json --num-classes "$classes" --dataset-size "$samples" |
    sed "s/^{/{\"kind\": \"entropy\", $head, /" >>"$raw"
  local fabric_bytes
  fabric_bytes=$({ grep -o 'reads, [0-9]* bytes read from peers' "$work/d.log" || true; } |
    awk '{ s += $2 } END { print s + 0 }')
  printf '{"kind": "run", %s, "wire_bytes": %d, "fabric_bytes": %d, "seconds": %d}\n' \
    "$head" "$((after - before))" "$fabric_bytes" "$((SECONDS - t0))" >>"$raw"
  { grep '^rank .* epoch' "$work/s.txt" || true; } | awk '$4 != "0:" { print "  " $0 }'

  return 0
}

sm_section "emulated cluster: $nodes namespaces at $rate per link and direction"
bash "$cluster" up "$nodes" "$rate" --prefix "$prefix"
for ((r = 0; r < repeat; r++)); do
  for q in $qs; do
    for w in $ws; do
      sm_section "grid: Q=$q W=$w (run $((r + 1))/$repeat)"
      run_point grid "$q" "$w" "$r" -1 0ms "$rate"
    done
  done
done

if ((slow)); then
  sm_section "slow peer: links unshaped, daemon rank $slow_rank's fetches +$slow_delay"
  bash "$cluster" up "$nodes" none --prefix "$prefix"
  for ((r = 0; r < repeat; r++)); do
    sm_section "slow peer reference: Q=1 W=0, no delay (run $((r + 1))/$repeat)"
    run_point reference 1 0 "$r" -1 0ms none
    for w in $ws; do
      sm_section "slow peer: Q=1 W=$w (run $((r + 1))/$repeat)"
      run_point slow_peer 1 "$w" "$r" "$slow_rank" "$slow_delay" none
    done
  done
fi

cat >"$work/meta.json" <<META
{"command": "$command_line", "samples": $samples, "classes": $classes, "median_kib": $median_kib,
 "lognormal_sigma": 0.5, "placement": "sorted", "dataset_bytes": $(du -sb --exclude=.complete "$data" | cut -f1),
 "nodes": $nodes, "trainers_per_node": 1, "batch": $batch, "prefetch": $prefetch, "epochs": $epochs,
 "repeat": $repeat, "compute_ms": $compute_ms, "link_rate": "$rate", "slow_peer_rank": $slow_rank,
 "slow_peer_delay": "$slow_delay", "provider": "tcp"}
META
mkdir -p -- "$repo/bench/results"
cp -- "$raw" "$data_root/sweep-last-raw.jsonl"  # every trainer-epoch line, to re-aggregate
"$python" "$bench_dir/sweep_report.py" --raw "$raw" --meta "$work/meta.json" \
  --json "$repo/bench/results/$out.json" --png "$repo/bench/results/$out.png"
if ((failures)); then
  sm_warn "$failures run(s) failed; they are listed in the JSON under 'failed'"
  exit 1
fi
