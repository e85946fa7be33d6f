#!/usr/bin/env bash
# Checkpoint absorption (docs/decisions/0056, 0059): 4 trainers train on ShardMix-delivered
# data (4 daemons, --provider, exchange_fraction 1, trainers in step as DDP holds them) and save
# --state-mib MiB each every --every batches, with checkpoint.dir on a slow shared file
# system (bench/slowfs --writable: every written byte shares one token bucket of
# --bandwidth-mbps with the reads, as on a PFS link). In one run (bench/checkpoint_torch.py):
#   none      no checkpoints: the data stall fraction without them;
#   shardmix  shardmix.torch.save into the node's daemon, which drains to checkpoint.dir;
#             then every rank saves once more at the same moment and waits until durable:
#             the drain's rate (bytes over the first save's start to the last durable);
#   torch     torch.save straight to the same file system; then every rank writes the
#             same bytes raw with fsync at the same moment: the file system's own rate.
# Figures (bench/checkpoint_report.py): time in save, shardmix against torch (target: at
# least 10x shorter); the data stall fraction (time waiting for batches over the run's
# span) with and without checkpointing (target: at most 1 point higher); the drain rate
# against the file system's own write rate (target: at least 80%). Each mode runs --repeat
# times, interleaved; medians with min-max. The dataset is on local disk in every mode
# (it is in the daemons' RAM after start-up either way); only checkpoint.dir is slow.
#
#   bash bench/checkpoint.sh [--quick] [--state-mib 1024] [--every 300] [--compute-ms 100]
#                            [--epochs 5] [--repeat 1] [--bandwidth-mbps 200] [--out FILE]
#                            [--provider tcp] [--modes "none shardmix torch"] [--shmem-huge-pages advise]
# --provider: the daemons' fabric (tcp or shm), which carries the batches' peer reads and
# each save's copy to its replica holder.
# --modes: a subset for a look at one mode (its raw rows only, no report).
# --shmem-huge-pages never|advise|...: sets the kernel's huge page setting for shared memory
# for the run (the machine's own is put back at exit; recorded in the conditions either
# way): under "advise" the checkpoint pool and the trainers' leases use 2 MiB pages
# (docs/operations.md, "Huge pages"). Default: leave it as it is.
# --quick: 256 MiB states every 80 batches, 8,192 samples, 4 epochs (about four minutes).
# Needs root (FUSE mount), shardmix-slowfs (libfuse3-dev), torch for /usr/bin/python3, the
# Python module (build/python). Memory: each trainer holds its state and, while saving, a
# serialised copy; each daemon holds its node's version and a peer's replica
# (checkpoint.capacity is set to 2 x state + 25%). Writes bench/results/checkpoint-latest.json.
set -euo pipefail
SM_PROG=checkpoint
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

command_line="bash bench/checkpoint.sh${*:+ $*}"
samples=32768 median_kib=32 state_mib=1024 every=300 compute_ms=100 epochs=5 repeat=1 bandwidth_mbps=200
out=$repo/bench/results/checkpoint-latest.json
quick_sizes() { samples=8192 state_mib=256 every=80 epochs=4 out=$repo/bench/results/checkpoint-quick.json; }
modes="none shardmix torch" provider=tcp shmem_huge_pages=
bench_parse_args quick:quick_sizes state-mib every compute-ms epochs repeat bandwidth-mbps provider modes \
  shmem-huge-pages out -- "$@"
[[ $provider == tcp || $provider == shm ]] || sm_die "--provider: tcp or shm, not '$provider'" 2
bench_check_positive_ints state_mib every epochs repeat
bench_check_numbers compute_ms bandwidth_mbps
bench_require_root "mounting the slow file system (FUSE)"
bench_require_built server/shardmixd tools/shardmix-gen
[[ -f $build/python/shardmix/__init__.py ]] || sm_die "$build/python/shardmix missing: build the Python module (cmake --build $build)" 2
bench_require_torch
bench_require_slowfs

data=$(bench_sample_dataset "$samples" "$median_kib")
bench_workdir checkpoint
sm_before_tmp_cleanup() { bench_unmount_slowfs; bench_shmem_huge_pages_restore; }
bench_shmem_huge_pages "$shmem_huge_pages"
raw=$work/raw.jsonl
: >"$raw"
mkdir -p "$work/backing" "$work/slow"
bench_mount_slowfs "$work/backing" "$work/slow" "$work/slowfs.log" --writable --latency-ms 2 \
  --bandwidth-mbps "$bandwidth_mbps" --stats "$work/slowfs-stats.json"

# Own version + a peer's replica + slack, per daemon; retain 1 (only the latest matters here).
capacity_mib=$((state_mib * 5 / 2))
sm_write_config "$work/c.toml" dataset.path="$data" batch.size=32 shuffle.exchange_fraction=1 fabric.provider="$provider" \
  service.prefetch=8 log.level=warn checkpoint.dir="$work/slow/ckpt" checkpoint.capacity="${capacity_mib}MiB" \
  checkpoint.retain=1
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1
mkdir -p "$work/slow/ckpt" "$work/slow/torch"

run_mode() {  # mode run
  local mode=$1 run=$2
  rm -f "$work/store"
  echo "== $mode (run $run): $state_mib MiB per rank every $every batches, compute $compute_ms ms"
  FI_TCP_IFACE=lo bench_launch_or_die "$work/t.txt" "$work/d.log" --timeout 1800 --nodes 4 --config "$work/c.toml" -- \
    "$torch_python" "$bench_dir/checkpoint_torch.py" --mode "$mode" --store "$work/store" --state-mib "$state_mib" \
    --every "$every" --compute-ms "$compute_ms" --epochs "$epochs" --dir "$work/slow/torch"
  bench_json_lines "\"run\": $run" <"$work/t.txt" >>"$raw"
  rm -rf "${work:?}/slow/torch/"* "${work:?}/slow/ckpt/"*
}

loadavg_start=$(bench_loadavg)
for ((r = 0; r < repeat; r++)); do
  for mode in $modes; do run_mode "$mode" "$r"; done
done
bench_unmount_slowfs
printf '{"kind": "conditions", "command": "%s", "provider": "%s", "shmem_huge_pages": "%s", "state_mib": %d, "every": %d, "compute_ms": %s, "epochs": %d, "samples": %d, "median_kib": %d, "bandwidth_mbps": %s, "slowfs": %s, "loadavg_start": "%s", "loadavg_end": "%s"}\n' \
  "$command_line" "$provider" "$bench_shmem_huge_pages_in_use" "$state_mib" "$every" "$compute_ms" "$epochs" "$samples" "$median_kib" "$bandwidth_mbps" \
  "$(tr -d '\n' <"$work/slowfs-stats.json" 2>/dev/null || echo null)" "$loadavg_start" "$(bench_loadavg)" >>"$raw"
if [[ $modes != "none shardmix torch" ]]; then
  cp "$raw" "$data_root/checkpoint-partial.jsonl"
  sm_log "--modes: the raw rows are in $data_root/checkpoint-partial.jsonl (no report without all three modes)"
  exit 0
fi
cp "$raw" "$data_root/checkpoint-last-raw.jsonl"
python3 "$bench_dir/checkpoint_report.py" "$raw" "$out"
