// libshardmix: the trainer side of ShardMix.
//
//   shardmix::Client client = shardmix::Client::connect();      // finds the local daemon
//   for (int epoch = 0; epoch < 90; ++epoch)
//     for (const shardmix::Batch& batch : client.epoch(epoch))   // prefetched, zero-copy
//       for (const shardmix::Sample& s : batch)                  // s.bytes(), s.label(), s.id()
//         consume(s);
//
// Prefetching happens in the daemon: it assembles up to service.prefetch batches ahead
// and the socket carries only small descriptors. Sample bytes are views into shared
// memory mapped once at connect (the node's cache arena and this trainer's staging area);
// a batch's views stay valid until the iterator moves past it (then the batch is released
// and its staging bytes are reused). Starting another epoch releases the previous one.
//
// Checkpoint and resume (docs/decisions/0022-checkpoint-and-resume.md):
//   auto blob = client.checkpoint();                  // after the optimizer step, inside the loop
//   ... restart ...
//   auto info = shardmix::Client::inspect_checkpoint(blob);
//   for (auto e = info.epoch; e < 90; ++e)
//     for (const auto& batch : e == info.epoch ? client.epoch(e, blob) : client.epoch(e)) ...
// A batch counts as delivered once the iterator has yielded it (operator* is valid), so a
// checkpoint taken in the loop body after training on a batch includes that batch; the
// resumed pass delivers exactly the rest of the epoch, keeping batch indices. Restoring
// needs the same job (dataset, seed, exchange fraction, batch size, world size); with a
// different number of trainers, start the daemons with resume.checkpoint_dir holding every
// old rank's blob and iterate client.resumed_epoch() without a blob.
//
// Model checkpoints (the trainer's own state, not the data position above; checkpoint.dir
// set on the daemons, docs/decisions/0053, 0056 and 0059):
//   client.save("rank3", bytes);                     // returns once in the node's and a peer daemon's RAM
//   client.wait_durable("rank3");                    // once the newest version is in checkpoint.dir
//   shardmix::LoadedCheckpoint c = client.load("rank3");   // c.bytes(): RAM, else the file
//   for (const shardmix::CheckpointVersion& v : client.list()) ...
// They travel on a second connection to the same daemon, opened on first use, so they can be
// called between batches without touching the batch stream.
//
// Errors: exceptions at this edge only (shardmix::Error, with the daemon's message),
// thrown by connect() and by the iterator. The library writes nothing to stdout or
// stderr (it does not log at all).
// Thread-safety: one Client per trainer thread; not safe to share without a lock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/catalog.h"
#include "common/status.h"
#include "common/trace.h"
#include "proto/wire.h"

