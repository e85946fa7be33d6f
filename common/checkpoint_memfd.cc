#include "common/checkpoint_memfd.h"

#include <sys/socket.h>

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
  // `sealed`: the memfd is sealed against writes, so a load may hand it on as it is.
  MappedCheckpointBytes(int fd, const std::uint8_t* data, std::uint64_t size, bool sealed = true)
      : fd_(fd), data_(data), size_(size), sealed_(sealed) {}
  ~MappedCheckpointBytes() override {
    if (size_ > 0) munmap(const_cast<std::uint8_t*>(data_), size_);
    ::close(fd_);
  }
  std::span<const std::uint8_t> bytes() const override { return {data_, size_}; }
  int memfd() const override { return sealed_ ? fd_ : -1; }

 private:
  int fd_;
  const std::uint8_t* data_;
  std::uint64_t size_;
  bool sealed_;
};

// The first `length` bytes of memfd `fd`, mapped read-only through a descriptor of our own
// (the caller keeps `fd`): what both a sealed checkpoint and a save buffer come to. `what`
// names the memfd in errors ("memfd", "save buffer"); `map_flags` are added to MAP_SHARED.
Result<CheckpointBytesPtr> map_read_only(int fd, std::uint64_t length, std::string_view checkpoint,
                                         std::string_view what, bool sealed, int map_flags) {
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) {
    return make_error(StatusCode::kIoError, "checkpoint {}: dup of its {}: {}", checkpoint, what, std::strerror(errno));
  }
  const std::uint8_t* data = nullptr;
  if (length > 0) {
    void* mapped = mmap(nullptr, length, PROT_READ, MAP_SHARED | map_flags, own, 0);
    if (mapped == MAP_FAILED) {
      const int err = errno;
      ::close(own);
      return make_error(StatusCode::kResourceExhausted, "checkpoint {}: mapping its {} ({} bytes): {}", checkpoint,
                        what, length, std::strerror(err));
    }
    data = static_cast<const std::uint8_t*>(mapped);
  }
  return CheckpointBytesPtr(std::make_shared<MappedCheckpointBytes>(own, data, length, sealed));
}

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
  return seal_checkpoint_memfd(fd_, "");
}

Result<CheckpointSaveBuffer> CheckpointSaveBuffer::create() {
  const int fd = memfd_create("shardmix-checkpoint-save-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return make_error(StatusCode::kIoError, "the checkpoint save buffer: memfd_create: {}", std::strerror(errno));
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error(StatusCode::kIoError, "the checkpoint save buffer: sealing it against shrinking: {}",
                      std::strerror(err));
  }
  return CheckpointSaveBuffer(fd);
}

CheckpointSaveBuffer::CheckpointSaveBuffer(CheckpointSaveBuffer&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      data_(std::exchange(other.data_, nullptr)),
      mapped_(std::exchange(other.mapped_, 0)) {}

CheckpointSaveBuffer& CheckpointSaveBuffer::operator=(CheckpointSaveBuffer&& other) noexcept {
  std::swap(fd_, other.fd_);
  std::swap(data_, other.data_);
  std::swap(mapped_, other.mapped_);
  return *this;
}

CheckpointSaveBuffer::~CheckpointSaveBuffer() {
  if (data_ != nullptr) munmap(data_, mapped_);
  if (fd_ >= 0) ::close(fd_);
}

Result<std::span<std::uint8_t>> CheckpointSaveBuffer::writable(std::uint64_t size) {
  if (size == 0) return std::span<std::uint8_t>{};
  if (size > mapped_) {
    struct stat st {};
    if (fstat(fd_, &st) != 0) {
      return make_error(StatusCode::kIoError, "the checkpoint save buffer: fstat: {}", std::strerror(errno));
    }
    // Grows only: a writer through fd() may have made it larger already.
    if (static_cast<std::uint64_t>(st.st_size) < size && ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      return make_error(StatusCode::kResourceExhausted, "the checkpoint save buffer: growing it to {} bytes: {}", size,
                        std::strerror(errno));
    }
    if (data_ != nullptr) munmap(data_, mapped_);
    data_ = nullptr;
    mapped_ = 0;
    void* mapped = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (mapped == MAP_FAILED) {
      return make_error(StatusCode::kResourceExhausted, "the checkpoint save buffer: mapping {} bytes: {}", size,
                        std::strerror(errno));
    }
    data_ = static_cast<std::uint8_t*>(mapped);
    mapped_ = size;
  }
  return std::span<std::uint8_t>{data_, size};
}

bool checkpoint_memfd_is_sealed(int fd) {
  const int seals = fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & F_SEAL_WRITE) != 0;
}

