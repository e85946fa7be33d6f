#!/usr/bin/env bash
# End-to-end checkpoint and resume (docs/decisions/0022). A job of 4 daemons x 1 trainer
# runs part of epoch 1: each trainer saves a checkpoint after 2 + rank batches and exits at
# once (as if killed). Then:
#   same:   the job restarts with the same world size; each trainer resumes from its own
#           blob, finishes epoch 1 and runs epoch 2;
#   redeal: the job restarts as 3 daemons x 2 trainers with resume.checkpoint_dir; the
#           daemons re-deal the rest of epoch 1 to the 6 trainers, which then run epoch 2.
# Judged by check_resume.py from the traces of both halves: every sample of epoch 1 exactly
# once, equal batch counts, bytes verified on disk; epoch 2 exactly once.
# SHARDMIX_E2E_METADATA=owner: both jobs with dataset.metadata = "owner" (spread placement):
# the daemons resume the trainers' blobs, or re-deal the epoch, without a global catalog.
#   tests/e2e/resume_e2e.sh same|redeal [tcp|shm]
set -euo pipefail
SM_PROG=resume_e2e
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

mode=${1:-same}
provider=${2:-tcp}
[[ $mode == same || $mode == redeal ]] || sm_die "mode must be same or redeal, got '$mode'" 2
metadata=${SHARDMIX_E2E_METADATA:-global}
metadata_settings=()
if [[ $metadata == owner ]]; then metadata_settings=(dataset.placement=spread dataset.metadata=owner); fi
batch=8 epoch=1
e2e_init resume
e2e_gen_dataset 800 8 16 5
sm_write_config "$tmp/c.toml" dataset.path="$tmp/data" batch.size="$batch" shuffle.seed=91 \
  shuffle.exchange_fraction=0.5 shuffle.window=4 fabric.provider="$provider" service.prefetch=3 "${metadata_settings[@]}"

# Each trainer checkpoints after 2 + rank batches, so the old ranks stop at different points.
cat >"$tmp/first.sh" <<'FIRST'
#!/usr/bin/env bash
set -euo pipefail
rank=${OMPI_COMM_WORLD_RANK:?}
exec "$1" --first-epoch "$2" --epochs 1 --trace "$3/trace-before" --checkpoint-dir "$3/ckpt" \
  --checkpoint-after $((2 + rank)) --compute-ms 1
FIRST

run() {  # nodes per_node log -- trainer command...
  local nodes=$1 per_node=$2 log=$3
  shift 4
  e2e_launch_or_die 240 "$log" --nodes "$nodes" --config "$tmp/c.toml" --trainers-per-node "$per_node" \
    "${extra[@]}" -- "$@"
}

extra=()
run 4 1 "$tmp/before.log" -- bash "$tmp/first.sh" "$consume" "$epoch" "$tmp"
n=$(find "$tmp/ckpt" -name 'rank-*.ckpt' | wc -l)
((n == 4)) || sm_die "expected 4 checkpoints, found $n" 1

if [[ $mode == same ]]; then
  run 4 1 "$tmp/after.log" -- "$consume" --resume-dir "$tmp/ckpt" --epochs 2 --trace "$tmp/trace-after"
  grep -q "trainer rank 3 resumes epoch $epoch after 5 batches" "$tmp/after.log" ||
    sm_die "the daemons did not resume trainer rank 3 from its checkpoint" 1
  "$python" "$SM_E2E/check_resume.py" --dataset "$tmp/data" --epoch "$epoch" --batch-size "$batch" \
    --before "$tmp/trace-before" --before-trainers 4 --after "$tmp/trace-after" --after-trainers 4 --later 1
else
  extra=(--set "resume.checkpoint_dir=$tmp/ckpt")
  run 3 2 "$tmp/after.log" -- "$consume" --resume-dir "$tmp/ckpt" --epochs 2 --trace "$tmp/trace-after"
  grep -q "resume: epoch $epoch re-dealt from 4 checkpoints" "$tmp/after.log" ||
    sm_die "the daemons did not re-deal epoch $epoch" 1
  "$python" "$SM_E2E/check_resume.py" --dataset "$tmp/data" --epoch "$epoch" --batch-size "$batch" \
    --before "$tmp/trace-before" --before-trainers 4 --after "$tmp/trace-after" --after-trainers 6 \
    --redealt --later 1
fi
echo "resume_e2e $mode: PASS"
