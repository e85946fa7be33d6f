#include "server/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <string>

#include "common/huge_pages.h"

namespace shardmix {

Result<std::unique_ptr<SharedRegion>> SharedRegion::create(const std::string& name, std::uint64_t length) {
  const std::uint64_t page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  length = std::max<std::uint64_t>(page, (length + page - 1) / page * page);
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return make_error(StatusCode::kIoError, "memfd_create({}): {}", name, std::strerror(errno));
  auto fail = [&](StatusCode code, const char* what) -> Status {
    const int err = errno;
    ::close(fd);
    return make_error(code, "{} shared region {} ({} bytes): {}", what, name, length, std::strerror(err));
  };
  if (ftruncate(fd, static_cast<off_t>(length)) != 0) return fail(StatusCode::kResourceExhausted, "sizing");
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return fail(StatusCode::kIoError, "sealing the size of");
  }
  // On a huge-page boundary with huge pages asked for, before the loader or a peer read
  // touches a page (decision 0070): with shmem_enabled = advise, peer reads on the shm
  // provider took about 40% less fabric CPU per GB (bench/README.md, peer_profile.sh).
  std::uint8_t* data = map_shared_huge_aligned(fd, length, PROT_READ | PROT_WRITE);
  if (data == nullptr) return fail(StatusCode::kResourceExhausted, "mapping");
  // A new open file description with read-only access: a trainer's mmap(PROT_WRITE,
  // MAP_SHARED) of it fails with EACCES.
  const std::string self_path = "/proc/self/fd/" + std::to_string(fd);
  const int readonly_fd = ::open(self_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (readonly_fd < 0) {
    munmap(data, length);
    return fail(StatusCode::kIoError, "opening a read-only descriptor of");
  }
  return std::unique_ptr<SharedRegion>(new SharedRegion(fd, readonly_fd, data, length));
}

SharedRegion::~SharedRegion() {
  munmap(data_, length_);
  close(readonly_fd_);
  close(fd_);
}

}  // namespace shardmix
