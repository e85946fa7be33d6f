#include "common/read_groups.h"

#include <algorithm>
#include <map>

namespace shardmix {

std::vector<ReadGroup> group_reads_by_peer(std::span<const PeerRead> reads, std::size_t max_segments) {
  max_segments = std::max<std::size_t>(max_segments, 1);
  std::vector<ReadGroup> groups;
  // The group of each peer still taking segments, by index into `groups`.
  std::map<std::uint32_t, std::size_t> open;
  for (std::size_t i = 0; i < reads.size(); ++i) {
    const std::uint32_t peer = reads[i].peer;
    auto it = open.find(peer);
    if (it == open.end() || groups[it->second].reads.size() >= max_segments) {
      groups.push_back(ReadGroup{peer, {}});
      groups.back().reads.reserve(max_segments);
      it = open.insert_or_assign(peer, groups.size() - 1).first;
    }
    groups[it->second].reads.push_back(i);
  }
  return groups;
}

}  // namespace shardmix
