#!/usr/bin/env bash
# End-to-end test of the MPMD example (deploy/mpmd.sh): 2 daemons and 4 trainers in one
# mpirun; the trainers' ranks exclude the daemons', every sample arrives exactly once per
# epoch (check_traces.py), and the job ends by itself when the trainers are done.
#
#   tests/e2e/mpmd_e2e.sh
set -euo pipefail

SM_PROG=mpmd_e2e
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

nodes=2 per_node=2 epochs=2 batch=8
e2e_init mpmd shardmix-mpmd-trainer
e2e_gen_dataset 400 8 8 5
sm_write_config "$tmp/job.toml" dataset.path="$tmp/data" batch.size="$batch" fabric.provider=tcp fabric.interface=lo

rc=0
SHARDMIX_RUN_DIR=$tmp/run SHARDMIX_CONNECT_TIMEOUT=120 timeout -s TERM -k 20 200 \
  bash "$SM_REPO/deploy/mpmd.sh" --nodes "$nodes" --trainers-per-node "$per_node" --config "$tmp/job.toml" \
  -- "$consume" --epochs "$epochs" --trace "$tmp/trace" >"$tmp/job.log" 2>&1 || rc=$?
if ((rc != 0)); then
  tail -n 40 "$tmp/job.log" >&2
  sm_die "the MPMD job failed with exit code $rc"
fi
n=$(find "$tmp/trace" -name 'rank-*.csv' | wc -l)
((n == nodes * per_node)) || sm_die "expected $((nodes * per_node)) trainer traces (ranks 0..$((nodes * per_node - 1))), found $n"
grep -q 'received signal 15, shutting down' "$tmp/job.log" || sm_die "the daemons were not stopped by the trainers' wrapper"
"$python" "$SM_E2E/check_traces.py" "$tmp/trace" --dataset "$tmp/data" --epochs "$epochs" \
  --trainers $((nodes * per_node)) --trainers-per-node "$per_node" --batch-size "$batch"
