#include "server/shared_region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace shardmix {

Result<std::unique_ptr<SharedRegion>> SharedRegion::create(const std::string& name, std::uint64_t length) {
  const std::uint64_t page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  length = std::max<std::uint64_t>(page, (length + page - 1) / page * page);
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return make_error(StatusCode::kIoError, "memfd_create({}): {}", name, std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(length)) != 0) {
    const int err = errno;
    close(fd);
    return make_error(StatusCode::kResourceExhausted, "sizing shared region {} to {} bytes: {}", name, length,
                      std::strerror(err));
  }
  void* data = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return make_error(StatusCode::kResourceExhausted, "mapping shared region {} ({} bytes): {}", name, length,
                      std::strerror(err));
  }
  return std::unique_ptr<SharedRegion>(new SharedRegion(fd, static_cast<std::uint8_t*>(data), length));
}

SharedRegion::~SharedRegion() {
  munmap(data_, length_);
  close(fd_);
}

}  // namespace shardmix
