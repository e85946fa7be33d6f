#!/usr/bin/env bash
# End-to-end test: 4 shardmixd daemons + trainers over a small generated dataset with
# awkward file names (spaces, unicode, comma/quote/newline, zero bytes, nested dirs, a
# hidden file that must be skipped); two epochs traced; check_traces.py judges
# exactly-once delivery, bytes and XXH64 against the files, labels, tiers.
#
#   tests/e2e/run_e2e.sh PROVIDER        PROVIDER: tcp | shm | verbs | auto
#
# Builds nothing: takes shardmixd, shardmix-consume and shardmix-gen from
# $SHARDMIX_BUILD_DIR (default <repo>/build) or PATH. Everything it writes lives in one
# temp dir, removed at the end (SHARDMIX_E2E_KEEP=1 keeps it for a post-mortem).
# Knobs: SHARDMIX_E2E_SAMPLES (default 1000), SHARDMIX_E2E_TRAINERS_PER_NODE (default 2),
# SHARDMIX_E2E_TIMEOUT (seconds for the whole run, default 240; stays under ctest's 300),
# SHARDMIX_E2E_WINDOW (shuffle.window, default 0), SHARDMIX_E2E_MIN_ENTROPY (shuffle.min_entropy,
# default 0), SHARDMIX_E2E_SLOW_PEER (a daemon rank
# whose fetches are delayed 5 ms, so that a window has stragglers to overtake; default none),
# SHARDMIX_E2E_REPEAT=1 (run the job twice and require byte-identical traces: W = 0 only),
# SHARDMIX_E2E_CAPACITY_FACTOR=F (storage tier: cache.capacity per node = dataset bytes /
# (F x nodes), so the dataset is F times the nodes' total capacity; then the samples served
# from storage must be exactly the cold ones the daemons report, the same ones every epoch,
# and their bytes what the capacity predicts; default 0 = no limit),
# SHARDMIX_E2E_STORAGE_DELAY (inject.storage_delay: each cold read holds its reader this
# long, so a window has late cold reads to overtake; default 0ms).
# SHARDMIX_E2E_ROTATION=K (cache.rotation_epochs, with a capacity factor: a new resident
# set every K epochs; then the storage-tier set must change between epochs, its size stay
# near the cold count, and every daemon must have reloaded; default 0 = static),
# SHARDMIX_E2E_REUSE_ROUNDS=R (cache.reuse_rounds, with a capacity factor: slots reused
# within the epoch, a generation per round, decision 0035; the storage-tier set must change
# between epochs and every daemon must have reloaded; default 0 = off),
# SHARDMIX_E2E_EPOCHS (default 2).
# SHARDMIX_E2E_PLACEMENT (dataset.placement, default balanced; spread: ownership as a
# function of the sample id, decision 0055).
# SHARDMIX_E2E_METADATA=owner (dataset.metadata, with spread and W = 0: owner-side metadata,
# decision 0063): the job runs owner-side, then once more with the global catalog; the two
# traces must be identical row for row, paths included (the owner-side daemons assemble the
# catalog the trainers ask for from the owners' shares, decision 0066), check_traces.py
# judges the owner-side run's against the files, and each owner-side daemon must report less
# catalog than a global one).
# SHARDMIX_E2E_UNEVEN_CAPACITY=1 (with a capacity factor: daemon rank r gets cache.capacity
# x (2 + r) / 2 through SHARDMIX_CACHE_CAPACITY, as nodes with different RAM would under
# the default "0.8"; delivery must stay byte-identical to the files; check_storage.py,
# which assumes one capacity, is skipped).
# SHARDMIX_E2E_FORMAT (folder | webdataset | tfrecord, default folder): the shard formats
# use shardmix-gen's tar / TFRecord shards of 64 samples with one damaged shard each (a tar
# cut in the middle of a member; a TFRecord with a flipped data byte and a cut last record):
# the damaged samples must be skipped, named in the daemons' log with file and offset,
# counted, and every valid sample delivered exactly once per epoch.
set -euo pipefail

