// Owner-side metadata (decision 0055): the spread ownership is a partition of the ids that
// the placement tabulates exactly, and a node's ShardedDirectory (its own OwnerShard plus
// the owners' answers) tells the scheduler the same bytes, label, owner and arena offset
// for every planned sample as the global catalog and placement do, cold samples included.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "common/catalog.h"
#include "common/epoch_plan.h"
#include "common/metadata_footprint.h"
#include "common/ownership.h"
#include "common/placement.h"
#include "common/sample_directory.h"
#include "tests/unit/plan_support.h"

namespace shardmix {
namespace sample_directory_test {

struct DirectoryCase {
  std::vector<std::uint64_t> sizes;
  std::uint32_t classes = 1;
  JobShape job;
  ShuffleConfig shuffle;
  double share = 1.0;  // of the dataset the nodes' arenas hold together
  // How samples are stored: 0 no files (synthetic), 1 in shards of shard_size samples,
  // 2 one file each (a whole-file format's paths).
  int layout = 0;
  std::uint64_t shard_size = 1;
};

std::ostream& operator<<(std::ostream& os, const DirectoryCase& c) {
  return os << "N=" << c.sizes.size() << " C=" << c.classes << " nodes=" << c.job.nodes
            << " tpn=" << c.job.trainers_per_node << " B=" << c.job.batch_size << " drop_last=" << c.job.drop_last
            << " Q=" << c.shuffle.exchange_fraction << " seed=" << c.shuffle.seed << " share=" << c.share
            << " layout=" << c.layout << " shard_size=" << c.shard_size;
}

rc::Gen<DirectoryCase> gen_case() {
  return rc::gen::exec([] {
    DirectoryCase c;
    const auto n = *rc::gen::inRange<std::size_t>(1, 600);
    c.sizes = test_support::random_sizes(*rc::gen::arbitrary<std::uint64_t>(), n);
    c.classes = *rc::gen::inRange<std::uint32_t>(1, 12);
    c.job.nodes = *rc::gen::inRange<std::uint32_t>(1, 9);
    c.job.trainers_per_node = *rc::gen::inRange<std::uint32_t>(1, 4);
    c.job.batch_size = *rc::gen::inRange<std::uint32_t>(1, 17);
    c.job.drop_last = *rc::gen::arbitrary<bool>();
    c.shuffle.seed = *rc::gen::arbitrary<std::uint64_t>();
    c.shuffle.exchange_fraction = *test_support::gen_exchange_fraction();
    c.share = *rc::gen::element(0.0, 0.3, 0.7, 1.0, 2.0);
    c.layout = *rc::gen::element(0, 1, 2);
    c.shard_size = *rc::gen::inRange<std::uint64_t>(1, 50);
    return c;
  });
}

// A synthetic catalog of the case (labels ascending in id, as every catalog assigns them).
Catalog catalog_of(const DirectoryCase& c) {
  std::vector<std::int32_t> labels(c.sizes.size());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    labels[i] = static_cast<std::int32_t>(i * c.classes / labels.size());
  }
  if (c.layout != 2) return std::move(Catalog::synthetic(c.sizes, labels, c.layout == 1 ? c.shard_size : 0).value());
  // One file per sample, named so that (label, path) order is id order.
  std::vector<CatalogEntry> entries;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    entries.push_back(CatalogEntry{fmt::format("class{}/sample-{:06}.bin", labels[i], i), c.sizes[i], labels[i]});
  }
  std::vector<std::string> classes;
  for (std::uint32_t k = 0; k < c.classes; ++k) classes.push_back(fmt::format("class{}", k));
  return std::move(Catalog::from_entries(std::move(entries), std::move(classes)).value());
}

bool same(const SampleInfo& a, const SampleInfo& b) {
  return a.bytes == b.bytes && a.arena_offset == b.arena_offset && a.owner == b.owner && a.label == b.label;
}

