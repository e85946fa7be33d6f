// Model checkpoints absorbed in node RAM (docs/decisions/0053): one daemon's view of the
// checkpoint versions it owns (saved by its trainers, or taken over from a dead owner) and
// of the replicas it holds for peers. Pure bookkeeping: no socket, no MPI, no file I/O. The
// daemon moves the bytes (replication to a peer, the drain to checkpoint.dir) and reports
// each outcome here; the property test drives several stores through the same calls in
// random orders, with daemon deaths, and checks that nothing saved becomes unreadable.
//
// Not to be confused with proto/checkpoint.h, a trainer's position in the epoch plan.
//
// A version's life at its owner:
//   begin_save (admitted: RAM reserved; invisible to readers)
//   -> replicated (a peer holds a copy: the trainer's save returns; visible to readers)
//   -> start_drain -> drained(ok) (durable: in checkpoint.dir; the replica is released)
//   -> evicted from RAM once durable and either outside the newest `retain` versions of its
//      name or, under memory pressure, the first to arrive first.
// A failed drain keeps the RAM copy and the replica, records the error, and the version is
// drained again later. A version is never evicted before it is durable, so every saved
// version stays readable (RAM here, RAM at the replica holder, or the file) until it is
// durable and a newer version has replaced it on the file system.
//
// Thread-safety: none; CheckpointNode (common/checkpoint_node.h) makes every call under
// its one mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace shardmix {

// A checkpoint's bytes, wherever the daemon keeps them (a memfd the trainer wrote into, a
// buffer a peer's copy landed in). Shared so that a load or a drain in progress keeps the
// bytes alive after the store has let them go.
class CheckpointBytes {
 public:
  virtual ~CheckpointBytes() = default;
  virtual std::span<const std::uint8_t> bytes() const = 0;
  // The sealed memfd holding them, if they are in one (what a load hands a trainer
  // without a copy); -1 otherwise. Owned by this object.
  virtual int memfd() const { return -1; }
};
using CheckpointBytesPtr = std::shared_ptr<const CheckpointBytes>;

// Plain owned bytes: what the tests and a peer's replica copy use.
class OwnedCheckpointBytes final : public CheckpointBytes {
 public:
  explicit OwnedCheckpointBytes(std::vector<std::uint8_t> data) : data_(std::move(data)) {}
  std::span<const std::uint8_t> bytes() const override { return data_; }

 private:
  std::vector<std::uint8_t> data_;
};

// One version of one named checkpoint. Names are chosen by trainers ("rank3", "model.pt").
struct CheckpointId {
  std::string name;
  std::uint64_t version = 0;  // 1, 2, ... per name

  auto operator<=>(const CheckpointId&) const = default;
};
std::string to_string(const CheckpointId& id);  // "model.pt@3"

inline constexpr std::int32_t kNoRank = -1;

enum class DrainState : std::uint8_t { kPending, kDraining, kDurable };

// What the store knows of one version it holds in RAM.
struct CheckpointEntry {
  CheckpointId id;
  CheckpointBytesPtr bytes;
  std::uint64_t size = 0;
  std::int32_t owner = kNoRank;          // the daemon that drains it
  std::int32_t replica_holder = kNoRank; // at the owner: the peer holding the copy (kNoRank: none yet)
  bool saved = false;                    // replicated once: the trainer's save returned; readers see it
  bool is_replica = false;               // held here for `owner`, which drains it
  std::uint64_t arrival = 0;             // order of arrival here, across names: eviction age
  DrainState drain = DrainState::kPending;
  std::string last_drain_error;          // the latest failed drain's message, "" if none
};

struct CheckpointStoreOptions {
  std::int32_t self_rank = 0;
  std::uint64_t capacity_bytes = 0;  // checkpoint.capacity: owned versions and replicas together
  std::uint32_t retain = 2;          // newest versions of a name kept in RAM once durable (>= 1)
};

// Counters for telemetry (bytes in RAM, waiting to drain, drained).
struct CheckpointStoreStats {
  std::uint64_t bytes_in_ram = 0;        // owned and replica copies
  std::uint64_t bytes_waiting = 0;       // owned, not yet durable (pending or draining)
  std::uint64_t bytes_drained = 0;       // total ever made durable by this daemon
  std::uint64_t versions_in_ram = 0;
  std::uint64_t drain_failures = 0;
};

class CheckpointStore {
 public:
  explicit CheckpointStore(CheckpointStoreOptions options);

  // The version a new save of `name` gets: one more than any version this daemon knows
  // (held, taken over, or reported durable on disk by note_durable_on_disk).
  std::uint64_t next_version(std::string_view name) const;
  // A version found in checkpoint.dir (start-up scan, or another daemon's drain).
  void note_durable_on_disk(const CheckpointId& id);
  std::optional<std::uint64_t> newest_durable_on_disk(std::string_view name) const;

