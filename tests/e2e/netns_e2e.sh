#!/usr/bin/env bash
# shellcheck disable=SC2317  # (whole file) sm_before_tmp_cleanup() runs from a trap
# End-to-end test of the emulated cluster: 4 shardmixd daemons, each in its own network
# namespace (fabric.netns = "smxe{rank}", made by deploy/netns-cluster.sh with 1 Gbit/s
# links), 4 trainers in the root namespace talking to them over their Unix sockets; two
# epochs traced; check_traces.py judges exactly-once delivery, bytes and tiers; the peer
# bytes must have crossed the namespaces' links (veth counters), not loopback.
#
#   tests/e2e/netns_e2e.sh
#
# Exits 77 (ctest SKIP_RETURN_CODE) where network namespaces cannot be made: not root,
# no ip/tc, or `ip netns add` refused (e.g. in an unprivileged container).
# Uses its own prefix (smxe, 10.78.0.0/24) so it never touches bench/sweep.sh's cluster.
# Builds nothing: shardmixd, shardmix-consume and shardmix-gen come from
# $SHARDMIX_BUILD_DIR (default <repo>/build) or PATH. SHARDMIX_E2E_KEEP=1 keeps the temp dir.
set -euo pipefail

SM_PROG=netns_e2e
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

skip() {
  sm_log "SKIP: $*"
  exit 77
}
(($(id -u) == 0)) || skip "network namespaces need root"
if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then skip "ip/tc (iproute2) not installed"; fi
probe=smxeprobe$$
ip netns add "$probe" >/dev/null 2>&1 || skip "'ip netns add' is not permitted here"
ip netns del "$probe" >/dev/null 2>&1 || true

nodes=4
samples=600
batch=8
epochs=2
prefix=smxe
timeout_s=${SHARDMIX_E2E_TIMEOUT:-100}

cluster=$SM_REPO/deploy/netns-cluster.sh
# The namespaces go too, whatever happens (the up command below creates them).
sm_before_tmp_cleanup() { bash "$cluster" down "$nodes" --prefix "$prefix" >/dev/null 2>&1; }
e2e_init netns

sm_section "cluster: $nodes namespaces ${prefix}0..${prefix}$((nodes - 1)), 1 Gbit/s links"
bash "$cluster" up "$nodes" 1gbit --prefix "$prefix" --subnet 10.78.0
# The up command is idempotent: a second run must succeed and change nothing that matters.
bash "$cluster" up "$nodes" 1gbit --prefix "$prefix" --subnet 10.78.0

data=$tmp/data
trace=$tmp/trace
e2e_gen_dataset "$samples" 8 16 11
config=$tmp/netns.toml
sm_write_config "$config" dataset.path="$data" dataset.placement=sorted batch.size="$batch" shuffle.seed=5 \
  shuffle.exchange_fraction=1.0 fabric.provider=tcp fabric.netns="${prefix}{rank}" fabric.interface="${prefix}eth" \
  log.level=info

sm_section "run: $nodes daemons in namespaces, $nodes trainers in the root namespace, $epochs epochs"
before=$(sm_netns_rx_bytes "$prefix" "$nodes")
e2e_launch_or_die "$timeout_s" "$tmp/daemons.log" --nodes "$nodes" --config "$config" --trainers-per-node 1 \
  -- "$consume" --epochs "$epochs" --trace "$trace"
after=$(sm_netns_rx_bytes "$prefix" "$nodes")

sm_section "verdict"
"$python" "$SM_E2E/check_traces.py" "$trace" --dataset "$data" --epochs "$epochs" \
  --trainers "$nodes" --trainers-per-node 1 --batch-size "$batch" --expect-peer

# Every daemon joined its namespace and used its link: the fabric domain is the
# namespace's interface, and the links carried at least the peer bytes the traces show.
e2e_python - "$tmp/daemons.log" "$trace" "$nodes" "$prefix" "$((after - before))" <<'PY'
import csv, glob, re, sys
from e2e_verdict import finish
log, trace, nodes, prefix, wire = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
text = open(log, encoding="utf-8", errors="replace").read()
domains = re.findall(r"\[rank (\d+)\]\[fabric\] provider \S+ domain (\S+)", text)
peer = 0
for path in glob.glob(trace + "/rank-*.csv"):
    with open(path, newline="", encoding="utf-8") as f:
        peer += sum(int(r["bytes"]) for r in csv.DictReader(f) if r["tier"] == "peer")
problems = []
if sorted(int(r) for r, _ in domains) != list(range(nodes)):
    problems.append(f"fabric domain lines for ranks {sorted(r for r, _ in domains)}, expected 0..{nodes - 1}")
if any(d != prefix + "eth" for _, d in domains):
    problems.append(f"fabric domains {sorted(set(d for _, d in domains))}, expected {prefix}eth")
if peer == 0 or wire < peer:
    problems.append(f"the namespaces' links carried {wire} bytes, less than the {peer} peer bytes delivered")
finish("netns check", text, problems,
       f"{nodes} daemons on domain {prefix}eth; links carried {wire} bytes for {peer} peer bytes delivered")
PY

# A daemon in a namespace must not sit on the loopback (peers in other namespaces can
# never answer it: a hang at the first read). Pinning fabric.interface = "lo" must stop
# start-up with an error that says so, not hang.
sm_section "misconfigured: fabric.interface = lo inside namespaces"
rc=0
e2e_launch 120 "$tmp/daemons-lo.log" --nodes "$nodes" --config "$config" --trainers-per-node 1 \
  --set fabric.interface=lo -- "$consume" --epochs 1 >/dev/null 2>&1 || rc=$?
if ((rc == 0 || rc == 124)); then
  sm_die "a daemon on 'lo' inside a namespace was not refused (launch exit $rc)" 1
fi
grep -q "picked the loopback interface 'lo'" "$tmp/daemons-lo.log" ||
  sm_die "no error naming the loopback in $tmp/daemons-lo.log" 1
echo "loopback inside a namespace: refused at start-up (launch exit $rc)"