Result<CheckpointBytesPtr> map_checkpoint_buffer(int fd, std::uint64_t length, std::string_view checkpoint) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "checkpoint {}: the save buffer is not a memfd sealed against shrinking (a trainer could "
                      "shrink it under the daemon's copy)",
                      checkpoint);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return make_error(StatusCode::kIoError, "checkpoint {}: fstat of its save buffer: {}", checkpoint, std::strerror(errno));
  }
  if (static_cast<std::uint64_t>(st.st_size) < length) {
    return make_error(StatusCode::kInvalidArgument, "checkpoint {}: its save buffer holds {} bytes, the save says {}",
                      checkpoint, st.st_size, length);
  }
  // MAP_POPULATE: the copy that follows reads every page; fill the page tables at once.
  return map_read_only(fd, length, checkpoint, "save buffer", /*sealed=*/false, MAP_POPULATE);
}

Status seal_checkpoint_memfd(int fd, std::string_view checkpoint) {
  const std::string what = checkpoint.empty() ? std::string("a checkpoint's memfd")
                                              : fmt::format("checkpoint {}'s memfd", checkpoint);
  if (fcntl(fd, F_ADD_SEALS, kRequiredSeals | F_SEAL_SEAL) == 0) return Status::ok_status();
  const int err = errno;
  switch (err) {
    case EBUSY:
      return make_error(StatusCode::kInvalidArgument,
                        "sealing {}: a writable shared mapping of it is still there (unmap it first)", what);
    case EPERM:
      return make_error(StatusCode::kInvalidArgument,
                        "sealing {}: it was created without MFD_ALLOW_SEALING or is sealed already", what);
    case EINVAL:
      return make_error(StatusCode::kInvalidArgument, "sealing {}: the descriptor is not a memfd", what);
    default:
      return make_error(StatusCode::kIoError, "sealing {}: {}", what, std::strerror(err));
  }
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
  return map_read_only(fd, static_cast<std::uint64_t>(st.st_size), checkpoint, "memfd", /*sealed=*/true, 0);
}

}  // namespace shardmix

namespace shardmix {

// One sendmsg of `bytes` with `fds` attached (SCM_RIGHTS); none when `fds` is empty.
ssize_t send_with_descriptors(int socket, std::span<const std::uint8_t> bytes, std::span<const int> fds, int flags) {
  if (fds.size() > 2) {
    errno = EINVAL;
    return -1;
  }
  iovec iov{const_cast<std::uint8_t*>(bytes.data()), bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(fds.size_bytes());
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(fds.size_bytes());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), fds.size_bytes());
  }
  return ::sendmsg(socket, &msg, flags | MSG_NOSIGNAL);
}

std::vector<int> received_descriptors(const msghdr& msg) {
  std::vector<int> fds;
  // CMSG_NXTHDR takes non-const pointers but only reads through them.
  auto* m = const_cast<msghdr*>(&msg);
  for (cmsghdr* c = CMSG_FIRSTHDR(m); c != nullptr; c = CMSG_NXTHDR(m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const std::size_t first = fds.size();
    fds.resize(first + n);
    std::memcpy(fds.data() + first, CMSG_DATA(c), n * sizeof(int));
  }
  return fds;
}

Result<CheckpointBytesPtr> checkpoint_bytes_in_memfd(CheckpointBytesPtr bytes, std::string_view checkpoint) {
  if (bytes->memfd() >= 0) return bytes;
  const std::span<const std::uint8_t> data = bytes->bytes();
  SHARDMIX_ASSIGN_OR_RETURN(CheckpointMemfd copy, CheckpointMemfd::create(checkpoint, data.size()));
  if (!data.empty()) std::memcpy(copy.data().data(), data.data(), data.size());
  SHARDMIX_RETURN_IF_ERROR(copy.seal());
  return map_sealed_checkpoint(copy.fd(), checkpoint);
}

}  // namespace shardmix
