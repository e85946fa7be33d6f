// Joining a network namespace: how one machine emulates a cluster of nodes, each daemon
// in its own namespace with its own shaped link (deploy/netns-cluster.sh,
// docs/decisions/0011-emulated-cluster-with-netns.md). Config key: fabric.netns.
//
// setns(2) moves only the calling thread; threads it starts afterwards inherit the
// namespace, threads started before keep theirs. The daemon therefore joins on its main
// thread after MPI_Init (mpirun's launch and PMIx need the shared loopback, so ranks cannot
// be started inside the namespaces) and before it creates any libfabric object, so the
// fabric's sockets and its progress thread live in the node's namespace. Unix sockets
// bound to a file-system path (the trainers' socket) work across network namespaces.
// Thread-safety: free functions without shared state.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace shardmix {

// The namespace name for `rank`: every "{rank}" in `pattern` replaced by the rank
// ("smx{rank}" -> "smx3"). Other text is kept as it is.
std::string expand_netns_name(std::string_view pattern, int rank);

// The file to open for a namespace name: "/run/netns/NAME" (where `ip netns add` puts it),
// or NAME itself if it contains a '/' (e.g. "/proc/1234/ns/net").
std::string netns_path(std::string_view name);

// Moves the calling thread into the network namespace named by `pattern` expanded for
// `rank`. An empty pattern does nothing. Errors name the namespace, the file, the rank and
// the config key, e.g. "fabric.netns = 'smx{rank}': cannot open /run/netns/smx3 (daemon
// rank 3): No such file or directory; create it first (deploy/netns-cluster.sh up N)".
Status join_netns(std::string_view pattern, int rank);

}  // namespace shardmix