namespace shardmix {

class Error : public std::runtime_error {
 public:
  explicit Error(const Status& status) : std::runtime_error(status.to_string()), code_(status.code()) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

struct ClientOptions {
  std::string run_dir;      // "" = $SHARDMIX_RUN_DIR, else /tmp/shardmix-<uid>
  int daemon = -1;          // node index of the daemon to use; -1 = $SHARDMIX_DAEMON, else by rank
  int rank = -1;            // trainer rank; -1 = from the launcher's environment
  int world_size = -1;      // trainer count; -1 = from the launcher's environment
  // How long to wait for the daemons' readiness file; < 0 = $SHARDMIX_CONNECT_TIMEOUT
  // (seconds, or a duration such as "90s", "5min"), else 300 s.
  double ready_timeout_s = -1;
  // A daemon that sends nothing this long, not even the keepalive it sends every second
  // while it has nothing else to say, is treated as stopped or hung; < 0 =
  // $SHARDMIX_RECEIVE_TIMEOUT (seconds or a duration), else 30 s.
  double receive_timeout_s = -1;
  // The backstop for a daemon that is alive (keepalives come) but never answers, e.g. a
  // stalled scheduler: no batch or other reply for this long is an error; < 0 =
  // $SHARDMIX_PROGRESS_TIMEOUT, else 600 s. Invalid environment values are errors.
  double progress_timeout_s = -1;
  // Called on the waiting thread when a signal interrupts a wait for the daemon (poll or
  // recv fails with EINTR), and at every keepalive the wait receives (one a second while
  // the daemon has nothing to send): a signal that lands between two system calls
  // interrupts neither. true = stop waiting: the call fails with kCancelled and the
  // connection is closed (the daemon frees what this trainer held; connect again to go
  // on). Empty = keep waiting. The Python binding checks for KeyboardInterrupt here, so a
  // Ctrl-C need not wait for the next batch.
  std::function<bool()> interrupted;
};

// The trainer's place in the job as the launcher sets it, first match wins:
//   SHARDMIX_RANK/_WORLD_SIZE (+ SHARDMIX_LOCAL_RANK/_LOCAL_SIZE);
//   Open MPI: OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK/_LOCAL_SIZE. In an MPMD job
//     (mpirun -np N shardmixd : -np M ./train) the numbers are made relative to this
//     program's app context (OMPI_MCA_orte_app_num, OMPI_APP_CTX_NUM_PROCS), so daemon
//     ranks are not counted; the local rank is unknown there (the node's ranks mix apps);
//   PMI (MPICH/Hydra): PMI_RANK/PMI_SIZE, MPI_LOCALRANKID/MPI_LOCALNRANKS;
//   Slurm: SLURM_PROCID/SLURM_NTASKS, SLURM_LOCALID, SLURM_NNODES (local size =
//     NTASKS / NNODES when that divides evenly);
//   torchrun: RANK/WORLD_SIZE, LOCAL_RANK/LOCAL_WORLD_SIZE.
// 0 and 1 when none is set; local_rank, local_size and nodes are -1 when unknown.
struct LauncherRank {
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;
  int local_size = -1;  // trainers on this node
  int nodes = -1;
  std::string source = "default";
  // "8 trainers (rank 5, local rank 1 of 4 per node, 2 nodes; from SLURM_PROCID)"
  std::string describe() const;
};
LauncherRank detect_launcher_rank();

// Asks a running daemon for its counters (the GetStats request; no Hello, so it works
// next to the trainers, e.g. from shardmix-stat). Returns the Prometheus text the daemon
// renders (docs/operations.md lists the metrics). `daemon` < 0: the first daemon on this
// host according to RUN_DIR/ready. Uses options.run_dir, ready_timeout_s, receive_timeout_s.
Result<std::string> query_daemon_stats(const ClientOptions& options, int daemon = -1);

class Sample {
 public:
  std::span<const std::byte> bytes() const { return {data_, static_cast<std::size_t>(desc_.length)}; }
  std::int32_t label() const { return desc_.label; }
  SampleId id() const { return desc_.sample_id; }
  proto::Tier tier() const { return static_cast<proto::Tier>(desc_.tier); }
  std::uint32_t owner() const { return desc_.owner; }

 private:
  friend class EpochIterator;
  const std::byte* data_ = nullptr;
  proto::SampleDescriptor desc_{};
};

class Batch {
 public:
  std::uint64_t epoch() const { return epoch_; }
  std::uint64_t index() const { return index_; }
  std::size_t size() const { return samples_.size(); }
  bool empty() const { return samples_.empty(); }
  const Sample& operator[](std::size_t i) const { return samples_[i]; }
  std::vector<Sample>::const_iterator begin() const { return samples_.begin(); }
  std::vector<Sample>::const_iterator end() const { return samples_.end(); }
  // Samples planned for this batch whose bytes could not be read (dataset.strict = false:
  // the file vanished or changed since the scan, or an I/O error; the daemon's log names
  // the file and offset). They are not in the batch, so size() is smaller than planned;
  // they count as delivered for checkpoints, and in EpochStats::unreadable_samples.
  const std::vector<SampleId>& skipped() const { return skipped_; }

 private:
  friend class EpochIterator;
  std::uint64_t epoch_ = 0;
  std::uint64_t index_ = 0;
  std::vector<Sample> samples_;
  std::vector<SampleId> skipped_;
};

class DaemonConnection;

// What a checkpoint blob says, readable without a daemon (Client::inspect_checkpoint).
struct CheckpointInfo {
  std::uint64_t epoch = 0;
  std::uint64_t batches_consumed = 0;  // batches yielded in `epoch` when it was taken
  std::uint64_t samples_consumed = 0;
  int rank = 0;
  int world_size = 0;
  bool redealt = false;  // taken in an epoch re-dealt from resume.checkpoint_dir
};

// Input iterator over one epoch's batches. Advancing releases the current batch.
class EpochIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = Batch;
  using difference_type = std::ptrdiff_t;
  using pointer = const Batch*;
  using reference = const Batch&;

