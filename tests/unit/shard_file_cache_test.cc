// The shard descriptor cache (service.open_shard_files, docs/decisions/0037): one open per
// shard, shared descriptors that outlive their eviction while a reader holds them, and the
// cache being invisible: with it, read_sample() returns what it returns without it (bytes,
// or the same error naming file and offset) whatever happened to the shard in between.
#include "server/shard_file_cache.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "common/catalog.h"
#include "common/shard_formats.h"
#include "common/epoch_plan.h"
#include "common/placement.h"
#include "server/cache_loader.h"
#include "tests/support/temp_dir.h"
#include "server/sample_reader.h"
#include "server/storage_reader.h"
#include "tests/unit/catalog_support.h"

namespace shardmix {
namespace shard_file_cache_test {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

// Sample i of shard s: distinct bytes and sizes, so a read from the wrong place shows.
std::string sample_text(int shard, int i, int variant = 0) {
  return std::string(static_cast<std::size_t>(17 + 5 * i + 3 * shard), static_cast<char>('a' + (shard * 7 + i + variant) % 26)) +
         fmt::format("|s{}i{}v{}", shard, i, variant);
}

// A WebDataset shard of `n` samples (key k<i>, members .jpg and .cls).
Bytes tar_shard(int shard, int n, int variant = 0) {
  Bytes tar;
  for (int i = 0; i < n; ++i) {
    const std::string data = sample_text(shard, i, variant);
    const std::string label = std::to_string(i % 3);
    append_tar_member(tar, fmt::format("k{:03}.cls", i), Bytes(label.begin(), label.end()));
    append_tar_member(tar, fmt::format("k{:03}.jpg", i), Bytes(data.begin(), data.end()));
  }
  append_tar_end(tar);
  return tar;
}

Bytes tfrecord_shard(int shard, int n) {
  Bytes out;
  for (int i = 0; i < n; ++i) {
    const std::string data = sample_text(shard, i);
    append_tfrecord(out, Bytes(data.begin(), data.end()));
  }
  return out;
}

// write() overwrites in place (same inode when the file exists), as an editor would.
class ShardFileCacheTest : public test_support::TempDirTest {
 protected:
  ShardFileCacheTest() : TempDirTest("fdcache") {}
  // Writes a new file and renames it over `rel` (a new inode), as dataset tools replace files.
  void replace(const std::string& rel, const Bytes& bytes) const {
    write(rel + ".new", bytes);
    fs::rename(dir_ / (rel + ".new"), dir_ / rel);
  }
  DatasetConfig dataset(DatasetFormat format, const std::string& rel) const {
    DatasetConfig d;
    d.path = (dir_ / rel).string();
    d.format = format;
    d.sample_ext = "jpg";
    return d;
  }
};

struct ReadOutcome {
  Status status;
  std::string bytes;
};

ReadOutcome read(const Catalog& c, const DatasetConfig& d, SampleId id, ShardFileCache* cache) {
  ReadOutcome r;
  r.bytes.assign(c.sample_bytes(id), '\0');
  r.status = read_sample(c, d, id, reinterpret_cast<std::uint8_t*>(r.bytes.data()), cache);
  if (!r.status.ok()) r.bytes.clear();  // what is in the buffer after an error is unspecified
  return r;
}

// The sample's bytes as written, found by the trace name's offset in the shard on disk.
std::string bytes_on_disk(const Catalog& c, const DatasetConfig& d, SampleId id) {
  std::ifstream in(sample_file_path(d, c.path(id)), std::ios::binary);
  in.seekg(static_cast<std::streamoff>(c.offset(id)));
  std::string s(c.sample_bytes(id), '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  return s;
}

TEST_F(ShardFileCacheTest, EachShardIsOpenedOnceAndEveryReadGivesTheFilesBytes) {
  for (int s = 0; s < 4; ++s) write(fmt::format("w/shard-{}.tar", s), tar_shard(s, 8));
  const DatasetConfig d = dataset(DatasetFormat::kWebDataset, "w");
  auto c = test_support::scan_all(d, 1);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(c->size(), 32u);
  ShardFileCache cache(8);
  for (int pass = 0; pass < 2; ++pass) {
    for (SampleId id = 0; id < c->size(); ++id) {
      const ReadOutcome r = read(*c, d, id, &cache);
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      EXPECT_EQ(r.bytes, bytes_on_disk(*c, d, id)) << c->location(id);
      EXPECT_EQ(r.bytes, read(*c, d, id, nullptr).bytes);
    }
  }
  const ShardFileCacheStats st = cache.stats();
  EXPECT_EQ(st.opens, 4u);
  EXPECT_EQ(st.hits, 2 * 32u - 4u);
  EXPECT_EQ(st.evictions, 0u);
  EXPECT_EQ(st.changed, 0u);
  EXPECT_EQ(st.open_now, 4);
}

TEST_F(ShardFileCacheTest, ManyThreadsReadingTheSameShardsThroughATinyCacheGetExactBytes) {
  // Capacity 1 over 3 TFRecord shards read by 6 threads: descriptors are evicted while other
  // threads are inside preadv on them, all the time.
  for (int s = 0; s < 3; ++s) write(fmt::format("t/s{}.tfrecord", s), tfrecord_shard(s, 24));
  const DatasetConfig d = dataset(DatasetFormat::kTfRecord, "t");
  auto c = test_support::scan_all(d, 1);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::vector<std::string> expected;
  for (SampleId id = 0; id < c->size(); ++id) expected.push_back(bytes_on_disk(*c, d, id));
  ShardFileCache cache(1);
  std::atomic<int> wrong{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 6; ++t) {
    readers.emplace_back([&, t] {
      for (int round = 0; round < 40; ++round) {
        for (SampleId k = 0; k < c->size(); ++k) {
          // Each thread walks the samples in its own order, so shards interleave.
          const SampleId id = (k * 7 + static_cast<SampleId>(t) * 5 + static_cast<SampleId>(round)) % c->size();
          const ReadOutcome r = read(*c, d, id, &cache);
          if (!r.status.ok()) {
            failed.fetch_add(1);
          } else if (r.bytes != expected[id]) {
            wrong.fetch_add(1);
          }
        }
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  const ShardFileCacheStats st = cache.stats();
  EXPECT_EQ(st.hits + st.opens + st.joined, 6u * 40u * c->size());
  EXPECT_GT(st.evictions, 0u);
  EXPECT_EQ(st.open_now, 1);  // the readers are done: only the cached descriptor is left open
}

TEST_F(ShardFileCacheTest, AnEvictedDescriptorStaysOpenUntilItsLastReaderLetsGo) {
  const std::string a = write("a.tar", tar_shard(0, 2));
  const std::string b = write("b.tar", tar_shard(1, 2));
  ShardFileCache cache(1);
  auto held = cache.acquire(a);
  ASSERT_TRUE(held.ok()) << held.status().to_string();
  ASSERT_TRUE(cache.acquire(b).ok());  // evicts a's entry while `held` still reads it
  ShardFileCacheStats st = cache.stats();
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_EQ(st.open_now, 2);
  char first[5] = {};
  ASSERT_EQ(::pread((*held)->fd(), first, 5, 257), 5);  // the ustar magic of a's first header
  EXPECT_EQ(std::string(first, 5), "ustar");
  held = Status(StatusCode::kCancelled, "done with it");  // the last holder lets go
  EXPECT_EQ(cache.stats().open_now, 1);
  ASSERT_TRUE(cache.acquire(a).ok());  // evicted: opened again
  st = cache.stats();
  EXPECT_EQ(st.opens, 3u);
  EXPECT_EQ(st.evictions, 2u);
  EXPECT_EQ(st.open_now, 1);
}

TEST_F(ShardFileCacheTest, AShardDeletedAfterItWasCachedIsTheSameErrorAsWithoutTheCache) {
  const std::string path = write("t/a.tfrecord", tfrecord_shard(0, 3));
  const DatasetConfig d = dataset(DatasetFormat::kTfRecord, "t");
  auto c = test_support::scan_all(d, 1);
  ASSERT_TRUE(c.ok());
  ShardFileCache cache(4);
  ASSERT_TRUE(read(*c, d, 1, &cache).status.ok());
  fs::remove(path);
  const ReadOutcome cached = read(*c, d, 1, &cache);
  EXPECT_EQ(cached.status.code(), StatusCode::kNotFound);
  EXPECT_EQ(cached.status.message(),
            fmt::format("{}: cannot open the shard to read the sample at offset {}: No such file or directory (it was "
                        "present when the dataset was scanned)",
                        path, c->offset(1)));
  EXPECT_EQ(cached.status.to_string(), read(*c, d, 1, nullptr).status.to_string());
  const ShardFileCacheStats st = cache.stats();
  EXPECT_EQ(st.changed, 1u);
  EXPECT_EQ(st.open_now, 0);  // the deleted file's descriptor is closed: its space is freed
}

TEST_F(ShardFileCacheTest, AShardReplacedByRenameIsReadFromTheNewFile) {
  write("w/s.tar", tar_shard(0, 3));
  const DatasetConfig d = dataset(DatasetFormat::kWebDataset, "w");
  auto c = test_support::scan_all(d, 1);
  ASSERT_TRUE(c.ok());
  ShardFileCache cache(4);
  const SampleId id = 2;
  const ReadOutcome before = read(*c, d, id, &cache);
  ASSERT_TRUE(before.status.ok());

  // Same layout, other bytes (the tar headers still hold): served from the new file, as an
  // open per read would; the format cannot tell, the cache must not hide it.
  replace("w/s.tar", tar_shard(0, 3, /*variant=*/1));
  const ReadOutcome same_layout = read(*c, d, id, &cache);
  ASSERT_TRUE(same_layout.status.ok()) << same_layout.status.to_string();
  EXPECT_NE(same_layout.bytes, before.bytes);
  EXPECT_EQ(same_layout.bytes, bytes_on_disk(*c, d, id));
  EXPECT_EQ(same_layout.bytes, read(*c, d, id, nullptr).bytes);

  // Another layout: the header check fails, with the same message as without the cache.
  replace("w/s.tar", tar_shard(5, 3));
  const ReadOutcome other = read(*c, d, id, &cache);
  EXPECT_FALSE(other.status.ok());
  EXPECT_NE(other.status.message().find("changed since the scan"), std::string::npos) << other.status.to_string();
  EXPECT_EQ(other.status.to_string(), read(*c, d, id, nullptr).status.to_string());
  EXPECT_EQ(cache.stats().changed, 2u);
}

TEST_F(ShardFileCacheTest, AShardRenamedAwayIsNotFoundAndInPlaceChangesAreSeen) {
  Bytes f = tfrecord_shard(0, 3);
  const std::string path = write("t/a.tfrecord", f);
  const DatasetConfig d = dataset(DatasetFormat::kTfRecord, "t");
  auto c = test_support::scan_all(d, 1);
  ASSERT_TRUE(c.ok());
  ShardFileCache cache(4);
  const SampleId id = 1;
  ASSERT_TRUE(read(*c, d, id, &cache).status.ok());

  // In place (same inode, still cached): a flipped data byte fails the CRC check.
  f[c->offset(id) + 2] ^= 1;
  write("t/a.tfrecord", f);
  const ReadOutcome flipped = read(*c, d, id, &cache);
  EXPECT_EQ(flipped.status.code(), StatusCode::kCorrupt);
  EXPECT_EQ(flipped.status.to_string(), read(*c, d, id, nullptr).status.to_string());
  // Truncated in place: the read ends early, named as before.
  fs::resize_file(path, c->offset(id) + 3);
  const ReadOutcome cut = read(*c, d, id, &cache);
  EXPECT_NE(cut.status.message().find(fmt::format("the shard ends at offset {}", c->offset(id) + 3)), std::string::npos)
      << cut.status.to_string();
  EXPECT_EQ(cut.status.to_string(), read(*c, d, id, nullptr).status.to_string());
  EXPECT_EQ(cache.stats().changed, 0u);  // still the same file: nothing to reopen

  // Renamed away (its link count is still 1, only the path is gone): not found, as before.
  fs::rename(path, dir_ / "elsewhere.tfrecord");
  const ReadOutcome moved = read(*c, d, id, &cache);
  EXPECT_EQ(moved.status.code(), StatusCode::kNotFound);
  EXPECT_EQ(moved.status.to_string(), read(*c, d, id, nullptr).status.to_string());
  EXPECT_EQ(cache.stats().changed, 1u);
}

// Every sample of `c` sits in `arena` at its placement offset, byte for byte as on disk.
void expect_arena_holds_every_sample(const std::vector<std::uint8_t>& arena, const Placement& placement,
                                     const Catalog& c, const DatasetConfig& d) {
  for (SampleId id = 0; id < c.size(); ++id) {
    ASSERT_EQ(std::string(reinterpret_cast<const char*>(arena.data() + placement.arena_offset[id]), c.sample_bytes(id)),
              bytes_on_disk(c, d, id))
        << c.location(id);
  }
}

TEST_F(ShardFileCacheTest, TheLoaderReadsShardsInStorageOrderSoEachIsOpenedOnce) {
  // 6 shards whose samples cycle through 3 labels: in id order (label, shard, offset) a
  // loader would visit every shard 3 times, and a cache of 2 descriptors would miss on
  // every shard change. In storage order each shard is opened once.
  for (int s = 0; s < 6; ++s) write(fmt::format("w/s{}.tar", s), tar_shard(s, 9));
  const DatasetConfig d = dataset(DatasetFormat::kWebDataset, "w");
  auto c = test_support::scan_all(d, 1);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(c->size(), 54u);
  const PlanShape shape = make_plan_shape(c->size(), JobShape{1, 1, 4, false});
  const Placement placement = make_placement(c->sizes(), shape, PlacementPolicy::kBalanced, 3);
  ASSERT_EQ(placement.cached[0].size(), c->size());
  std::vector<std::uint8_t> arena(placement.arena_bytes[0] + 1);
  ShardFileCache cache(2);
  auto loaded = load_owned_samples(*c, placement, 0, d, 1, arena.data(), {}, {}, {}, &cache);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  expect_arena_holds_every_sample(arena, placement, *c, d);
  EXPECT_EQ(cache.stats().opens, 6u);

  // A cache rotation's reload, given in id order, is read in storage order too.
  std::vector<std::pair<SampleId, std::uint64_t>> entering;
  for (SampleId id = 0; id < c->size(); ++id) entering.emplace_back(id, placement.arena_offset[id]);
  std::fill(arena.begin(), arena.end(), 0);
  ShardFileCache reload_cache(2);
  auto reloaded = load_entering_samples(*c, d, entering, 1, arena.data(), {}, &reload_cache);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().to_string();
  EXPECT_EQ(reloaded->samples, c->size());
  expect_arena_holds_every_sample(arena, placement, *c, d);
  EXPECT_EQ(reload_cache.stats().opens, 6u);
}

// Owner-side metadata (decision 0062): the reader has no catalog of the samples, only the
// job's shard table, and every read carries its location (shard index, offset). The pool
// reads the right bytes whichever order the table lists the shards in, and a location
// that names no shard fails its batch, naming the sample.
TEST_F(ShardFileCacheTest, TheStorageReadersReadByTheLocationsTheReadsCarry) {
  for (int s = 0; s < 3; ++s) write(fmt::format("t/s{}.tfrecord", s), tfrecord_shard(s, 10));
  const DatasetConfig d = dataset(DatasetFormat::kTfRecord, "t");
  auto c = test_support::scan_all(d, 1);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(c->file_count(), 3u);
  // The table in reverse: a location's shard index is into this table, not the catalog's.
  const std::vector<std::string> table = {std::string(c->file_path(2)), std::string(c->file_path(1)),
                                          std::string(c->file_path(0))};
  const Catalog files = Catalog::of_share(table, {}, {});
  std::vector<StorageRead> reads;
  std::uint64_t offset = 0;
  for (SampleId id = 0; id < c->size(); id += 2) {
    const CatalogEntry where{"", c->sample_bytes(id), c->label(id), 2 - c->shard(id), c->offset(id)};
    reads.push_back({id + 1000, c->sample_bytes(id), offset, where});
    offset += c->sample_bytes(id);
  }
  std::vector<std::uint8_t> staging(offset);
  auto run = [&](std::vector<StorageRead> group) {
    std::promise<StorageOutcome> done;
    StorageReaderPool pool(files, d, staging.data(), 2, [](std::function<void()> f) { f(); });
    pool.fetch(std::move(group), [&done](const StorageOutcome& o) { done.set_value(o); });
    auto finished = done.get_future();
    EXPECT_EQ(finished.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    return finished.get();
  };
  const StorageOutcome outcome = run(reads);
  ASSERT_TRUE(outcome.ok()) << outcome.first_error().to_string();
  for (const StorageRead& r : reads) {
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(staging.data() + r.staging_offset), r.length),
              bytes_on_disk(*c, d, r.sample - 1000))
        << "sample " << r.sample;
  }

  std::vector<StorageRead> nowhere = {reads[0], reads[1]};
  nowhere[1].location->shard = 3;
  const StorageOutcome bad = run(nowhere);
  ASSERT_EQ(bad.failed.size(), 2u);  // the batch's group fails as one
  const std::string why = bad.first_error().to_string();
  EXPECT_NE(why.find("cold sample 1002 is in shard 3 of a table of 3 shards"), std::string::npos) << why;

  // A read without a location on a node without the catalog (a resident sample's read
  // rerouted to storage): an error saying the location is only its owner's.
  std::vector<StorageRead> unlocated = {reads[0]};
  unlocated[0].location.reset();
  const StorageOutcome lost = run(unlocated);
  ASSERT_EQ(lost.failed.size(), 1u);
  const std::string missing = lost.first_error().to_string();
  EXPECT_NE(missing.find("cold read of sample 1000: this node has no storage location for it"), std::string::npos)
      << missing;
}

TEST_F(ShardFileCacheTest, TheStorageReadersReadColdShardSamplesThroughTheCache) {
  for (int s = 0; s < 3; ++s) write(fmt::format("t/s{}.tfrecord", s), tfrecord_shard(s, 10));
  const DatasetConfig d = dataset(DatasetFormat::kTfRecord, "t");
  auto c = test_support::scan_all(d, 1);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::vector<StorageRead> reads;
  std::uint64_t offset = 0;
  for (SampleId id = 0; id < c->size(); ++id) {
    reads.push_back({id, c->sample_bytes(id), offset});
    offset += c->sample_bytes(id);
  }
  std::vector<std::uint8_t> staging(offset);
  ShardFileCache cache(8);
  std::promise<Status> done;
  {
    // Completions run on the reader thread that finishes the group (the daemon posts them
    // to its io thread); the test only waits for the one completion.
    StorageReaderPool pool(*c, d, staging.data(), 3, [](std::function<void()> f) { f(); }, {}, &cache);
    pool.fetch(reads, [&done](const StorageOutcome& o) { done.set_value(o.first_error()); });
    auto finished = done.get_future();
    ASSERT_EQ(finished.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    const Status s = finished.get();
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  for (const StorageRead& r : reads) {
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(staging.data() + r.staging_offset), r.length),
              bytes_on_disk(*c, d, r.sample));
  }
  const ShardFileCacheStats st = cache.stats();
  EXPECT_EQ(st.opens, 3u);
  EXPECT_EQ(st.hits + st.joined, c->size() - 3);
}

TEST(ShardDescriptorLimitTest, TheSoftOpenFilesLimitIsRaisedToFitTheCacheOrTheKeyIsNamed) {
  rlimit original{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &original), 0);
  if (original.rlim_max != RLIM_INFINITY && original.rlim_max < 512) GTEST_SKIP() << "hard limit too low to test";
  rlimit low = original;
  low.rlim_cur = 256;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  // 300 + 64 of the daemon's own do not fit under 256: raised within the hard limit.
  Status s = reserve_shard_descriptors(300);
  rlimit now{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(now.rlim_cur, 364u);
  // Beyond the hard limit: an error naming the key (unless there is no hard limit).
  if (original.rlim_max != RLIM_INFINITY && original.rlim_max < std::numeric_limits<std::uint32_t>::max() - 64) {
    s = reserve_shard_descriptors(static_cast<std::uint32_t>(original.rlim_max));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("config key 'service.open_shard_files'"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(reserve_shard_descriptors(0).ok());
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &original), 0);
}

// Property: whatever happens to the shards between reads (replaced with the same or other
// bytes, deleted, restored, renamed away) and whatever the capacity, a read through the
// cache gives exactly what a read that opens the shard gives: the same bytes, or the same
// error. That is what makes the cache safe to turn on by default.
RC_GTEST_FIXTURE_PROP(ShardFileCacheTest, ACachedReadAlwaysEqualsAnUncachedOne, ()) {
  constexpr int kShards = 3;
  constexpr int kPerShard = 4;
  // A fresh directory per case (the fixture's is per test, shared by the cases).
  static std::atomic<int> case_number{0};
  const std::string root = fmt::format("case{}", case_number.fetch_add(1));
  for (int s = 0; s < kShards; ++s) write(fmt::format("{}/s{}.tar", root, s), tar_shard(s, kPerShard));
  const DatasetConfig d = dataset(DatasetFormat::kWebDataset, root);
  auto c = test_support::scan_all(d, 1);
  RC_ASSERT(c.ok());
  RC_ASSERT(c->size() == static_cast<std::size_t>(kShards * kPerShard));
  ShardFileCache cache(*rc::gen::inRange<std::size_t>(1, kShards + 1));

  enum Op { kRead, kReplaceSameLayout, kReplaceOtherLayout, kDelete, kRestore, kRenameAway, kCount };
  const auto steps = *rc::gen::container<std::vector<std::pair<int, int>>>(
      rc::gen::pair(rc::gen::weightedElement<int>({{6, kRead},
                                                    {1, kReplaceSameLayout},
                                                    {1, kReplaceOtherLayout},
                                                    {1, kDelete},
                                                    {1, kRestore},
                                                    {1, kRenameAway}}),
                    rc::gen::inRange(0, kShards * kPerShard)));
  int variant = 1;
  for (const auto& [op, arg] : steps) {
    const int shard = arg % kShards;
    const std::string rel = fmt::format("{}/s{}.tar", root, shard);
    std::error_code ec;
    switch (op) {
      case kRead: {
        const auto id = static_cast<SampleId>(arg);
        const ReadOutcome cached = read(*c, d, id, &cache);
        const ReadOutcome direct = read(*c, d, id, nullptr);
        RC_ASSERT(cached.status.to_string() == direct.status.to_string());
        RC_ASSERT(cached.bytes == direct.bytes);
        break;
      }
      case kReplaceSameLayout: replace(rel, tar_shard(shard, kPerShard, variant++)); break;
      case kReplaceOtherLayout: replace(rel, tar_shard(shard + kShards, kPerShard)); break;
      case kDelete: fs::remove(dir_ / rel, ec); break;
      case kRestore: replace(rel, tar_shard(shard, kPerShard)); break;
      case kRenameAway: fs::rename(dir_ / rel, dir_ / (rel + ".away"), ec); break;
      default: break;
    }
  }
  RC_ASSERT(cache.stats().open_now <= static_cast<std::int64_t>(cache.capacity()));
  fs::remove_all(dir_ / root);
}

}  // namespace shard_file_cache_test
}  // namespace shardmix
