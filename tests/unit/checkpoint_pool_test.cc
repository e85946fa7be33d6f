// CheckpointPool (common/checkpoint_pool.h) and the save buffer (common/checkpoint_memfd.h):
// the memory a daemon reuses for checkpoint versions, and the trainer's reusable buffer the
// daemon copies from (docs/decisions/0068).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/checkpoint_memfd.h"
#include "common/checkpoint_pool.h"
#include "tests/unit/mapping_support.h"

namespace shardmix {
namespace checkpoint_pool_test {

constexpr std::uint64_t kChunk = 64 * 1024;

std::unique_ptr<CheckpointPool> make_pool(std::uint64_t capacity, bool prefault = false) {
  Result<std::unique_ptr<CheckpointPool>> pool = CheckpointPool::create(capacity, prefault, kChunk);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  return std::move(pool).value();
}

void fill(std::span<std::uint8_t> bytes, std::uint8_t seed) {
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(seed + i * 7);
}

bool holds(std::span<const std::uint8_t> bytes, std::uint8_t seed) {
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != static_cast<std::uint8_t>(seed + i * 7)) return false;
  }
  return true;
}

TEST(CheckpointPoolTest, ABufferSpansItsChunksAsOneRangeAndReadsBackWhatWasWritten) {
  auto pool = make_pool(8 * kChunk);
  // Not a whole number of chunks, and after other buffers so that its chunks need not be
  // the first ones.
  auto first = pool->allocate(kChunk + 5, "a");
  ASSERT_TRUE(first.ok());
  auto buffer = pool->allocate(3 * kChunk + 123, "b");
  ASSERT_TRUE(buffer.ok()) << buffer.status().to_string();
  EXPECT_TRUE((*buffer)->pooled());
  ASSERT_EQ((*buffer)->writable().size(), 3 * kChunk + 123);
  fill((*buffer)->writable(), 3);
  first->reset();
  EXPECT_TRUE(holds((*buffer)->bytes(), 3));
  EXPECT_EQ(pool->stats().bytes_in_use, 4 * kChunk);
}

// The point of the pool: a new buffer gets the pages an old one left, not fresh ones. Fresh
// shmem pages read as zeros; reused ones still hold the old version's bytes.
TEST(CheckpointPoolTest, ABufferReleasedGivesItsPagesToTheNext) {
  auto pool = make_pool(4 * kChunk);
  {
    auto old = pool->allocate(4 * kChunk, "old");
    ASSERT_TRUE(old.ok());
    fill((*old)->writable(), 9);
  }
  EXPECT_EQ(pool->stats().bytes_in_use, 0u);
  auto next = pool->allocate(4 * kChunk, "next");
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE((*next)->pooled());
  EXPECT_TRUE(holds((*next)->bytes(), 9));
  EXPECT_EQ(pool->stats().overflows, 0u);
}

TEST(CheckpointPoolTest, TooFewFreeChunksGiveAMemfdOfItsOwnAndCountAnOverflow) {
  auto pool = make_pool(4 * kChunk);
  auto held = pool->allocate(3 * kChunk, "held");
  ASSERT_TRUE(held.ok());
  EXPECT_FALSE(pool->fits(2 * kChunk));
  EXPECT_TRUE(pool->fits(kChunk));
  auto spilled = pool->allocate(2 * kChunk, "spilled");
  ASSERT_TRUE(spilled.ok()) << spilled.status().to_string();
  EXPECT_FALSE((*spilled)->pooled());
  fill((*spilled)->writable(), 1);
  EXPECT_TRUE(holds((*spilled)->bytes(), 1));
  const CheckpointPoolStats stats = pool->stats();
  EXPECT_EQ(stats.overflows, 1u);
  EXPECT_EQ(stats.overflow_bytes, 2 * kChunk);
  EXPECT_EQ(stats.bytes_in_use, 3 * kChunk);  // the overflow is not the pool's
  spilled->reset();
  EXPECT_EQ(pool->stats().bytes_in_use, 3 * kChunk);
}

TEST(CheckpointPoolTest, AnEmptyBufferTakesNoChunkAndABufferOutlivesItsPool) {
  auto pool = make_pool(2 * kChunk);
  auto empty = pool->allocate(0, "empty");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE((*empty)->bytes().empty());
  EXPECT_EQ(pool->stats().bytes_in_use, 0u);
  auto kept = pool->allocate(kChunk, "kept");
  ASSERT_TRUE(kept.ok());
  fill((*kept)->writable(), 4);
  pool.reset();  // a load still reading a version when the daemon stops
  EXPECT_TRUE(holds((*kept)->bytes(), 4));
}

