#!/usr/bin/env bash
# The layering rule of docs/decisions/0042, checked three ways. Fails (exit 1) naming the
# offending file, symbol or library:
#  1. no source of the core (common/, proto/) or of the client (client/) includes an MPI,
#     libfabric, rdma-core or Boost.Asio header;
#  2. the core's and the client's archives neither define nor need an MPI, libfabric,
#     ibverbs or Asio symbol;
#  3. a program linked against the core and the client alone (tests/layering/core_probe.cc,
#     linked with --no-as-needed) needs no MPI, libfabric, ibverbs or Boost library.
# So that the check itself is known to work, each probe is also run on the adapters
# (control/ must show MPI, fabric/ must show libfabric); if it finds nothing there, the
# check is broken and fails too.
# The simulator (sim/) is held to the same rule: it runs the core with modelled transports.
# Usage: check_layering.sh SOURCE_DIR CORE.a CLIENT.a CONTROL.a FABRIC.a PROBE_BINARY [MORE_TRANSPORT_FREE.a ...]
set -uo pipefail
src=$1 core=$2 client=$3 control=$4 fabric=$5 probe=$6
shift 6
more=("$@")
fail=0
bad() { echo "LAYERING VIOLATION: $*"; fail=1; }

headers='#[[:space:]]*include[[:space:]]*[<"](mpi\.h|rdma/|infiniband/|boost/asio)'
if hits=$(grep -rnE "$headers" "$src/common" "$src/proto" "$src/client" "$src/sim"); then
  bad "transport header included by the core, the client or the simulator:"; echo "$hits"
fi
grep -rqE "$headers" "$src/control" || bad "self-check: found no MPI include in control/ (is the header pattern broken?)"
grep -rqE "$headers" "$src/fabric" || bad "self-check: found no libfabric include in fabric/ (is the header pattern broken?)"

# Symbols: C names of MPI (MPI_*, PMPI_*, ompi_*), libfabric (fi_*), ibverbs (ibv_*), and
# Boost.Asio's mangled namespace. Each archive's symbol list is taken whole first: a
# `grep -q` or `head` at the end of a pipeline would end nm early, and with pipefail that
# SIGPIPE would read as a failed match (seen with the larger sanitizer archives).
symbols='^(P?MPI_|ompi_|fi_|ibv_)|boost4asio'
symbol_names() { nm -P "$1" 2>/dev/null | awk '{print $1}'; }
for lib in "$core" "$client" "${more[@]}"; do
  names=$(symbol_names "$lib")
  [[ -n $names ]] || bad "self-check: nm listed no symbol at all in $lib"
  hits=$(grep -E "$symbols" <<<"$names" | sort -u) || true
  if [[ -n $hits ]]; then
    bad "$(basename "$lib") refers to transport symbols:"; head -20 <<<"$hits"
  fi
done
grep -qE '^P?MPI_' <<<"$(symbol_names "$control")" || bad "self-check: no MPI symbol in $(basename "$control")"
grep -qE '^fi_' <<<"$(symbol_names "$fabric")" || bad "self-check: no fi_ symbol in $(basename "$fabric")"

libs='lib(mpi|open-pal|open-rte|pmix|fabric|ibverbs|rdmacm|boost)'
needed=$(readelf -d "$probe" | awk '/NEEDED/{gsub(/[][]/, "", $5); print $5}')
[[ -n $needed ]] || bad "self-check: the probe $probe lists no NEEDED library at all"
if hits=$(grep -E "$libs" <<<"$needed"); then
  bad "a program linked with the core and the client alone needs:"; echo "$hits"
fi
if ((fail)); then exit 1; fi
echo "layering: core and client include, define and link no MPI, libfabric, ibverbs or Asio"
echo "  probe needs: $(tr '\n' ' ' <<<"$needed")"
