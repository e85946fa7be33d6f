#!/usr/bin/env bash
# The S3 source end to end, against the local S3 server (deploy/s3-local.sh) through a
# fault-injecting proxy (s3_fault_proxy.py) that also verifies every request's SigV4
# signature (the server does not), so a signing mistake fails the job:
#  1. folder, webdataset, tfrecord and filelist datasets uploaded with shardmix-gen --out
#     s3://..., at twice the 3 daemons' cache.capacity (initial load and cold tier both from
#     S3), while the proxy answers some object GETs with 503 SlowDown, 500 InternalError or
#     a reset mid-object: every sample exactly once per epoch with the bytes of the uploaded files
#     (check_traces.py on the local copy), the faults must really have happened, and the
#     proxy must have verified signatures and seen no bad one;
#  2. a shard object deleted after the listing (the proxy answers 404 for it): skipped and
#     counted, and with dataset.strict = true an error naming its key;
#     a folder object deleted after the listing (404 at the initial load): the sample is
#     made cold, skipped and counted every epoch, every other sample exactly once; with
#     strict, start-up fails naming the key;
#  3. wrong credentials (an unknown access key id; the right key id with a wrong secret): an
#     error naming the endpoint and the access key id, never the secret;
#  4. (serving) cold-tier reads failing after the load, the dataset at 2x capacity: a class
#     whose objects answer 500 every time (folder) is skipped and counted where cold,
#     delivered from RAM where resident, and nothing else is missed or repeated; with
#     strict, a deleted shard (404) fails the trainer with an error naming its key.
# Usage: s3_e2e.sh [all|load|faults|serving]
set -euo pipefail
# (A grep that reads a pipe ends with >/dev/null, not -q: -q exits at the first match, the
# writer gets SIGPIPE, and pipefail fails the check that matched.)
SM_PROG=s3_e2e
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

what=${1:-all}
case $what in all | load | faults | serving) ;; *) sm_die "usage: $0 [all|load|faults|serving]" 2 ;; esac
nodes=3
epochs=2
batch=8
timeout_s=${SHARDMIX_E2E_TIMEOUT:-300}

e2e_init s3
sm_before_tmp_cleanup() { sm_s3_local_stop; }
sm_section "local S3 server"
sm_s3_local_start "$tmp/s3"
echo "server $AWS_ENDPOINT_URL, bucket $SHARDMIX_S3_BUCKET"

# start_proxy ARG...: (re)starts the proxy in front of the server, verifying signatures
# with the server's key pair and counting into $tmp/proxy.json; sets proxy_url.
start_proxy() {
  rm -f "$tmp/proxy.json"
  sm_s3_proxy_start "$tmp" --stats "$tmp/proxy.json" --verify-sigv4 "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" "$@"
  proxy_url=$SM_S3_PROXY_URL
}

# expect_signed CASE: the proxy verified the signatures of the daemons' requests and
# rejected none (a signing mistake in the client would show as a mismatch here).
expect_signed() {
  e2e_python - "$tmp/proxy.json" "$1" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
bad = {k: c[k] for k in ("sigv4_mismatch", "sigv4_unknown_key", "sigv4_unsigned") if c[k]}
if c["sigv4_verified"] == 0 or bad:
    sys.exit("%s: the proxy verified %d signatures and rejected %s (%s)" % (sys.argv[2], c["sigv4_verified"], bad, c))
print("%s: %d request signatures verified, none rejected" % (sys.argv[2], c["sigv4_verified"]))
PY
}

