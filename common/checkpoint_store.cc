#include "common/checkpoint_store.h"

#include <algorithm>

#include <fmt/format.h>

namespace shardmix {

std::string to_string(const CheckpointId& id) { return fmt::format("{}@{}", id.name, id.version); }

CheckpointStore::CheckpointStore(CheckpointStoreOptions options) : options_(options) {
  if (options_.retain == 0) options_.retain = 1;  // the newest version always stays
}

std::uint64_t CheckpointStore::next_version(std::string_view name) const {
  const auto it = newest_known_.find(name);
  return it == newest_known_.end() ? 1 : it->second + 1;
}

void CheckpointStore::note_durable_on_disk(const CheckpointId& id) {
  auto [it, inserted] = durable_on_disk_.try_emplace(id.name, id.version);
  if (!inserted) it->second = std::max(it->second, id.version);
  auto [known, fresh] = newest_known_.try_emplace(id.name, id.version);
  if (!fresh) known->second = std::max(known->second, id.version);
}

std::optional<std::uint64_t> CheckpointStore::newest_durable_on_disk(std::string_view name) const {
  const auto it = durable_on_disk_.find(name);
  if (it == durable_on_disk_.end()) return std::nullopt;
  return it->second;
}

CheckpointEntry& CheckpointStore::entry(const CheckpointId& id, std::string_view caller) {
  const auto it = entries_.find(id);
  if (it == entries_.end()) invariant_failed("CheckpointStore::{}: {} is not held by rank {}", caller, to_string(id), options_.self_rank);
  return it->second;
}

void CheckpointStore::update_waiting() {
  std::uint64_t waiting = 0;
  for (const auto& [id, e] : entries_) {
    if (!e.is_replica && e.drain != DrainState::kDurable) waiting += e.size;
  }
  stats_.bytes_waiting = waiting;
  stats_.versions_in_ram = entries_.size();
}

void CheckpointStore::evict(std::map<CheckpointId, CheckpointEntry>::iterator it) {
  stats_.bytes_in_ram -= it->second.size;
  entries_.erase(it);
}

bool CheckpointStore::evict_oldest_durable() {
  auto oldest = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->second.drain == DrainState::kDurable &&
        (oldest == entries_.end() || it->second.arrival < oldest->second.arrival)) {
      oldest = it;
    }
  }
  if (oldest == entries_.end()) return false;
  evict(oldest);
  update_waiting();
  return true;
}

bool CheckpointStore::make_room(std::uint64_t bytes) {
  if (bytes > options_.capacity_bytes) return false;
  if (bytes <= free_bytes()) return true;
  // Durable copies are on the file system, so dropping them loses nothing; replicas whose
  // owner made them durable were already released. Oldest arrival first, across names.
  std::vector<std::map<CheckpointId, CheckpointEntry>::iterator> durable;
  std::uint64_t reclaimable = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->second.drain == DrainState::kDurable) {
      durable.push_back(it);
      reclaimable += it->second.size;
    }
  }
  if (bytes > free_bytes() + reclaimable) return false;
  std::sort(durable.begin(), durable.end(), [](auto a, auto b) { return a->second.arrival < b->second.arrival; });
  for (auto it : durable) {
    if (bytes <= free_bytes()) break;
    evict(it);
  }
  update_waiting();
  return true;
}

Result<CheckpointId> CheckpointStore::begin_save(std::string_view name, CheckpointBytesPtr bytes) {
  const CheckpointId id{std::string(name), next_version(name)};
  const std::uint64_t size = bytes->bytes().size();
  if (!make_room(size)) {
    return make_error(StatusCode::kResourceExhausted,
                      "checkpoint {} ({} bytes) does not fit in checkpoint.capacity ({} bytes, {} free, the rest "
                      "waiting to drain)",
                      to_string(id), size, options_.capacity_bytes, free_bytes());
  }
  CheckpointEntry e;
  e.id = id;
  e.bytes = std::move(bytes);
  e.size = size;
  e.owner = options_.self_rank;
  e.arrival = ++arrivals_;
  entries_.emplace(id, std::move(e));
  stats_.bytes_in_ram += size;
  newest_known_[id.name] = id.version;
  update_waiting();
  return id;
}