TEST(CheckpointPoolTest, PrefaultAllocatesEveryPageAheadOfUse) {
  auto pool = make_pool(16 * kChunk, /*prefault=*/true);
  // The background thread's progress, not its speed: wait for it to report all pages.
  for (int i = 0; i < 10000 && pool->stats().prefaulted_bytes < 16 * kChunk; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(pool->stats().prefaulted_bytes, 16 * kChunk);
  EXPECT_EQ(pool->stats().capacity_bytes, 16 * kChunk);
}

TEST(CheckpointPoolTest, AChunkThatIsNotWholePagesIsRefused) {
  EXPECT_EQ(CheckpointPool::create(kChunk, false, 1000).status().code(), StatusCode::kInvalidArgument);
}

// A lease (decision 0069): the trainer maps the buffer's runs of its memfd and writes there;
// the daemon's view must then hold those very bytes, with no copy in between. Checked for
// a buffer whose chunks are not consecutive (two runs) and for an overflow.
TEST(CheckpointPoolTest, TheRunsOfABuffersMemfdMappedElsewhereAreTheBufferItself) {
  auto pool = make_pool(5 * kChunk);
  auto a = pool->allocate(kChunk, "a");
  auto b = pool->allocate(kChunk, "b");
  auto c = pool->allocate(kChunk, "c");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  b->reset();  // chunk 1 free between 0 and 2, and no 3 free in a row: the next buffer is 1, 3 and 4
  auto pooled = pool->allocate(2 * kChunk + 100, "leased");
  auto overflow = pool->allocate(2 * kChunk, "spilled");  // none left
  ASSERT_TRUE(pooled.ok() && overflow.ok());
  ASSERT_TRUE((*pooled)->pooled());
  ASSERT_FALSE((*overflow)->pooled());
  EXPECT_EQ((*pooled)->runs(), (std::vector<MemfdRun>{{kChunk, kChunk}, {3 * kChunk, 2 * kChunk}}));
  for (const auto* buffer : {&*pooled, &*overflow}) {
    const std::vector<MemfdRun> runs = (*buffer)->runs();
    Result<SideBySideMapping> trainer = SideBySideMapping::map((*buffer)->lease_memfd(), runs);
    ASSERT_TRUE(trainer.ok()) << trainer.status().to_string();
    ASSERT_GE(trainer->bytes().size(), (*buffer)->bytes().size());
    fill(trainer->bytes().first((*buffer)->bytes().size()), 21);
    EXPECT_TRUE(holds((*buffer)->bytes(), 21));
  }
}

TEST(CheckpointPoolTest, ShrinkingABufferKeepsItsBytesAndGivesItsWholeChunksBack) {
  auto pool = make_pool(8 * kChunk);
  auto buffer = pool->allocate(5 * kChunk, "rank0");
  ASSERT_TRUE(buffer.ok());
  fill((*buffer)->writable(), 5);
  (*buffer)->shrink(2 * kChunk + 1);
  EXPECT_EQ((*buffer)->bytes().size(), 2 * kChunk + 1);
  EXPECT_TRUE(holds((*buffer)->bytes(), 5));
  EXPECT_EQ(pool->stats().bytes_in_use, 3 * kChunk);
  EXPECT_EQ((*buffer)->runs(), (std::vector<MemfdRun>{{0, 3 * kChunk}}));
  EXPECT_TRUE(pool->fits(5 * kChunk));
  (*buffer)->shrink(4 * kChunk);  // never grows back
  EXPECT_EQ((*buffer)->bytes().size(), 2 * kChunk + 1);
  buffer->reset();
  EXPECT_EQ(pool->stats().bytes_in_use, 0u);
}

// A buffer of consecutive chunks is a window of the pool's one mapping, made at start: it
// maps nothing, and the same chunks are at the same address for every buffer that gets
// them (a page reached through a new mapping costs its first touch again: the pool's
// comment). The pool prefers consecutive chunks, even past lower scattered ones; only a
// buffer that has none in a row gets a mapping of its own.
TEST(CheckpointPoolTest, ABufferOfConsecutiveChunksIsAWindowOfThePoolsOneMapping) {
  auto pool = make_pool(8 * kChunk);
  auto first = pool->allocate(3 * kChunk, "rank0");
  ASSERT_TRUE(first.ok());
  ASSERT_EQ((*first)->runs(), (std::vector<MemfdRun>{{0, 3 * kChunk}}));
  const std::uint8_t* base = (*first)->bytes().data();  // chunk 0: where the pool's mapping starts
  const test::MappingEntry pool_mapping = test::mapping_holding(base);
  const auto begin = reinterpret_cast<std::uintptr_t>(base);
  // One mapping holds all eight chunks, so every window below lies inside it.
  ASSERT_LE(pool_mapping.begin, begin);
  ASSERT_GE(pool_mapping.end, begin + 8 * kChunk);
  fill((*first)->writable(), 9);
  first->reset();
  auto again = pool->allocate(3 * kChunk - 5, "rank0");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->bytes().data(), base);
  EXPECT_TRUE(holds((*again)->bytes(), 9));
  // Free now: 3 (one), 5-7 (three in a row). Two chunks come from 5 and 6, not 3 and 5.
  auto a = pool->allocate(kChunk, "a");   // chunk 3
  auto b = pool->allocate(kChunk, "b");   // chunk 4
  EXPECT_EQ((*b)->bytes().data(), base + 4 * kChunk);
  a->reset();
  auto two = pool->allocate(2 * kChunk, "two");
  ASSERT_TRUE(two.ok());
  EXPECT_EQ((*two)->runs(), (std::vector<MemfdRun>{{5 * kChunk, 2 * kChunk}}));
  EXPECT_EQ((*two)->bytes().data(), base + 5 * kChunk);
  EXPECT_EQ(test::mapping_holding((*two)->bytes().data()).begin, pool_mapping.begin);
  auto scattered = pool->allocate(2 * kChunk, "scattered");  // chunks 3 and 7: mapped side by side
  ASSERT_TRUE(scattered.ok());
  EXPECT_EQ((*scattered)->runs(), (std::vector<MemfdRun>{{3 * kChunk, kChunk}, {7 * kChunk, kChunk}}));
  const auto at = reinterpret_cast<std::uintptr_t>((*scattered)->bytes().data());
  EXPECT_TRUE(at + 2 * kChunk <= begin || at >= begin + 8 * kChunk) << "a scattered buffer is a mapping of its own";
  fill((*scattered)->writable(), 4);
  EXPECT_TRUE(holds((*scattered)->bytes(), 4));
  // The same pages: chunk 3 seen through the pool's mapping holds what was written here.
  EXPECT_TRUE(holds(std::span<const std::uint8_t>(base + 3 * kChunk, kChunk), 4));
}