# expect_credentials_error CASE KEY_ID SECRET CODE COUNTER: a job with these credentials
# fails naming the endpoint, the key id and S3's error CODE, never the secret, and the
# proxy counted the rejection under COUNTER.
expect_credentials_error() {
  local name=$1 key_id=$2 secret=$3 code=$4 counter=$5 rc=0
  start_proxy
  write_config "$tmp/$name.toml" webdataset 0
  AWS_ACCESS_KEY_ID=$key_id AWS_SECRET_ACCESS_KEY=$secret \
    run_job "$tmp/$name.toml" "$tmp/$name.log" "$tmp/$name-trace" || rc=$?
  ((rc != 0)) || sm_die "$name: the job succeeded"
  grep -F "$proxy_url" "$tmp/$name.log" | grep -F "access key id $key_id" | grep -F "$code" >/dev/null ||
    { tail -n 20 "$tmp/$name.log" >&2; sm_die "$name: the error does not name the endpoint, key id and $code"; }
  if grep -rqF -- "$secret" "$tmp/$name.log" "$tmp/$name-trace" 2>/dev/null; then
    sm_die "$name: the secret access key appears in the daemons' output"
  fi
  e2e_python - "$tmp/proxy.json" "$counter" <<'PY' || sm_die "$name: the proxy did not reject the request itself"
import json, sys
sys.exit(json.load(open(sys.argv[1]))[sys.argv[2]] == 0)
PY
  echo "$name: $(grep -m1 -oE "HTTP 403 ${code}[^)]*\)" "$tmp/$name.log")"
}

# upload FORMAT: a generated dataset at s3://BUCKET/FORMAT, its local copy in $tmp/FORMAT;
# through the proxy, so that the uploads' signatures are verified too.
upload() {
  local extra=()
  case $1 in
    folder) ;;
    filelist) extra=(--list) ;;  # the folder layout plus filelist.txt
    *) extra=(--format "$1" --samples-per-shard 24) ;;
  esac
  AWS_ENDPOINT_URL=$proxy_url "$gen" --out "s3://$SHARDMIX_S3_BUCKET/$1" --local-copy "$tmp/$1" --samples 240 --classes 6 --median-kib 4 \
    --seed 11 --quiet "${extra[@]}" >/dev/null
}

# write_config FILE FORMAT CAPACITY [KEY=VALUE...]
write_config() {
  local file=$1 format=$2 capacity=$3 path=s3://$SHARDMIX_S3_BUCKET/$2
  shift 3
  [[ $format != filelist ]] || path+=/filelist.txt
  sm_write_config "$file" dataset.path="$path" dataset.format="$format" \
    batch.size="$batch" shuffle.seed=5 cache.capacity="$capacity" fabric.provider=tcp fabric.interface=lo \
    service.trainers_per_node=1 service.prefetch=4 service.cold_readahead_batches=4 log.level=info \
    storage.s3.endpoint="$proxy_url" storage.s3.concurrency=8 "$@"
}

run_job() { # CONFIG LOG TRACE [WRAPPER...]: WRAPPER... runs the trainer command (after_load)
  e2e_launch "$timeout_s" "$2" --nodes "$nodes" --config "$1" --trainers-per-node 1 \
    -- "${@:4}" "$consume" --epochs "$epochs" --trace "$3"
}
# A trainer wrapper: creates $tmp/keyed-faults (the proxy's --keyed-faults-after) and runs
# the trainer. The daemons have loaded when trainers start, and a cold read only follows
# a trainer's request, so the proxy's keyed faults hit the serving only.
# shellcheck disable=SC2016  # $0 and $@ are the inner bash's
after_load=(bash -c 'touch "$0" && exec "$@"' "$tmp/keyed-faults")

