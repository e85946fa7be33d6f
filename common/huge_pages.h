// Transparent huge pages for the daemon's shared memory (docs/decisions/0070): the
// checkpoint pool, trainers' leases, the sample arena and the staging area are memfds
// whose mappings start on a 2 MiB boundary and ask for huge pages (MADV_HUGEPAGE). The
// kernel grants them to shared memory only when
// /sys/kernel/mm/transparent_hugepage/shmem_enabled is "advise" (or within_size, always);
// under "never", most distributions' default, the advice does nothing. Nothing here
// changes that setting: it is the operator's (docs/operations.md, "Huge pages").
// Thread-safety: free functions, safe from any thread.
#pragma once

#include <cstdint>
#include <string>

namespace shardmix {

// The huge page that mappings are aligned to, and the checkpoint pool's chunk size.
inline constexpr std::uint64_t kHugePageBytes = 2ull << 20;

// A PROT_NONE reservation of `bytes` starting on a huge-page boundary (what a 2 MiB
// page-table entry needs), for mappings placed in it with MAP_FIXED; nullptr with errno
// set on failure. Unmap it with munmap(result, bytes).
std::uint8_t* reserve_huge_aligned(std::uint64_t bytes);

// Maps `bytes` of `fd` from offset 0, shared, with `prot`, on a huge-page boundary, and asks
// for huge pages before any page is touched; nullptr with errno set on failure.
std::uint8_t* map_shared_huge_aligned(int fd, std::uint64_t bytes, int prot);

// Asks for transparent huge pages on a mapping. The answer does not matter (a kernel
// without them says EINVAL, one whose setting is "never" ignores it), so none is returned.
void advise_huge_pages(void* at, std::uint64_t bytes);

// The bracketed word of shmem_enabled ("never", "advise", "within_size", "always", ...),
// or "" if it cannot be read (no transparent huge pages in this kernel).
std::string shmem_huge_page_setting();

}  // namespace shardmix
