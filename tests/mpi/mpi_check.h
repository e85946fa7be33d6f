// Shared by the MPI tests that check core logic over the real control plane
// (catalog_mpitest, directory_mpitest): a failure counter that prints each failure with its
// rank, a hash for deterministic test data, and the verdict every rank agrees on.
// Thread-safety: Checker::check may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "control/mpi_comm.h"

namespace shardmix::mpi_check {

struct Checker {
  const MpiSession& mpi;
  std::atomic<std::uint64_t> failures{0};
  void check(bool ok, const std::string& what) {
    if (ok) return;
    ++failures;
    std::fprintf(stderr, "[rank %d] FAIL: %s\n", mpi.rank(), what.c_str());
  }
};

inline std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33, x *= 0xff51afd7ed558ccdULL, x ^= x >> 33;
  return x;
}

// Sums the failures of every rank; rank 0 prints "PASS: <name> ranks=N" or FAIL. Returns
// main's exit status, the same on every rank.
inline int verdict(Checker& c, const char* name) {
  const auto total = c.mpi.allreduce_sum(c.failures.load());
  const bool passed = total.ok() && *total == 0;
  if (c.mpi.rank() == 0) {
    std::printf("%s: %s ranks=%d (%llu failures)\n", passed ? "PASS" : "FAIL", name, c.mpi.size(),
                total.ok() ? static_cast<unsigned long long>(*total) : 0ULL);
  }
  std::fflush(stdout);
  return passed ? EXIT_SUCCESS : EXIT_FAILURE;
}

}  // namespace shardmix::mpi_check