# expect_skipped CASE TRACE OUT KEY_PART: every epoch some samples were skipped, each one's
# key contains KEY_PART, delivered + skipped is the dataset each once (check_traces.py
# --skipped, run by the caller), and the trainers' epoch statistics (OUT) count them.
expect_skipped() {
  e2e_python - "$@" <<'PY'
import csv, glob, re, sys
name, trace, out, part = sys.argv[1:5]
skipped = {}
for path in glob.glob(trace + "/skipped-rank-*.csv"):
    for row in csv.DictReader(open(path)):
        skipped.setdefault(int(row["epoch"]), set()).add(row["path"])
counted = {}
for e, n in re.findall(r"rank \d+ epoch (\d+): .*; (\d+) unreadable samples skipped", open(out).read()):
    counted[int(e)] = counted.get(int(e), 0) + int(n)
problems = []
for e in range(max(counted) + 1 if counted else 1):
    s = skipped.get(e, set())
    if not s:
        problems.append("epoch %d: nothing skipped" % e)
    if any(part not in p for p in s):
        problems.append("epoch %d: skipped samples outside %s: %s" % (e, part, sorted(p for p in s if part not in p)[:5]))
    if counted.get(e, 0) != len(s):
        problems.append("epoch %d: the trainers count %d unreadable samples, the traces skipped %d" % (e, counted.get(e, 0), len(s)))
if problems:
    sys.exit("%s: %s" % (name, "; ".join(problems)))
print("%s: skipped per epoch %s, all under %s, counted by the trainers" % (name, [len(skipped[e]) for e in sorted(skipped)], part))
PY
}

load_case() {
  local format=$1 bytes capacity shard_args=()
  sm_section "$format: $nodes daemons, dataset at 2x their capacity, 503/500/reset faults injected"
  start_proxy --slowdown-every 7 --error-every 11 --reset-every 13 --budget 6
  upload "$format"
  bytes=$(find "$tmp/$format" -type f ! -name filelist.txt -printf '%s\n' | awk '{ s += $1 } END { print s }')
  capacity=$((bytes / (2 * nodes)))
  local labels=()
  [[ $format != tfrecord ]] || labels=(dataset.label_feature=label)
  write_config "$tmp/$format.toml" "$format" "$capacity" "${labels[@]}"
  local rc=0
  run_job "$tmp/$format.toml" "$tmp/$format.log" "$tmp/$format-trace" || rc=$?
  ((rc == 0)) || { tail -n 30 "$tmp/$format.log" >&2; sm_die "$format: the job failed with exit code $rc"; }
  e2e_python - "$tmp/proxy.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
missing = [k for k in ("slowdown", "server_error", "reset") if c[k] == 0]
if missing:
    sys.exit("the proxy injected no %s: the retries were not exercised (%s)" % (", ".join(missing), c))
print("faults injected and ridden out: %d SlowDown, %d InternalError, %d resets in %d object GETs"
      % (c["slowdown"], c["server_error"], c["reset"], c["object_gets"]))
PY
  expect_signed "$format"
  [[ $format == folder || $format == filelist ]] || shard_args=(--format "$format")
  [[ $format != tfrecord ]] || shard_args+=(--label-feature label)
  "$python" "$SM_E2E/check_traces.py" "$tmp/$format-trace" --dataset "$tmp/$format" --epochs "$epochs" \
    --trainers "$nodes" --trainers-per-node 1 --batch-size "$batch" --allow-storage "${shard_args[@]}"
  grep -qE "s3: [0-9]+ requests \([1-9][0-9]* retried\)" "$tmp/$format.log" ||
    sm_die "$format: no daemon reports a retried S3 request (its 's3:' line at exit)"
  grep -qE "storage: [1-9][0-9]* cold reads" "$tmp/$format.log" ||
    sm_die "$format: no daemon read a cold sample from S3 (the cold tier was not exercised)"
}

