// Anonymous shared memory (memfd) mapped read-write by the daemon. Trainers receive a
// read-only descriptor of it over the Unix socket (SCM_RIGHTS): no file in /dev/shm, so a
// crashed daemon leaves nothing behind (unlike a named /dev/shm file), and a
// trainer can neither write the cache nor resize it (the size is sealed: a shrink would
// make the daemon's own accesses fault with SIGBUS).
// Thread-safety: the mapping itself is plain memory; the object is not synchronised.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace shardmix {

class SharedRegion {
 public:
  // Creates a region of `length` bytes (at least one page, so even an empty node has a
  // valid mapping to register and send).
  static Result<std::unique_ptr<SharedRegion>> create(const std::string& name, std::uint64_t length);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  std::uint8_t* data() const { return data_; }
  std::uint64_t length() const { return length_; }
  // An O_RDONLY descriptor of the same memory: what trainers get.
  int readonly_fd() const { return readonly_fd_; }

 private:
  SharedRegion(int fd, int readonly_fd, std::uint8_t* data, std::uint64_t length)
      : fd_(fd), readonly_fd_(readonly_fd), data_(data), length_(length) {}
  int fd_;
  int readonly_fd_;
  std::uint8_t* data_;
  std::uint64_t length_;
};

}  // namespace shardmix
