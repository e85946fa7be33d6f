#!/usr/bin/env bash
# Where a checkpoint save's time goes (decision 0069): 4 daemons and 4 trainers
# (bench/checkpoint_phases.py) that do nothing but save a --state-mib MiB state at once,
# in --rounds rounds, each round waiting until durable (checkpoint.dir on local disk, so
# the drain is not what is measured). Prints per round the range over the ranks of each
# phase (lease, serialise, commit) and of the whole save, then the mean save over the
# rounds after the first (round 0 may still share the machine with the pools' prefault).
# For comparing two builds in one session: run it for each, back to back
# (SHARDMIX_BUILD_DIR picks the build). No training: bench/checkpoint.sh measures saves as
# training sees them.
#
#   bash bench/checkpoint_phases.sh [--provider tcp|shm] [--rounds 4] [--state-mib 256]
#                                   [--shmem-huge-pages never|advise]
# --shmem-huge-pages: as in bench/checkpoint.sh (set for the run, put back at exit).
# Needs torch for /usr/bin/python3 and the Python module (build/python). Memory: each
# trainer holds its state; each daemon a pool of 2.5 x the state.
set -euo pipefail
SM_PROG=checkpoint_phases
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

provider=tcp rounds=4 state_mib=256 shmem_huge_pages=
bench_parse_args provider rounds state-mib shmem-huge-pages -- "$@"
[[ $provider == tcp || $provider == shm ]] || sm_die "--provider: tcp or shm, not '$provider'" 2
bench_check_positive_ints rounds state_mib
((rounds >= 2)) || sm_die "--rounds must be at least 2 (round 0 is not in the mean)" 2
bench_require_built server/shardmixd tools/shardmix-gen
[[ -f $build/python/shardmix/__init__.py ]] || sm_die "$build/python/shardmix missing: build the Python module (cmake --build $build)" 2
bench_require_torch

data=$(bench_sample_dataset 8192 32)
bench_workdir checkpoint-phases
sm_before_tmp_cleanup() { bench_shmem_huge_pages_restore; }
bench_shmem_huge_pages "$shmem_huge_pages"
echo "shmem_enabled: ${bench_shmem_huge_pages_in_use:-unknown}"
mkdir -p "$work/ckpt"
sm_write_config "$work/c.toml" dataset.path="$data" batch.size=32 shuffle.exchange_fraction=1 fabric.provider="$provider" \
  log.level=warn checkpoint.dir="$work/ckpt" checkpoint.capacity="$((state_mib * 5 / 2))MiB" checkpoint.retain=1
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1
echo "loadavg before: $(bench_loadavg)"
FI_TCP_IFACE=lo bench_launch_or_die "$work/t.txt" "$work/d.log" --timeout 1200 --nodes 4 --config "$work/c.toml" -- \
  "$torch_python" "$bench_dir/checkpoint_phases.py" --store "$work/store" --rounds "$rounds" --state-mib "$state_mib"
echo "loadavg after: $(bench_loadavg)"
# Ranks print concurrently: take each JSON object wherever it landed.
grep -o 'JSON {[^}]*}' "$work/t.txt" | sed 's/^JSON //' >"$work/rows.jsonl"
"$torch_python" - "$work/rows.jsonl" "$state_mib" "$provider" <<'PY'
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
for r in sorted({x["round"] for x in rows}):
    these = [x for x in rows if x["round"] == r]
    span = lambda k: "%.2f-%.2f" % (min(x[k] for x in these), max(x[k] for x in these))
    print(f"round {r}: lease {span('lease')} s, serialise {span('serialise')} s, commit {span('commit')} s, "
          f"save {span('save')} s, trainer CPU {span('cpu')} s")
later = [x["save"] for x in rows if x["round"] > 0]
last = max(x["round"] for x in rows)
print(f"mean save, rounds 1-{last}: {statistics.mean(later):.2f} s ({len(later)} saves of {sys.argv[2]} MiB, {sys.argv[3]})")
PY
