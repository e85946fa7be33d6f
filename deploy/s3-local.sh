#!/usr/bin/env bash
# A local S3-compatible server for the S3 source's tests and benchmark: s3rver (Node.js,
# from the npm registry) on 127.0.0.1, its data in a temporary folder
# (docs/decisions/0051-s3-client-and-test-server.md says why not radosgw).
#
#   deploy/s3-local.sh install            installs s3rver into deploy/.s3-local (git-ignored)
#   deploy/s3-local.sh start [STATE_DIR]  starts a server with one empty bucket; prints
#                                          shell-sourceable AWS_ENDPOINT_URL=..., AWS_REGION=...,
#                                          AWS_ACCESS_KEY_ID=..., AWS_SECRET_ACCESS_KEY=...,
#                                          SHARDMIX_S3_BUCKET=... and S3_LOCAL_STATE=...
#   deploy/s3-local.sh stop [STATE_DIR]   stops it and removes its data
#
# STATE_DIR (default $S3_LOCAL_STATE, else a fresh temporary folder) holds the pid, the
# port, the log and the objects. s3rver refuses an unknown access key id but does not
# verify signatures (a wrong secret is accepted: decision 0051); the tests verify them in
# the proxy they put in front of it (tests/e2e/s3_fault_proxy.py --verify-sigv4), so a
# client talking to this server directly is not checked. The key pair is a fixed test
# pair of this local server, not a secret.
set -euo pipefail
SM_PROG=s3-local.sh
# shellcheck source=deploy/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

S3RVER_VERSION=3.7.1
install_dir=$SM_REPO/deploy/.s3-local
access_key=S3RVER
secret_key=S3RVER
region=us-east-1

install_server() {
  [[ -x $install_dir/node_modules/.bin/s3rver ]] && return 0
  command -v npm >/dev/null || sm_die "npm not found: deploy/install-deps.sh installs nodejs and npm"
  mkdir -p "$install_dir"
  sm_log "installing s3rver $S3RVER_VERSION into $install_dir"
  npm install --silent --no-audit --no-fund --prefix "$install_dir" "s3rver@$S3RVER_VERSION" >&2 ||
    sm_die "npm install s3rver@$S3RVER_VERSION failed"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

start_server() {
  local state=${1:-${S3_LOCAL_STATE:-}} port bucket i
  install_server
  [[ -n $state ]] || state=$(mktemp -d "${TMPDIR:-/tmp}/shardmix-s3.XXXXXX")
  mkdir -p "$state/data"
  [[ ! -f $state/pid ]] || ! kill -0 "$(cat "$state/pid")" 2>/dev/null ||
    sm_die "a server is already running from $state (pid $(cat "$state/pid"))"
  port=$(free_port)
  bucket=shardmix-test
  # Its own process group, so that stop ends node and nothing else.
  setsid "$install_dir/node_modules/.bin/s3rver" --address 127.0.0.1 --port "$port" --silent \
    --directory "$state/data" --configure-bucket "$bucket" >"$state/log" 2>&1 </dev/null &
  echo $! >"$state/pid"
  echo "$port" >"$state/port"
  for ((i = 0; i < 300; i++)); do
    curl -s -o /dev/null "http://127.0.0.1:$port/" && break
    kill -0 "$(cat "$state/pid")" 2>/dev/null || { cat "$state/log" >&2; sm_die "s3rver exited at start-up"; }
    sleep 0.1
  done
  ((i < 300)) || sm_die "s3rver did not answer on port $port within 30 s (log $state/log)"
  printf 'AWS_ENDPOINT_URL=http://127.0.0.1:%s\nAWS_REGION=%s\nAWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n' \
    "$port" "$region" "$access_key" "$secret_key"
  printf 'SHARDMIX_S3_BUCKET=%s\nS3_LOCAL_STATE=%s\n' "$bucket" "$state"
}

stop_server() {
  local state=${1:-${S3_LOCAL_STATE:-}} pid i
  [[ -n $state && -d $state ]] || sm_die "stop: no state folder (pass the S3_LOCAL_STATE that start printed)"
  if [[ -f $state/pid ]]; then
    pid=$(cat "$state/pid")
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -rf -- "$state"
}

case ${1:-} in
  install) install_server ;;
  start) start_server "${2:-}" ;;
  stop) stop_server "${2:-}" ;;
  *) sm_die "usage: deploy/s3-local.sh install|start [STATE_DIR]|stop [STATE_DIR]" 2 ;;
esac
