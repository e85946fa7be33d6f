#include "common/checkpoint_node.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "common/checkpoint_file.h"
#include "common/trace.h"

namespace shardmix {
namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t micros_since(Clock::time_point start) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count());
}

// One version to checkpoint.dir, as a span on the daemon's trace (telemetry.trace_dir).
Status traced_write(const std::filesystem::path& dir, const CheckpointId& id, std::span<const std::uint8_t> bytes,
                    bool write_through) {
  const std::int64_t begin = trace::start();
  Status written = write_checkpoint_file(dir, id, bytes);
  trace::span(trace::What::kCheckpointDrain, 0, begin, trace::kAlways,
              {id.version, bytes.size(), written.ok() ? 1u : 0u, write_through ? 1u : 0u});
  return written;
}

}  // namespace

Result<std::unique_ptr<CheckpointNode>> CheckpointNode::start(CheckpointNodeOptions options,
                                                              CheckpointReplicator* replicator) {
  if (options.dir.empty()) {
    return make_error(StatusCode::kInvalidArgument, "checkpoint.dir is empty: checkpoints need a directory to drain to");
  }
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return make_error(StatusCode::kIoError, "checkpoint.dir {}: cannot create it: {}", options.dir.string(), ec.message());
  }
  Result<std::vector<CheckpointId>> on_disk = list_checkpoint_files(options.dir);
  if (!on_disk.ok()) return on_disk.status();
  // The store's budget in the pool's whole chunks, with a few to spare for the chunk a
  // version rounds up to: short of them, a buffer overflows into a memfd of its own.
  constexpr std::uint64_t kSpareChunks = 8;
  SHARDMIX_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointPool> pool,
                            CheckpointPool::create(options.capacity_bytes + kSpareChunks * CheckpointPool::kDefaultChunkBytes,
                                                   options.prefault_pool));
  std::unique_ptr<CheckpointNode> node(new CheckpointNode(std::move(options), replicator));
  node->pool_ = std::move(pool);
  for (const CheckpointId& id : *on_disk) node->store_.note_durable_on_disk(id);
  node->drain_thread_ = std::thread([raw = node.get()] { raw->drain_loop(); });
  return node;
}

CheckpointNode::CheckpointNode(CheckpointNodeOptions options, CheckpointReplicator* replicator)
    : options_(std::move(options)),
      replicator_(replicator),
      store_(CheckpointStoreOptions{options_.rank, options_.capacity_bytes, options_.retain}),
      alive_(std::max<std::size_t>(options_.domains.size(), static_cast<std::size_t>(options_.rank) + 1), true) {}

CheckpointNode::~CheckpointNode() {
  Callbacks out;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_drain_.notify_all();
  if (drain_thread_.joinable()) drain_thread_.join();
  std::lock_guard lock(mutex_);
  const Status stopping(StatusCode::kCancelled, "the daemon is stopping");
  for (PendingSave& save : waiting_for_room_) out.push_back([done = save.done, stopping] { done(stopping); });
  for (PendingSave& save : write_through_) out.push_back([done = save.done, stopping] { done(stopping); });
  for (DurableWaiter& waiter : durable_waiters_) out.push_back([done = waiter.done, stopping] { done(stopping); });
  for (auto& [id, replication] : replicating_) {
    if (replication.done) out.push_back([done = replication.done, stopping] { done(stopping); });
  }
  run(out);
}

void CheckpointNode::run(Callbacks& callbacks) {
  for (auto& callback : callbacks) callback();
  callbacks.clear();
}

void CheckpointNode::finish_save(SaveDone done, Clock::time_point started, Result<CheckpointId> result, Callbacks& out) {
  if (!done) return;
  ++stats_.saves;
  stats_.save_us += micros_since(started);
  out.push_back([done = std::move(done), result = std::move(result)] { done(result); });
}