  // Reserves RAM for a new version owned here, evicting durable versions if that makes
  // room. kResourceExhausted (naming the checkpoint and checkpoint.capacity) when it does
  // not fit now: the caller waits for a drain, or writes it through (reserve_version, then
  // written_through).
  Result<CheckpointId> begin_save(std::string_view name, CheckpointBytesPtr bytes);
  // A peer acknowledged its copy: the save is complete and visible. kNoRank as holder: no
  // peer exists (a one-daemon job), the save completes with the one copy. Returns the
  // holder when the version is already durable, or was evicted as durable (its copy can be
  // released at once), else kNoRank.
  std::int32_t replicated(const CheckpointId& id, std::int32_t holder);
  // The save could not be replicated (no peer accepted it): the version is dropped.
  void abandon(const CheckpointId& id);
  // A version to be written straight to the file system because RAM was full (when_full =
  // "write_through"): reserves its number now, so a save admitted meanwhile gets the next.
  CheckpointId reserve_version(std::string_view name);
  // That write succeeded: durable, never in RAM.
  void written_through(const CheckpointId& id);

  // At a replica holder: keeps a copy of `id` for `owner`. kResourceExhausted when it does
  // not fit even after evicting durable versions; the owner then asks another peer. A copy
  // that lands after its owner was declared dead (read just before the death) is taken over
  // at once, as peer_died would have: nobody else would ever drain it.
  Status accept_replica(std::int32_t owner, const CheckpointId& id, CheckpointBytesPtr bytes);
  // The owner made `id` durable: the copy is no longer needed.
  void release_replica(const CheckpointId& id);

  // The oldest saved version owned here that is neither durable nor draining; marks it
  // draining. Versions taken over from a dead owner come first (they have one copy left).
  std::optional<CheckpointId> start_drain();
  // The drain of `id` ended. ok: durable; returns the peer whose replica can be released
  // (kNoRank if none). Error: pending again, the RAM copy kept, the message recorded.
  std::int32_t drained(const CheckpointId& id, const Status& outcome);

  // A peer daemon died. Replicas this daemon held for it become owned here (and are
  // drained, before anything else); versions owned here whose replica it held lose it.
  // Returns the versions owned here that are not durable and now have no replica, for the
  // caller to replicate again if another peer can take them.
  std::vector<CheckpointId> peer_died(std::int32_t rank);

  // The newest saved version of `name` in RAM here (owned or replica), or of `id` exactly.
  const CheckpointEntry* find_latest(std::string_view name) const;
  const CheckpointEntry* find(const CheckpointId& id) const;
  // `id` in RAM here, saved or not (a save in progress, a replica): for the drain and the
  // replica copy, never for readers.
  const CheckpointEntry* held(const CheckpointId& id) const;
  // Every version held in RAM, saved or not, in (name, version) order.
  std::vector<const CheckpointEntry*> entries() const;
  // Saved versions held in RAM, and the newest durable version on disk of every name, newest
  // first per name.
  std::vector<CheckpointId> list() const;

  // Evicts the durable version that arrived first; false if none is held. The node calls it
  // until its checkpoint pool has the chunks for a new buffer: the versions a save or a
  // replica would displace anyway go before it needs their memory, not after (a buffer is
  // filled before the store admits it).
  bool evict_oldest_durable();

  const CheckpointStoreStats& stats() const { return stats_; }
  std::uint64_t capacity_bytes() const { return options_.capacity_bytes; }
  std::uint64_t free_bytes() const { return options_.capacity_bytes - stats_.bytes_in_ram; }

 private:
  // Drops durable versions of `name` older than its newest `retain` in RAM.
  void apply_retention(std::string_view name);
  // Frees RAM by evicting durable versions, oldest first, until `bytes` fit. false if they
  // cannot (then nothing was evicted).
  bool make_room(std::uint64_t bytes);
  void evict(std::map<CheckpointId, CheckpointEntry>::iterator it);
  CheckpointEntry& entry(const CheckpointId& id, std::string_view caller);
  void update_waiting();

  CheckpointStoreOptions options_;
  std::map<CheckpointId, CheckpointEntry> entries_;
  std::map<std::string, std::uint64_t, std::less<>> durable_on_disk_;  // newest durable version per name
  std::map<std::string, std::uint64_t, std::less<>> newest_known_;     // for next_version
  std::vector<CheckpointId> takeover_queue_;  // taken over from a dead owner, drained first
  std::set<std::int32_t> dead_peers_;
  std::uint64_t arrivals_ = 0;
  CheckpointStoreStats stats_;
};

// The peer that holds a replica of the checkpoint name `self` numbers `slot` (0 for the
// first name it saved, 1 for the next, ...): a live rank other than self, preferring one in
// another failure domain (`domains[r]`, e.g. the host name; ranks with the same label can
// fail together), skipping `excluded` (ranks that refused or died). Slot k goes to
// self + 1 + k around the ring of ranks, so that when every node saves as many names, as
// data-parallel trainers do, every node holds as many replicas: a shift of the ranks is a
// permutation. (A hash of the name sent two or three owners' replicas to one holder, whose
// budget then made the others wait; decision 0068.) kNoRank if no rank qualifies.
std::int32_t choose_replica_holder(std::int32_t self, std::uint32_t slot, const std::vector<std::string>& domains,
                                   const std::vector<bool>& alive, const std::vector<std::int32_t>& excluded);

}  // namespace shardmix
