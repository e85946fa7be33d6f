// The checkpoint store's state machine (docs/decisions/0053): unit cases, then a property
// that runs several daemons' stores through random interleavings of saves, replica copies
// and acks, drains that succeed or fail, releases, and one daemon death at any step.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "common/checkpoint_store.h"

namespace shardmix {
namespace checkpoint_store_test {

CheckpointBytesPtr bytes_of(std::uint64_t size, std::uint8_t fill) {
  return std::make_shared<OwnedCheckpointBytes>(std::vector<std::uint8_t>(size, fill));
}

CheckpointStore store_of(std::int32_t rank, std::uint64_t capacity, std::uint32_t retain = 2) {
  return CheckpointStore(CheckpointStoreOptions{rank, capacity, retain});
}

TEST(CheckpointStoreTest, SaveIsInvisibleUntilReplicatedThenDrainsOldestFirst) {
  CheckpointStore store = store_of(0, 1000);
  const CheckpointId first = *store.begin_save("model", bytes_of(100, 1));
  const CheckpointId second = *store.begin_save("model", bytes_of(100, 2));
  EXPECT_EQ(first.version, 1u);
  EXPECT_EQ(second.version, 2u);
  EXPECT_EQ(store.find_latest("model"), nullptr);  // neither save has returned yet
  EXPECT_FALSE(store.start_drain().has_value());   // nor can a half-saved version drain

  EXPECT_EQ(store.replicated(second, 1), kNoRank);
  ASSERT_NE(store.find_latest("model"), nullptr);
  EXPECT_EQ(store.find_latest("model")->id, second);
  EXPECT_EQ(store.replicated(first, 1), kNoRank);
  EXPECT_EQ(store.find_latest("model")->id, second);

  EXPECT_EQ(store.start_drain(), first);
  EXPECT_EQ(store.start_drain(), second);
  EXPECT_FALSE(store.start_drain().has_value());
  EXPECT_EQ(store.stats().bytes_waiting, 200u);
  EXPECT_EQ(store.drained(first, Status::ok_status()), 1);  // release rank 1's copy
  EXPECT_EQ(store.stats().bytes_waiting, 100u);
  EXPECT_EQ(store.stats().bytes_drained, 100u);
  EXPECT_EQ(store.newest_durable_on_disk("model"), 1u);
}

TEST(CheckpointStoreTest, DrainsInArrivalOrderAcrossNames) {
  CheckpointStore store = store_of(0, 1000);
  for (int i = 0; i < 3; ++i) store.replicated(*store.begin_save("busy", bytes_of(1, 1)), 1);
  const CheckpointId quiet = *store.begin_save("quiet", bytes_of(1, 2));
  store.replicated(quiet, 1);
  const CheckpointId busy4 = *store.begin_save("busy", bytes_of(1, 3));
  store.replicated(busy4, 1);
  std::vector<CheckpointId> order;
  while (const std::optional<CheckpointId> id = store.start_drain()) order.push_back(*id);
  const std::vector<CheckpointId> expected = {{"busy", 1}, {"busy", 2}, {"busy", 3}, quiet, busy4};
  EXPECT_EQ(order, expected);
}

TEST(CheckpointStoreTest, FullStoreEvictsDurableVersionsFirstAndOtherwiseNamesCheckpointAndKey) {
  CheckpointStore store = store_of(0, 250);
  const CheckpointId a = *store.begin_save("a", bytes_of(100, 1));
  store.replicated(a, 1);
  const CheckpointId b = *store.begin_save("b", bytes_of(100, 2));
  store.replicated(b, 1);

  const Result<CheckpointId> refused = store.begin_save("c", bytes_of(100, 3));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("c@1"), std::string::npos) << refused.status().message();
  EXPECT_NE(refused.status().message().find("checkpoint.capacity"), std::string::npos);
  EXPECT_EQ(store.stats().bytes_in_ram, 200u);  // nothing not durable was dropped

