// common/huge_pages.h and the daemon's SharedRegion (the sample arena and staging): their
// mappings start on a huge page and ask for huge pages (decision 0070). Whether the kernel
// grants them is its shmem_enabled setting, which these tests neither need nor change.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "common/huge_pages.h"
#include "server/shared_region.h"
#include "tests/unit/mapping_support.h"

namespace shardmix {
namespace huge_pages_test {

bool on_huge_page(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kHugePageBytes == 0; }

TEST(HugePagesTest, AReservationStartsOnAHugePageAndHoldsItsBytesOnly) {
  for (std::uint64_t bytes : {std::uint64_t{4096}, kHugePageBytes, 3 * kHugePageBytes + 8192}) {
    std::uint8_t* at = reserve_huge_aligned(bytes);
    ASSERT_NE(at, nullptr) << bytes;
    EXPECT_TRUE(on_huge_page(at)) << bytes;
    const test::MappingEntry entry = test::mapping_holding(at);
    EXPECT_EQ(entry.begin, reinterpret_cast<std::uintptr_t>(at)) << entry.header;
    EXPECT_EQ(entry.end, reinterpret_cast<std::uintptr_t>(at) + bytes) << entry.header;  // the padding went back
    munmap(at, bytes);
  }
}

TEST(HugePagesTest, TheArenaAndStagingAreMappedOnAHugePageWithHugePagesAskedFor) {
  auto region = SharedRegion::create("test-huge-arena", 5 * kHugePageBytes + 100);
  ASSERT_TRUE(region.ok()) << region.status().to_string();
  const std::uint8_t* data = (*region)->data();
  EXPECT_TRUE(on_huge_page(data));
  const test::MappingEntry entry = test::mapping_holding(data);
  EXPECT_TRUE(entry.advised_huge()) << entry.vm_flags;
  EXPECT_NE(entry.header.find("test-huge-arena"), std::string::npos) << entry.header;
  std::memset((*region)->data(), 7, (*region)->length());  // writable, every byte
  EXPECT_EQ((*region)->data()[(*region)->length() - 1], 7);
}

TEST(HugePagesTest, TheSettingIsReadAsTheKernelPrintsIt) {
  const std::string setting = shmem_huge_page_setting();
  if (::access("/sys/kernel/mm/transparent_hugepage/shmem_enabled", R_OK) != 0) {
    EXPECT_EQ(setting, "");
    return;
  }
  // One of the kernel's words, without the brackets that mark it in the file.
  EXPECT_FALSE(setting.empty());
  EXPECT_EQ(setting.find_first_of("[] "), std::string::npos) << setting;
}

}  // namespace huge_pages_test
}  // namespace shardmix
