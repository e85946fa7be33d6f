#!/usr/bin/env bash
# MPMD example: the daemons and the trainers in ONE mpirun, one app context each:
#
#   mpirun -np N shardmixd --config FILE : -np N*P shardmix-mpmd-trainer -- TRAINER ARGS
#
#   deploy/mpmd.sh --nodes N --trainers-per-node P --config FILE [--set k=v ...] -- TRAINER [ARGS...]
#
# What makes this work (docs/operations.md, "MPMD"):
#  - the daemons build their communicator from their own app context only
#    (MPI_Comm_create_group over OMPI_APP_CTX_NUM_PROCS), so trainer ranks never take part
#    in the daemons' collectives;
#  - Open MPI 4.1 requires every process of the job to call MPI_Init/MPI_Finalize:
#    shardmix-mpmd-trainer does it for a non-MPI trainer, and stops the daemons of its host
#    once every trainer has exited, which ends the job;
#  - the trainers start with the daemons and wait for RUN_DIR/ready (SHARDMIX_CONNECT_TIMEOUT);
#    their rank counts only the trainer app's processes.
# On a cluster, map each app context (one daemon per node, P trainers per node, same node
# order) and use a node-local SHARDMIX_RUN_DIR; here SHARDMIX_MPIRUN_FLAGS and
# SHARDMIX_BUILD_DIR work as for launch.sh. Exit status: mpirun's.
set -euo pipefail

SM_PROG=mpmd
# shellcheck source=deploy/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

nodes="" per_node=1 config="" sets=()
while (($#)); do
  case $1 in
    --nodes) nodes=${2:?}; shift 2 ;;
    --trainers-per-node) per_node=${2:?}; shift 2 ;;
    --config) config=${2:?}; shift 2 ;;
    --set) sets+=(--set "${2:?}"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) sm_die "unknown argument '$1' (see --help)" 2 ;;
  esac
done
(($#)) || sm_die "no trainer command (put it after --)" 2
if ! sm_is_uint "$nodes" || ((nodes == 0)); then sm_die "--nodes must be a positive integer" 2; fi
if ! sm_is_uint "$per_node" || ((per_node == 0)); then sm_die "--trainers-per-node must be a positive integer" 2; fi
[[ -r $config ]] || sm_die "config file '$config' not found" 2

daemon=$(sm_find_exe shardmixd) || sm_die "shardmixd not found; build it or set SHARDMIX_BUILD_DIR"
wrapper=$(sm_find_exe shardmix-mpmd-trainer) || sm_die "shardmix-mpmd-trainer not found"
sm_mpirun_init

export SHARDMIX_RUN_DIR=${SHARDMIX_RUN_DIR:-/tmp/shardmix-$(id -u)}
mkdir -p -- "$SHARDMIX_RUN_DIR"
chmod 0700 -- "$SHARDMIX_RUN_DIR"
rm -f -- "$SHARDMIX_RUN_DIR/ready"  # a stale one would let trainers start too early
SHARDMIX_JOB_TOKEN=${SHARDMIX_JOB_TOKEN:-$(sm_job_token)}  # docs/security.md
export SHARDMIX_JOB_TOKEN
sm_unexport_tool_vars
export_args=()
while IFS= read -r name; do export_args+=(-x "$name"); done < <(compgen -e | grep -E '^(SHARDMIX_|FI_)' || true)

sm_log "$nodes daemon(s) and $((nodes * per_node)) trainer(s) in one mpirun; run dir $SHARDMIX_RUN_DIR"
exec "$SM_MPIRUN" "${SM_MPIRUN_FLAGS[@]}" "${export_args[@]}" \
  -np "$nodes" "$daemon" --config "$config" --set "service.trainers_per_node=$per_node" "${sets[@]}" : \
  -np "$((nodes * per_node))" "$wrapper" -- "$@"
