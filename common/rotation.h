// Cache rotation (docs/decisions/0033): what each node caches changes every
// cache.rotation_epochs epochs, without a peer ever reading a slot that is being rewritten.
//
// ResidencyTable: this daemon's view of every node's arena, "the generation of node k that
// may be read now", one immutable ArenaView per node swapped under a mutex. The schedulers
// (service thread) snapshot it once per staged batch and ask locate(): a sample is read
// from node k's arena only if the view says where; otherwise it is staged as a storage read
// (always correct). Each read or zero-copy reference taken under a view holds the view's
// pin (a shared_ptr) until the read has landed or the trainer released the batch; the fence
// waits for the pins to expire, so no counting can go wrong.
//
// RotationCoordinator: the fence, per daemon, driven from the main thread (like the
// telemetry of 0014; MPI stays there). For node k going from generation g to g+1:
// Generations come from a GenerationClock (common/slot_reuse.h): one per cache.rotation_epochs
// epochs, or one per round of cache.reuse_rounds (slot reuse within an epoch, 0035).
//  1. Every daemon, once one of its trainers stages a batch of generation g+1, *retires* g
//     for k: its view of k becomes "transition": only samples at the same offset in g and
//     g+1 (kept ones, never written by the reload) may be read; the rest go to storage.
//  2. When the pin of its generation-g view of k has expired (no read of k's g arena can be
//     posted any more and every one in flight has landed; for k itself also every batch its
//     trainers held that referenced the arena was released), it tells k: Done(k, g).
//  3. Node k, with Done(k, g) from every daemon including itself, writes the entering
//     samples of g+1 into the holes (the delta only), then tells every daemon Readable(k, g+1).
//  4. A daemon receiving Readable(k, g+1) swaps its view of k to the stable g+1 layout.
// No trainer ever waits on the fence (what it cannot read from an arena it reads from
// storage), and correctness never depends on which epoch a trainer is in: a view is where
// bytes *are*, so a restarted pass over an old epoch reads correct bytes too.
// Transport-free: messages and the reload are callbacks, so the fence is tested in an
// in-process cluster (tests/unit/rotation_test.cc).
// Thread-safety: ResidencyTable is thread-safe. RotationCoordinator: one thread (the main
// thread), including on_done/on_readable.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/arena_layout.h"
#include "common/slot_reuse.h"
#include "common/status.h"

namespace shardmix {

struct ArenaView {
  std::shared_ptr<const ArenaLayout> layout;  // what the arena holds
  // Non-null while node `layout->node` moves to next->generation: only samples at the same
  // offset in both may be read.
  std::shared_ptr<const ArenaLayout> next;
  // Held by every read and zero-copy reference taken under this view.
  std::shared_ptr<const int> pin;
};

class ResidencyTable {
 public:
  ResidencyTable(std::vector<ArenaLayout> initial, GenerationClock clock);

  using Snapshot = std::vector<std::shared_ptr<const ArenaView>>;
  Snapshot snapshot() const;

  struct ArenaRead {
    std::uint64_t offset;
    std::shared_ptr<const int> pin;
  };
  // Where sample `id` of node `node` can be read now, with the pin to hold while reading;
  // nullopt: read it from storage.
  static std::optional<ArenaRead> locate(const Snapshot& views, std::uint32_t node, SampleId id);

  // Schedulers note every batch they stage (ahead included; `batch` of the epoch): rotation
  // follows the furthest generation staged.
  void note_staged(std::uint64_t epoch, std::uint64_t batch);
  std::optional<std::uint64_t> furthest_generation_staged() const;
  const GenerationClock& clock() const { return clock_; }

  // Main thread. Begins node's move to `next` (its generation must be the current one + 1);
  // returns the pin of the retired view (expired: nothing reads the old slots any more).
  std::weak_ptr<const int> begin_transition(std::uint32_t node, std::shared_ptr<const ArenaLayout> next);
  // Node's reload is done: its view becomes the stable `next`.
  void finish_transition(std::uint32_t node);
  std::shared_ptr<const ArenaView> view(std::uint32_t node) const;

 private:
  mutable std::mutex mutex_;  // guards views_
  std::vector<std::shared_ptr<const ArenaView>> views_;
  GenerationClock clock_;
  std::atomic<std::uint64_t> furthest_generation_plus_one_{0};  // 0: nothing staged yet
};

class RotationCoordinator {
 public:
  struct Hooks {
    // Sends Done(node, generation) to the daemon of `node` (never called for this daemon's own node).
    std::function<void(std::uint32_t node, std::uint64_t generation)> send_done;
    // Sends Readable(self, generation) to every other daemon.
    std::function<void(std::uint64_t generation)> announce_readable;
    // Starts writing `layout.entering` into this daemon's arena; the coordinator polls
    // reload_finished() afterwards.
    std::function<void(const ArenaLayout& layout)> start_reload;
    // nullopt while the reload runs; its outcome once finished (then forgotten).
    std::function<std::optional<Status>()> reload_finished;
    // The resident set node wants in `generation` (ascending ids), given the layout it
    // holds now: choose_resident (rotation) or choose_by_next_use (reuse rounds).
    std::function<std::vector<SampleId>(std::uint32_t node, std::uint64_t generation, const ArenaLayout& current)>
        wanted;
  };

  // Generations follow table.clock(); nothing happens if it is not enabled.
  RotationCoordinator(std::uint32_t self, std::uint32_t nodes, const std::vector<std::uint64_t>& sizes,
                      ResidencyTable& table, Hooks hooks);

  // Main thread, periodically: retires, declares, starts and announces reloads as they
  // become possible. Returns the first reload error (the node then stays in transition:
  // its changing samples keep coming from storage).
  Status poll();
  void on_done(std::uint32_t from, std::uint32_t node, std::uint64_t generation);
  void on_readable(std::uint32_t node, std::uint64_t generation);

  struct Stats {
    std::uint64_t generations_loaded = 0;  // reloads of this node finished
    std::uint64_t samples_loaded = 0;      // entering samples written
    std::uint64_t samples_unplaced = 0;    // chosen but found no hole (stayed cold)
    std::uint64_t unexpected_messages = 0; // Done/Readable that fit no state (a bug if non-zero)
  };
  Stats stats() const { return stats_; }
  // The generation of `node` this daemon reads (the stable one, or the one being left).
  std::uint64_t generation(std::uint32_t node) const { return nodes_[node].generation; }
  bool in_transition(std::uint32_t node) const { return nodes_[node].next != nullptr; }

 private:
  struct NodeState {
    std::uint64_t generation = 0;
    std::shared_ptr<const ArenaLayout> current;
    std::shared_ptr<const ArenaLayout> next;  // non-null while in transition
    std::weak_ptr<const int> retired_pin;
    bool done_sent = false;
  };

  std::uint32_t self_;
  const std::vector<std::uint64_t>& sizes_;
  ResidencyTable& table_;
  Hooks hooks_;
  std::vector<NodeState> nodes_;
  std::map<std::uint64_t, std::uint32_t> done_count_;  // this node's generation -> Done messages
  bool reloading_ = false;
  bool reload_error_ = false;
  Stats stats_;
};

}  // namespace shardmix
