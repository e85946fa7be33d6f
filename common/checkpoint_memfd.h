// Where a saved checkpoint's bytes live (docs/decisions/0053): in a memfd the trainer
// creates, serialises into, and seals against writes and resizing before handing its
// descriptor to the daemon (SCM_RIGHTS). The daemon checks the seals and maps it read-only:
// the trainer's one write is the only copy on the node, the pages outlive the trainer (the
// daemon holds the descriptor), and a trainer can neither change a saved checkpoint nor
// shrink it under the daemon's mapping (SIGBUS).
// Thread-safety: a CheckpointMemfd belongs to one thread; the mapped bytes are immutable.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/checkpoint_store.h"
#include "common/status.h"

namespace shardmix {

// The trainer's side.
class CheckpointMemfd {
 public:
  static Result<CheckpointMemfd> create(std::string_view name, std::uint64_t size);
  CheckpointMemfd(CheckpointMemfd&& other) noexcept;
  CheckpointMemfd& operator=(CheckpointMemfd&& other) noexcept;
  ~CheckpointMemfd();

  // The writable view; empty after seal().
  std::span<std::uint8_t> data() const { return {data_, sealed_ ? 0 : size_}; }
  std::uint64_t size() const { return size_; }
  // Drops the writable view and seals the memfd (no write, no resize, no new seal).
  Status seal();
  // The descriptor to send; stays owned by this object.
  int fd() const { return fd_; }

 private:
  CheckpointMemfd(int fd, std::uint8_t* data, std::uint64_t size) : fd_(fd), data_(data), size_(size) {}
  int fd_ = -1;
  std::uint8_t* data_ = nullptr;
  std::uint64_t size_ = 0;
  bool sealed_ = false;
};

// The trainer's reusable save buffer (docs/decisions/0068): one memfd a client writes each
// checkpoint into, from offset 0, and keeps for the next. The daemon copies the bytes out
// into its checkpoint pool before the save returns, so the buffer's pages serve every save
// and are allocated once, not once a save. Sealed against shrinking from the start, so
// that the daemon's read-only mapping of it can never lose its pages (SIGBUS); it grows
// to the largest checkpoint saved.
class CheckpointSaveBuffer {
 public:
  static Result<CheckpointSaveBuffer> create();
  CheckpointSaveBuffer(CheckpointSaveBuffer&& other) noexcept;
  CheckpointSaveBuffer& operator=(CheckpointSaveBuffer&& other) noexcept;
  ~CheckpointSaveBuffer();

  // The first `size` bytes, writable (the buffer grows to hold them).
  Result<std::span<std::uint8_t>> writable(std::uint64_t size);
  // For a serializer that writes to it as a file: it may write at any offset; the memfd
  // grows as it does. Owned by this object.
  int fd() const { return fd_; }

 private:
  explicit CheckpointSaveBuffer(int fd) : fd_(fd) {}
  int fd_ = -1;
  std::uint8_t* data_ = nullptr;
  std::uint64_t mapped_ = 0;
};

// Whether memfd `fd` is sealed against writes (a checkpoint the daemon keeps as it is)
// rather than a save buffer whose bytes it copies out.
bool checkpoint_memfd_is_sealed(int fd);

// The daemon's side of a save buffer: the first `length` bytes of memfd `fd`, mapped
// read-only for as long as the copy into the pool takes. kInvalidArgument, naming
// `checkpoint`, if the memfd is not sealed against shrinking or holds fewer bytes.
Result<CheckpointBytesPtr> map_checkpoint_buffer(int fd, std::uint64_t length, std::string_view checkpoint);

// Seals memfd `fd` for handing over as checkpoint `checkpoint` (named in errors): no write,
// no resize, no new seal. A descriptor that is not a memfd created with MFD_ALLOW_SEALING,
// one already sealed, or one with a writable shared mapping left is an error saying which.
// CheckpointMemfd::seal and Client::save_memfd (a memfd the caller serialised into) use it.
Status seal_checkpoint_memfd(int fd, std::string_view checkpoint);

// The daemon's side: maps the sealed memfd `fd` (duplicated: the caller keeps its own)
// read-only as the bytes of `checkpoint` (named in errors). kInvalidArgument if it is not
// a memfd sealed against writes, growth and shrinking.
Result<CheckpointBytesPtr> map_sealed_checkpoint(int fd, std::string_view checkpoint);

// `bytes` if they are in a sealed memfd already (CheckpointBytes::memfd()), else a copy in
// a new sealed memfd: what the daemon passes a trainer that loads a version it read from
// its file or holds as a peer's replica.
Result<CheckpointBytesPtr> checkpoint_bytes_in_memfd(CheckpointBytesPtr bytes, std::string_view checkpoint);

// One sendmsg (MSG_NOSIGNAL | `flags`) of `bytes` with `fds` attached (SCM_RIGHTS; at most
// two), or none when `fds` is empty: how a memfd crosses the trainer's Unix socket. Returns
// what sendmsg returns (errno set on -1).
ssize_t send_with_descriptors(int socket, std::span<const std::uint8_t> bytes, std::span<const int> fds, int flags);

// Every descriptor that arrived with a recvmsg'd message (its SCM_RIGHTS control
// messages), in order. The caller owns them: it keeps the ones it expects and closes the
// rest, so a confused peer cannot leak descriptors into the process.
std::vector<int> received_descriptors(const msghdr& msg);

}  // namespace shardmix
