// Open MPI's MPMD app contexts (mpirun -np 2 shardmixd : -np 4 ./train): which world ranks
// belong to one app context. Both the daemons and shardmix-mpmd-trainer build their own
// communicator from this, so the parsing lives here once.
// Thread-safety: a pure function.
#pragma once

#include <optional>

namespace shardmix {

struct AppContextRange {
  int first = 0;  // the context's first world rank
  int count = 0;  // its number of processes
};

// The ranks of app context `appnum`, from OMPI_APP_CTX_NUM_PROCS (`num_procs`: each
// context's size, space-separated, e.g. "2 4"). nullopt when the list is missing or empty,
// or `appnum` is not one of its contexts.
std::optional<AppContextRange> app_context_range(const char* num_procs, int appnum);

}  // namespace shardmix
