// Anonymous shared memory (memfd) mapped read-write by the daemon. Trainers receive the
// fd over the Unix socket (SCM_RIGHTS) and map it read-only: no file in /dev/shm, so a
// crashed daemon leaves nothing behind (pain 7 in shared/reference/peers.md).
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
  int fd() const { return fd_; }

 private:
  SharedRegion(int fd, std::uint8_t* data, std::uint64_t length) : fd_(fd), data_(data), length_(length) {}
  int fd_;
  std::uint8_t* data_;
  std::uint64_t length_;
};

}  // namespace shardmix
