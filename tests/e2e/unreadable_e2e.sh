#!/usr/bin/env bash
# End-to-end bad input while serving: files of the dataset vanish after the
# daemons have scanned and loaded it, with half the dataset cold (read from storage every
# epoch). Two runs over the same dataset and files:
#  - dataset.strict = false (the default): every trainer finishes every epoch; the cold
#    samples whose files vanished are skipped and reported (Batch::skipped, the trace's
#    skipped-rank-R.csv, EpochStats unreadable_samples, a daemon warning naming the file);
#    the vanished samples that are cached in RAM are still delivered, from RAM; per epoch,
#    delivered plus skipped is the dataset, each sample once (check_traces.py --skipped,
#    bytes verified against the files, put back for the check); the daemons stay up and exit
#    cleanly.
#  - dataset.strict = true: a trainer that meets such a sample fails with an error naming
#    its file; the daemons stay up (the other trainers are not failed by it).
#   tests/e2e/unreadable_e2e.sh
set -euo pipefail
SM_PROG=unreadable_e2e
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

nodes=2 per_node=1 epochs=2 batch=8
trainers=$((nodes * per_node))
e2e_init unreadable
e2e_gen_dataset 400 4 4 9
total=$(find "$tmp/data" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
capacity=$((total / (2 * nodes)))  # half the dataset is cold
# Every 8th file, by sorted path, vanishes once the daemons have loaded.
find "$tmp/data" -type f -printf '%P\n' | LC_ALL=C sort | awk 'NR % 8 == 1' >"$tmp/vanish.list"

write_config() { # STRICT
  sm_write_config "$tmp/c.toml" dataset.path="$tmp/data" dataset.strict="$1" batch.size="$batch" \
    shuffle.seed=31 cache.capacity="$capacity" fabric.provider=tcp fabric.interface=lo \
    service.trainers_per_node="$per_node" service.prefetch=3
}
# run_trainers DAEMON_LOG TRACE_DIR: the job with $tmp/c.toml; returns its exit status.
run_trainers() {
  e2e_launch 200 "$1" --nodes "$nodes" --config "$tmp/c.toml" --trainers-per-node "$per_node" \
    -- bash "$tmp/trainer.sh" "$consume" "$tmp" "$epochs" "$2"
}

# Runs once per trainer rank under launch.sh (the daemons are ready): rank 0 moves the
# listed files out of the dataset, then marks it; every rank waits for the mark before it
# consumes, so no read of this job happens before the files are gone.
cat >"$tmp/trainer.sh" <<'TRAINER'
#!/usr/bin/env bash
set -uo pipefail
consume=$1 tmp=$2 epochs=$3 trace=$4
if [[ ${OMPI_COMM_WORLD_RANK:-0} == 0 ]]; then
  while IFS= read -r f; do
    mkdir -p "$tmp/gone/$(dirname -- "$f")"
    mv -- "$tmp/data/$f" "$tmp/gone/$f"
  done <"$tmp/vanish.list"
  touch "$tmp/vanished"
fi
for ((i = 0; i < 600; i++)); do [[ -e $tmp/vanished ]] && break; sleep 0.1; done
[[ -e $tmp/vanished ]] || { echo "trainer: the files never vanished" >&2; exit 1; }
exec "$consume" --epochs "$epochs" --trace "$trace"
TRAINER

put_back() {
  [[ -d $tmp/gone ]] || return 0
  (cd "$tmp/gone" && find . -type f -print0 | while IFS= read -r -d '' f; do
    mkdir -p "$tmp/data/$(dirname -- "$f")"
    mv -- "$f" "$tmp/data/$f"
  done)
  rm -rf "$tmp/gone" "$tmp/vanished"
}

sm_section "dataset.strict = false: vanished cold samples are skipped and counted"
write_config false
rc=0
run_trainers "$tmp/daemons.log" "$tmp/trace" >"$tmp/trainers.out" 2>&1 || rc=$?
put_back
cat "$tmp/trainers.out"
if ((rc != 0)); then
  tail -30 "$tmp/daemons.log" >&2
  sm_die "the job failed (exit $rc) although dataset.strict = false" 1
fi
"$python" "$SM_E2E/check_traces.py" "$tmp/trace" --dataset "$tmp/data" --epochs "$epochs" \
  --trainers "$trainers" --trainers-per-node "$per_node" --batch-size "$batch" --allow-storage --skipped
"$python" - "$tmp" "$epochs" <<'PY'
import csv, glob, re, sys
tmp, epochs = sys.argv[1], int(sys.argv[2])
vanished = set(open(f"{tmp}/vanish.list").read().split("\n")) - {""}
skipped, delivered_vanished = {}, {}
for path in glob.glob(f"{tmp}/trace/skipped-rank-*.csv"):
    for row in csv.DictReader(open(path)):
        skipped.setdefault(int(row["epoch"]), set()).add(row["path"])
for path in glob.glob(f"{tmp}/trace/rank-*.csv"):
    for row in csv.DictReader(open(path)):
        if row["path"] in vanished:
            delivered_vanished.setdefault(int(row["epoch"]), []).append((row["path"], row["tier"]))
log = open(f"{tmp}/daemons.log").read()
problems = []
for e in range(epochs):
    s = skipped.get(e, set())
    if not s:
        problems.append(f"epoch {e}: nothing skipped, though {len(vanished)} files vanished and half the dataset is cold")
    if not s <= vanished:
        problems.append(f"epoch {e}: skipped samples whose files did not vanish: {sorted(s - vanished)[:5]}")
    for path, tier in delivered_vanished.get(e, []):
        if tier == "storage":
            problems.append(f"epoch {e}: {path} vanished but was delivered from storage")
    # Every vanished file is either skipped (cold) or delivered from RAM (resident).
    covered = s | {p for p, _ in delivered_vanished.get(e, [])}
    if covered != vanished:
        problems.append(f"epoch {e}: vanished files neither skipped nor delivered: {sorted(vanished - covered)[:5]}")
    # The same cold samples each epoch (static residency).
    if e > 0 and s != skipped.get(0, set()):
        problems.append(f"epoch {e}: skipped another set than epoch 0")
    stats = sum(int(m) for m in re.findall(rf"rank \d+ epoch {e}: .*; (\d+) unreadable samples skipped", open(f"{tmp}/trainers.out").read()))
    if stats != len(s):
        problems.append(f"epoch {e}: the trainers' epoch statistics count {stats} unreadable samples, the traces {len(s)}")
    # Warned when delivered (not when read ahead), once each: as many as the traces skipped.
    warned = len(re.findall(rf"skipping sample \d+ in epoch {e} \(dataset.strict = false\)", log))
    if warned != len(s):
        problems.append(f"epoch {e}: {warned} daemon warnings for {len(s)} skipped samples")
for path in sorted(skipped.get(0, set()))[:3]:
    if not re.search(r"skipping sample \d+ in epoch 0 \(dataset.strict = false\): .*" + re.escape(path), log):
        problems.append(f"no daemon warning names {path}")
if "unreadable this epoch" not in log:
    problems.append("no epoch summary counts unreadable samples")
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"skipped per epoch: {[len(skipped.get(e, ())) for e in range(epochs)]} of {len(vanished)} vanished files; "
      f"the rest delivered from RAM")
PY
clean=$(grep -c "bytes read from peers" "$tmp/daemons.log" || true)
((clean == nodes)) || sm_die "only $clean of $nodes daemons exited cleanly after skipping" 1

sm_section "dataset.strict = true: the trainer that meets one fails, naming the file"
write_config true
rm -rf "$tmp/trace-strict"
rc=0
run_trainers "$tmp/daemons-strict.log" "$tmp/trace-strict" >"$tmp/strict.out" 2>&1 || rc=$?
put_back
cat "$tmp/strict.out"
((rc != 0)) || sm_die "every trainer finished although dataset.strict = true and files vanished" 1
grep -q "shardmix-consume: .*reading cold sample [0-9]* from storage: $tmp/data/.*" "$tmp/strict.out" ||
  sm_die "no trainer error names the vanished file" 1
if grep -q "skipping sample" "$tmp/daemons-strict.log"; then sm_die "a strict daemon skipped a sample" 1; fi
clean=$(grep -c "bytes read from peers" "$tmp/daemons-strict.log" || true)
((clean == nodes)) || sm_die "only $clean of $nodes daemons exited cleanly after failing a trainer" 1
echo "unreadable_e2e: PASS"
