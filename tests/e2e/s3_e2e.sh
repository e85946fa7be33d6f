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
#  3. wrong credentials (an unknown access key id; the right key id with a wrong secret): an
#     error naming the endpoint and the access key id, never the secret.
# Usage: s3_e2e.sh [all|load|faults]
set -euo pipefail
SM_PROG=s3_e2e
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

what=${1:-all}
case $what in all | load | faults) ;; *) sm_die "usage: $0 [all|load|faults]" 2 ;; esac
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
  grep -F "$proxy_url" "$tmp/$name.log" | grep -F "access key id $key_id" | grep -qF "$code" ||
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

run_job() { # CONFIG LOG TRACE
  e2e_launch "$timeout_s" "$2" --nodes "$nodes" --config "$1" --trainers-per-node 1 \
    -- "$consume" --epochs "$epochs" --trace "$3"
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
  grep -F "s3://$SHARDMIX_S3_BUCKET/webdataset/$gone" "$tmp/strict.log" | grep -qF "dataset.strict" ||
    { tail -n 20 "$tmp/strict.log" >&2; sm_die "the strict error does not name the key"; }
  echo "strict: failed naming s3://$SHARDMIX_S3_BUCKET/webdataset/$gone"
  expect_signed strict

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
if [[ $what == all || $what == faults ]]; then faults_case; fi
echo "s3_e2e: PASS"