  ASSERT_EQ(store.start_drain(), a);
  store.drained(a, Status::ok_status());
  const Result<CheckpointId> admitted = store.begin_save("c", bytes_of(100, 3));
  ASSERT_TRUE(admitted.ok()) << admitted.status().to_string();
  EXPECT_EQ(store.find(a), nullptr);  // a is on disk: evicted to make room
  EXPECT_NE(store.find(b), nullptr);
  EXPECT_EQ(store.stats().bytes_in_ram, 200u);
  EXPECT_FALSE(store.begin_save("huge", bytes_of(251, 4)).ok());  // larger than the whole budget
}

TEST(CheckpointStoreTest, PressureEvictsTheDurableVersionThatArrivedFirstWhateverItsNumber) {
  CheckpointStore store = store_of(0, 300, 10);
  // "young" reaches version 3 before "old" is saved once: numbers say nothing of age.
  std::vector<CheckpointId> young;
  for (int i = 0; i < 2; ++i) {
    young.push_back(*store.begin_save("young", bytes_of(10, 1)));
    store.replicated(young.back(), 1);
  }
  const CheckpointId old_one = *store.begin_save("old", bytes_of(100, 2));
  store.replicated(old_one, 1);
  const CheckpointId young3 = *store.begin_save("young", bytes_of(100, 3));
  store.replicated(young3, 1);
  while (const std::optional<CheckpointId> id = store.start_drain()) store.drained(*id, Status::ok_status());
  ASSERT_TRUE(store.begin_save("new", bytes_of(150, 4)).ok());  // 80 free: 70 more must go
  EXPECT_EQ(store.find(young[0]), nullptr);
  EXPECT_EQ(store.find(young[1]), nullptr);
  EXPECT_EQ(store.find(old_one), nullptr);   // arrived before young@3
  EXPECT_NE(store.find(young3), nullptr);
}

TEST(CheckpointStoreTest, FailedDrainKeepsTheRamCopyAndTheReplicaAndIsRetried) {
  CheckpointStore store = store_of(0, 1000);
  const CheckpointId id = *store.begin_save("m", bytes_of(10, 1));
  store.replicated(id, 2);
  ASSERT_EQ(store.start_drain(), id);
  EXPECT_EQ(store.drained(id, Status(StatusCode::kIoError, "writing checkpoint m@1 to /ckpt: No space left")), kNoRank);
  const CheckpointEntry* entry = store.find(id);
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->drain, DrainState::kPending);
  EXPECT_EQ(entry->replica_holder, 2);
  EXPECT_NE(entry->last_drain_error.find("No space left"), std::string::npos);
  EXPECT_EQ(store.stats().drain_failures, 1u);
  EXPECT_EQ(store.start_drain(), id);
  EXPECT_EQ(store.drained(id, Status::ok_status()), 2);
  EXPECT_TRUE(store.find(id)->last_drain_error.empty());
}

TEST(CheckpointStoreTest, RetentionKeepsTheNewestVersionsOfANameOnceDurable) {
  CheckpointStore store = store_of(0, 1000, 2);
  std::vector<CheckpointId> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(*store.begin_save("m", bytes_of(10, static_cast<std::uint8_t>(i))));
    store.replicated(ids.back(), 1);
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(store.start_drain(), ids[static_cast<std::size_t>(i)]);
    store.drained(ids[static_cast<std::size_t>(i)], Status::ok_status());
  }
  // 1 and 2 are durable and outside the newest two; 4 is not durable yet, so 3 stays too.
  EXPECT_EQ(store.find(ids[0]), nullptr);
  EXPECT_EQ(store.find(ids[1]), nullptr);
  EXPECT_NE(store.find(ids[2]), nullptr);
  EXPECT_NE(store.find(ids[3]), nullptr);
  const std::vector<CheckpointId> listed = store.list();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0], ids[3]);
  EXPECT_EQ(listed[1], ids[2]);
  EXPECT_EQ(store.next_version("m"), 5u);
}