  EpochIterator() = default;
  // Move-only: a copy would release the same batch twice.
  EpochIterator(const EpochIterator&) = delete;
  EpochIterator& operator=(const EpochIterator&) = delete;
  EpochIterator(EpochIterator&&) noexcept = default;
  EpochIterator& operator=(EpochIterator&&) noexcept = default;
  const Batch& operator*() const { return batch_; }
  const Batch* operator->() const { return &batch_; }
  EpochIterator& operator++();
  bool operator==(std::default_sentinel_t) const { return done_; }

 private:
  friend class Epoch;
  EpochIterator(DaemonConnection* connection, std::uint64_t epoch, std::span<const std::uint8_t> resume);
  void fetch_next();

  DaemonConnection* connection_ = nullptr;
  std::uint64_t epoch_ = 0;
  Batch batch_;
  bool holding_ = false;
  bool done_ = true;
  // Since when this trainer waits for the next batch, and how long it waited for batch_.
  std::chrono::steady_clock::time_point waiting_since_{};
  std::uint64_t wait_us_ = 0;
  // The trace's (telemetry.trace_dir) wait and hold start times; 0 when not tracing.
  std::int64_t trace_wait_ = 0;
  std::int64_t trace_hold_ = 0;
  trace::Key trace_key() const;
};

// One version of a model checkpoint the daemon knows (in its RAM, or newest on disk).
struct CheckpointVersion {
  std::string name;
  std::uint64_t version = 0;
};

// Memory of the node's checkpoint pool leased to this trainer (Client::lease_checkpoint,
// docs/decisions/0069): write the checkpoint into `bytes`, then Client::save_lease saves it
// with no copy at all. `bytes` is mapped by the Client and valid until save_lease,
// abandon_lease, the next lease_checkpoint, the close of the Client's checkpoint
// connection (an interrupted wait, an answer that did not come) or the Client's end,
// whichever comes first; after that it is unmapped (a write faults rather than changing a
// saved checkpoint). `id` is the Client's own serial, never reused.
struct CheckpointLease {
  std::uint64_t id = 0;
  std::string name;
  std::span<std::uint8_t> bytes;
};

// A loaded version: a read-only mapping of the sealed memfd the daemon passed (no copy
// when the version was in its RAM). Valid until destroyed.
class LoadedCheckpoint {
 public:
  LoadedCheckpoint() = default;
  LoadedCheckpoint(LoadedCheckpoint&& other) noexcept;
  LoadedCheckpoint& operator=(LoadedCheckpoint&& other) noexcept;
  ~LoadedCheckpoint();
  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  std::uint64_t version() const { return version_; }

 private:
  friend class Client;
  const std::uint8_t* data_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t version_ = 0;
};

class Epoch {
 public:
  EpochIterator begin();
  std::default_sentinel_t end() const { return {}; }
  // The daemon's figures for this epoch; available once iteration reached the end.
  const std::optional<proto::EpochStats>& stats() const;

 private:
  friend class Client;
  Epoch(DaemonConnection* connection, std::uint64_t epoch) : connection_(connection), epoch_(epoch) {}
  DaemonConnection* connection_;
  std::uint64_t epoch_;
  std::vector<std::uint8_t> resume_;  // checkpoint blob to resume from, or empty
};

class Client {
 public:
  // Finds and connects to this trainer's daemon. Throws shardmix::Error.
  static Client connect(const ClientOptions& options = {});
  static Result<Client> try_connect(const ClientOptions& options = {});
  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;
  ~Client();

  // The batches of `epoch` for this trainer. Only one epoch is iterated at a time.
  Epoch epoch(std::uint64_t epoch);
  // The batches of `epoch` not yet delivered when `resume_from` (a checkpoint() blob of
  // this rank, taken in `epoch`) was saved. The blob is copied. A blob of another job,
  // rank, epoch or world size makes begin() throw an Error saying what differs.
  Epoch epoch(std::uint64_t epoch, std::span<const std::uint8_t> resume_from);

  // This trainer's position: the epoch last started and the batches yielded in it, as an
  // opaque, versioned blob (proto/checkpoint.h; about 100 bytes plus 16 per sample that
  // shuffle.window delivered out of order). Throws if no epoch was started yet. Cheap: no
  // daemon round trip.
  std::vector<std::uint8_t> checkpoint() const;
  // Reads a blob without a daemon (e.g. to find the epoch to resume). Throws on a bad blob.
  static CheckpointInfo inspect_checkpoint(std::span<const std::uint8_t> blob);
  // The epoch the daemons re-dealt from resume.checkpoint_dir (a job restarted with a
  // different number of trainers), if any: iterate it with epoch(e), without a blob.
  std::optional<std::uint64_t> resumed_epoch() const;

