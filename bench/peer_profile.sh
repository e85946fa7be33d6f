#!/usr/bin/env bash
# Where the CPU goes in peer delivery (target: >= 70% of raw fi_read): one raw fi_read run and one ShardMix run
# (4 daemons + 4 trainers, shuffle.exchange_fraction 1, trainers taking views only), back
# to back, each with per-thread CPU seconds and context switches over its steady state
# (bench/thread_cpu.py), and the figures that do not need a quiet machine:
#   - fabric-thread CPU seconds per GB read from peers (the same copies in both runs, so a
#     difference is overhead: spinning, page walks, cache misses);
#   - fabric-thread cores (the share of the 2 cores the copying threads got);
#   - involuntary context switches of the fabric threads per second (on shm, a preempted
#     thread may hold the provider's region spinlock while the others spin on it).
# bench/results/peer-delivery-bound.md explains why these, not wall-clock rates alone, were used.
#
#   flock /tmp/shardmix-bench.lock bash bench/peer_profile.sh [--provider shm|tcp] [--epochs 4]
#         [--out DIR] [--set SECTION.KEY=VALUE ...] [--huge-pages never|advise]
# --huge-pages: sets the kernel's shmem_enabled for the run (root; put back at exit), and
# with "advise" the raw run asks for huge pages on its memory too (--huge-pages), so both
# sides read the same kind of pages: the daemon always asks for them on its arena and
# staging (decision 0070), which only "advise" grants. Default: leave the setting alone.
# Env: SHARDMIX_BUILD_DIR (default build/), SHARDMIX_BENCH_DIR (default /tmp/shardmix-bench).
# Uses the delivery benchmark's dataset (16,384 samples, median 112 KiB), generating it if missing.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

py=/usr/bin/python3
provider=shm epochs=4 out="" sets=() huge_pages=
bench_parse_args provider epochs out "set[]=sets" huge-pages -- "$@"
bench_check_positive_ints epochs
((epochs >= 2)) || sm_die "--epochs must be at least 2 (epoch 0 is not measured)" 2
bench_require_built server/shardmixd tools/shardmix-consume tools/shardmix-gen bench/shardmix-bench-fabric-read
data=$(bench_sample_dataset 16384 112)
work=${out:-$(mktemp -d /tmp/shardmix-peer-profile.XXXXXX)}
mkdir -p "$work"
# A failed run must not leave a sampler polling for its stop file.
trap 'touch "$work/raw.stop" "$work/smx.stop"; bench_shmem_huge_pages_restore' EXIT
bench_shmem_huge_pages "$huge_pages"
raw_memory=()
[[ $huge_pages == never || -z $huge_pages ]] || raw_memory=(--huge-pages)
uptime_now() { cut -d' ' -f1 /proc/uptime; }
# Only processes started from this build or this work dir are sampled.
mark=$build

echo "loadavg before: $(cat /proc/loadavg); shmem_enabled ${bench_shmem_huge_pages_in_use:-unknown}; raw ${raw_memory[*]:-default pages}" | tee "$work/summary.txt"

# Raw fi_read: 6 s timed; the window is 2.5..5 s after mpirun starts (after launch and
# warm-up, before the end), so it holds only the timed phase unless launch took > 2.5 s.
$py "$bench_dir/thread_cpu.py" sample "$work/raw" '^shardmix-bench-' "$mark" & sampler=$!
t0=$(uptime_now)
bench_fabric_read 4 "$provider" --median-kib 112 --lognormal-sigma 0.5 --count 2048 --seconds 6 --seed 0 \
  "${raw_memory[@]}" >"$work/raw.txt" 2>&1
touch "$work/raw.stop"; wait "$sampler"
$py "$bench_dir/thread_cpu.py" window "$work/raw" "$(echo "$t0 + 2.5" | bc)" "$(echo "$t0 + 5" | bc)" >"$work/raw.threads"

sm_write_config "$work/c.toml" dataset.path="$data" batch.size=32 shuffle.seed=1 shuffle.exchange_fraction=1 \
  fabric.provider="$provider" service.prefetch=8 log.level=warn
$py "$bench_dir/thread_cpu.py" sample "$work/smx" '^(shardmixd|shardmix-consum)$' "$mark" & sampler=$!
FI_TCP_IFACE=lo bench_launch_or_die "$work/s.txt" "$work/d.log" --nodes 4 --config "$work/c.toml" "${sets[@]}" -- \
  "$build/tools/shardmix-consume" --epochs "$epochs" --touch none --json
touch "$work/smx.stop"; wait "$sampler"
echo "loadavg after: $(cat /proc/loadavg)" | tee -a "$work/summary.txt"

# The measured epochs' span (epoch 0 includes connection set-up), on the same clock.
read -r t0 t1 < <(PYTHONPATH=$bench_dir $py -c '
import sys, benchlib
rows = [r for r in benchlib.json_lines(sys.argv[1]) if r["epoch"] > 0]
print(min(r["t_start"] for r in rows), max(r["t_end"] for r in rows))' "$work/s.txt")
$py "$bench_dir/thread_cpu.py" window "$work/smx" "$t0" "$t1" >"$work/smx.threads"

PYTHONPATH=$bench_dir $py - "$work" <<'PY' | tee -a "$work/summary.txt"
import sys
import benchlib
work = sys.argv[1]
def fabric(path):
    seconds = cpu = invol = 0.0
    for line in open(path):
        f = line.split()
        if line.startswith("window"):
            seconds = float(f[1])
        elif len(f) == 8 and f[1] == "smx-fabric":
            cpu += float(f[3]) + float(f[4]); invol += float(f[7])
    return seconds, cpu, invol
raw_gbps = benchlib.json_lines(f"{work}/raw.txt")[-1]["total_gbps"]
measured = [r for r in benchlib.json_lines(f"{work}/s.txt") if r["epoch"] > 0]
span = benchlib.epoch_span(measured)
peer_gbps = sum(r["peer_bytes"] for r in measured) / span / 1e9
rs, rc, ri = fabric(f"{work}/raw.threads")
ss, sc, si = fabric(f"{work}/smx.threads")
print(f"raw fi_read: {raw_gbps:.2f} GB/s; fabric threads {rc / rs:.2f} cores, {rc / rs / raw_gbps:.2f} CPU s/GB, "
      f"{ri:.0f} involuntary switches/s")
print(f"ShardMix peer: {peer_gbps:.2f} GB/s over {span:.2f} s; fabric threads {sc / ss:.2f} cores, "
      f"{sc / ss / peer_gbps:.2f} CPU s/GB, {si:.0f} involuntary switches/s")
print(f"peer / raw fi_read: {peer_gbps / raw_gbps:.2f}")
PY
echo "per-thread tables: $work/raw.threads $work/smx.threads"
