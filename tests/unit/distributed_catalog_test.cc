// The owner-side catalog's start-up (decision 0061): for any dataset, any split of its scan
// across P ranks and any spread ownership, the sample sort gives each rank a slice of
// exactly the global catalog's order (merge_scans), routing gives each node exactly the
// entries of its share, and the OwnerShard built from them equals the one built from the
// global catalog; failures are every rank's, with the global catalog's messages. Runs P ranks as threads over an InProcessGroup.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/catalog.h"
#include "common/collectives.h"
#include "common/distributed_catalog.h"
#include "common/ownership.h"
#include "common/sample_directory.h"
#include "proto/catalog_exchange.h"
#include "proto/directory_exchange.h"

namespace shardmix {
namespace distributed_catalog_test {

struct Case {
  DatasetConfig dataset;
  std::vector<ScanResult> parts;  // one per rank, as each rank's scan returns it
  std::vector<std::uint64_t> node_owned;  // filled once N is known
  std::uint64_t seed = 0;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  std::size_t n = 0;
  for (const ScanResult& p : c.parts) n += p.entries.size();
  return os << (c.dataset.format == DatasetFormat::kFolder ? "folder" : "webdataset") << " N=" << n
            << " ranks=" << c.parts.size() << " seed=" << c.seed;
}

// A dataset split across `ranks` scans at random: whole files (folder) are dealt one by
// one, shards (webdataset) whole, with their samples, as the scans do.
rc::Gen<Case> gen_case() {
  return rc::gen::exec([] {
    Case c;
    const bool sharded = *rc::gen::arbitrary<bool>();
    c.dataset.path = "/data";
    c.dataset.format = sharded ? DatasetFormat::kWebDataset : DatasetFormat::kFolder;
    const auto ranks = *rc::gen::inRange<std::size_t>(1, 8);
    c.parts.resize(ranks);
    c.seed = *rc::gen::arbitrary<std::uint64_t>();
    const auto samples = *rc::gen::inRange<std::size_t>(0, 300);
    const auto classes = *rc::gen::inRange<std::int32_t>(1, 6);
    if (!sharded) {
      std::vector<std::string> names;
      for (std::int32_t k = 0; k < classes; ++k) names.push_back("class" + std::to_string(k));
      for (ScanResult& part : c.parts) part.class_names = names;
      for (std::size_t i = 0; i < samples; ++i) {
        CatalogEntry e;
        e.label = *rc::gen::inRange<std::int32_t>(0, classes);
        e.path = names[static_cast<std::size_t>(e.label)] + "/" + std::to_string(*rc::gen::inRange(0, 1000000)) +
                 "-" + std::to_string(i) + ".jpg";
        e.size = *rc::gen::inRange<std::uint64_t>(1, 5000);
        c.parts[*rc::gen::inRange<std::size_t>(0, ranks)].entries.push_back(std::move(e));
      }
    } else {
      const auto shards = *rc::gen::inRange<std::size_t>(1, 12);
      for (std::size_t s = 0; s < shards; ++s) {
        ScanResult& part = c.parts[*rc::gen::inRange<std::size_t>(0, ranks)];
        const auto local = static_cast<std::uint32_t>(part.shards.size());
        part.shards.push_back("shard-" + std::to_string(*rc::gen::inRange(0, 1000)) + "-" + std::to_string(s) + ".tar");
        const auto in_shard = samples / shards + (s < samples % shards ? 1 : 0);
        std::uint64_t offset = 512;
        for (std::size_t i = 0; i < in_shard; ++i) {
          CatalogEntry e;
          e.label = *rc::gen::inRange<std::int32_t>(0, classes) * 7;  // sparse labels, as shards carry them
          e.size = *rc::gen::inRange<std::uint64_t>(1, 5000);
          e.shard = local;
          e.offset = offset;
          offset += e.size + 512;
          part.entries.push_back(std::move(e));
        }
      }
    }
    return c;
  });
}

// Node k's count of the spread ownership: a random composition of N into P parts.
std::vector<std::uint64_t> random_counts(std::uint64_t n, std::size_t nodes, std::uint64_t seed) {
  std::vector<std::uint64_t> counts(nodes, 0);
  std::uint64_t x = seed | 1;
  for (std::uint64_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ++counts[x % nodes];
  }
  return counts;
}

struct RankOutcome {
  std::optional<Status> sort_error;
  CatalogSlice slice;
  Result<std::vector<SampleId>> runs = std::vector<SampleId>{};
  std::optional<Status> route_error;
  OwnerEntries owned;
};

// Every rank's sort_scans, then (if every rank sorted) route_to_owners, each on its thread.
std::vector<RankOutcome> run_ranks(const Case& c) {
  const auto ranks = static_cast<int>(c.parts.size());
  InProcessGroup group(ranks);
  std::vector<RankOutcome> out(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      RankOutcome& mine = out[static_cast<std::size_t>(r)];
      auto slice = sort_scans(c.dataset, c.parts[static_cast<std::size_t>(r)], group.member(r));
      if (!slice.ok()) {
        mine.sort_error = slice.status();
        return;
      }
      mine.slice = *slice;
      mine.runs = class_runs(*slice, group.member(r));
      const std::uint64_t n = slice->tables.samples;
      const Ownership ownership = Ownership::spread(n, random_counts(n, c.parts.size(), c.seed), c.seed);
      auto owned = route_to_owners(std::move(*slice), ownership, group.member(r));
      if (!owned.ok()) {
        mine.route_error = owned.status();
      } else {
        mine.owned = std::move(*owned);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

std::string location_of(const CatalogEntry& e, const CatalogTables& tables) {
  return tables.shards.empty() ? e.path : tables.shards[e.shard] + "@" + std::to_string(e.offset);
}

RC_GTEST_PROP(DistributedCatalog, SlicesAreTheGlobalOrderAndOwnersGetTheirShares, ()) {
  const Case c = *gen_case();
  auto global = merge_scans(c.dataset, c.parts);
  const std::vector<RankOutcome> ranks = run_ranks(c);
  if (!global.ok()) {
    // Only an empty dataset fails here, and it fails on every rank with the same message.
    for (const RankOutcome& r : ranks) {
      RC_ASSERT(r.sort_error.has_value());
      RC_ASSERT(r.sort_error->message() == global.status().message());
    }
    return;
  }
  const Catalog& catalog = *global;
  std::uint64_t next_id = 0;
  for (const RankOutcome& r : ranks) {
    RC_ASSERT(!r.sort_error.has_value());
    RC_ASSERT(!r.route_error.has_value());
    const CatalogTables& tables = r.slice.tables;
    RC_ASSERT(tables.samples == catalog.size());
    RC_ASSERT(tables.class_names == catalog.class_names());
    if (catalog.sharded()) {
      RC_ASSERT(tables.shards.size() == catalog.file_count());
      for (std::size_t s = 0; s < tables.shards.size(); ++s) RC_ASSERT(tables.shards[s] == catalog.file_path(s));
    }
    // Slices follow each other in rank order and are the catalog's order.
    RC_ASSERT(r.slice.first == next_id);
    for (std::size_t i = 0; i < r.slice.entries.size(); ++i) {
      const auto id = static_cast<SampleId>(r.slice.first + i);
      const CatalogEntry& e = r.slice.entries[i];
      RC_ASSERT(e.label == catalog.label(id));
      RC_ASSERT(e.size == catalog.sample_bytes(id));
      RC_ASSERT(location_of(e, tables) == catalog.location(id));
    }
    next_id += r.slice.entries.size();
  }
  RC_ASSERT(next_id == catalog.size());
  // Every rank knows where each class's run of ids starts, as the catalog's labels say.
  std::vector<SampleId> runs;
  for (SampleId id = 0; id < catalog.size(); ++id) {
    if (id == 0 || catalog.label(id) != catalog.label(id - 1)) runs.push_back(id);
  }
  for (const RankOutcome& r : ranks) {
    RC_ASSERT(r.runs.ok());
    RC_ASSERT(*r.runs == runs);
  }
  // Each node holds exactly its share, in share order, and lays out the same arena from it
  // as from the global catalog.
  const Ownership ownership =
      Ownership::spread(catalog.size(), random_counts(catalog.size(), c.parts.size(), c.seed), c.seed);
  const auto capacity = *rc::gen::inRange<std::uint64_t>(0, 2 * catalog.total_bytes() / ranks.size() + 2);
  for (std::uint32_t k = 0; k < ranks.size(); ++k) {
    const OwnerEntries& owned = ranks[k].owned;
    const OwnerShard from_routed = OwnerShard::from_entries(owned, k, capacity, c.seed);
    const OwnerShard from_global = OwnerShard::build(catalog, ownership, k, capacity, c.seed);
    RC_ASSERT(from_routed.size() == from_global.size());
    RC_ASSERT(from_routed.cold_samples() == from_global.cold_samples());
    RC_ASSERT(from_routed.cached_bytes() == from_global.cached_bytes());
    RC_ASSERT(from_routed.memory_bytes() == from_global.memory_bytes());
    for (std::uint64_t i = 0; i < from_routed.size(); ++i) {
      const SampleInfo a = from_routed.at(i), b = from_global.at(i);
      RC_ASSERT(a.bytes == b.bytes);
      RC_ASSERT(a.arena_offset == b.arena_offset);
      RC_ASSERT(a.owner == b.owner);
      RC_ASSERT(a.label == b.label);
      RC_ASSERT(from_routed.shard(i) == from_global.shard(i));
      RC_ASSERT(from_routed.offset(i) == from_global.offset(i));
      RC_ASSERT(from_routed.path(i) == from_global.path(i));
      RC_ASSERT(from_global.path(i) == (catalog.sharded() ? std::string_view() : catalog.path(owned.ids[i])));
    }
    RC_ASSERT(owned.entries.size() == ownership.owned_count(k));
    RC_ASSERT(owned.ids.size() == owned.entries.size());
    for (std::size_t i = 0; i < owned.entries.size(); ++i) {
      const SampleId id = owned.ids[i];
      RC_ASSERT(id == ownership.owned_at(k, i));
      RC_ASSERT(owned.entries[i].size == catalog.sample_bytes(id));
      RC_ASSERT(owned.entries[i].label == catalog.label(id));
      RC_ASSERT(location_of(owned.entries[i], owned.tables) == catalog.location(id));
    }
  }
}

// sort_scans fails on every rank of the case, each time with `message` in its error.
void expect_every_rank_fails(const Case& c, std::string_view message) {
  for (const RankOutcome& r : run_ranks(c)) {
    ASSERT_TRUE(r.sort_error.has_value());
    EXPECT_NE(r.sort_error->message().find(message), std::string::npos) << r.sort_error->message();
  }
}

// Two ranks each scanned the same file: the equal keys meet on one rank, which fails, and
// every rank reports it (none waits in a collective the failed one never joins).
TEST(DistributedCatalog, ADuplicatePathOnTwoRanksFailsOnEveryRank) {
  Case c;
  c.dataset.path = "/data";
  c.dataset.format = DatasetFormat::kFolder;
  c.parts.resize(3);
  for (ScanResult& p : c.parts) p.class_names = {"cat", "dog"};
  for (int i = 0; i < 30; ++i) {
    c.parts[static_cast<std::size_t>(i % 3)].entries.push_back(
        CatalogEntry{"dog/" + std::to_string(i) + ".jpg", 10, 1, 0, 0});
  }
  c.parts[2].entries.push_back(CatalogEntry{"dog/4.jpg", 10, 1, 0, 0});  // rank 1 has it too
  expect_every_rank_fails(c, "duplicate sample path 'dog/4.jpg' in the dataset");
}

TEST(DistributedCatalog, ASampleOverTheLimitIsNamedOnEveryRank) {
  Case c;
  c.dataset.path = "/data";
  c.dataset.format = DatasetFormat::kWebDataset;
  c.dataset.max_sample_bytes = 100;
  c.parts.resize(2);
  c.parts[0].shards = {"a.tar"};
  c.parts[1].shards = {"b.tar"};
  for (std::uint64_t i = 0; i < 5; ++i) {
    c.parts[0].entries.push_back(CatalogEntry{"", 50, 0, 0, 512 * (i + 1)});
    c.parts[1].entries.push_back(CatalogEntry{"", i == 3 ? 101u : 50u, 0, 0, 512 * (i + 1)});
  }
  expect_every_rank_fails(c, "b.tar@2048' is 101 bytes, larger than dataset.max_sample_bytes = 100");
}

TEST(DistributedCatalog, ClassListsThatDifferBetweenRanksAreAnError) {
  Case c;
  c.dataset.path = "/data";
  c.dataset.format = DatasetFormat::kFolder;
  c.parts.resize(2);
  c.parts[0].class_names = {"cat", "dog"};
  c.parts[1].class_names = {"cat", "dog", "emu"};
  c.parts[0].entries.push_back(CatalogEntry{"cat/1.jpg", 10, 0, 0, 0});
  expect_every_rank_fails(c, "ranks 0 and 1 found different classes under dataset.path '/data' (2 vs 3");
}

TEST(EntryBatchWire, RoundTripsAndNamesWhatIsWrong) {
  proto::EntryBatch batch;
  batch.add(3, 100, 0, 0, "dog/1.jpg", 7);
  batch.add(4, 200, 0, 0, "emu/2.jpg", 8);
  const std::vector<std::uint8_t> bytes = proto::encode_entry_batch(batch);
  proto::EntryBatch back;
  ASSERT_EQ(proto::decode_entry_batch(bytes, "daemon rank 3", back), "");
  EXPECT_EQ(back.paths, "dog/1.jpgemu/2.jpg");
  EXPECT_EQ(back.index, (std::vector<std::uint64_t>{7, 8}));
  EXPECT_EQ(back.sizes, (std::vector<std::uint64_t>{100, 200}));

  proto::EntryBatch cut;
  const std::string truncated =
      proto::decode_entry_batch(std::span(bytes).first(bytes.size() - 3), "daemon rank 3", cut);
  EXPECT_NE(truncated.find("catalog entries from daemon rank 3: field 'paths'"), std::string::npos) << truncated;

  batch.path_bytes[1] = 3;  // the lengths no longer add up to the paths' bytes
  proto::EntryBatch lying;
  const std::string mismatch = proto::decode_entry_batch(proto::encode_entry_batch(batch), "daemon rank 1", lying);
  EXPECT_NE(mismatch.find("path lengths add up to 12 bytes, the paths hold 18"), std::string::npos) << mismatch;
}

// The per-plan directory layouts (decision 0062) round-trip, and a damaged or mismatched
// message is an error naming the sender and what is wrong.
TEST(DirectoryExchangeWire, RoundTripsAndNamesWhatIsWrong) {
  proto::DirectoryAsk ask;
  ask.request = 12;
  ask.indices = {4, 0, 9};
  ask.flags = proto::kAskEveryLocation;
  proto::DirectoryAsk ask_back;
  ASSERT_EQ(proto::decode_directory_ask(proto::encode_directory_ask(ask), "daemon rank 2", ask_back), "");
  EXPECT_EQ(ask_back.request, 12u);
  EXPECT_EQ(ask_back.flags, proto::kAskEveryLocation);
  EXPECT_EQ(ask_back.indices, ask.indices);

  proto::DirectoryAnswer answer;
  answer.request = 12;
  answer.bytes = {10, 20, 30};
  answer.arena_offset = {0, kNotResident, 64};
  answer.labels = {2, 0, 1};
  // Entry 1 is cold: its storage location travels with it (a whole-file format's path).
  answer.located_entry = {1};
  answer.located_shard = {0};
  answer.located_offset = {0};
  answer.located_paths = "cat/0001.jpg";
  answer.located_path_end = {answer.located_paths.size()};
  const std::vector<std::uint8_t> bytes = proto::encode_directory_answer(answer);
  proto::DirectoryAnswer back;
  ASSERT_EQ(proto::decode_directory_answer(bytes, "daemon rank 1", back), "");
  EXPECT_EQ(back.arena_offset, answer.arena_offset);
  EXPECT_EQ(back.labels, answer.labels);
  EXPECT_EQ(back.located_entry, answer.located_entry);
  EXPECT_EQ(back.located_path(0), "cat/0001.jpg");
  {
    // Every entry located (the catalog a trainer asks for), resident ones too.
    proto::DirectoryAnswer every = answer;
    every.every_entry = true;
    every.located_entry = {0, 1, 2};
    every.located_shard = {0, 0, 0};
    every.located_offset = {0, 0, 0};
    every.located_paths = "a/1b/2c/3";
    every.located_path_end = {3, 6, 9};
    proto::DirectoryAnswer out;
    ASSERT_EQ(proto::decode_directory_answer(proto::encode_directory_answer(every), "daemon rank 1", out), "");
    EXPECT_TRUE(out.every_entry);
    EXPECT_EQ(out.located_path(2), "c/3");
  }

  // The cold list must name exactly the cold entries, with paths inside located_paths.
  auto refusal = [](proto::DirectoryAnswer a) {
    proto::DirectoryAnswer out;
    return proto::decode_directory_answer(proto::encode_directory_answer(a), "daemon rank 5", out);
  };
  {
    proto::DirectoryAnswer a = answer;
    a.located_entry = {};
    a.located_shard = {};
    a.located_offset = {};
    a.located_path_end = {};
    a.located_paths.clear();
    const std::string why = refusal(a);
    EXPECT_NE(why.find("daemon rank 5: entry 1 of request 12 is cold but has no storage location"), std::string::npos)
        << why;
  }
  {
    proto::DirectoryAnswer a = answer;
    a.located_entry = {2};
    const std::string why = refusal(a);
    EXPECT_NE(why.find("entry 1 of request 12 is cold but has no storage location"), std::string::npos) << why;
  }
  {
    proto::DirectoryAnswer a = answer;
    a.arena_offset[1] = 128;
    const std::string why = refusal(a);
    EXPECT_NE(why.find("entry 1 of request 12 is resident but has a storage location"), std::string::npos) << why;
  }
  {
    proto::DirectoryAnswer a = answer;
    a.located_path_end = {a.located_paths.size() + 4};
    const std::string why = refusal(a);
    EXPECT_NE(why.find("located entry 1 of request 12 has its path at [0, 16) of 12 path bytes"), std::string::npos)
        << why;
  }
  {
    // An answer of every location must locate the resident entries too.
    proto::DirectoryAnswer a = answer;
    a.every_entry = true;
    const std::string why = refusal(a);
    EXPECT_NE(why.find("entry 0 of request 12 has no storage location in an answer of every location"),
              std::string::npos)
        << why;
  }
  {
    proto::DirectoryAsk flagged = ask;
    flagged.flags = 6;
    proto::DirectoryAsk out;
    const std::string why = proto::decode_directory_ask(proto::encode_directory_ask(flagged), "daemon rank 2", out);
    EXPECT_NE(why.find("request 12 sets unknown flags 6"), std::string::npos) << why;
  }
  {
    proto::DirectoryAnswer a = answer;
    a.located_paths += "xyz";
    const std::string why = refusal(a);
    EXPECT_NE(why.find("request 12 carries 3 path bytes past its last path"), std::string::npos) << why;
  }
  {
    proto::DirectoryAnswer a = answer;
    a.located_entry = {1, 7};
    a.located_shard = {0, 0};
    a.located_offset = {0, 0};
    a.located_path_end = {12, 12};
    const std::string why = refusal(a);
    EXPECT_NE(why.find("location 1 of request 12 names entry 7 out of order or beyond the 3 entries"),
              std::string::npos)
        << why;
  }

  proto::DirectoryAnswer cut;
  const std::string truncated = proto::decode_directory_answer(std::span(bytes).first(bytes.size() - 3), "daemon rank 1", cut);
  EXPECT_NE(truncated.find("directory answer from daemon rank 1: field 'error'"), std::string::npos) << truncated;
  proto::DirectoryAsk not_an_ask;
  const std::string magic = proto::decode_directory_ask(bytes, "daemon rank 1", not_an_ask);
  EXPECT_NE(magic.find("bad magic (not a ShardMix directory request)"), std::string::npos) << magic;

  answer.labels[1] = -4;
  proto::DirectoryAnswer negative;
  const std::string label = proto::decode_directory_answer(proto::encode_directory_answer(answer), "daemon rank 3", negative);
  EXPECT_NE(label.find("entry 1 of request 12 has negative label -4"), std::string::npos) << label;

  // An error too long for the layout is cut to fit, not refused.
  proto::DirectoryAnswer refused;
  refused.request = 13;
  refused.error = std::string(proto::kMaxDirectoryErrorBytes + 100, 'e');
  proto::DirectoryAnswer refused_back;
  ASSERT_EQ(proto::decode_directory_answer(proto::encode_directory_answer(refused), "daemon rank 3", refused_back), "");
  EXPECT_EQ(refused_back.error.size(), proto::kMaxDirectoryErrorBytes);
}

}  // namespace distributed_catalog_test
}  // namespace shardmix