  int rank() const;
  int world_size() const;
  std::uint32_t node() const;
  std::uint64_t batches_per_epoch() const;
  std::uint64_t samples_per_epoch() const;
  std::uint64_t dataset_samples() const;
  // The dataset's catalog (paths, sizes, labels), fetched from the daemon on first use.
  const Catalog& catalog();
  // The last completed epoch's statistics as reported by the daemon.
  const std::optional<proto::EpochStats>& last_epoch_stats() const;

  // Model checkpoints; each throws shardmix::Error with the daemon's message (naming the
  // checkpoint, and checkpoint.dir for file system errors).
  // Saves `bytes` as the next version of `name` (letters, digits, '.', '_', '-'; at most
  // 200 bytes) and returns its version number once the node holds it and, with two or more
  // daemons, a peer daemon holds a copy, so they survive this process (and the copy
  // survives this node's daemon). The bytes are copied once, into a lease of the daemon's
  // checkpoint pool (lease_checkpoint below), pages the daemon reuses from save to save.
  std::uint64_t save(std::string_view name, std::span<const std::uint8_t> bytes);
  // The same without that copy: `write` fills the `size` leased bytes itself (e.g. a
  // serializer writing straight into them). If `write` throws, the lease is abandoned and
  // the exception goes on.
  std::uint64_t save(std::string_view name, std::uint64_t size,
                     const std::function<void(std::span<std::uint8_t>)>& write);
  // `size` bytes of the daemon's checkpoint pool, mapped writable here, to become the next
  // version of `name` (decision 0069). A lease still held from before is abandoned first:
  // a client holds one at a time. A serializer that cannot tell its size ahead asks for
  // enough and saves fewer.
  CheckpointLease lease_checkpoint(std::string_view name, std::uint64_t size);
  // Unmaps the lease and saves its first `length` bytes (at most its size) as save() does;
  // returns the version. The lease is used up either way.
  std::uint64_t save_lease(const CheckpointLease& lease, std::uint64_t length);
  // Unmaps the lease and gives its memory back unsaved.
  void abandon_lease(const CheckpointLease& lease);
  // Whether `lease` is the one this client holds now (not saved, abandoned or replaced,
  // and its connection still open).
  bool holds_lease(const CheckpointLease& lease) const;
  // A save buffer, for a serializer that writes to a file descriptor: a memfd this client
  // keeps and reuses, which the daemon copies into its checkpoint pool (decision 0068).
  // It holds as much as the largest checkpoint saved through it. The descriptor: write the
  // checkpoint from offset 0 (it grows as needed), then save_buffer(name, bytes written).
  // Owned by the client; do not close it, or write to it while a save is in progress. Ask
  // for it before every save: after a failed save the client makes a new buffer.
  int checkpoint_buffer_fd();
  std::uint64_t save_buffer(std::string_view name, std::uint64_t size);
  // The same for a memfd the caller created (memfd_create with MFD_ALLOW_SEALING) and
  // filled: no copy at all, the daemon keeps the memfd (its pages are new, though: on most
  // machines save_buffer, which copies into pages reused, is faster). Its whole size is the
  // checkpoint. The client seals it against writes and resizing (so no writable mapping of
  // it may be left) and the daemon keeps its pages; the caller still owns and closes `fd`.
  std::uint64_t save_memfd(std::string_view name, int fd);
  // Returns once the newest version of `name` saved so far is in checkpoint.dir; throws
  // the drain's error (naming the checkpoint and the directory) if writing it failed: the
  // RAM copy is kept and the drain retries, so it may be called again.
  void wait_durable(std::string_view name);
  // The newest version of `name`: from the daemon's RAM when it is there, else its file
  // (checksum verified). kNotFound if there is none.
  LoadedCheckpoint load(std::string_view name);
  // The versions this node's daemon knows, newest first per name: held in its RAM, and the
  // newest durable one of each name it found in checkpoint.dir at start or loaded since
  // (another node's checkpoint saved during this job shows after a load of its name).
  std::vector<CheckpointVersion> list();

 private:
  explicit Client(std::unique_ptr<DaemonConnection> connection);
  std::unique_ptr<DaemonConnection> connection_;
};

}  // namespace shardmix
