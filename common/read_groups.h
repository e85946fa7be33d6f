// How a fetch's peer reads become provider operations: the reads of one peer, in their
// order, are packed into vectored reads of at most `max_segments` segments each (one
// fi_readmsg and one completion per group instead of one per sample). Pure, so it is
// tested on its own (tests/unit/read_groups_test.cc); FabricFetcher applies it.
// Thread-safety: a free function on its arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/trainer_scheduler.h"

namespace shardmix {

// One vectored read: indices into the fetch's reads, all of one peer, in input order.
struct ReadGroup {
  std::uint32_t peer = 0;
  std::vector<std::size_t> reads;
};

// Every read lands in exactly one group; a group holds 1..max_segments reads of one peer
// (max_segments 0 counts as 1). Groups come in the order of their peers' first reads, so
// that a batch's reads are posted roughly in plan order.
std::vector<ReadGroup> group_reads_by_peer(std::span<const PeerRead> reads, std::size_t max_segments);

}  // namespace shardmix
