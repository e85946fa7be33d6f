// shardmixd's life: MPI bootstrap -> catalog (scan split across ranks, allgather) ->
// plan shape and placement -> cache arena and staging (memfd) -> fabric (expose the
// arena once, exchange endpoint names and keys over MPI, progress thread) -> load owned
// samples -> serve trainers on the Unix socket -> readiness file -> wait for SIGTERM/SIGINT
// -> drain (barrier while the fabric keeps progressing) -> clean exit.
// Any rank's startup failure is shared with all ranks (named by rank) so every daemon
// exits with the same message instead of hanging in a collective.
// run_daemon assembles a Daemon (daemon.cc): the core's parts (catalog, placement, planner,
// schedulers) with the adapters (MPI control plane, libfabric, Asio service, storage
// readers) as members declared in creation order, built step by step by Daemon::start()
// and destroyed in reverse, so every way out tears down what was built and nothing more.
#pragma once

#include <string>

#include "common/config.h"
#include "control/mpi_comm.h"

namespace shardmix {

// The run directory: service.run_dir, else $SHARDMIX_RUN_DIR, else /tmp/shardmix-<uid>.
std::string resolve_run_dir(const Config& config);

// Runs the daemon to completion; returns the process exit code.
int run_daemon(const Config& config, MpiSession& mpi);

}  // namespace shardmix