void CheckpointNode::save(std::string name, CheckpointBytesPtr bytes, SaveDone done) {
  if (Status valid = validate_checkpoint_name(name); !valid.ok()) {
    done(valid);
    return;
  }
  Callbacks out;
  {
    std::lock_guard lock(mutex_);
    admit(PendingSave{std::move(name), std::move(bytes), std::move(done), Clock::now()}, out);
  }
  run(out);
}

void CheckpointNode::admit(PendingSave save, Callbacks& out) {
  const std::uint64_t size = save.bytes->bytes().size();
  // Saves queued for room keep their order: a new one does not overtake them.
  if (waiting_for_room_.empty()) {
    Result<CheckpointId> id = store_.begin_save(save.name, save.bytes);
    if (id.ok()) {
      replicating_[*id] = Replication{{}, kNoRank, std::move(save.done), save.started};
      replicate(*id, out);
      return;
    }
    if (id.status().code() != StatusCode::kResourceExhausted) {
      finish_save(std::move(save.done), save.started, id.status(), out);
      return;
    }
  }
  if (options_.when_full == WhenFull::kWriteThrough) {
    write_through_.push_back(std::move(save));
    wake_drain_.notify_all();
    return;
  }
  if (size > options_.capacity_bytes) {
    finish_save(std::move(save.done), save.started,
                make_error(StatusCode::kResourceExhausted,
                           "checkpoint {} ({} bytes) is larger than checkpoint.capacity ({} bytes): raise it, or set "
                           "checkpoint.when_full = \"write_through\"",
                           save.name, size, options_.capacity_bytes),
                out);
    return;
  }
  waiting_for_room_.push_back(std::move(save));
}

void CheckpointNode::admit_waiting(Callbacks& out) {
  while (!waiting_for_room_.empty()) {
    PendingSave& front = waiting_for_room_.front();
    Result<CheckpointId> id = store_.begin_save(front.name, front.bytes);
    if (!id.ok()) return;  // still no room: wait for the next drain or release
    replicating_[*id] = Replication{{}, kNoRank, std::move(front.done), front.started};
    waiting_for_room_.pop_front();
    replicate(*id, out);
  }
}

void CheckpointNode::replicate(const CheckpointId& id, Callbacks& out) {
  auto it = replicating_.find(id);
  if (it == replicating_.end()) return;
  Replication& replication = it->second;
  const CheckpointEntry* entry = store_.held(id);
  if (entry == nullptr) {  // evicted as durable meanwhile: no copy needed any more
    replicating_.erase(it);
    return;
  }
  const std::int32_t holder =
      choose_replica_holder(options_.rank, slot_of(id.name), options_.domains, alive_, replication.excluded);
  if (holder != kNoRank) {
    replication.holder = holder;
    out.push_back([this, holder, id, bytes = entry->bytes] {
      replicator_->copy(holder, id, bytes, [this, holder, id](const Status& status) { on_copied(id, holder, status); });
    });
    return;
  }
  if (!entry->saved && options_.when_full == WhenFull::kWait && !replication.busy.empty()) {
    // Every live peer that could take the copy has no room now: wait, as a save waits for
    // room in this node's own budget. Their room comes back as their versions become
    // durable; the drain thread asks the busy ones again after retry_interval.
    std::erase_if(replication.excluded, [&](std::int32_t r) {
      return std::find(replication.busy.begin(), replication.busy.end(), r) != replication.busy.end();
    });
    replication.busy.clear();
    replication.holder = kNoRank;
    replication.retry_at = Clock::now() + options_.retry_interval;
    wake_drain_.notify_all();
    return;
  }
  const auto live_peers = std::count(alive_.begin(), alive_.end(), true) - 1;
  SaveDone done = std::move(replication.done);
  const Clock::time_point started = replication.started;
  const std::vector<std::int32_t> tried = std::move(replication.excluded);
  replicating_.erase(it);  // `replication` dangles from here on
  if (live_peers <= 0 || entry->saved) {
    // The only daemon left (or a re-replication that found no taker): one copy is all
    // there can be; the drain makes it durable.
    if (!entry->saved) store_.replicated(id, kNoRank);
    finish_save(std::move(done), started, id, out);
    wake_drain_.notify_all();
    return;
  }
  store_.abandon(id);
  finish_save(std::move(done), started,
              make_error(StatusCode::kUnavailable,
                         "checkpoint {}: no peer daemon could hold its replica (ranks tried: {}); not saved",
                         to_string(id), fmt::join(tried, ", ")),
              out);
  admit_waiting(out);
}

