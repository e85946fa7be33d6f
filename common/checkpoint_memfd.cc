#include "common/checkpoint_memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace shardmix {
namespace {

constexpr int kRequiredSeals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW;

// A read-only mapping of a sealed memfd; unmapped and closed with the last reference.
class MappedCheckpointBytes final : public CheckpointBytes {
 public:
  MappedCheckpointBytes(int fd, const std::uint8_t* data, std::uint64_t size) : fd_(fd), data_(data), size_(size) {}
  ~MappedCheckpointBytes() override {
    if (size_ > 0) munmap(const_cast<std::uint8_t*>(data_), size_);
    ::close(fd_);
  }
  std::span<const std::uint8_t> bytes() const override { return {data_, size_}; }

 private:
  int fd_;
  const std::uint8_t* data_;
  std::uint64_t size_;
};

}  // namespace

Result<CheckpointMemfd> CheckpointMemfd::create(std::string_view name, std::uint64_t size) {
  const std::string label = "shardmix-checkpoint-" + std::string(name);
  const int fd = memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return make_error(StatusCode::kIoError, "checkpoint {}: memfd_create: {}", name, std::strerror(errno));
  const auto fail = [&](const char* step) -> Status {
    const int err = errno;
    ::close(fd);
    return make_error(StatusCode::kResourceExhausted, "checkpoint {} ({} bytes): {}: {}", name, size, step,
                      std::strerror(err));
  };
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) return fail("sizing its memfd");
  std::uint8_t* data = nullptr;
  if (size > 0) {
    void* mapped = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) return fail("mapping its memfd");
    data = static_cast<std::uint8_t*>(mapped);
  }
  return CheckpointMemfd(fd, data, size);
}

CheckpointMemfd::CheckpointMemfd(CheckpointMemfd&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      sealed_(other.sealed_) {}

CheckpointMemfd& CheckpointMemfd::operator=(CheckpointMemfd&& other) noexcept {
  // The moved-from object releases what this one held.
  std::swap(fd_, other.fd_);
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  std::swap(sealed_, other.sealed_);
  return *this;
}

CheckpointMemfd::~CheckpointMemfd() {
  if (data_ != nullptr && !sealed_) munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

Status CheckpointMemfd::seal() {
  if (sealed_) return Status::ok_status();
  // F_SEAL_WRITE is refused while a writable shared mapping exists.
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  sealed_ = true;
  if (fcntl(fd_, F_ADD_SEALS, kRequiredSeals | F_SEAL_SEAL) != 0) {
    return make_error(StatusCode::kIoError, "sealing a checkpoint's memfd: {}", std::strerror(errno));
  }
  return Status::ok_status();
}

Result<CheckpointBytesPtr> map_sealed_checkpoint(int fd, std::string_view checkpoint) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return make_error(StatusCode::kInvalidArgument, "checkpoint {}: the descriptor is not a sealable memfd ({})",
                      checkpoint, std::strerror(errno));
  }
  if ((seals & kRequiredSeals) != kRequiredSeals) {
    return make_error(StatusCode::kInvalidArgument,
                      "checkpoint {}: its memfd is not sealed against{}{}{} (seal it before saving)", checkpoint,
                      (seals & F_SEAL_WRITE) ? "" : " writes", (seals & F_SEAL_SHRINK) ? "" : " shrinking",
                      (seals & F_SEAL_GROW) ? "" : " growth");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return make_error(StatusCode::kIoError, "checkpoint {}: fstat of its memfd: {}", checkpoint, std::strerror(errno));
  }
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return make_error(StatusCode::kIoError, "checkpoint {}: dup of its memfd: {}", checkpoint, std::strerror(errno));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const std::uint8_t* data = nullptr;
  if (size > 0) {
    void* mapped = mmap(nullptr, size, PROT_READ, MAP_SHARED, own, 0);
    if (mapped == MAP_FAILED) {
      const int err = errno;
      ::close(own);
      return make_error(StatusCode::kResourceExhausted, "checkpoint {}: mapping its memfd ({} bytes): {}", checkpoint,
                        size, std::strerror(err));
    }
    data = static_cast<const std::uint8_t*>(mapped);
  }
  return CheckpointBytesPtr(std::make_shared<MappedCheckpointBytes>(own, data, size));
}

}  // namespace shardmix
