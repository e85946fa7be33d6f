#!/usr/bin/env bash
# End-to-end test of shardmix-consume --lockstep (docs/decisions/0050): 2 daemons + 4
# trainers through deploy/launch.sh, rank 0 computing 4 ms per batch and the others none,
# on a dataset whose last batch is empty for two of the trainers. Expected: every sample
# exactly once per epoch (check_traces.py; the collective changes nothing in delivery), the
# job ends (the trainers with an empty last batch still join the collective), and no
# trainer began waiting for batch k+1 before every trainer had batch k (check_lockstep.py
# on the traces' batch times). The same job without --lockstep runs too and its drift is
# reported, not judged: free-running trainers may or may not run ahead. Last, a lockstep
# trainer SIGKILLed mid-epoch: the job ends, failed, instead of hanging in the collective.
#   tests/e2e/lockstep_e2e.sh [tcp|shm]
set -euo pipefail
SM_PROG=lockstep_e2e
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

e2e_init lockstep
provider=${1:-tcp} nodes=2 per_node=2 epochs=2 batch=8
trainers=$((nodes * per_node))
# 802 = 25 full steps of 4 x 8, then 2 left over: two trainers get 1 sample, two an empty batch.
e2e_gen_dataset 802 8 16 5
settings=(dataset.path="$tmp/data" batch.size="$batch" shuffle.seed=11 fabric.provider="$provider"
          service.trainers_per_node="$per_node" service.prefetch=4 log.level=info)
if [[ $provider == tcp ]]; then settings+=(fabric.interface=lo); fi
sm_write_config "$tmp/c.toml" "${settings[@]}"

# One slow trainer: free-running, the others would run ahead of it by up to the prefetch.
cat >"$tmp/uneven.sh" <<'TRAINER'
#!/usr/bin/env bash
compute_ms=0
[[ ${OMPI_COMM_WORLD_RANK:-0} == 0 ]] && compute_ms=4
exec "$@" --compute-ms "$compute_ms"
TRAINER

run_job() { # TRACE_DIR LOG [CONSUME_ARG...]
  local trace=$1 log=$2
  shift 2
  e2e_launch_or_die 240 "$log" --nodes "$nodes" --config "$tmp/c.toml" --trainers-per-node "$per_node" \
    -- bash "$tmp/uneven.sh" "$consume" --epochs "$epochs" --trace "$trace" "$@"
}

sm_section "lockstep: $nodes daemons ($provider), $trainers trainers, $epochs epochs, batch $batch"
run_job "$tmp/lockstep" "$tmp/daemons-lockstep.log" --lockstep
"$python" "$SM_E2E/check_traces.py" "$tmp/lockstep" --dataset "$tmp/data" --epochs "$epochs" \
  --trainers "$trainers" --trainers-per-node "$per_node" --batch-size "$batch" --expect-peer
empty=$(cat "$tmp"/lockstep/empty-rank-*.csv | grep -vc '^epoch' || true)
((empty == 2 * epochs)) || sm_die "expected 2 empty last batches per epoch, the trainers listed $empty in $epochs epochs" 1
"$python" "$SM_E2E/check_lockstep.py" "$tmp/lockstep" --trainers "$trainers" --expect-in-step

sm_section "free-running, for comparison (reported, not judged)"
run_job "$tmp/free" "$tmp/daemons-free.log"
"$python" "$SM_E2E/check_lockstep.py" "$tmp/free" --trainers "$trainers"

# A trainer SIGKILLed mid-epoch must not leave the others waiting in the collective for
# ever: mpirun sees the rank die and ends the job, which fails (and not by our timeout).
sm_section "lockstep, trainer rank 1 SIGKILLed mid-epoch: the job must end, failed"
cat >"$tmp/victim.sh" <<'TRAINER'
#!/usr/bin/env bash
# After exec, $$ is the trainer itself.
[[ ${OMPI_COMM_WORLD_RANK:-0} == 1 ]] && { sleep 0.5; kill -KILL $$; } &
exec "$@" --compute-ms 20
TRAINER
rc=0
e2e_launch 120 "$tmp/daemons-killed.log" --nodes "$nodes" --config "$tmp/c.toml" --trainers-per-node "$per_node" \
  -- bash "$tmp/victim.sh" "$consume" --epochs "$epochs" --lockstep >"$tmp/killed.out" 2>&1 || rc=$?
# launch.sh's own line, not only its status: mpirun reports the SIGKILL as 137, which
# timeout's -k would give too.
if ((rc == 124)) || ! grep -Eq 'trainers finished in .* with exit code [1-9]' "$tmp/killed.out"; then
  cat "$tmp/killed.out" >&2
  sm_die "after trainer rank 1 was killed the job hung or succeeded (launch.sh exit code $rc)" 1
fi
echo "a killed trainer ended the job: launch.sh exit code $rc"