// Every mapping of the pool's memfd starts on a 2 MiB boundary and asks for huge pages, so
// that where the kernel allows them for shared memory a page-table entry maps 2 MiB (the
// pool's comment: 0.06 s instead of 3.2-3.9 s to write a GiB through a new mapping on the
// development VM). Whether the kernel grants them is its setting, not checked here.
TEST(CheckpointPoolTest, ItsMappingsStartOnAHugePageAndAskForHugePages) {
  auto pool = make_pool(8 * kChunk);
  auto window = pool->allocate(2 * kChunk, "window");  // chunks 0-1: a window of the pool's mapping
  ASSERT_TRUE(window.ok());
  ASSERT_EQ((*window)->runs(), (std::vector<MemfdRun>{{0, 2 * kChunk}}));
  const std::uint8_t* base = (*window)->bytes().data();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(base) % kHugePageBytes, 0u);
  EXPECT_TRUE(test::mapping_holding(base).advised_huge()) << test::mapping_holding(base).vm_flags;

  // Scattered chunks, mapped side by side: that mapping starts on a huge page too.
  auto pool2 = make_pool(4 * kChunk);
  auto p0 = pool2->allocate(kChunk, "0");
  auto p1 = pool2->allocate(kChunk, "1");
  auto p2 = pool2->allocate(kChunk, "2");
  auto p3 = pool2->allocate(kChunk, "3");
  p0->reset();
  p2->reset();
  auto side = pool2->allocate(2 * kChunk, "side");  // chunks 0 and 2
  ASSERT_TRUE(side.ok());
  ASSERT_EQ((*side)->runs(), (std::vector<MemfdRun>{{0, kChunk}, {2 * kChunk, kChunk}}));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>((*side)->bytes().data()) % kHugePageBytes, 0u);
  EXPECT_TRUE(test::mapping_holding((*side)->bytes().data()).advised_huge());
  fill((*side)->writable(), 6);
  EXPECT_TRUE(holds((*side)->bytes(), 6));
}