TEST(CheckpointStoreTest, ReplicaHolderTakesOverADeadOwnersVersionsAndDrainsThemFirst) {
  CheckpointStore holder = store_of(1, 1000);
  const CheckpointId own = *holder.begin_save("mine", bytes_of(10, 1));
  holder.replicated(own, 2);
  const CheckpointId theirs{"theirs", 3};
  ASSERT_TRUE(holder.accept_replica(0, theirs, bytes_of(20, 2)).ok());
  EXPECT_EQ(holder.stats().bytes_waiting, 10u);  // a replica is its owner's to drain

  // Rank 2 held our replica, rank 0 owned the one we hold.
  const std::vector<CheckpointId> unreplicated = holder.peer_died(2);
  EXPECT_EQ(unreplicated, std::vector<CheckpointId>{own});
  EXPECT_TRUE(holder.peer_died(0).empty());
  EXPECT_EQ(holder.stats().bytes_waiting, 30u);
  EXPECT_EQ(holder.start_drain(), theirs);  // one copy left in the world: first
  EXPECT_EQ(holder.start_drain(), own);
  EXPECT_EQ(holder.next_version("theirs"), 4u);
}

TEST(CheckpointStoreTest, ACopyThatLandsAfterItsOwnerDiedIsTakenOverAtOnce) {
  CheckpointStore holder = store_of(1, 1000);
  EXPECT_TRUE(holder.peer_died(0).empty());
  const CheckpointId late{"theirs", 2};
  ASSERT_TRUE(holder.accept_replica(0, late, bytes_of(20, 1)).ok());
  const CheckpointEntry* entry = holder.find(late);
  ASSERT_NE(entry, nullptr);
  EXPECT_FALSE(entry->is_replica);
  EXPECT_EQ(entry->owner, 1);
  EXPECT_EQ(holder.stats().bytes_waiting, 20u);
  EXPECT_EQ(holder.start_drain(), late);
}

TEST(CheckpointStoreTest, ReleasedReplicaBecomesAnEvictableDurableCopy) {
  CheckpointStore holder = store_of(1, 100);
  const CheckpointId theirs{"theirs", 1};
  ASSERT_TRUE(holder.accept_replica(0, theirs, bytes_of(60, 1)).ok());
  // No room now: kUnavailable, since room comes back (the owner may ask again). Larger than
  // the whole checkpoint.capacity: kResourceExhausted, for good.
  const Status refused = holder.accept_replica(2, CheckpointId{"other", 1}, bytes_of(60, 2));
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("other@1"), std::string::npos) << refused.message();
  const Status never = holder.accept_replica(2, CheckpointId{"huge", 1}, bytes_of(101, 3));
  EXPECT_EQ(never.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(never.message().find("exceeds checkpoint.capacity"), std::string::npos) << never.message();
  holder.release_replica(theirs);
  EXPECT_TRUE(holder.accept_replica(2, CheckpointId{"other", 1}, bytes_of(60, 2)).ok());
  EXPECT_EQ(holder.find(theirs), nullptr);
}

TEST(CheckpointStoreTest, WrittenThroughVersionIsDurableWithoutRam) {
  CheckpointStore store = store_of(0, 10);
  const CheckpointId id = store.reserve_version("big");
  EXPECT_EQ(id.version, 1u);
  EXPECT_EQ(store.next_version("big"), 2u);  // taken, though not written yet
  EXPECT_FALSE(store.newest_durable_on_disk("big").has_value());
  store.written_through(id);
  EXPECT_EQ(store.newest_durable_on_disk("big"), 1u);
  EXPECT_EQ(store.stats().bytes_in_ram, 0u);
  EXPECT_EQ(store.list(), std::vector<CheckpointId>{id});
  EXPECT_EQ(store.next_version("big"), 2u);
}

