#!/usr/bin/env bash
# Emulates a small cluster on one machine: N network namespaces ("nodes") on one switch,
# each linked at RATE in both directions. See --help and docs/decisions/0011.
set -euo pipefail

SM_PROG=netns-cluster
# shellcheck source=deploy/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<'EOF'
Usage: deploy/netns-cluster.sh up N [RATE] [--prefix P] [--subnet A.B.C] [--mtu BYTES]
       deploy/netns-cluster.sh down [N] [--prefix P]
       deploy/netns-cluster.sh status [--prefix P]

up     creates N network namespaces P0 .. P{N-1} (default prefix "smx": smx0, smx1, ...),
       each with loopback up and one interface named "<P>eth" (smxeth) at A.B.C.(i+1)/24
       (default subnet 10.77.0), whose other end (<P>h<i> in the root namespace) is a port
       of the bridge <P>br: a switch with one link per node. Each link is shaped to RATE
       (tc tbf, default 1gbit) in both directions: on <P>eth (what the node sends) and on
       <P>h<i> (what the node receives). RATE "none" removes the shaping. MTU (default
       9000, jumbo frames as on most cluster Ethernet) applies to the veths and the bridge:
       with 1500 the emulation spends more CPU per byte on packets than a real node would,
       on cores the daemons share. Idempotent:
       running it again fixes up what is missing and applies the new RATE; namespaces
       numbered N or higher from an earlier, larger "up" are removed.
down   removes the namespaces, veths and the bridge of prefix P (every P<digits>
       namespace when N is not given). Idempotent.
status prints the namespaces, addresses and qdiscs of prefix P.

A daemon joins its node with the config key fabric.netns = "<P>{rank}" (after MPI_Init,
before any libfabric object) and sets fabric.interface = "<P>eth". Trainers stay in the
root namespace: they reach their daemon through its Unix socket, a file-system path.
Needs root and iproute2 (ip, tc). Exit status: 0 done, 2 usage error, 1 failure.
EOF
}