RC_GTEST_PROP(Ownership, SpreadIsAPartitionThatThePlacementTabulates, ()) {
  const DirectoryCase c = *gen_case();
  const PlanShape shape = make_plan_shape(c.sizes.size(), c.job);
  const Ownership spread = Ownership::spread(c.sizes.size(), shape.node_owned, c.shuffle.seed);
  const Placement p = make_placement(c.sizes, shape, PlacementPolicy::kSpread, c.shuffle.seed);
  std::vector<int> seen(c.sizes.size(), 0);
  for (std::uint32_t k = 0; k < c.job.nodes; ++k) {
    RC_ASSERT(spread.owned_count(k) == shape.node_owned[k]);
    std::vector<SampleId> share;
    for (std::uint64_t i = 0; i < spread.owned_count(k); ++i) {
      const SampleId id = spread.owned_at(k, i);
      RC_ASSERT(id < c.sizes.size());
      ++seen[id];
      const Ownership::Share where = spread.locate(id);
      RC_ASSERT(where.node == k);
      RC_ASSERT(where.index == i);
      RC_ASSERT(spread.owner(id) == k);
      share.push_back(id);
    }
    std::sort(share.begin(), share.end());
    RC_ASSERT(share == p.owned[k]);  // the tabulated lists are the function's shares, ascending
  }
  RC_ASSERT(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
  // The planner reads the function, not the tabulated lists' ascending order.
  RC_ASSERT(ownership_of(p).is_spread());
}

// An id past the dataset is a caller's bug: named and stopped, not a cycle walk for ever.
TEST(Ownership, LocatingAnIdPastTheDatasetStopsNamingIt) {
  const Ownership spread = Ownership::spread(10, {4, 6}, 3);
  const Ownership::Share last = spread.locate(9);  // the last id is still located
  EXPECT_EQ(spread.owned_at(last.node, last.index), 9u);
  EXPECT_DEATH((void)spread.locate(10), "sample id 10 of a dataset of 10 samples");
}

RC_GTEST_PROP(ShardedDirectory, TellsTheSchedulerWhatTheGlobalDirectoryTells, ()) {
  const DirectoryCase c = *gen_case();
  const Catalog catalog = catalog_of(c);
  const PlanShape shape = make_plan_shape(c.sizes.size(), c.job);
  const std::uint64_t capacity = c.share >= 2.0 ? kNoCapacityLimit
                                                : test_support::capacity_for_share(c.sizes, c.job.nodes, c.share);
  const Placement p = make_placement(catalog.sizes(), shape, PlacementPolicy::kSpread, c.shuffle.seed, capacity);
  const GlobalDirectory global(catalog, p);

  const Ownership ownership = Ownership::spread(c.sizes.size(), shape.node_owned, c.shuffle.seed);
  std::vector<OwnerShard> shards;
  std::vector<std::uint64_t> cold;
  for (std::uint32_t k = 0; k < c.job.nodes; ++k) {
    shards.push_back(OwnerShard::build(catalog, ownership, k, capacity, c.shuffle.seed));
    RC_ASSERT(shards[k].size() == p.owned[k].size());
    RC_ASSERT(shards[k].cold_samples() == p.cold_samples[k]);
    RC_ASSERT(shards[k].cached_bytes() == p.cached_bytes[k]);
    RC_ASSERT(shards[k].arena_bytes() == p.arena_bytes[k]);
    cold.push_back(shards[k].cold_samples());
    for (std::uint64_t i = 0; i < shards[k].size(); ++i) {
      RC_ASSERT(same(shards[k].at(i), global.info(ownership.owned_at(k, i))));
    }
  }
  const InProcessExchange exchange(shards);
  const EpochPlanner from_placement(shape, p, c.shuffle);
  const EpochPlanner from_ownership(shape, ownership, c.shuffle);
  const auto epoch = *rc::gen::inRange<std::uint64_t>(0, 5);
  for (std::uint32_t k = 0; k < c.job.nodes; ++k) {
    const ShardedDirectory directory(k, ownership, shards[k], exchange, cold, 0);
    RC_ASSERT(directory.has_cold_samples() == global.has_cold_samples());
    const std::vector<TrainerPlan> plans = from_ownership.plan_node(epoch, k);
    const std::vector<TrainerPlan> tabulated = from_placement.plan_node(epoch, k);
    for (std::size_t t = 0; t < plans.size(); ++t) {
      // The same plan whether the planner has the tabulated placement or the function alone.
      RC_ASSERT(plans[t].order == tabulated[t].order);
      const auto resolved = directory.resolve(plans[t].order);
      const auto looked_up = global.resolve(plans[t].order);
      RC_ASSERT(resolved.ok());
      RC_ASSERT(looked_up.ok());
      for (std::uint64_t i = 0; i < plans[t].order.size(); ++i) {
        const SampleId id = plans[t].order[i];
        RC_ASSERT(same((*resolved)->at(i, id), (*looked_up)->at(i, id)));
        // A cold sample's storage location comes with it (the reader has no catalog);
        // a resident one's stays with its owner.
        const std::optional<CatalogEntry> stored = (*resolved)->storage_location(i);
        RC_ASSERT(!(*looked_up)->storage_location(i).has_value());
        if (p.is_resident(id)) {
          RC_ASSERT(!stored.has_value());
        } else {
          RC_ASSERT(stored.has_value());
          RC_ASSERT(stored->size == catalog.sample_bytes(id));
          RC_ASSERT(stored->label == catalog.label(id));
          RC_ASSERT(stored->shard == catalog.shard(id));
          RC_ASSERT(stored->offset == catalog.offset(id));
          RC_ASSERT(stored->path == (catalog.sharded() ? std::string() : std::string(catalog.path(id))));
        }
      }
    }
    // What the node holds: its shard and O(P) tables, never the other shards.
    const DirectoryBytes held = directory.memory_bytes();
    RC_ASSERT(held.catalog == shards[k].memory_bytes());
    RC_ASSERT(held.placement == ownership.memory_bytes() + cold.size() * sizeof(std::uint64_t));
  }
  RC_TAG(c.layout, p.total_cold_samples() > 0);  // layout, and whether cold samples were there
}

// The catalog a trainer asks for under owner-side metadata (decision 0066): assembled from
// every owner's share with every location, it serializes to the very bytes of the global
// catalog, for shard and whole-file layouts, whatever the capacity.
RC_GTEST_PROP(ShardedDirectory, AssemblesTheGlobalCatalogFromTheOwnersShares, ()) {
  DirectoryCase c = *gen_case();
  c.layout = *rc::gen::element(1, 2);  // a catalog with files (the synthetic one has none to name)
  const Catalog catalog = catalog_of(c);
  const PlanShape shape = make_plan_shape(c.sizes.size(), c.job);
  const std::uint64_t capacity = c.share >= 2.0 ? kNoCapacityLimit
                                                : test_support::capacity_for_share(c.sizes, c.job.nodes, c.share);
  const Ownership ownership = Ownership::spread(c.sizes.size(), shape.node_owned, c.shuffle.seed);
  std::vector<OwnerShard> shards;
  for (std::uint32_t k = 0; k < c.job.nodes; ++k) {
    shards.push_back(OwnerShard::build(catalog, ownership, k, capacity, c.shuffle.seed));
  }
  std::vector<std::string> table;
  if (catalog.sharded()) {
    for (std::size_t f = 0; f < catalog.file_count(); ++f) table.emplace_back(catalog.file_path(f));
  }
  Catalog files = Catalog::of_share(table, {}, catalog.class_names());
  const InProcessExchange exchange(shards);
  const auto node = *rc::gen::inRange<std::uint32_t>(0, c.job.nodes);
  auto assembled = assemble_catalog(node, ownership, shards[node], exchange, files);
  RC_ASSERT(assembled.ok());
  RC_ASSERT(assembled->serialize() == catalog.serialize());
}

// A resident sample whose bytes could not be loaded (decision 0058): cold from then on, in
// the placement's lists and counts and in what the directory tells the scheduler.
TEST(MakeCold, AResidentSampleLeavesItsOwnersArenaAndNothingElseMoves) {
  DirectoryCase c;
  c.sizes = {100, 200, 300, 400, 500, 600};
  c.job.nodes = 2;
  const Catalog catalog = catalog_of(c);
  Placement p = make_placement(catalog.sizes(), make_plan_shape(c.sizes.size(), c.job), PlacementPolicy::kBalanced,
                               c.shuffle.seed, kNoCapacityLimit);
  ASSERT_EQ(p.total_cold_samples(), 0u);
  const Placement before = p;
  const SampleId gone = 3;
  const std::uint32_t node = p.owner[gone];
  make_cold(p, gone, catalog.sample_bytes(gone));
  make_cold(p, gone, catalog.sample_bytes(gone));  // already cold: no change
  const GlobalDirectory directory(catalog, p);
  EXPECT_TRUE(directory.has_cold_samples());
  EXPECT_FALSE(p.is_resident(gone));
  EXPECT_FALSE(directory.info(gone).resident());
  EXPECT_EQ(directory.info(gone).owner, node);
  EXPECT_EQ(std::count(p.cached[node].begin(), p.cached[node].end(), gone), 0);
  EXPECT_EQ(p.cached[node].size(), before.cached[node].size() - 1);
  EXPECT_EQ(p.cached_bytes[node], before.cached_bytes[node] - 400);
  EXPECT_EQ(p.cold_samples[node], 1u);
  EXPECT_EQ(p.cold_bytes[node], 400u);
  EXPECT_EQ(p.arena_bytes, before.arena_bytes);  // the slot stays allocated
  EXPECT_EQ(p.owned, before.owned);
  for (SampleId id = 0; id < c.sizes.size(); ++id) {
    if (id != gone) {
      EXPECT_EQ(p.arena_offset[id], before.arena_offset[id]) << id;
    }
  }
}

// An owner answers only for its share: an index past it is an error naming who asked and
// the index, and a reader's plan then fails with that error instead of reading garbage.
TEST(ShardedDirectory, AnIndexOutsideTheOwnersShareIsAnErrorNamingTheAsker) {
  DirectoryCase c;
  c.sizes = {100, 200, 300, 400, 500, 600};
  c.job.nodes = 2;
  const Catalog catalog = catalog_of(c);
  const PlanShape shape = make_plan_shape(c.sizes.size(), c.job);
  const Ownership ownership = Ownership::spread(c.sizes.size(), shape.node_owned, 1);
  const OwnerShard shard = OwnerShard::build(catalog, ownership, 1, kNoCapacityLimit, 1);
  std::vector<SampleInfo> out(2);
  const std::vector<std::uint64_t> fine{0, shard.size() - 1};
  ASSERT_TRUE(describe_from(shard, fine, out, "daemon rank 0").ok());
  EXPECT_EQ(out[1].bytes, shard.at(shard.size() - 1).bytes);
  const std::vector<std::uint64_t> past{0, shard.size()};
  const Status s = describe_from(shard, past, out, "daemon rank 0");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("daemon rank 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(fmt::format("index {}", shard.size())), std::string::npos) << s.message();
  // Through a directory: node 0 asks an exchange that knows only one shard for node 1's.
  const std::vector<OwnerShard> only_node0{OwnerShard::build(catalog, ownership, 0, kNoCapacityLimit, 1)};
  const InProcessExchange exchange(only_node0);
  const ShardedDirectory directory(0, ownership, only_node0[0], exchange, {0, 0}, 0);
  std::vector<SampleId> all(c.sizes.size());
  std::iota(all.begin(), all.end(), SampleId{0});
  const auto resolved = directory.resolve(all);
  ASSERT_FALSE(resolved.ok());
  EXPECT_NE(resolved.status().message().find("owner 1"), std::string::npos) << resolved.status().message();
}

// The figure the issue is about: at a fixed dataset, a node's owner-side metadata shrinks as
// nodes are added, while the global directory's does not.
TEST(ShardedDirectory, PerNodeBytesFallWithTheNodeCount) {
  constexpr std::size_t kSamples = 200000;
  DirectoryCase c;
  c.sizes = test_support::random_sizes(3, kSamples);
  c.classes = 10;
  const Catalog catalog = catalog_of(c);
  std::vector<std::uint64_t> sharded_bytes;
  std::vector<std::uint64_t> global_bytes;
  for (std::uint32_t nodes : {4u, 16u, 64u}) {
    const PlanShape shape = make_plan_shape(kSamples, JobShape{nodes, 2, 32, false});
    const Ownership ownership = Ownership::spread(kSamples, shape.node_owned, 1);
    const std::vector<OwnerShard> shards{OwnerShard::build(catalog, ownership, 0, kNoCapacityLimit, 1)};
    const InProcessExchange exchange(shards);
    const ShardedDirectory directory(0, ownership, shards[0], exchange, std::vector<std::uint64_t>(nodes, 0), 0);
    sharded_bytes.push_back(node_metadata_bytes(directory, 0).total());
    const Placement p = make_placement(catalog.sizes(), shape, PlacementPolicy::kSpread, 1);
    global_bytes.push_back(node_metadata_bytes(GlobalDirectory(catalog, p), 0).total());
  }
  // N/P entries of 32 bytes: a quarter each time the nodes quadruple (plus O(P) tables).
  EXPECT_LT(sharded_bytes[1], sharded_bytes[0] / 3) << sharded_bytes[0] << " -> " << sharded_bytes[1];
  EXPECT_LT(sharded_bytes[2], sharded_bytes[1] / 3) << sharded_bytes[1] << " -> " << sharded_bytes[2];
  EXPECT_LE(sharded_bytes[0], kSamples / 4 * 40);
  // The global directory holds every sample on every node: it does not fall.
  EXPECT_GE(global_bytes[2], global_bytes[0]);
  EXPECT_GT(global_bytes[2], 20 * sharded_bytes[2]);
}

}  // namespace sample_directory_test
}  // namespace shardmix