void CheckpointNode::on_copied(const CheckpointId& id, std::int32_t holder, const Status& status) {
  Callbacks out;
  {
    std::lock_guard lock(mutex_);
    auto it = replicating_.find(id);
    // Stale: the replication moved on to another holder (this one was declared dead).
    if (it == replicating_.end() || it->second.holder != holder) return;
    if (!status.ok() || !alive_[static_cast<std::size_t>(holder)]) {
      it->second.excluded.push_back(holder);
      if (status.code() == StatusCode::kUnavailable && alive_[static_cast<std::size_t>(holder)]) {
        it->second.busy.push_back(holder);  // no room now: worth asking again (replicate)
      }
      replicate(id, out);
    } else {
      const std::int32_t release = store_.replicated(id, holder);
      finish_save(std::move(it->second.done), it->second.started, id, out);
      replicating_.erase(it);
      if (release != kNoRank) out.push_back([this, release, id] { replicator_->release(release, id); });
      wake_drain_.notify_all();
    }
  }
  run(out);
}

void CheckpointNode::wait_durable(const std::string& name, DurableDone done) {
  Status now;
  {
    std::lock_guard lock(mutex_);
    const CheckpointEntry* latest = store_.find_latest(name);
    const std::optional<std::uint64_t> on_disk = store_.newest_durable_on_disk(name);
    if (latest == nullptr && !on_disk) {
      now = make_error(StatusCode::kNotFound, "checkpoint '{}': no version saved (checkpoint.dir {})", name,
                       options_.dir.string());
    } else if (latest == nullptr || (on_disk && *on_disk >= latest->id.version) ||
               latest->drain == DrainState::kDurable) {
      now = Status::ok_status();
    } else if (!latest->last_drain_error.empty() && latest->drain == DrainState::kPending) {
      now = Status(StatusCode::kIoError, latest->last_drain_error + " (the copy in RAM is kept and the drain retried)");
    } else {
      durable_waiters_.push_back(DurableWaiter{latest->id, std::move(done)});
      return;
    }
  }
  done(now);
}

Result<CheckpointBytesPtr> CheckpointNode::load(const std::string& name) {
  std::optional<std::uint64_t> on_disk;
  {
    std::lock_guard lock(mutex_);
    const CheckpointEntry* latest = store_.find_latest(name);
    on_disk = store_.newest_durable_on_disk(name);
    if (latest != nullptr && (!on_disk || latest->id.version >= *on_disk)) return latest->bytes;
  }
  if (!on_disk) {
    // Not held here: another daemon of the job may have drained it since this one listed
    // checkpoint.dir at start (a trainer loading another node's checkpoint).
    Result<std::vector<CheckpointId>> listed = list_checkpoint_files(options_.dir);
    if (!listed.ok()) return listed.status();
    std::lock_guard lock(mutex_);
    for (const CheckpointId& id : *listed) {
      if (id.name == name) store_.note_durable_on_disk(id);
    }
    on_disk = store_.newest_durable_on_disk(name);
  }
  if (!on_disk) {
    return make_error(StatusCode::kNotFound, "checkpoint '{}': no version in RAM or in checkpoint.dir {}", name,
                      options_.dir.string());
  }
  Result<std::vector<std::uint8_t>> read = read_checkpoint_file(options_.dir, CheckpointId{name, *on_disk});
  if (!read.ok()) return read.status();
  return CheckpointBytesPtr(std::make_shared<OwnedCheckpointBytes>(std::move(read).value()));
}

