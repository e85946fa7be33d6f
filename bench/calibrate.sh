#!/usr/bin/env bash
# Measures this machine's parameters for the simulator (docs/simulator.md "Calibration") and
# writes them as a calibration file: TOML with one [sim] table, read by
# `shardmix-sim --config FILE` and `shardmix-whatif --calibration FILE`.
#   sim.link_gbps            raw fi_read (bench/fabric_read.cc) at the job's rank count and
#                            provider, the dataset's size distribution, qd 8: total / ranks
#   sim.storage_gbps, sim.storage_iops
#                            shardmix-bench-storage-read over the dataset's files with
#                            service.loader_threads threads per node, all nodes' threads at
#                            once (the nodes of a one-machine job share its storage and
#                            cores): the aggregate rate / nodes. The files are read as they
#                            are (page cache warm after shardmix-gen, as the jobs here see them)
#   sim.trainer_samples_per_s
#                            --nodes synthetic trainers at once (shardmix-consume
#                            --synthetic-batches: in-memory batches of the dataset's mean
#                            batch bytes, --touch copy, --compute-ms): samples / second per trainer
# Not measured: the link latency (sim default kept) and a per-sample daemon CPU cost (the
# simulator has no such model).
#
#   bash bench/calibrate.sh --dataset DIR --out FILE [--nodes 4] [--provider tcp]
#                           [--batch 32] [--compute-ms 16] [--loader-threads 4] [--seconds 2]
# Env: SHARDMIX_BUILD_DIR (default build/). Exit 0, 1 when a measurement failed, 2 usage.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

dataset="" out="" nodes=4 provider=tcp batch=32 compute_ms=16 loader_threads=4 seconds=2
bench_parse_args dataset out nodes provider batch compute-ms loader-threads seconds -- "$@"
[[ -d $dataset && -n $out ]] || sm_die "--dataset DIR and --out FILE are required" 2
bench_check_positive_ints nodes batch loader_threads
bench_check_numbers compute_ms seconds
bench_require_built bench/shardmix-bench-fabric-read bench/shardmix-bench-storage-read tools/shardmix-consume
bench_workdir calibrate

bench_sample_list "$dataset" "$work/files.txt"
read -r total_bytes nfiles < <(bench_sample_bytes "$dataset")
((nfiles > 0)) || sm_die "no .bin files under $dataset" 2
read -r median_kib sigma < <(cd -- "$dataset" && xargs -a "$work/files.txt" -d '\n' stat -c %s | python3 -c '
import math, statistics, sys
s = [int(x) for x in sys.stdin]
l = [math.log(x) for x in s]
print(statistics.median(s) / 1024, statistics.pstdev(l))')
mean_bytes=$((total_bytes / nfiles))
echo "calibrate: $nfiles samples, $total_bytes bytes (median $median_kib KiB, sigma $sigma); load $(bench_loadavg)"

echo "== raw fi_read, $provider, $nodes ranks, qd 8, ${seconds} s"
bench_fabric_read "$nodes" "$provider" --median-kib "$median_kib" --lognormal-sigma "$sigma" --count 2048 \
  --seconds "$seconds" >"$work/f.txt" 2>&1 || { cat "$work/f.txt"; exit 1; }
grep -v '^JSON ' "$work/f.txt" | tail -2

threads=$((nodes * loader_threads))
echo "== storage read, $threads threads (all nodes' loader threads), whole files"
"$build/bench/shardmix-bench-storage-read" --dir "$dataset" --list "$work/files.txt" --threads "$threads" \
  --bytes 0 --seed 3 --json >"$work/s.txt" 2>&1 || { cat "$work/s.txt"; exit 1; }
grep -v '^JSON ' "$work/s.txt"

batches=$(python3 -c "print(max(16, int($seconds * 1000 / ($compute_ms + 0.5))))")
echo "== $nodes synthetic trainers, $batches batches of $batch x $mean_bytes bytes, compute $compute_ms ms, touch copy"
bench_mpirun "$nodes" "$build/tools/shardmix-consume" --synthetic-batches "$batches" \
  --synthetic-batch-bytes $((batch * mean_bytes)) --touch copy --compute-ms "$compute_ms" --epochs 2 --json \
  >"$work/y.txt" 2>&1 || { cat "$work/y.txt"; exit 1; }

PYTHONPATH=$bench_dir python3 - "$work" "$out" "$nodes" "$batch" "$compute_ms" "$provider" <<'PY'
import sys, datetime
import benchlib
work, out, nodes, batch, compute_ms, provider = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
jl = lambda f: benchlib.json_lines(f"{work}/{f}")
fab = jl("f.txt")[-1]
sto = jl("s.txt")[-1]
syn = [r for r in jl("y.txt") if r["epoch"] >= 1] or jl("y.txt")
link_gbps = fab["total_gbps"] * 8 / nodes          # GB/s of all ranks -> Gb/s per node
storage_gbps = sto["mbps"] * 8 / 1000 / nodes      # MB/s of all threads -> Gb/s per node
storage_iops = sto["files_per_s"] / nodes
trainer = sum(r["batches"] * batch for r in syn) / sum(r["seconds"] for r in syn)
load = open("/proc/loadavg").read().split()[:3]
text = f"""# Calibration for shardmix-sim / shardmix-whatif, written by bench/calibrate.sh
# {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, load {' '.join(load)}; {nodes} nodes on this machine, provider {provider}
# raw fi_read: {fab['total_gbps']:.4f} GB/s over {nodes} ranks (qd 8); storage: {sto['mbps']:.1f} MB/s, {sto['files_per_s']:.0f} files/s
# with {sto['threads']} threads; synthetic trainers: batch {batch}, compute {compute_ms} ms, touch copy
[sim]
link_gbps = {link_gbps:.6g}
storage_gbps = {storage_gbps:.6g}
storage_iops = {storage_iops:.6g}
trainer_samples_per_s = {trainer:.6g}
"""
open(out, "w").write(text)
print(text, end="")
PY
