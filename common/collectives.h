// The collectives that start-up logic needs from the control plane, behind one interface, so
// that core code which talks to every rank (the owner-side catalog, common/
// distributed_catalog.h) runs the same over MPI (control/mpi_collectives.h) and inside one
// process (InProcessGroup: tests, an in-process cluster). Both are collectives: every rank
// calls the same operations in the same order. Errors are values, naming the rank.
// Thread-safety: one Collectives per rank, used by that rank's thread only; an
// InProcessGroup's members are used by their own threads concurrently.
#pragma once

#include <barrier>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace shardmix {

using RankBytes = std::vector<std::vector<std::uint8_t>>;  // index = rank

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank contributes `mine`; returns all ranks' bytes, indexed by rank.
  virtual Result<RankBytes> allgather(std::span<const std::uint8_t> mine) = 0;
  // outgoing[r] goes to rank r (outgoing.size() == size()); returns what each rank sent
  // to this one, indexed by rank.
  virtual Result<RankBytes> alltoall(RankBytes outgoing) = 0;
};

// Every rank learns every rank's outcome of `step`: the first failure, named by rank,
// becomes everyone's error, so no rank goes on to wait in a collective that a failed one
// never joins.
Status agree(Collectives& group, const Status& mine, std::string_view step);

// P ranks as P threads of one process. member(r) is rank r's Collectives; each collective
// returns once every rank has called it (a std::barrier between the deposit and the pick-up).
class InProcessGroup {
 public:
  explicit InProcessGroup(int ranks);
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;
  ~InProcessGroup();
  int size() const { return static_cast<int>(members_.size()); }
  Collectives& member(int rank);

 private:
  class Member;
  friend class Member;
  // mailbox_[from][to]: what rank `from` deposited for rank `to` in the current collective.
  std::vector<RankBytes> mailbox_;
  std::barrier<> deposited_;
  std::barrier<> picked_up_;
  std::vector<std::unique_ptr<Member>> members_;
};

}  // namespace shardmix