// A size near 2^64 must not round up past the top to a few chunks (a buffer that says it
// holds 2^64 bytes over none): it overflows, and no memfd holds that much.
TEST(CheckpointPoolTest, ASizeNearTheTopOfItsRangeTakesNoChunk) {
  auto pool = make_pool(4 * kChunk);
  for (std::uint64_t size : {std::numeric_limits<std::uint64_t>::max(), std::numeric_limits<std::uint64_t>::max() - kChunk + 2}) {
    EXPECT_FALSE(pool->fits(size)) << size;
    auto buffer = pool->allocate(size, "huge");
    EXPECT_FALSE(buffer.ok() && (*buffer)->pooled()) << size << " bytes took " << pool->stats().bytes_in_use;
  }
  EXPECT_EQ(pool->stats().bytes_in_use, 0u);
  EXPECT_EQ(pool->stats().buffers, 0u);
}

// Trainers get the pool's memfd with their leases (decision 0069). Sealed at its size, so
// none can shrink it under the daemon's views (which would SIGBUS the daemon) or grow it.
TEST(CheckpointPoolTest, ThePoolsMemfdCannotBeResizedByWhoeverHoldsIt) {
  auto pool = make_pool(4 * kChunk);
  auto buffer = pool->allocate(kChunk, "rank0");
  ASSERT_TRUE(buffer.ok());
  const int fd = (*buffer)->lease_memfd();
  struct stat before {};
  ASSERT_EQ(::fstat(fd, &before), 0);
  EXPECT_NE(::ftruncate(fd, 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::ftruncate(fd, before.st_size + static_cast<off_t>(kChunk)), 0);
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);  // and no seal can be added or taken
  const int seals = ::fcntl(fd, F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  fill((*buffer)->writable(), 3);  // the daemon still writes its chunks
  EXPECT_TRUE(holds((*buffer)->bytes(), 3));
  // An overflow's memfd of its own goes to a trainer with a lease as well.
  auto overflow = pool->allocate(8 * kChunk, "rank1");
  ASSERT_TRUE(overflow.ok());
  ASSERT_FALSE((*overflow)->pooled());
  EXPECT_NE(::ftruncate((*overflow)->lease_memfd(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  fill((*overflow)->writable(), 5);
  EXPECT_TRUE(holds((*overflow)->bytes(), 5));
}

TEST(CheckpointSaveBufferTest, TheDaemonMapsWhatTheTrainerWroteAndTheBufferIsReused) {
  Result<CheckpointSaveBuffer> buffer = CheckpointSaveBuffer::create();
  ASSERT_TRUE(buffer.ok()) << buffer.status().to_string();
  EXPECT_FALSE(checkpoint_memfd_is_sealed(buffer->fd()));
  for (const std::uint64_t size : {std::uint64_t{3000}, std::uint64_t{100000}, std::uint64_t{500}}) {
    Result<std::span<std::uint8_t>> into = buffer->writable(size);
    ASSERT_TRUE(into.ok());
    fill(*into, static_cast<std::uint8_t>(size));
    Result<CheckpointBytesPtr> mapped = map_checkpoint_buffer(buffer->fd(), size, "rank0");
    ASSERT_TRUE(mapped.ok()) << mapped.status().to_string();
    EXPECT_EQ((*mapped)->bytes().size(), size);
    EXPECT_TRUE(holds((*mapped)->bytes(), static_cast<std::uint8_t>(size)));
    EXPECT_EQ((*mapped)->memfd(), -1);  // not sealed: a load must not hand it on
  }
  // It grew to the largest and never shrinks: the daemon's mapping cannot lose its pages.
  EXPECT_EQ(ftruncate(buffer->fd(), 10), -1);
}

TEST(CheckpointSaveBufferTest, AnUnsealedMemfdOrAShortOneIsRefusedNamingTheCheckpoint) {
  const int plain = memfd_create("plain", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(plain, 0);
  ASSERT_EQ(ftruncate(plain, 4096), 0);
  Result<CheckpointBytesPtr> unsealed = map_checkpoint_buffer(plain, 4096, "rank3");
  EXPECT_EQ(unsealed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unsealed.status().message().find("rank3"), std::string::npos);
  EXPECT_NE(unsealed.status().message().find("shrinking"), std::string::npos);
  ASSERT_EQ(fcntl(plain, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  Result<CheckpointBytesPtr> short_one = map_checkpoint_buffer(plain, 8192, "rank3");
  EXPECT_EQ(short_one.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_one.status().message().find("4096"), std::string::npos);
  EXPECT_TRUE(map_checkpoint_buffer(plain, 4096, "rank3").ok());
  ::close(plain);
}

}  // namespace checkpoint_pool_test
}  // namespace shardmix