std::vector<CheckpointId> CheckpointNode::list() const {
  std::lock_guard lock(mutex_);
  return store_.list();
}

Status CheckpointNode::accept_replica(std::int32_t owner, const CheckpointId& id, CheckpointBytesPtr bytes) {
  std::lock_guard lock(mutex_);
  Status accepted = store_.accept_replica(owner, id, std::move(bytes));
  // From an owner already dead the copy is ours to drain now.
  if (accepted.ok() && !alive_[static_cast<std::size_t>(owner)]) wake_drain_.notify_all();
  return accepted;
}

void CheckpointNode::release_replica(const CheckpointId& id) {
  Callbacks out;
  {
    std::lock_guard lock(mutex_);
    store_.release_replica(id);
    for (auto it = durable_waiters_.begin(); it != durable_waiters_.end();) {
      if (it->target.name == id.name && it->target.version <= id.version) {
        out.push_back([done = std::move(it->done)] { done(Status::ok_status()); });
        it = durable_waiters_.erase(it);
      } else {
        ++it;
      }
    }
    admit_waiting(out);
  }
  run(out);
}

std::size_t CheckpointNode::peer_died(std::int32_t rank) {
  Callbacks out;
  std::size_t taken_over = 0;
  {
    std::lock_guard lock(mutex_);
    if (rank < 0 || static_cast<std::size_t>(rank) >= alive_.size() || !alive_[static_cast<std::size_t>(rank)]) return 0;
    alive_[static_cast<std::size_t>(rank)] = false;
    for (const CheckpointEntry* e : store_.entries()) {
      if (e->is_replica && e->owner == rank && e->drain != DrainState::kDurable) ++taken_over;
    }
    for (const CheckpointId& id : store_.peer_died(rank)) {
      replicating_[id] = Replication{{}, kNoRank, {}, Clock::now()};
      replicate(id, out);
    }
    // Copies on their way to the dead rank: no answer will come; try the next peer.
    std::vector<CheckpointId> stranded;
    for (auto& [id, replication] : replicating_) {
      if (replication.holder == rank) stranded.push_back(id);
    }
    for (const CheckpointId& id : stranded) {
      replicating_[id].excluded.push_back(rank);
      replicate(id, out);
    }
    wake_drain_.notify_all();
  }
  run(out);
  return taken_over;
}

std::vector<std::string> CheckpointNode::owned_names() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> names;
  for (const CheckpointEntry* e : store_.entries()) {
    if (!e->is_replica && (names.empty() || names.back() != e->id.name)) names.push_back(e->id.name);
  }
  return names;
}

std::uint32_t CheckpointNode::slot_of(const std::string& name) {
  return name_slots_.try_emplace(name, static_cast<std::uint32_t>(name_slots_.size())).first->second;
}

Result<std::shared_ptr<CheckpointBuffer>> CheckpointNode::allocate(std::uint64_t size, std::string_view checkpoint) {
  // A lease asks for its size before the bytes exist, so a raw client can ask for anything:
  // a size past off_t is no memfd's, and is refused before any memory is taken. A size past
  // checkpoint.capacity is not: a lease is an upper bound (shardmix.torch.save asks for its
  // tensors plus 1 MiB), so it overflows, and admit() judges the size committed.
  if (size > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return make_error(StatusCode::kInvalidArgument, "checkpoint {} ({} bytes) is larger than any memory could hold",
                      checkpoint, size);
  }
  {
    // The durable versions the new one displaces go now, so that their chunks are free for
    // it. Counting the pool's free chunks rather than the store's budget also counts the
    // buffers being filled, which the store admits only afterwards (two at once: a trainer's
    // save being copied and a peer's replica landing). Short of durable versions, the
    // buffer overflows; the store's budget still decides whether the save waits.
    // A buffer larger than the pool overflows whatever is evicted: evict nothing for it.
    std::lock_guard lock(mutex_);
    while (size <= pool_->stats().capacity_bytes && !pool_->fits(size) && store_.evict_oldest_durable()) {
    }
  }
  return pool_->allocate(size, checkpoint);
}