faults_case() {
  local gone=shard_000001.tar rc
  sm_section "an object deleted after the listing: skipped and counted"
  start_proxy --missing "webdataset/$gone"
  [[ -d $tmp/webdataset ]] || upload webdataset
  write_config "$tmp/missing.toml" webdataset 0
  rc=0
  run_job "$tmp/missing.toml" "$tmp/missing.log" "$tmp/missing-trace" || rc=$?
  ((rc == 0)) || { tail -n 30 "$tmp/missing.log" >&2; sm_die "dataset.strict = false: the job failed ($rc)"; }
  grep -qF "s3://$SHARDMIX_S3_BUCKET/webdataset/$gone" "$tmp/missing.log" ||
    sm_die "the daemons' log does not name the missing object"
  grep -qE "dataset: skipped [0-9]+ invalid samples; 1 shards could not be read" "$tmp/missing.log" ||
    { grep -E "dataset: skipped" "$tmp/missing.log" >&2 || true; sm_die "the missing shard was not counted"; }
  echo "missing object named and counted: $(grep -m1 -oE "dataset: skipped [^;]*" "$tmp/missing.log")"
  expect_signed missing

  sm_section "the same with dataset.strict = true: an error naming the key"
  write_config "$tmp/strict.toml" webdataset 0 dataset.strict=true
  rc=0
  run_job "$tmp/strict.toml" "$tmp/strict.log" "$tmp/strict-trace" || rc=$?
  ((rc != 0)) || sm_die "dataset.strict = true: the job succeeded without the object"
  grep -F "s3://$SHARDMIX_S3_BUCKET/webdataset/$gone" "$tmp/strict.log" | grep -F "dataset.strict" >/dev/null ||
    { tail -n 20 "$tmp/strict.log" >&2; sm_die "the strict error does not name the key"; }
  echo "strict: failed naming s3://$SHARDMIX_S3_BUCKET/webdataset/$gone"
  expect_signed strict

  local sample
  sm_section "folder: an object deleted after the listing: cold from then on, skipped and counted"
  start_proxy
  [[ -d $tmp/folder ]] || upload folder
  sample=$(cd "$tmp/folder" && find . -name '*.bin' | sort | sed -n '2s|^\./||p')
  start_proxy --missing "folder/$sample"
  write_config "$tmp/folder-missing.toml" folder 0
  rc=0
  run_job "$tmp/folder-missing.toml" "$tmp/folder-missing.log" "$tmp/folder-missing-trace" \
    >"$tmp/folder-missing.out" 2>&1 || rc=$?
  ((rc == 0)) || { tail -n 30 "$tmp/folder-missing.log" "$tmp/folder-missing.out" >&2; sm_die "folder, strict = false: the job failed ($rc)"; }
  grep -F "s3://$SHARDMIX_S3_BUCKET/folder/$sample" "$tmp/folder-missing.log" | grep -F "not loaded" >/dev/null ||
    sm_die "folder: no daemon warning names the deleted object"
  grep -qF "dataset: 1 resident samples could not be loaded" "$tmp/folder-missing.log" ||
    sm_die "folder: the deleted object was not counted at the load"
  "$python" "$SM_E2E/check_traces.py" "$tmp/folder-missing-trace" --dataset "$tmp/folder" --epochs "$epochs" \
    --trainers "$nodes" --trainers-per-node 1 --batch-size "$batch" --allow-storage --skipped
  expect_skipped folder-missing "$tmp/folder-missing-trace" "$tmp/folder-missing.out" "$sample"
  expect_signed folder-missing

  sm_section "folder, the same with dataset.strict = true: start-up fails naming the key"
  write_config "$tmp/folder-strict.toml" folder 0 dataset.strict=true
  rc=0
  run_job "$tmp/folder-strict.toml" "$tmp/folder-strict.log" "$tmp/folder-strict-trace" \
    >"$tmp/folder-strict.out" 2>&1 || rc=$?
  ((rc != 0)) || sm_die "folder, strict = true: the job succeeded without the object"
  grep -F "s3://$SHARDMIX_S3_BUCKET/folder/$sample" "$tmp/folder-strict.log" | grep -F "dataset.strict = true" >/dev/null ||
    { tail -n 20 "$tmp/folder-strict.log" >&2; sm_die "folder, strict: the error does not name the key"; }
  echo "folder, strict: failed naming s3://$SHARDMIX_S3_BUCKET/folder/$sample"

  sm_section "wrong credentials: endpoint and key id named, secret never"
  expect_credentials_error creds WRONGKEYID "not-the-secret-$RANDOM$RANDOM" InvalidAccessKeyId sigv4_unknown_key
  sm_section "the right access key id with a wrong secret: the signature is refused"
  expect_credentials_error wrong-secret "$AWS_ACCESS_KEY_ID" "not-the-secret-$RANDOM$RANDOM" SignatureDoesNotMatch \
    sigv4_mismatch
}