SM_PROG=run_e2e
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

provider=${1:-}
case $provider in
  tcp | shm | verbs | auto) ;;
  *) sm_die "usage: $0 tcp|shm|verbs|auto" 2 ;;
esac

nodes=4
per_node=${SHARDMIX_E2E_TRAINERS_PER_NODE:-2}
samples=${SHARDMIX_E2E_SAMPLES:-1000}
batch=8
epochs=${SHARDMIX_E2E_EPOCHS:-2}
rotation=${SHARDMIX_E2E_ROTATION:-0}
reuse_rounds=${SHARDMIX_E2E_REUSE_ROUNDS:-0}
seed=20240611
timeout_s=${SHARDMIX_E2E_TIMEOUT:-240}
window=${SHARDMIX_E2E_WINDOW:-0}
min_entropy=${SHARDMIX_E2E_MIN_ENTROPY:-0}
slow_peer=${SHARDMIX_E2E_SLOW_PEER:--1}
repeat=${SHARDMIX_E2E_REPEAT:-0}
metadata=${SHARDMIX_E2E_METADATA:-global}
capacity_factor=${SHARDMIX_E2E_CAPACITY_FACTOR:-0}
readahead=8 # service.cold_readahead_batches
storage_delay=${SHARDMIX_E2E_STORAGE_DELAY:-0ms}
format=${SHARDMIX_E2E_FORMAT:-folder}
uneven_capacity=${SHARDMIX_E2E_UNEVEN_CAPACITY:-0}
case $format in
  folder | webdataset | tfrecord) ;;
  *) sm_die "SHARDMIX_E2E_FORMAT must be folder, webdataset or tfrecord, not '$format'" 2 ;;
esac
if ((repeat == 1 && window != 0)); then sm_die "SHARDMIX_E2E_REPEAT=1 needs SHARDMIX_E2E_WINDOW=0" 2; fi
if [[ $metadata == owner ]] && ((window != 0 || repeat == 1)); then
  sm_die "SHARDMIX_E2E_METADATA=owner needs SHARDMIX_E2E_WINDOW=0 and compares two runs itself (no REPEAT)" 2
fi
trainers=$((nodes * per_node))

e2e_init e2e
data=$tmp/data
trace=$tmp/trace