TEST(ReplicaHolderTest, PrefersAnotherFailureDomainAndSkipsDeadAndExcludedRanks) {
  const std::vector<std::string> domains = {"hostA", "hostA", "hostB", "hostB"};
  std::vector<bool> alive(4, true);
  for (std::uint32_t slot = 0; slot < 6; ++slot) {
    const std::int32_t holder = choose_replica_holder(0, slot, domains, alive, {});
    EXPECT_TRUE(holder == 2 || holder == 3) << "slot " << slot << " -> " << holder;
  }
  alive[2] = false;
  EXPECT_EQ(choose_replica_holder(0, 0, domains, alive, {}), 3);
  EXPECT_EQ(choose_replica_holder(0, 0, domains, alive, {3}), 1);  // same host: better than none
  EXPECT_EQ(choose_replica_holder(0, 0, domains, alive, {1, 3}), kNoRank);
  EXPECT_EQ(choose_replica_holder(0, 0, {"h"}, {true}, {}), kNoRank);
}

// Data-parallel trainers save alike: every node saves its k-th name at about the same time.
// Each node must then hold exactly as many replicas as it saved names, or one holder's
// checkpoint.capacity fills while another's is idle and the saves wait on it.
TEST(ReplicaHolderTest, EveryNodeHoldsAsManyReplicasAsItSavesWhenAllSaveAlike) {
  for (const std::int32_t ranks : {2, 3, 4, 7, 16}) {
    for (const std::uint32_t names : {1u, 2u, 3u, 8u}) {
      const std::vector<std::string> domains(static_cast<std::size_t>(ranks), "host");
      const std::vector<bool> alive(static_cast<std::size_t>(ranks), true);
      std::vector<std::uint32_t> held(static_cast<std::size_t>(ranks), 0);
      for (std::int32_t owner = 0; owner < ranks; ++owner) {
        for (std::uint32_t slot = 0; slot < names; ++slot) {
          const std::int32_t holder = choose_replica_holder(owner, slot, domains, alive, {});
          ASSERT_NE(holder, owner);
          ASSERT_NE(holder, kNoRank);
          ++held[static_cast<std::size_t>(holder)];
        }
      }
      for (std::int32_t r = 0; r < ranks; ++r) {
        EXPECT_EQ(held[static_cast<std::size_t>(r)], names) << ranks << " ranks, " << names << " names, rank " << r;
      }
    }
  }
}

// ---- The property: several daemons, random interleavings, one death at any step. ----

struct Message {
  enum class Kind { kReplicaCopy, kReplicaAck, kRelease, kDrainEnd } kind;
  std::int32_t from = kNoRank;
  std::int32_t to = kNoRank;
  CheckpointId id;
  bool drain_ok = true;
  // kReplicaCopy: the bytes the owner offered. The daemon's transport (server/
  // checkpoint_replicator.h) keeps them registered until the holder answers, so the copy
  // lands whole even if the owner drained and evicted the version while it travelled.
  CheckpointBytesPtr bytes;
};

class World {
 public:
  World(std::int32_t nodes, std::uint64_t capacity, std::uint32_t retain, bool write_through)
      : retain_(retain), write_through_(write_through), alive_(static_cast<std::size_t>(nodes), true) {
    for (std::int32_t r = 0; r < nodes; ++r) {
      stores_.emplace_back(CheckpointStoreOptions{r, capacity, retain});
      domains_.push_back(fmt::format("host{}", r / 2));  // two daemons a host
    }
  }

  std::int32_t nodes() const { return static_cast<std::int32_t>(stores_.size()); }
  bool alive(std::int32_t r) const { return alive_[static_cast<std::size_t>(r)]; }
  CheckpointStore& store(std::int32_t r) { return stores_[static_cast<std::size_t>(r)]; }
  bool quiet() const { return in_flight_.empty(); }
  std::size_t in_flight() const { return in_flight_.size(); }

