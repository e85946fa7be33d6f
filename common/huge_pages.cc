#include "common/huge_pages.h"

#include <sys/mman.h>

#include <cerrno>
#include <fstream>

namespace shardmix {

std::uint8_t* reserve_huge_aligned(std::uint64_t bytes) {
  const std::uint64_t padded = bytes + kHugePageBytes;
  void* reserved = mmap(nullptr, padded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<std::uintptr_t>(reserved);
  const std::uintptr_t aligned = (start + kHugePageBytes - 1) & ~static_cast<std::uintptr_t>(kHugePageBytes - 1);
  if (aligned > start) munmap(reserved, aligned - start);
  const std::uintptr_t tail = start + padded - (aligned + bytes);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  return reinterpret_cast<std::uint8_t*>(aligned);
}

std::uint8_t* map_shared_huge_aligned(int fd, std::uint64_t bytes, int prot) {
  std::uint8_t* reserved = reserve_huge_aligned(bytes);
  if (reserved == nullptr) return nullptr;
  if (mmap(reserved, bytes, prot, MAP_SHARED | MAP_FIXED, fd, 0) != reserved) {
    const int err = errno;
    munmap(reserved, bytes);
    errno = err;
    return nullptr;
  }
  advise_huge_pages(reserved, bytes);
  return reserved;
}

void advise_huge_pages(void* at, std::uint64_t bytes) { (void)madvise(at, bytes, MADV_HUGEPAGE); }

std::string shmem_huge_page_setting() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string line;
  if (!std::getline(in, line)) return "";
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return line;
  return line.substr(open + 1, close - open - 1);
}

}  // namespace shardmix