# ---------------------------------------------------------------- dataset
expect_problems=()  # shard formats: daemon log lines that must appear (file and offset)
if [[ $format == folder ]]; then
sm_section "dataset: $samples generated samples + odd names ($data)"
e2e_gen_dataset "$samples" 10 16 7
mapfile -t classes < <(find "$data" -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%f\n' | LC_ALL=C sort)
((${#classes[@]} >= 4)) || sm_die "shardmix-gen made ${#classes[@]} class dirs, expected 10"
c0=$data/${classes[0]} c1=$data/${classes[1]} c2=$data/${classes[2]} c3=$data/${classes[3]}
printf 'a sample whose name has spaces\n' >"$c0/name with spaces.bin"
printf 'unicode name\n' >"$c1/ünïcødé-数据-🙂.bin"
: >"$c2/zero-bytes.bin"
mkdir -p -- "$c3/nested/deeper"
head -c 40000 /dev/urandom >"$c3/nested/deeper/inner.bin"
printf 'commas and quotes need CSV quoting\n' >"$c0/comma,and\"quote.bin"
printf 'so does a newline\n' >"$c2/new"$'\n'"line.bin"
printf 'hidden: not a sample\n' >"$c1/.hidden.bin"
total=$((samples + 6))
echo "$total samples in ${#classes[@]} classes ($(du -sh -- "$data" | cut -f1))"
else
sm_section "dataset: $samples generated samples as $format shards of 64, one shard damaged ($data)"
e2e_gen_dataset "$samples" 10 16 7 --format "$format" --samples-per-shard 64
printf 'not a shard\n' >"$data/README.txt"
printf 'hidden: not a shard\n' >"$data/.hidden.$([[ $format == webdataset ]] && echo tar || echo tfrecord)"
# Damage one shard and print the log line each damage must produce (file and offset).
mapfile -t expect_problems < <("$python" - "$data" "$format" <<'PY'
import os, struct, sys, tarfile
data, fmt = sys.argv[1], sys.argv[2]
if fmt == "webdataset":
    shard = os.path.join(data, "shard_000003.tar")
    with tarfile.open(shard) as tf:
        m = [x for x in tf.getmembers() if x.isreg()][21]  # a member in the middle
    os.truncate(shard, m.offset_data + m.size // 2)  # cut inside its data
    print("%s: truncated tar: member '%s' (header at offset %d)" % (shard, m.name, m.offset))
else:
    shard = os.path.join(data, "shard_000002.tfrecord")
    buf = bytearray(open(shard, "rb").read())
    i = 0
    for _ in range(5):  # skip to record 5
        (n,) = struct.unpack_from("<Q", buf, i)
        i += 12 + n + 4
    buf[i + 12 + 7] ^= 0x40  # a data byte: the data CRC fails, the length CRC still holds
    open(shard, "wb").write(bytes(buf))
    print("%s: TFRecord record at offset %d: bad data CRC" % (shard, i))
    last = os.path.join(data, "shard_000005.tfrecord")
    buf = open(last, "rb").read()
    i = 0
    while True:  # find the last record
        (n,) = struct.unpack_from("<Q", buf, i)
        if i + 12 + n + 4 >= len(buf):
            break
        i += 12 + n + 4
    os.truncate(last, i + 12 + n // 2)
    print("%s: truncated TFRecord: record at offset %d" % (last, i))
PY
)
((${#expect_problems[@]} > 0)) || sm_die "could not damage a shard"
printf 'damaged: %s\n' "${expect_problems[@]}"
echo "$(find "$data" -name 'shard_*' | wc -l) shards ($(du -sh -- "$data" | cut -f1))"
fi
capacity=0
if ((capacity_factor > 0)); then
  dataset_bytes=$(find "$data" -type f ! -name '.*' -printf '%s\n' | awk '{ s += $1 } END { print s }')
  capacity=$((dataset_bytes / (capacity_factor * nodes)))
  echo "storage tier: dataset $dataset_bytes bytes = ${capacity_factor}x the total cache.capacity ($nodes x $capacity bytes)"
fi
if ((uneven_capacity == 1)); then
  ((capacity > 0)) || sm_die "SHARDMIX_E2E_UNEVEN_CAPACITY=1 needs SHARDMIX_E2E_CAPACITY_FACTOR" 2
  # Each daemon rank its own capacity (the environment overrides the TOML), so every daemon
  # must lay out each peer's arena from that peer's capacity, not its own.
  wrapper=$tmp/uneven-capacity-daemon.sh
  cat >"$wrapper" <<EOF
#!/usr/bin/env bash
rank=\${OMPI_COMM_WORLD_RANK:?not started by Open MPI}
export SHARDMIX_CACHE_CAPACITY=\$(( $capacity * (2 + rank) / 2 ))
exec $daemon "\$@"
EOF
  chmod +x "$wrapper"
  export SHARDMIX_DAEMON_CMD=$wrapper
  echo "uneven capacity: daemon rank r has $capacity x (2 + r) / 2 bytes"
fi

# ---------------------------------------------------------------- config
config=$tmp/e2e.toml
settings=(dataset.path="$data" dataset.format="$format" dataset.placement="${SHARDMIX_E2E_PLACEMENT:-balanced}")
if [[ $format == tfrecord ]]; then settings+=(dataset.label_feature=label); fi
settings+=(batch.size="$batch" batch.drop_last=false shuffle.seed="$seed" shuffle.exchange_fraction=1.0
           shuffle.window="$window" shuffle.min_entropy="$min_entropy")
if ((capacity > 0)); then
  settings+=(cache.capacity="$capacity" cache.rotation_epochs="$rotation" cache.reuse_rounds="$reuse_rounds")
fi
settings+=(fabric.provider="$provider")
if [[ $provider == tcp ]]; then settings+=(fabric.interface=lo); fi
settings+=(service.trainers_per_node="$per_node" service.prefetch=4 service.cold_readahead_batches="$readahead"
           inject.slow_peer_rank="$slow_peer" inject.slow_peer_delay=5ms inject.storage_delay="$storage_delay"
           log.level=info)
sm_write_config "$config" "${settings[@]}"
if [[ $metadata == owner ]]; then
  global_config=$tmp/e2e-global.toml
  sm_write_config "$global_config" "${settings[@]}"
  sm_write_config "$config" "${settings[@]}" dataset.metadata=owner
fi

# ---------------------------------------------------------------- run
run_job() { # TRACE_DIR LOG [CONFIG]
  e2e_launch_or_die "$timeout_s" "$2" --nodes "$nodes" --config "${3:-$config}" --trainers-per-node "$per_node" \
    -- "$consume" --epochs "$epochs" --trace "$1"
}
sm_section "run: $nodes daemons ($provider), $trainers trainers, $epochs epochs, batch $batch, window $window"
run_job "$trace" "$tmp/daemons.log"
if ((repeat == 1)); then
  sm_section "run again: window 0 must give byte-identical traces"
  run_job "$tmp/trace-again" "$tmp/daemons-again.log"
  # batch-rank-<R>.csv holds each batch's times, which differ from run to run.
  diff -r -q -x 'batch-rank-*.csv' -- "$trace" "$tmp/trace-again" ||
    sm_die "two runs with window = 0 delivered different traces" 1
  echo "traces identical: $(find "$trace" -name 'rank-*.csv' | wc -l) rank files"
fi
if [[ $metadata == owner ]]; then
  sm_section "run again with the global catalog: the same deliveries"
  run_job "$tmp/trace-global" "$tmp/daemons-global.log" "$global_config"
  e2e_python - "$trace" "$tmp/trace-global" "$tmp/daemons.log" "$tmp/daemons-global.log" "$nodes" "$min_entropy" <<'PY'
import csv, glob, os, re, sys
from e2e_verdict import finish
owner, global_, owner_log, global_log, nodes = sys.argv[1:6]
floor = float(sys.argv[6])
problems = []
def rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))
files = sorted(os.path.basename(p) for p in glob.glob(global_ + "/*.csv") if not os.path.basename(p).startswith("batch-"))
compared = 0
for name in files:
    mine, theirs = rows(os.path.join(owner, name)), rows(os.path.join(global_, name))
    compared += len(theirs)
    if mine != theirs:
        first = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        problems.append(f"{name}: owner-side and global runs differ at row {first} ({len(mine)} vs {len(theirs)} rows)")
pattern = r"metadata: rank=(\d+) samples=(\d+) catalog_bytes=(\d+) placement_bytes=(\d+)"
text = open(owner_log, encoding="utf-8", errors="replace").read()
o = {r: (int(c), int(p)) for r, _, c, p in re.findall(pattern, text)}
g = {r: (int(c), int(p)) for r, _, c, p in re.findall(pattern, open(global_log, encoding="utf-8", errors="replace").read())}
if len(o) != int(nodes) or len(g) != int(nodes):
    problems.append(f"metadata lines: {len(o)} owner-side, {len(g)} global, of {nodes} daemons")
for r in o:
    # A share of 1/nodes of the entries (plus the shard table and class names) against all of them.
    if r in g and not o[r][0] < g[r][0] / 2:
        problems.append(f"daemon {r}: owner-side catalog {o[r][0]} bytes, global {g[r][0]}: not below half")
# The entropy floor: every daemon's choice of each epoch, with the planned entropy it scored
# (owner-side from the class runs, decision 0065), as the global daemons' from every label.
choice = r"\[rank (\d+)\]\[service\] (epoch \d+: (?:shuffle\.min_entropy chose|no exchange_fraction).*)"
oc = sorted(re.findall(choice, text))
gc = sorted(re.findall(choice, open(global_log, encoding="utf-8", errors="replace").read()))
floor_note = ""
if floor > 0:
    if not gc:
        problems.append(f"shuffle.min_entropy = {floor}: no daemon of the global run logged its epoch choice")
    elif oc != gc:
        only = [c for c in oc if c not in gc] or [c for c in gc if c not in oc]
        problems.append(f"the entropy floor chose differently owner-side ({len(oc)} vs {len(gc)} choices): "
                        f"rank {only[0][0]}: {only[0][1]}")
    else:
        floor_note = f"; the floor's {len(oc)} epoch choices identical ({oc[0][1][:90]}...)"
finish("owner-side against global", text, problems,
       f"{compared} rows identical in {len(files)} files, paths included; owner-side catalog bytes "
       + ", ".join(f"{o[r][0]}/{g[r][0]}" for r in sorted(o) if r in g) + " (owner-side/global)" + floor_note)
PY
  # check_traces.py then judges the owner-side run's traces against the files: their paths
  # come from the catalog the owner-side daemons assemble for GetCatalog (decision 0066).
fi

# ---------------------------------------------------------------- verdict
sm_section "verdict"
rc=0
storage_flag=()
if ((capacity > 0)); then storage_flag=(--allow-storage); fi
shard_args=()
case $format in
  webdataset) shard_args=(--format webdataset --expect-invalid 1) ;;
  tfrecord) shard_args=(--format tfrecord --label-feature label --expect-invalid 2) ;;
esac
"$python" "$SM_E2E/check_traces.py" "$trace" --dataset "$data" --epochs "$epochs" \
  --trainers "$trainers" --trainers-per-node "$per_node" --batch-size "$batch" \
  --expect-peer --json "$tmp/verdict.json" "${storage_flag[@]}" "${shard_args[@]}" || rc=$?
((rc == 0)) || exit "$rc"
if [[ $format != folder ]]; then
  # Each damage is a warning naming the file and byte offset, and the count reaches the log.
  for line in "${expect_problems[@]}"; do
    grep -qF -- "$line" "$tmp/daemons.log" || sm_die "the daemons' log does not say: $line" 1
  done
  invalid=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["invalid_samples"])' "$tmp/verdict.json")
  grep -qF "dataset: skipped $invalid invalid samples" "$tmp/daemons.log" ||
    sm_die "the daemons' log does not report 'skipped $invalid invalid samples'" 1
  echo "damage reported: ${#expect_problems[@]} warning(s) naming file and offset; $invalid invalid samples counted"
  # The shard descriptor cache (service.open_shard_files, default 64 > the shards here) is in
  # use: each daemon opened every shard at most once and read the rest through it.
  shards=$(find "$data" -maxdepth 1 -type f \( -name '*.tar' -o -name '*.tfrecord' \) | wc -l)
  "$python" - "$tmp/daemons.log" "$nodes" "$shards" <<'PY'
import re, sys
text, nodes, shards = open(sys.argv[1]).read(), int(sys.argv[2]), int(sys.argv[3])
found = re.findall(r"shard descriptors \(service\.open_shard_files \d+\): (\d+) reads on a cached descriptor, "
                   r"(\d+) opens", text)
if len(found) != nodes:
    sys.exit(f"{len(found)} of {nodes} daemons logged their shard descriptor counts")
for hits, opens in found:
    if int(opens) > shards or int(hits) == 0:
        sys.exit(f"a daemon opened shards {opens} times for {shards} shards with {hits} cached reads")
print(f"shard descriptors: each daemon opened each of the {shards} shards at most once; cached reads "
      + ", ".join(h for h, _ in found))
PY
fi

if ((capacity > 0 && uneven_capacity == 0)); then
  sm_section "storage tier"
  "$python" "$SM_E2E/check_storage.py" --log "$tmp/daemons.log" --trace "$trace" \
    --nodes "$nodes" --epochs "$epochs" --capacity "$capacity" --trainers "$trainers" --batch-size "$batch" \
    --prefetch 4 --readahead "$readahead" --window "$window" --rotation-epochs "$rotation" \
    --reuse-rounds "$reuse_rounds"
fi

# The peer samples must really have crossed the fabric: the daemons' fabric layers read
# at least the bytes the trainers saw tagged 'peer', and at most one prefetch window more
# per trainer (the daemons read the next epoch's first batches ahead of its StartEpoch,
# which never comes after the last epoch). And every daemon must have shut down cleanly.
sm_section "fabric and shutdown"
ahead_readahead=0
if ((capacity > 0)); then ahead_readahead=$readahead; fi
e2e_python - "$tmp/daemons.log" "$trace" "$nodes" "$trainers" "$batch" 4 "$data" "$window" "$ahead_readahead" <<'PY'
import csv, glob, os, re, sys
from e2e_verdict import finish
log, trace, nodes = sys.argv[1], sys.argv[2], int(sys.argv[3])
trainers, batch, prefetch, data = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
window = int(sys.argv[8])
largest = max(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(data) for f in fs)
# Staged ahead per trainer: prefetch batches plus the window (trainer_scheduler.h).
# With cold samples the scheduler stages cold_readahead_batches more (its read-ahead).
readahead = int(sys.argv[9])
ahead_bound = trainers * ((prefetch + readahead) * batch + window) * largest
text = open(log, encoding="utf-8", errors="replace").read()
fabric = [int(m) for m in re.findall(r"\]\[daemon\] fabric \S+: \d+ reads, (\d+) bytes read from peers", text)]
peer = 0
for path in glob.glob(trace + "/rank-*.csv"):
    with open(path, newline="", encoding="utf-8") as f:
        peer += sum(int(r["bytes"]) for r in csv.DictReader(f) if r["tier"] == "peer")
problems = []
if len(fabric) != nodes:
    problems.append(f"{len(fabric)} of {nodes} daemons logged their fabric totals at a clean exit")
if not peer <= sum(fabric) <= peer + ahead_bound:
    problems.append(f"daemons read {sum(fabric)} bytes over the fabric, traces show {peer} peer bytes "
                    f"(allowed: up to {ahead_bound} more, read ahead for an epoch never asked)")
if peer == 0:
    problems.append("no peer bytes at all")
# Every daemon reports its metadata as the simulator counts it (node_metadata_bytes): the
# parts add up, and the schedulers' state was sampled while serving.
metadata = re.findall(r"metadata: rank=(\d+) samples=(\d+) catalog_bytes=(\d+) placement_bytes=(\d+) "
                      r"scheduler_bytes_max=(\d+) metadata_bytes=(\d+)", text)
if len(metadata) != nodes:
    problems.append(f"{len(metadata)} of {nodes} daemons logged a metadata: line at a clean exit")
for rank, samples, catalog, placement, schedulers, total in metadata:
    if int(total) != int(catalog) + int(placement) + int(schedulers) or min(int(catalog), int(placement), int(schedulers)) <= 0:
        problems.append(f"daemon {rank}: metadata parts do not add up or one is zero: "
                        f"{catalog} + {placement} + {schedulers} != {total}")
finish("fabric check", text, problems,
       f"{peer} peer bytes delivered, {sum(fabric)} bytes read by fi_read "
       f"({sum(fabric) - peer} read ahead for the next epoch); {nodes} clean exits")
PY