  void save(std::int32_t node, std::string name, std::uint64_t size) {
    CheckpointStore& s = store(node);
    const CheckpointId next{name, s.next_version(name)};
    const std::vector<std::uint8_t> data = content(next, size);
    Result<CheckpointId> id = s.begin_save(name, std::make_shared<OwnedCheckpointBytes>(data));
    if (!id.ok()) {
      if (!write_through_) return;  // the trainer waits: modelled as trying again later
      const CheckpointId written = s.reserve_version(name);
      RC_ASSERT(written == next);
      s.written_through(written);
      offered_[written] = data;
      files_[written] = data;
      ever_durable_.insert(written);
      saved_.insert(written);
      return;
    }
    RC_ASSERT(*id == next);
    offered_[*id] = data;
    replicate(node, *id);
  }

  // Delivers the message at `index` (in flight messages may be delivered in any order).
  // `late_copy_lands`: a copy from an owner that died meanwhile was read just before the
  // death and lands anyway (else the read failed and nothing lands).
  void deliver(std::size_t index, bool late_copy_lands = false) {
    const Message m = in_flight_[index];
    in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(index));
    switch (m.kind) {
      case Message::Kind::kReplicaCopy: {
        if (!alive(m.from)) {
          if (!late_copy_lands || !alive(m.to)) return;
          (void)store(m.to).accept_replica(m.from, m.id, m.bytes);
          return;
        }
        if (!alive(m.to)) return retry_replica(m.from, m.id, m.to);
        if (!store(m.to).accept_replica(m.from, m.id, m.bytes).ok()) return retry_replica(m.from, m.id, m.to);
        in_flight_.push_back(Message{Message::Kind::kReplicaAck, m.to, m.from, m.id});
        return;
      }
      case Message::Kind::kReplicaAck: {
        if (!alive(m.to)) return;
        if (!alive(m.from)) return retry_replica(m.to, m.id, m.from);  // the holder died meanwhile
        const std::int32_t release = store(m.to).replicated(m.id, m.from);
        saved_.insert(m.id);
        if (release != kNoRank) in_flight_.push_back(Message{Message::Kind::kRelease, m.to, release, m.id});
        return;
      }
      case Message::Kind::kRelease:
        if (alive(m.to)) store(m.to).release_replica(m.id);
        return;
      case Message::Kind::kDrainEnd: {
        if (!alive(m.from)) return;  // died mid-write: the temporary file is never renamed
        CheckpointStore& s = store(m.from);
        if (!m.drain_ok) {
          s.drained(m.id, Status(StatusCode::kIoError, "injected: file system full"));
          return;
        }
        const CheckpointEntry* e = s.held(m.id);
        RC_ASSERT(e != nullptr);
        files_[m.id] = std::vector<std::uint8_t>(e->bytes->bytes().begin(), e->bytes->bytes().end());
        ever_durable_.insert(m.id);
        remove_superseded_files(m.id.name);
        const std::int32_t release = s.drained(m.id, Status::ok_status());
        if (release != kNoRank) in_flight_.push_back(Message{Message::Kind::kRelease, m.from, release, m.id});
        return;
      }
    }
  }

  bool start_drain(std::int32_t node, bool succeeds) {
    const std::optional<CheckpointId> id = store(node).start_drain();
    if (!id) return false;
    in_flight_.push_back(Message{Message::Kind::kDrainEnd, node, node, *id, succeeds});
    return true;
  }

  void kill(std::int32_t node) {
    alive_[static_cast<std::size_t>(node)] = false;
    for (std::int32_t r = 0; r < nodes(); ++r) {
      if (!alive(r)) continue;
      for (const CheckpointId& id : store(r).peer_died(node)) replicate(r, id);
    }
  }

  // Nothing saved is lost or torn: every saved version is readable somewhere unless it is
  // durable and a newer version of its name is durable too; whatever a reader finds is
  // exactly what some trainer offered; the budget holds.
  void check() {
    for (std::int32_t r = 0; r < nodes(); ++r) {
      if (!alive(r)) continue;
      std::uint64_t held = 0;
      for (const CheckpointEntry* e : store(r).entries()) {
        held += e->size;
        RC_ASSERT(same_bytes(e->id, e->bytes->bytes()));
      }
      RC_ASSERT(held == store(r).stats().bytes_in_ram);
      RC_ASSERT(held <= store(r).capacity_bytes());
    }
    for (const CheckpointId& id : saved_) {
      if (readable(id)) continue;
      RC_ASSERT(ever_durable_.contains(id));
      RC_ASSERT(newest_file(id.name) > id.version);
    }
    for (const auto& [id, data] : files_) RC_ASSERT(data == offered_.at(id));
  }

  // After every message is delivered and every drain succeeded: the newest saved version
  // of every name is in a file, or a newer one is (a save whose copy reached its holder
  // just before the owner died: whole, taken over and drained, though never acknowledged).
  void check_all_durable() {
    std::map<std::string, std::uint64_t> newest_saved;
    for (const CheckpointId& id : saved_) newest_saved[id.name] = std::max(newest_saved[id.name], id.version);
    for (const auto& [name, version] : newest_saved) {
      RC_ASSERT(newest_file(name) >= version);
    }
    // Nothing is left waiting, and no copy is stranded as a replica of a dead owner
    // (nobody would ever drain or release it: RAM lost for good).
    for (std::int32_t r = 0; r < nodes(); ++r) {
      if (!alive(r)) continue;
      RC_ASSERT(store(r).stats().bytes_waiting == 0u);
      for (const CheckpointEntry* e : store(r).entries()) RC_ASSERT(!e->is_replica || alive(e->owner));
    }
  }

  std::size_t saved_count() const { return saved_.size(); }

 private:
  static std::vector<std::uint8_t> content(const CheckpointId& id, std::uint64_t size) {
    std::vector<std::uint8_t> data(size);
    std::uint64_t x = std::hash<std::string>{}(id.name) ^ (id.version * 0x9e3779b97f4a7c15ull);
    for (auto& byte : data) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      byte = static_cast<std::uint8_t>(x >> 56);
    }
    return data;
  }

  bool same_bytes(const CheckpointId& id, std::span<const std::uint8_t> bytes) const {
    const auto it = offered_.find(id);
    return it != offered_.end() && std::equal(bytes.begin(), bytes.end(), it->second.begin(), it->second.end());
  }

  bool readable(const CheckpointId& id) {
    if (files_.contains(id)) return true;
    for (std::int32_t r = 0; r < nodes(); ++r) {
      if (alive(r) && store(r).held(id) != nullptr) return true;
    }
    return false;
  }

  std::uint64_t newest_file(const std::string& name) const {
    std::uint64_t newest = 0;
    for (const auto& [id, data] : files_) {
      if (id.name == name) newest = std::max(newest, id.version);
    }
    return newest;
  }

  // What remove_superseded_checkpoint_files does after each successful drain.
  void remove_superseded_files(const std::string& name) {
    std::vector<CheckpointId> versions;
    for (const auto& [id, data] : files_) {
      if (id.name == name) versions.push_back(id);
    }
    for (std::size_t i = 0; i + retain_ < versions.size(); ++i) files_.erase(versions[i]);
  }

  void replicate(std::int32_t owner, const CheckpointId& id) {
    excluded_[id].clear();
    send_copy(owner, id);
  }

  void retry_replica(std::int32_t owner, const CheckpointId& id, std::int32_t refused_by) {
    excluded_[id].push_back(refused_by);
    send_copy(owner, id);
  }

  void send_copy(std::int32_t owner, const CheckpointId& id) {
    // Numbered per owner in order of first replication, as CheckpointNode numbers them.
    auto& slots = slots_[owner];
    const std::uint32_t slot = slots.try_emplace(id.name, static_cast<std::uint32_t>(slots.size())).first->second;
    const std::int32_t holder = choose_replica_holder(owner, slot, domains_, alive_, excluded_[id]);
    const CheckpointEntry* e = store(owner).held(id);
    if (holder != kNoRank) {
      // Evicted as durable meanwhile: the node copies nothing (CheckpointNode::replicate).
      if (e != nullptr) in_flight_.push_back(Message{Message::Kind::kReplicaCopy, owner, holder, id, true, e->bytes});
      return;
    }
    const bool any_peer_alive = std::count(alive_.begin(), alive_.end(), true) > 1;
    if (!any_peer_alive && e != nullptr) {
      // The last daemon standing: the save completes with its one copy.
      store(owner).replicated(id, kNoRank);
      saved_.insert(id);
    } else if (e != nullptr && !e->saved) {
      store(owner).abandon(id);  // every live peer refused: the trainer's save fails
    }
  }

  std::uint32_t retain_;
  bool write_through_;
  std::vector<bool> alive_;
  std::vector<std::string> domains_;
  std::vector<CheckpointStore> stores_;
  std::vector<Message> in_flight_;
  std::map<CheckpointId, std::vector<std::int32_t>> excluded_;
  std::map<std::int32_t, std::map<std::string, std::uint32_t>> slots_;
  std::map<CheckpointId, std::vector<std::uint8_t>> offered_;
  std::set<CheckpointId> saved_;
  std::map<CheckpointId, std::vector<std::uint8_t>> files_;
  std::set<CheckpointId> ever_durable_;
};