cmd=${1:-}
[[ -n $cmd ]] || { usage >&2; exit 2; }
shift
n=""
rate=1gbit
prefix=smx
subnet=10.77.0
mtu=9000
positional=()
while (($#)); do
  case $1 in
    --prefix) (($# >= 2)) || sm_die "--prefix needs a value" 2; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --subnet) (($# >= 2)) || sm_die "--subnet needs a value" 2; subnet=$2; shift 2 ;;
    --subnet=*) subnet=${1#*=}; shift ;;
    --mtu) (($# >= 2)) || sm_die "--mtu needs a value" 2; mtu=$2; shift 2 ;;
    --mtu=*) mtu=${1#*=}; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) usage >&2; sm_die "unknown option '$1'" 2 ;;
    *) positional+=("$1"); shift ;;
  esac
done
case $cmd in
  -h|--help) usage; exit 0 ;;
  up)
    ((${#positional[@]} >= 1 && ${#positional[@]} <= 2)) || { usage >&2; sm_die "up needs N [RATE]" 2; }
    n=${positional[0]}
    rate=${positional[1]:-1gbit}
    ;;
  down)
    ((${#positional[@]} <= 1)) || { usage >&2; sm_die "down takes at most N" 2; }
    n=${positional[0]:-}
    ;;
  status)
    ((${#positional[@]} == 0)) || { usage >&2; sm_die "status takes no N" 2; }
    ;;
  *) usage >&2; sm_die "unknown command '$cmd' (up, down, status)" 2 ;;
esac
if [[ -n $n ]]; then
  if ! sm_is_uint "$n" || ((10#$n < 1 || 10#$n > 250)); then sm_die "N must be 1..250, got '$n'" 2; fi
  n=$((10#$n))
fi
# Interface names are at most 15 bytes: "<P>h<i>" with i < 250 needs P <= 11 bytes.
[[ $prefix =~ ^[a-z][a-z0-9]{0,10}$ ]] || sm_die "--prefix must be 1-11 lowercase letters/digits starting with a letter, got '$prefix'" 2
if ! sm_is_uint "$mtu" || ((10#$mtu < 1280 || 10#$mtu > 65535)); then sm_die "--mtu must be 1280..65535, got '$mtu'" 2; fi
mtu=$((10#$mtu))
[[ $subnet =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || sm_die "--subnet must look like 10.77.0, got '$subnet'" 2
if [[ $rate != none ]] && ! [[ $rate =~ ^[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)$ ]]; then
  sm_die "RATE must be a tc rate such as 1gbit, 100mbit, 125mbps, or 'none'; got '$rate'" 2
fi

bridge=${prefix}br
node_if=${prefix}eth

need_tools() {
  if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
    sm_die "ip and tc not found; install iproute2 (deploy/install-deps.sh)"
  fi
  (($(id -u) == 0)) || sm_die "network namespaces need root (uid $(id -u))"
}

# Namespaces of this prefix: P followed by digits only (so "smx" does not match "smxt0").
list_namespaces() {
  ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^${prefix}[0-9]+\$" | sort -V || true
}

# shape DEV [NS]: tbf at RATE on DEV's egress (DEV in namespace NS, default the root
# one), or no root qdisc for RATE none.
# The burst must hold at least one (GSO-sized) packet; 256 KiB is 2 ms at 1 Gbit/s. A
# queue of 20 ms (2.5 MB at 1 Gbit/s) is what a switch port buffers, roughly.
shape() {
  local dev=$1
  local -a in_ns=()
  if [[ -n ${2:-} ]]; then in_ns=(-netns "$2"); fi
  if [[ $rate == none ]]; then
    tc "${in_ns[@]}" qdisc del dev "$dev" root 2>/dev/null || true
  else
    tc "${in_ns[@]}" qdisc replace dev "$dev" root tbf rate "$rate" burst 256kb latency 20ms
  fi
}

up() {
  need_tools
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge
  fi
  ip link set "$bridge" mtu "$mtu" up
  local i ns host_if master
  for ((i = 0; i < n; i++)); do
    ns=$prefix$i
    host_if=${prefix}h$i
    if ! ip netns list | awk '{ print $1 }' | grep -qx -- "$ns"; then
      ip netns add "$ns"
    fi
    ip -n "$ns" link set lo up
    # A host end whose peer is gone (or in another namespace) is recreated.
    if ip link show "$host_if" >/dev/null 2>&1 && ! ip -n "$ns" link show "$node_if" >/dev/null 2>&1; then
      ip link del "$host_if"
    fi
    if ! ip link show "$host_if" >/dev/null 2>&1; then
      ip -n "$ns" link del "$node_if" 2>/dev/null || true
      ip link add "$host_if" type veth peer name "$node_if" netns "$ns"
    fi
    master=$(ip -o link show "$host_if" | grep -o "master [^ ]*" || true)
    [[ $master == "master $bridge" ]] || ip link set "$host_if" master "$bridge"
    ip link set "$host_if" mtu "$mtu" up
    ip -n "$ns" addr replace "$subnet.$((i + 1))/24" dev "$node_if"
    ip -n "$ns" link set "$node_if" mtu "$mtu" up
    shape "$host_if"                  # bridge -> node: what the node receives
    shape "$node_if" "$ns"            # node -> bridge: what the node sends
  done
  # Nodes left over from an earlier, larger cluster.
  local leftover
  while IFS= read -r ns; do
    [[ -n $ns ]] || continue
    i=${ns#"$prefix"}
    if ((10#$i >= n)); then
      ip link del "${prefix}h$((10#$i))" 2>/dev/null || true
      ip netns del "$ns"
      leftover+="$ns "
    fi
  done < <(list_namespaces)
  [[ -z ${leftover:-} ]] || sm_log "removed leftover namespace(s) ${leftover% }"
  sm_log "up: $n namespace(s) ${prefix}0..${prefix}$((n - 1)) on bridge $bridge, interface $node_if, $subnet.1-$subnet.$n/24, rate $rate each way, MTU $mtu"
}

down() {
  need_tools
  local ns i
  local -a targets=()
  if [[ -n $n ]]; then
    for ((i = 0; i < n; i++)); do targets+=("$prefix$i"); done
  fi
  while IFS= read -r ns; do
    [[ -n $ns ]] && targets+=("$ns")
  done < <(list_namespaces)
  local -A seen=()
  for ns in "${targets[@]}"; do
    [[ -z ${seen[$ns]:-} ]] || continue
    seen[$ns]=1
    i=${ns#"$prefix"}
    ip link del "${prefix}h$((10#$i))" 2>/dev/null || true
    if ip netns list | awk '{ print $1 }' | grep -qx -- "$ns"; then ip netns del "$ns"; fi
  done
  if ip link show "$bridge" >/dev/null 2>&1; then ip link del "$bridge"; fi
  sm_log "down: removed namespaces, veths and bridge of prefix '$prefix'"
}

status() {
  need_tools
  local ns
  ip -br link show "$bridge" 2>/dev/null || echo "no bridge $bridge"
  while IFS= read -r ns; do
    [[ -n $ns ]] || continue
    printf '%s: %s\n' "$ns" "$(ip -n "$ns" -br addr show "$node_if" 2>/dev/null | tr -s ' ')"
    printf '  send: %s\n' "$(tc -netns "$ns" qdisc show dev "$node_if" root 2>/dev/null | head -1)"
    printf '  recv: %s\n' "$(tc qdisc show dev "${prefix}h${ns#"$prefix"}" root 2>/dev/null | head -1)"
  done < <(list_namespaces)
}

case $cmd in
  up) up ;;
  down) down ;;
  status) status ;;
esac
