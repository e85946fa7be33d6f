#!/usr/bin/env bash
# End-to-end checks of README promises that unit tests alone covered before: real
# shardmixd daemons through deploy/launch.sh, shardmix-consume trainers, and independent
# checkers (check_traces.py, check_min_entropy.py, check_overtake.py). One case a call:
#   drop_last     batch.drop_last = true; 1006 samples for 8 trainers x 8: a leftover of
#                 46 every epoch; 3 epochs of equal counts of full batches, no sample
#                 twice, exactly 46 missing, a different 46 each epoch, and a different
#                 share of them from each node's samples.
#   empty_batch   drop_last = false; 965 samples = 15 x 64 + 5: 3 of the 8 trainers get
#                 an empty last batch each epoch. The trace lists it (empty-rank-R.csv)
#                 and check_traces.py counts it; exactly 3 per epoch.
#   min_entropy   placement "sorted" (a node holds 2 of the 8 classes), min_entropy 0.6
#                 under the ceiling exchange_fraction 1.0: every epoch the daemons pick
#                 some Q < 1, and the label entropy measured on the delivered batches is
#                 >= 0.6 and is the planned figure they logged.
#   min_entropy_unreachable  the same with the floor 0.95 and the ceiling 0.05: each
#                 daemon warns every epoch and uses 0.05; the delivered entropy is below
#                 the floor and is the one logged.
#   overtake      daemon rank 1 serves every read 5 ms late (inject.slow_peer_rank): with
#                 W = 0 the delivery is exactly that of a run without the slow peer; with
#                 W = 64 some sample is delivered while one planned before it is not yet,
#                 and every sample stays inside its window.
#   other_user    uid 65534 runs a trainer against the daemons' run dir (0700, root's):
#                 it must fail at once, naming the run dir and its owner, although
#                 SHARDMIX_CONNECT_TIMEOUT is 120 s (ctest's TIMEOUT is 60 s); the
#                 daemons' own trainer then runs an epoch.
#   tests/e2e/promises_e2e.sh CASE
# Builds nothing: shardmixd, shardmix-consume and shardmix-gen come from
# $SHARDMIX_BUILD_DIR (default <repo>/build) or PATH. SHARDMIX_E2E_KEEP=1 keeps the temp dir.
set -euo pipefail

SM_PROG=promises_e2e
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=deploy/lib.sh
source "$here/../../deploy/lib.sh"

case=${1:-}
nodes=4 per_node=2 batch=8 seed=20240611
trainers=$((nodes * per_node))
sm_require_exes shardmixd shardmix-consume shardmix-gen
consume=$(sm_find_exe shardmix-consume)
python=$(sm_python) || sm_die "python3 not found"
trainer=("$consume")  # the trainer command job() runs, before its --epochs and --trace
sm_unexport_tool_vars
sm_test_tmpdir promises
tmp=$SM_TMP

# dataset SAMPLES CLASSES: shardmix-gen's class folders in $tmp/data.
dataset() {
  "$(sm_find_exe shardmix-gen)" --out "$tmp/data" --samples "$1" --classes "$2" --median-kib 4 --seed 7 --quiet
}
# job NAME EPOCHS [--set K=V...]: the daemons and trainers of one run; the trace goes to
# $tmp/NAME, the daemons' log to $tmp/NAME.log.
job() {
  local name=$1 epochs=$2 rc=0
  shift 2
  cat >"$tmp/base.toml" <<TOML
[dataset]
path = "$tmp/data"
[batch]
size = $batch
[shuffle]
seed = $seed
[fabric]
provider = "tcp"
interface = "lo"
[service]
trainers_per_node = $per_node
TOML
  sm_section "$case: $name, $nodes daemons x $per_node trainers, $epochs epochs $*"
  # Our own deadline, below ctest's TIMEOUT, so that launch.sh's traps stop the daemons.
  timeout -s TERM -k 20 "${SHARDMIX_E2E_TIMEOUT:-200}" bash "$SM_REPO/deploy/launch.sh" --nodes "$nodes" \
    --config "$tmp/base.toml" --trainers-per-node "$per_node" --daemon-log "$tmp/$name.log" "$@" \
    -- "${trainer[@]}" --epochs "$epochs" --trace "$tmp/$name" || rc=$?
  ((rc == 0)) || { tail -n 20 "$tmp/$name.log" >&2; sm_die "$name: launch.sh failed with exit code $rc" 1; }
}
# traces NAME EPOCHS [check_traces.py flags...]: exactly once against the files.
traces() {
  "$python" "$here/check_traces.py" "$tmp/$1" --dataset "$tmp/data" --epochs "$2" --trainers "$trainers" \
    --trainers-per-node "$per_node" --batch-size "$batch" --json "$tmp/$1.json" "${@:3}"
}
# per_epoch NAME FIELD: that field of check_traces.py's per-epoch summary, one line each.
per_epoch() {
  "$python" -c 'import json, sys; [print(e[sys.argv[2]]) for e in json.load(open(sys.argv[1]))["per_epoch"]]' \
    "$tmp/$1.json" "$2"
}
# entropy NAME EPOCHS FLOOR CEILING [--unreachable]
entropy() {
  "$python" "$here/check_min_entropy.py" "$tmp/$1" --log "$tmp/$1.log" --daemons "$nodes" --epochs "$2" \
    --classes 8 --floor "$3" --ceiling "$4" "${@:5}"
}