RC_GTEST_PROP(CheckpointStoreProperty, SavedVersionsStayReadableUntilDurableAndSuperseded, ()) {
  const auto nodes = *rc::gen::inRange<std::int32_t>(2, 5);
  const auto capacity = *rc::gen::inRange<std::uint64_t>(64, 512);
  const auto retain = *rc::gen::inRange<std::uint32_t>(1, 4);
  const bool write_through = *rc::gen::arbitrary<bool>();
  const auto steps = *rc::gen::inRange<int>(1, 150);
  World world(nodes, capacity, retain, write_through);
  // A daemon dies at any step, or (one run in four) none does.
  const bool a_daemon_dies = *rc::gen::inRange(0, 4) != 0;
  const auto death_step = a_daemon_dies ? *rc::gen::inRange<int>(0, steps) : -1;
  const auto victim = *rc::gen::inRange<std::int32_t>(0, nodes);
  bool died = false;
  for (int step = 0; step < steps; ++step) {
    if (step == death_step) {
      world.kill(victim);
      died = true;
    }
    const auto action = *rc::gen::inRange<int>(0, 100);
    const auto node = *rc::gen::inRange<std::int32_t>(0, nodes);
    if (action < 25) {
      if (!world.alive(node)) continue;
      const auto name = *rc::gen::element<std::string>("a", "b");
      const auto size = *rc::gen::inRange<std::uint64_t>(1, capacity / 2);
      world.save(node, fmt::format("n{}{}", node, name), size);
    } else if (action < 65) {
      if (world.quiet()) continue;
      const auto index = *rc::gen::inRange<std::size_t>(0, world.in_flight());
      world.deliver(index, *rc::gen::arbitrary<bool>());
    } else {
      if (world.alive(node)) world.start_drain(node, *rc::gen::inRange(0, 5) != 0);
    }
    world.check();
  }
  // Then the storm passes: every message lands, every drain succeeds.
  for (int round = 0; round < 10000; ++round) {
    bool progressed = false;
    while (!world.quiet()) {
      world.deliver(0);
      progressed = true;
    }
    for (std::int32_t r = 0; r < nodes; ++r) {
      if (world.alive(r)) progressed = world.start_drain(r, true) || progressed;
    }
    world.check();
    if (!progressed) break;
  }
  world.check_all_durable();
  RC_TAG(died ? "a daemon died" : "no death");
  RC_CLASSIFY(world.saved_count() > 5, "more than 5 saves");
}

}  // namespace checkpoint_store_test
}  // namespace shardmix
