// Packing a fetch's peer reads into vectored reads (common/read_groups.h).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <map>
#include <vector>

#include "common/read_groups.h"

namespace shardmix {
namespace read_groups_test {

TEST(ReadGroups, PacksEachPeersReadsInOrderUpToTheLimit) {
  // peers: 1 2 1 1 3 1 1 2
  const std::vector<PeerRead> reads = {{1, 0, 10, 0},    {2, 0, 10, 16},   {1, 100, 10, 32}, {1, 200, 10, 48},
                                       {3, 0, 10, 64},   {1, 300, 10, 80}, {1, 400, 10, 96}, {2, 50, 10, 112}};
  const auto groups = group_reads_by_peer(reads, 4);
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0].peer, 1u);
  EXPECT_EQ(groups[0].reads, (std::vector<std::size_t>{0, 2, 3, 5}));
  EXPECT_EQ(groups[1].peer, 2u);
  EXPECT_EQ(groups[1].reads, (std::vector<std::size_t>{1, 7}));
  EXPECT_EQ(groups[2].peer, 3u);
  EXPECT_EQ(groups[2].reads, (std::vector<std::size_t>{4}));
  EXPECT_EQ(groups[3].peer, 1u);  // the fifth read of peer 1 opens a new group
  EXPECT_EQ(groups[3].reads, (std::vector<std::size_t>{6}));
}

TEST(ReadGroups, OneSegmentPerReadWhenTheProviderTakesOne) {
  const std::vector<PeerRead> reads = {{1, 0, 10, 0}, {1, 16, 10, 16}, {2, 0, 10, 32}};
  for (const std::size_t limit : {std::size_t{0}, std::size_t{1}}) {
    const auto groups = group_reads_by_peer(reads, limit);
    ASSERT_EQ(groups.size(), 3u);
    for (std::size_t g = 0; g < 3; ++g) EXPECT_EQ(groups[g].reads, std::vector<std::size_t>{g});
  }
  EXPECT_TRUE(group_reads_by_peer({}, 4).empty());
}

RC_GTEST_PROP(ReadGroups, EveryReadInExactlyOneGroupOfItsPeerWithinTheLimit, ()) {
  const auto peers = *rc::gen::container<std::vector<std::uint32_t>>(rc::gen::inRange<std::uint32_t>(0, 5));
  const auto limit = *rc::gen::inRange<std::size_t>(1, 6);
  std::vector<PeerRead> reads;
  for (std::size_t i = 0; i < peers.size(); ++i) reads.push_back({peers[i], i * 100, 10, i * 16});
  const auto groups = group_reads_by_peer(reads, limit);
  std::vector<int> seen(reads.size(), 0);
  for (const ReadGroup& g : groups) {
    RC_ASSERT(!g.reads.empty());
    RC_ASSERT(g.reads.size() <= limit);
    for (std::size_t k = 0; k < g.reads.size(); ++k) {
      RC_ASSERT(g.reads[k] < reads.size());
      RC_ASSERT(reads[g.reads[k]].peer == g.peer);
      if (k > 0) RC_ASSERT(g.reads[k - 1] < g.reads[k]);  // input order within a group
      ++seen[g.reads[k]];
    }
  }
  for (const int n : seen) RC_ASSERT(n == 1);
  // As few groups as the limit allows: per peer, ceil(reads of that peer / limit).
  std::map<std::uint32_t, std::size_t> per_peer;
  for (const auto p : peers) ++per_peer[p];
  std::size_t minimum = 0;
  for (const auto& [peer, n] : per_peer) minimum += (n + limit - 1) / limit;
  RC_ASSERT(groups.size() == minimum);
}

}  // namespace read_groups_test
}  // namespace shardmix