if [[ $what == all || $what == load ]]; then
  load_case folder
  load_case webdataset
  load_case tfrecord
  load_case filelist
fi
serving_case() {
  local bytes capacity rc failing=folder/class_00001/ gone=shard_000002.tar
  sm_section "serving: a class answering 500 every time after the load, 2x capacity: cold ones skipped"
  start_proxy
  [[ -d $tmp/folder ]] || upload folder
  [[ -d $tmp/webdataset ]] || upload webdataset
  bytes=$(find "$tmp/folder" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
  capacity=$((bytes / (2 * nodes)))
  rm -f "$tmp/keyed-faults"
  start_proxy --failing "$failing" --keyed-faults-after "$tmp/keyed-faults"
  write_config "$tmp/failing.toml" folder "$capacity" storage.s3.max_attempts=3
  rc=0
  run_job "$tmp/failing.toml" "$tmp/failing.log" "$tmp/failing-trace" "${after_load[@]}" >"$tmp/failing.out" 2>&1 || rc=$?
  ((rc == 0)) || { tail -n 30 "$tmp/failing.log" "$tmp/failing.out" >&2; sm_die "serving, strict = false: the job failed ($rc)"; }
  "$python" "$SM_E2E/check_traces.py" "$tmp/failing-trace" --dataset "$tmp/folder" --epochs "$epochs" \
    --trainers "$nodes" --trainers-per-node 1 --batch-size "$batch" --allow-storage --skipped
  expect_skipped serving-failing "$tmp/failing-trace" "$tmp/failing.out" "${failing#folder/}"
  e2e_python - "$tmp/failing-trace" "${failing#folder/}" <<'PY'
import csv, glob, sys
trace, part = sys.argv[1:3]
# Of the failing class, what was delivered came from RAM: a storage read of it must fail.
bad = [r["path"] for p in glob.glob(trace + "/rank-*.csv") for r in csv.DictReader(open(p))
       if part in r["path"] and r["tier"] == "storage"]
if bad:
    sys.exit("serving: samples of the failing class delivered from storage: %s" % bad[:5])
PY
  grep -E "skipping sample [0-9]+ in epoch [0-9]+ \(dataset.strict = false\)" "$tmp/failing.log" |
    grep -F "s3://$SHARDMIX_S3_BUCKET/$failing" >/dev/null || sm_die "serving: no daemon warning names a failing key"
  expect_signed serving-failing

  sm_section "serving, dataset.strict = true: a shard deleted after the load fails the trainer naming its key"
  bytes=$(find "$tmp/webdataset" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
  rm -f "$tmp/keyed-faults"
  start_proxy --missing "webdataset/$gone" --keyed-faults-after "$tmp/keyed-faults"
  write_config "$tmp/gone-strict.toml" webdataset $((bytes / (2 * nodes))) dataset.strict=true
  rc=0
  run_job "$tmp/gone-strict.toml" "$tmp/gone-strict.log" "$tmp/gone-strict-trace" "${after_load[@]}" \
    >"$tmp/gone-strict.out" 2>&1 || rc=$?
  ((rc != 0)) || sm_die "serving, strict = true: the job succeeded without the shard"
  grep -hF "s3://$SHARDMIX_S3_BUCKET/webdataset/$gone" "$tmp/gone-strict.out" | grep -F "404" >/dev/null ||
    { tail -n 20 "$tmp/gone-strict.out" >&2; sm_die "serving, strict: the trainer's error does not name the key"; }
  echo "serving, strict: $(grep -m1 -ohE "s3://$SHARDMIX_S3_BUCKET/webdataset/${gone}[^(]*" "$tmp/gone-strict.out")"
  expect_signed gone-strict
}

if [[ $what == all || $what == faults ]]; then faults_case; fi
if [[ $what == all || $what == serving ]]; then serving_case; fi
echo "s3_e2e: PASS"