case $case in
  drop_last)
    dataset 1006 10
    job run 3 --set batch.drop_last=true
    traces run 3 --drop-last --expect-peer
    # 1006 = 15 x 64 + 46: the checker counted 960 delivered, so exactly 46 missing.
    [[ $(per_epoch run delivered | sort -u) == 960 ]] || sm_die "not 960 samples delivered every epoch" 1
    # The leftover is drawn afresh: how many each node's samples lose changes between epochs.
    by_owner=$(per_epoch run dropped_by_owner)
    echo "dropped samples by owner node, per epoch:"$'\n'"$by_owner"
    (($(sort -u <<<"$by_owner" | wc -l) > 1)) || sm_die "every epoch dropped the same count from each node" 1
    ;;
  empty_batch)
    dataset 965 10
    job run 2 --set batch.drop_last=false
    traces run 2 --expect-peer
    # The last step's 5 samples go to 5 of the 8 trainers: 3 empty last batches.
    [[ $(per_epoch run empty_batches | sort -u) == 3 ]] ||
      sm_die "expected 3 empty batches every epoch, counted: $(per_epoch run empty_batches | tr '\n' ' ')" 1
    ;;
  min_entropy)
    dataset 1600 8
    job run 2 --set dataset.placement=sorted --set shuffle.exchange_fraction=1.0 --set shuffle.min_entropy=0.6
    traces run 2
    entropy run 2 0.6 1.0
    ;;
  min_entropy_unreachable)
    dataset 1600 8
    job run 2 --set dataset.placement=sorted --set shuffle.exchange_fraction=0.05 --set shuffle.min_entropy=0.95
    traces run 2
    entropy run 2 0.95 0.05 --unreachable
    ;;
  overtake)
    dataset 1006 10
    slow=(--set inject.slow_peer_rank=1 --set inject.slow_peer_delay=5ms)
    job planned 2 --set shuffle.window=0
    job slow_w0 2 --set shuffle.window=0 "${slow[@]}"
    job slow_w64 2 --set shuffle.window=64 "${slow[@]}"
    for name in planned slow_w0 slow_w64; do traces "$name" 2 --expect-peer; done
    "$python" "$here/check_overtake.py" "$tmp/planned" "$tmp/slow_w0" --window 0 --expect-same-order
    "$python" "$here/check_overtake.py" "$tmp/planned" "$tmp/slow_w64" --window 64 --expect-overtake
    ;;
  other_user)
    command -v setpriv >/dev/null 2>&1 || sm_die "setpriv (util-linux) not found: cannot run a trainer as uid 65534"
    if (($(id -u) != 0)); then
      echo "not root: cannot start a trainer of another user (uid 65534)"
      exit 77
    fi
    dataset 200 4
    # uid 65534 cannot enter the build tree everywhere: it runs a copy of the trainer.
    mkdir -m 755 "$tmp/bin"
    chmod 755 "$tmp"
    cp "$consume" "$tmp/bin/"
    # Trainer rank 0 first runs the same trainer as uid 65534 against this job's run dir.
    cat >"$tmp/trainer.sh" <<EOF
#!/usr/bin/env bash
if [[ \$OMPI_COMM_WORLD_RANK == 0 ]]; then
  rc=0
  setpriv --reuid=65534 --regid=65534 --clear-groups env SHARDMIX_CONNECT_TIMEOUT=120 \\
    "$tmp/bin/shardmix-consume" --epochs 1 >"$tmp/other-user.out" 2>&1 || rc=\$?
  echo "\$SHARDMIX_RUN_DIR \$rc" >"$tmp/other-user.rc"
fi
exec "$consume" "\$@"
EOF
    nodes=1 per_node=1 trainer=(bash "$tmp/trainer.sh")
    SHARDMIX_E2E_TIMEOUT=35 job run 1
    read -r run_dir rc <"$tmp/other-user.rc"
    cat "$tmp/other-user.out"
    ((rc != 0)) || sm_die "the trainer of uid 65534 did not fail" 1
    want="uid 65534 may not enter the run dir $run_dir (owned by uid 0"
    grep -qF -- "$want" "$tmp/other-user.out" || sm_die "its error does not say: $want" 1
    echo "refused at once: $want"
    ;;
  *) sm_die "usage: $0 drop_last|empty_batch|min_entropy|min_entropy_unreachable|overtake|other_user" 2 ;;
esac
