#!/usr/bin/env bash
# The Python binding in a real job (ctest: python_binding_in_job). 2 shardmixd daemons
# (tcp over loopback), 1 trainer per node, a small generated dataset:
#   1. shardmix-consume (the C++ client) traces epochs 0-1;
#   2. the same config and seed again, with tests/python/test_binding.py as the trainers:
#      every rank compares its ids, labels and bytes (XXH64) with the C++ trace and checks
#      zero-copy, release, strict mode, statistics, shardmix.torch and errors;
#   3. tests/python/test_interrupt.py as the trainers of a job whose batches wait 8 s for
#      storage: a SIGINT after 1 s raises KeyboardInterrupt out of the wait.
# Env: SHARDMIX_BUILD_DIR (default <repo>/build), SHARDMIX_PYTHON (default /usr/bin/python3
# if present, else python3): the interpreter the module was built for. Temp files go in one
# dir, removed at the end (SHARDMIX_E2E_KEEP=1 keeps it).
set -euo pipefail

SM_PROG=run_python_tests
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=tests/e2e/lib.sh
source "$here/../e2e/lib.sh"

build=$(sm_build_dir)
py=${SHARDMIX_PYTHON:-}
if [[ -z $py ]]; then
  if [[ -x /usr/bin/python3 ]]; then py=/usr/bin/python3; else py=$(command -v python3); fi
fi
[[ -d $build/python/shardmix ]] || sm_die "$build/python/shardmix not built (cmake --build $build)"

nodes=2 per_node=1 q=0.5 seed=4242
e2e_init py
e2e_gen_dataset 300 6 4 3
sm_write_config "$tmp/job.toml" dataset.path="$tmp/data" batch.size=8 batch.drop_last=false shuffle.seed="$seed" \
  shuffle.exchange_fraction="$q" fabric.provider=tcp fabric.interface=lo service.trainers_per_node="$per_node" \
  service.prefetch=3

run() { # LOG -- COMMAND...   (the config: $run_config, default job.toml)
  local log=$1
  shift
  e2e_launch 100 "$log" --nodes "$nodes" --config "${run_config:-$tmp/job.toml}" "$@"
}
sm_section "reference: the C++ client (shardmix-consume), epochs 0-1"
run "$tmp/daemons-cpp.log" -- "$consume" --epochs 2 --trace "$tmp/ref" >/dev/null ||
  { cat "$tmp/daemons-cpp.log" >&2; sm_die "the reference job failed"; }

sm_section "the Python binding as the trainers ($py)"
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1
export SMX_TEST_REF=$tmp/ref SMX_TEST_DATA=$tmp/data SMX_TEST_Q=$q
SHARDMIX_TRAINER_MPI_ARGS="--tag-output -x PYTHONPATH -x PYTHONDONTWRITEBYTECODE" \
  run "$tmp/daemons-py.log" -- "$py" "$here/test_binding.py" ||
  { tail -n 30 "$tmp/daemons-py.log" >&2; sm_die "the binding's tests failed"; }
echo "python binding: every rank passed"

# 3. Ctrl-C while the trainers wait: every batch waits for cold reads held 8 s each
#    (inject.storage_delay), and each trainer sends itself SIGINT after 1 s: the
#    KeyboardInterrupt must come out of the wait, before any batch (decision 0036).
sm_section "Ctrl-C while a trainer waits for a batch"
sed -e 's/^exchange_fraction = .*/exchange_fraction = 1.0/' "$tmp/job.toml" >"$tmp/slow.toml"
cat >>"$tmp/slow.toml" <<TOML
[cache]
capacity = 100000
[inject]
storage_delay = "8s"
TOML
run_config=$tmp/slow.toml SHARDMIX_TRAINER_MPI_ARGS="--tag-output -x PYTHONPATH -x PYTHONDONTWRITEBYTECODE" \
  run "$tmp/daemons-interrupt.log" -- "$py" "$here/test_interrupt.py" ||
  { tail -n 30 "$tmp/daemons-interrupt.log" >&2; sm_die "Ctrl-C did not interrupt a trainer's wait"; }
echo "python binding: Ctrl-C interrupts the wait on every rank"
