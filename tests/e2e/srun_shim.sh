#!/usr/bin/env bash
# A stand-in for Slurm's srun on a machine without Slurm, for tests/e2e/slurm_e2e.sh:
# runs the command as --ntasks ranks with mpirun, and gives each rank the variables a
# real srun step would (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NNODES, SLURM_STEP_ID),
# taking OMPI_COMM_WORLD_* away from the non-MPI ranks so that the trainers really go by
# the Slurm variables. --nodes N emulates N nodes on this one host (tasks in blocks).
# Other srun options are accepted and ignored. SIGTERM/SIGINT go to mpirun, which
# forwards them to the ranks, as srun does.
set -euo pipefail
nodes=1 ntasks=1 per_node=""
while (($#)); do
  case $1 in
    --nodes=*) nodes=${1#*=}; shift ;;
    --ntasks=*) ntasks=${1#*=}; shift ;;
    --ntasks-per-node=*) per_node=${1#*=}; shift ;;
    --*=*) shift ;;
    --*) shift ;;
    *) break ;;
  esac
done
per_node=${per_node:-$(((ntasks + nodes - 1) / nodes))}
# mpirun and its flags as the other tests use them (deploy/lib.sh).
mpirun_cmd=${SHARDMIX_MPIRUN:-mpirun}
# shellcheck disable=SC2206  # flags given as one string
flags=(${SHARDMIX_MPIRUN_FLAGS:---allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader})
# Test and script knobs must not reach shardmixd, which refuses unknown SHARDMIX_* names
# (mpirun hands its whole environment to the ranks).
while IFS= read -r name; do
  unset "$name"
done < <(compgen -e | grep -E '^SHARDMIX_(BUILD_DIR|READY_TIMEOUT|STOP_TIMEOUT|DAEMON_CMD|MPIRUN|MPIRUN_FLAGS|DAEMON_MPI_ARGS|TRAINER_MPI_ARGS|PYTHON|E2E_[A-Z0-9_]*|DEMO_[A-Z0-9_]*)$' || true)
export SHARDMIX_SRUN_SHIM_NODES=$nodes SHARDMIX_SRUN_SHIM_PER_NODE=$per_node
exports=()
while IFS= read -r name; do exports+=(-x "$name"); done < <(compgen -e | grep -E '^(SHARDMIX_|FI_|SLURM_)' || true)
# shellcheck disable=SC2016  # expanded by each rank's bash
"$mpirun_cmd" "${flags[@]}" "${exports[@]}" -np "$ntasks" bash -c '
  r=$OMPI_COMM_WORLD_RANK
  export SLURM_PROCID=$r SLURM_NTASKS=$OMPI_COMM_WORLD_SIZE SLURM_NNODES=$SHARDMIX_SRUN_SHIM_NODES
  export SLURM_LOCALID=$((r % SHARDMIX_SRUN_SHIM_PER_NODE)) SLURM_NODEID=$((r / SHARDMIX_SRUN_SHIM_PER_NODE))
  unset SHARDMIX_SRUN_SHIM_NODES SHARDMIX_SRUN_SHIM_PER_NODE
  case $(basename -- "$1") in
    shardmixd) ;;  # an MPI program: keeps Open MPI'"'"'s variables
    *) unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE ;;
  esac
  exec "$@"' srun-shim "$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null' TERM INT
rc=0
wait "$pid" || rc=$?
# wait returns early when a trapped signal arrives: wait for mpirun itself.
while kill -0 "$pid" 2>/dev/null; do wait "$pid" || rc=$?; done
exit "$rc"