CheckpointNodeStats CheckpointNode::stats() const {
  std::lock_guard lock(mutex_);
  CheckpointNodeStats out = stats_;
  out.pool = pool_->stats();
  out.store = store_.stats();
  out.saves_waiting_for_room = waiting_for_room_.size();
  return out;
}

std::optional<Clock::time_point> CheckpointNode::retry_replications(Callbacks& out) {
  const Clock::time_point now = Clock::now();
  std::vector<CheckpointId> due;
  std::optional<Clock::time_point> next;
  for (auto& [id, replication] : replicating_) {
    if (!replication.retry_at) continue;
    if (*replication.retry_at <= now) {
      replication.retry_at.reset();
      due.push_back(id);
    } else if (!next || *replication.retry_at < *next) {
      next = replication.retry_at;
    }
  }
  for (const CheckpointId& id : due) replicate(id, out);
  return next;
}

void CheckpointNode::drain_loop() {
  std::unique_lock lock(mutex_);
  Clock::time_point paused_until{};
  while (!stopping_) {
    Callbacks out;
    const std::optional<Clock::time_point> next_retry = retry_replications(out);
    if (!out.empty()) {
      lock.unlock();
      run(out);
      lock.lock();
      continue;
    }
    if (!write_through_.empty()) {
      PendingSave save = std::move(write_through_.front());
      write_through_.pop_front();
      const CheckpointId id = store_.reserve_version(save.name);
      lock.unlock();
      const Clock::time_point t0 = Clock::now();
      const Status written = traced_write(options_.dir, id, save.bytes->bytes(), /*write_through=*/true);
      if (written.ok()) (void)remove_superseded_checkpoint_files(options_.dir, id.name, options_.retain);
      lock.lock();
      stats_.drain_busy_us += micros_since(t0);
      if (written.ok()) {
        store_.written_through(id);
        stats_.written_through_bytes += save.bytes->bytes().size();
        finish_save(std::move(save.done), save.started, id, out);
      } else {
        finish_save(std::move(save.done), save.started, written, out);
      }
    } else if (Clock::now() < paused_until) {
      wake_drain_.wait_until(lock, next_retry ? std::min(paused_until, *next_retry) : paused_until);
      continue;
    } else if (const std::optional<CheckpointId> id = store_.start_drain()) {
      const CheckpointBytesPtr bytes = store_.held(*id)->bytes;
      lock.unlock();
      const Clock::time_point t0 = Clock::now();
      Status written = traced_write(options_.dir, *id, bytes->bytes(), /*write_through=*/false);
      if (written.ok()) {
        // The version is durable either way; a superseded file left behind is only space.
        (void)remove_superseded_checkpoint_files(options_.dir, id->name, options_.retain);
      }
      lock.lock();
      stats_.drain_busy_us += micros_since(t0);
      const std::int32_t release = store_.drained(*id, written);
      for (auto it = durable_waiters_.begin(); it != durable_waiters_.end();) {
        const bool covers = it->target.name == id->name && it->target.version <= id->version;
        if (covers && (written.ok() || it->target == *id)) {
          const Status outcome = written.ok() ? Status::ok_status()
                                              : Status(written.code(), written.message() +
                                                                           " (the copy in RAM is kept and the drain retried)");
          out.push_back([done = std::move(it->done), outcome] { done(outcome); });
          it = durable_waiters_.erase(it);
        } else {
          ++it;
        }
      }
      if (!written.ok()) paused_until = Clock::now() + options_.retry_interval;
      if (release != kNoRank) out.push_back([this, release, id = *id] { replicator_->release(release, id); });
      admit_waiting(out);
    } else {
      if (next_retry) {
        wake_drain_.wait_until(lock, *next_retry);
      } else {
        wake_drain_.wait(lock);
      }
      continue;
    }
    lock.unlock();
    run(out);
    lock.lock();
  }
}

}  // namespace shardmix
