#include "common/collectives.h"

#include <string>
#include <utility>

namespace shardmix {

class InProcessGroup::Member : public Collectives {
 public:
  Member(InProcessGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }

  Result<RankBytes> allgather(std::span<const std::uint8_t> mine) override {
    RankBytes outgoing(static_cast<std::size_t>(size()), std::vector<std::uint8_t>(mine.begin(), mine.end()));
    return alltoall(std::move(outgoing));
  }

  Result<RankBytes> alltoall(RankBytes outgoing) override {
    if (outgoing.size() != static_cast<std::size_t>(size())) {
      return make_error(StatusCode::kInvalidArgument, "alltoall on rank {}: {} messages for {} ranks", rank_,
                        outgoing.size(), size());
    }
    const auto me = static_cast<std::size_t>(rank_);
    group_.mailbox_[me] = std::move(outgoing);
    group_.deposited_.arrive_and_wait();
    RankBytes incoming(static_cast<std::size_t>(size()));
    for (std::size_t from = 0; from < incoming.size(); ++from) incoming[from] = std::move(group_.mailbox_[from][me]);
    // Nobody deposits the next collective's messages before everyone has picked these up.
    group_.picked_up_.arrive_and_wait();
    return incoming;
  }

 private:
  InProcessGroup& group_;
  int rank_;
};

Status agree(Collectives& group, const Status& mine, std::string_view step) {
  const std::string encoded = mine.ok() ? std::string() : mine.to_string();
  SHARDMIX_ASSIGN_OR_RETURN(RankBytes all,
                            group.allgather(std::span(reinterpret_cast<const std::uint8_t*>(encoded.data()),
                                                      encoded.size())));
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) {
      return make_error(StatusCode::kUnavailable, "{} failed on daemon rank {}: {}", step, r,
                        std::string(all[r].begin(), all[r].end()));
    }
  }
  return Status::ok_status();
}

InProcessGroup::InProcessGroup(int ranks)
    : mailbox_(static_cast<std::size_t>(ranks)), deposited_(ranks), picked_up_(ranks) {
  for (int r = 0; r < ranks; ++r) members_.push_back(std::make_unique<Member>(*this, r));
}

InProcessGroup::~InProcessGroup() = default;

Collectives& InProcessGroup::member(int rank) { return *members_[static_cast<std::size_t>(rank)]; }

}  // namespace shardmix