std::int32_t CheckpointStore::replicated(const CheckpointId& id, std::int32_t holder) {
  const auto it = entries_.find(id);
  // A second copy (after the first holder died) landed after the version became durable
  // and was evicted here: the copy is not needed.
  if (it == entries_.end()) return holder;
  CheckpointEntry& e = it->second;
  e.saved = true;
  // Already durable (written while the copy travelled): the copy is not needed after all.
  if (e.drain == DrainState::kDurable) return holder;
  e.replica_holder = holder;
  return kNoRank;
}

void CheckpointStore::abandon(const CheckpointId& id) {
  const auto it = entries_.find(id);
  if (it == entries_.end() || it->second.saved) return;  // a saved version is never dropped
  evict(it);
  update_waiting();
}

CheckpointId CheckpointStore::reserve_version(std::string_view name) {
  const CheckpointId id{std::string(name), next_version(name)};
  newest_known_[id.name] = id.version;
  return id;
}

void CheckpointStore::written_through(const CheckpointId& id) { note_durable_on_disk(id); }

Status CheckpointStore::accept_replica(std::int32_t owner, const CheckpointId& id, CheckpointBytesPtr bytes) {
  const std::uint64_t size = bytes->bytes().size();
  if (entries_.contains(id)) return Status::ok_status();  // a retried copy
  if (size > options_.capacity_bytes) {
    return make_error(StatusCode::kResourceExhausted,
                      "rank {}: a replica of checkpoint {} from rank {} ({} bytes) exceeds checkpoint.capacity ({} bytes)",
                      options_.self_rank, to_string(id), owner, size, options_.capacity_bytes);
  }
  if (!make_room(size)) {
    // kUnavailable, not kResourceExhausted: room comes back as versions here become durable,
    // so the owner may ask again (CheckpointNode, when_full = wait).
    return make_error(StatusCode::kUnavailable,
                      "rank {}: no room now for a replica of checkpoint {} from rank {} ({} bytes; checkpoint.capacity {} "
                      "bytes, {} free)",
                      options_.self_rank, to_string(id), owner, size, options_.capacity_bytes, free_bytes());
  }
  CheckpointEntry e;
  e.id = id;
  e.bytes = std::move(bytes);
  e.size = size;
  e.owner = owner;
  e.saved = true;  // its bytes arrived whole
  e.arrival = ++arrivals_;
  e.is_replica = !dead_peers_.contains(owner);
  if (!e.is_replica) {
    e.owner = options_.self_rank;
    takeover_queue_.push_back(id);
  }
  entries_.emplace(id, std::move(e));
  stats_.bytes_in_ram += size;
  auto [known, fresh] = newest_known_.try_emplace(id.name, id.version);
  if (!fresh) known->second = std::max(known->second, id.version);
  update_waiting();
  return Status::ok_status();
}

void CheckpointStore::release_replica(const CheckpointId& id) {
  const auto it = entries_.find(id);
  // Gone already (evicted as durable, or taken over and drained here): nothing to release.
  if (it == entries_.end() || !it->second.is_replica) return;
  // The owner's file now holds it: keep the copy as a durable one, so reads here stay
  // local, evictable like any durable version.
  it->second.drain = DrainState::kDurable;
  note_durable_on_disk(id);
  apply_retention(id.name);
  update_waiting();
}

std::optional<CheckpointId> CheckpointStore::start_drain() {
  while (!takeover_queue_.empty()) {
    const CheckpointId id = takeover_queue_.front();
    takeover_queue_.erase(takeover_queue_.begin());
    const auto it = entries_.find(id);
    if (it != entries_.end() && it->second.drain == DrainState::kPending) {
      it->second.drain = DrainState::kDraining;
      return id;
    }
  }
  const CheckpointEntry* oldest = nullptr;
  for (auto& [id, e] : entries_) {
    if (e.is_replica || !e.saved || e.drain != DrainState::kPending) continue;
    if (oldest == nullptr || e.arrival < oldest->arrival) oldest = &e;
  }
  if (oldest == nullptr) return std::nullopt;
  CheckpointEntry& e = entries_.at(oldest->id);
  e.drain = DrainState::kDraining;
  return e.id;
}

std::int32_t CheckpointStore::drained(const CheckpointId& id, const Status& outcome) {
  CheckpointEntry& e = entry(id, "drained");
  if (!outcome.ok()) {
    e.drain = DrainState::kPending;
    e.last_drain_error = outcome.message();
    ++stats_.drain_failures;
    return kNoRank;
  }
  e.drain = DrainState::kDurable;
  e.last_drain_error.clear();
  stats_.bytes_drained += e.size;
  const std::int32_t holder = e.replica_holder;
  e.replica_holder = kNoRank;
  note_durable_on_disk(id);
  apply_retention(id.name);
  update_waiting();
  return holder;
}

