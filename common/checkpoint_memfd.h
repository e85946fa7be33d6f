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
