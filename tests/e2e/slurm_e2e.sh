#!/usr/bin/env bash
# End-to-end test of deploy/slurm/shardmix.sbatch without Slurm: `srun` is
# tests/e2e/srun_shim.sh (mpirun underneath, SLURM_* per rank, Open MPI's rank variables
# hidden from the trainers). 2 "nodes", 2 trainers per node, 2 epochs: the daemons start as
# a background step, the script waits for readiness, the trainers (which find their rank
# from SLURM_PROCID/SLURM_LOCALID) get every sample exactly once per epoch, and the
# daemons stop cleanly. Also: a trainer layout that does not match the daemons' fails with
# a message naming both.
#
#   tests/e2e/slurm_e2e.sh
set -euo pipefail

SM_PROG=slurm_e2e
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

nodes=2 per_node=2 epochs=2 batch=8
e2e_init slurm

mkdir -p "$tmp/bin"
ln -s "$SM_E2E/srun_shim.sh" "$tmp/bin/srun"
e2e_gen_dataset 400 8 8 9
sm_write_config "$tmp/job.toml" dataset.path="$tmp/data" batch.size="$batch" fabric.provider=tcp fabric.interface=lo

# run_job LOG TRAINER...: the batch script as sbatch would start it on the first node.
run_job() {
  local log=$1
  shift
  env PATH="$tmp/bin:$PATH" SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=$nodes SLURM_NTASKS_PER_NODE="$per_node" \
    SHARDMIX_CONFIG="$tmp/job.toml" SHARDMIXD="$daemon" SHARDMIX_RUN_DIR="$tmp/run" \
    SHARDMIX_READY_TIMEOUT=120 SHARDMIX_STOP_TIMEOUT=20 \
    timeout -s TERM -k 20 200 bash "$SM_REPO/deploy/slurm/shardmix.sbatch" "$@" >"$log" 2>&1
}

sm_section "sbatch script: $nodes nodes x $per_node trainers, $epochs epochs"
rc=0
run_job "$tmp/job.log" "$consume" --epochs "$epochs" --trace "$tmp/trace" || rc=$?
if ((rc != 0)); then
  tail -n 40 "$tmp/job.log" >&2
  sm_die "the batch script failed with exit code $rc"
fi
grep -q 'daemons ready after' "$tmp/job.log" || sm_die "no readiness line in the job log"
grep -q 'received signal 15, shutting down' "$tmp/job.log" || sm_die "the daemons were not stopped with SIGTERM"
[[ ! -e $tmp/run/ready ]] || sm_die "the ready file outlived the daemons"
"$python" "$SM_E2E/check_traces.py" "$tmp/trace" --dataset "$tmp/data" --epochs "$epochs" \
  --trainers $((nodes * per_node)) --trainers-per-node "$per_node" --batch-size "$batch"

sm_section "a trainer layout that does not match the daemons'"
# The trainers believe in 2 more tasks than the daemons serve.
# shellcheck disable=SC2016  # expanded by the wrapper when it runs
printf '#!/usr/bin/env bash\nexport SLURM_NTASKS=$((SLURM_NTASKS + %d))\nexec "%s" --epochs 1\n' \
  "$nodes" "$consume" >"$tmp/wrong.sh"
chmod +x "$tmp/wrong.sh"
rc=0
run_job "$tmp/wrong.log" "$tmp/wrong.sh" || rc=$?
((rc != 0)) || sm_die "a mismatched layout did not fail"
grep -q "trainer layout does not match the daemons'.*6 trainers.*from SLURM_PROCID.*2 nodes x service.trainers_per_node 2 = 4 trainers" \
  "$tmp/wrong.log" || { tail -n 20 "$tmp/wrong.log" >&2; sm_die "the layout error does not name both layouts"; }
grep -q 'received signal 15, shutting down' "$tmp/wrong.log" || sm_die "the daemons were not stopped after the failure"
echo "slurm check: PASS"