void CheckpointStore::apply_retention(std::string_view name) {
  std::vector<std::map<CheckpointId, CheckpointEntry>::iterator> versions;
  for (auto it = entries_.lower_bound(CheckpointId{std::string(name), 0});
       it != entries_.end() && it->first.name == name; ++it) {
    versions.push_back(it);
  }
  if (versions.size() <= options_.retain) return;
  // Ascending by version (the map's order within a name): all but the newest `retain`.
  const std::size_t drop = versions.size() - options_.retain;
  for (std::size_t i = 0; i < drop; ++i) {
    if (versions[i]->second.drain == DrainState::kDurable) evict(versions[i]);
  }
}

std::vector<CheckpointId> CheckpointStore::peer_died(std::int32_t rank) {
  dead_peers_.insert(rank);
  std::vector<CheckpointId> unreplicated;
  for (auto& [id, e] : entries_) {
    if (e.is_replica && e.owner == rank) {
      e.is_replica = false;
      e.owner = options_.self_rank;
      if (e.drain != DrainState::kDurable) takeover_queue_.push_back(id);
    } else if (!e.is_replica && e.replica_holder == rank) {
      e.replica_holder = kNoRank;
      if (e.drain != DrainState::kDurable) unreplicated.push_back(id);
    }
  }
  update_waiting();
  return unreplicated;
}

const CheckpointEntry* CheckpointStore::find_latest(std::string_view name) const {
  const CheckpointEntry* newest = nullptr;
  for (auto it = entries_.lower_bound(CheckpointId{std::string(name), 0});
       it != entries_.end() && it->first.name == name; ++it) {
    if (it->second.saved) newest = &it->second;
  }
  return newest;
}

const CheckpointEntry* CheckpointStore::find(const CheckpointId& id) const {
  const auto it = entries_.find(id);
  return it == entries_.end() || !it->second.saved ? nullptr : &it->second;
}

const CheckpointEntry* CheckpointStore::held(const CheckpointId& id) const {
  const auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<const CheckpointEntry*> CheckpointStore::entries() const {
  std::vector<const CheckpointEntry*> out;
  out.reserve(entries_.size());
  for (const auto& [id, e] : entries_) out.push_back(&e);
  return out;
}

std::vector<CheckpointId> CheckpointStore::list() const {
  std::vector<CheckpointId> out;
  for (const auto& [id, e] : entries_) {
    if (e.saved) out.push_back(id);
  }
  for (const auto& [name, version] : durable_on_disk_) {
    const CheckpointId id{name, version};
    if (!entries_.contains(id)) out.push_back(id);
  }
  std::sort(out.begin(), out.end(), [](const CheckpointId& a, const CheckpointId& b) {
    return a.name != b.name ? a.name < b.name : a.version > b.version;
  });
  return out;
}

std::int32_t choose_replica_holder(std::int32_t self, std::uint32_t slot, const std::vector<std::string>& domains,
                                   const std::vector<bool>& alive, const std::vector<std::int32_t>& excluded) {
  const auto ranks = static_cast<std::int32_t>(alive.size());
  if (ranks <= 1) return kNoRank;
  const auto start = static_cast<std::int32_t>(slot % static_cast<std::uint32_t>(ranks - 1));
  const auto usable = [&](std::int32_t r) {
    return r != self && alive[static_cast<std::size_t>(r)] &&
           std::find(excluded.begin(), excluded.end(), r) == excluded.end();
  };
  const auto own_domain = [&](std::int32_t r) {
    return static_cast<std::size_t>(r) < domains.size() && static_cast<std::size_t>(self) < domains.size() &&
           domains[static_cast<std::size_t>(r)] == domains[static_cast<std::size_t>(self)];
  };
  std::int32_t same_domain_choice = kNoRank;
  for (std::int32_t step = 0; step < ranks - 1; ++step) {
    const std::int32_t r = (self + 1 + (start + step) % (ranks - 1)) % ranks;
    if (!usable(r)) continue;
    if (!own_domain(r)) return r;
    if (same_domain_choice == kNoRank) same_domain_choice = r;
  }
  return same_domain_choice;
}

}  // namespace shardmix
