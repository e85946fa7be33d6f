#include "server/checkpoint_replicator.h"

#include <algorithm>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "common/checkpoint_file.h"
#include "common/log.h"
#include "proto/field_codec.h"

namespace shardmix {
namespace {

// A replica pull reads its version in chunks, with at most kPullReadsInFlight of them
// (checkpoint_replicator.h) in the fabric at a time: the next is posted as one lands. Everything else bound for the
// same peer (sample reads, the failure detector's heartbeats) then queues behind at most
// that many chunks, in the fabric's per-peer queue and on the provider's connection,
// instead of behind the whole version. With all of a 1 GiB version queued at once (8 MiB
// reads), the slowest heartbeat answers were 0.66-2.98 s while four such pulls ran on this
// machine's tcp provider (decision 0059, update). Raw tcp reads between 4
// ranks of 2-8 MiB moved ~5 GB/s in all with 2 in flight as with 7
// (shardmix-bench-fabric-read --qd), so the bound costs the pull nothing there.
constexpr std::size_t kPullChunkBytes = 4u << 20;
// Longest error text a Refused carries (the rest is cut).
constexpr std::size_t kMaxNoticeText = 1024;

// kBusy: refused for want of room now (the owner may ask again later); kRefused: for good
// (larger than this daemon's checkpoint.capacity, a failed read).
enum class NoticeKind : std::uint8_t { kOffer = 1, kCopied = 2, kRefused = 3, kRelease = 4, kBusy = 5 };

}  // namespace

struct FabricCheckpointReplicator::Notice {
  NoticeKind kind = NoticeKind::kOffer;
  std::uint64_t version = 0;
  std::uint64_t length = 0;   // Offer: the version's bytes
  std::uint64_t address = 0;  // Offer: fabric::RemoteRegion
  std::uint64_t key = 0;
  std::string name;
  std::string error;  // Refused: why

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("kind", m.kind), visit("pad", proto::ZeroPad<std::uint8_t>{}), visit("pad", proto::ZeroPad<std::uint16_t>{});
    visit("pad", proto::ZeroPad<std::uint32_t>{});
    visit("version", m.version), visit("length", m.length), visit("address", m.address), visit("key", m.key);
    visit("name", proto::counted(kMaxCheckpointNameBytes, m.name));
    visit("error", proto::counted(kMaxNoticeText, m.error));
  }

  CheckpointId id() const { return CheckpointId{name, version}; }
};

struct FabricCheckpointReplicator::Pull {
  std::int32_t owner = kNoRank;
  CheckpointId id;
  // The landing buffer, in the node's checkpoint pool (pages reused from version to version,
  // decision 0068), registered for the reads while they run.
  std::shared_ptr<CheckpointBuffer> landing;
  fabric::LocalRegion region;
  fabric::RemoteRegion remote;
  // Under the replicator's mutex: the next byte to read, the reads posted and not landed,
  // the first failure (after which nothing more is posted).
  std::uint64_t next_offset = 0;
  std::size_t in_flight = 0;
  Status first_error;
};

FabricCheckpointReplicator::FabricCheckpointReplicator(fabric::Fabric& fabric, const MpiSession& mpi)
    : fabric_(fabric), mpi_(mpi), dead_(static_cast<std::size_t>(mpi.size()), false) {}

// Offered regions and landing buffers still registered are closed with the fabric, which
// the daemon destroys before this object: a read still with the provider may land in a
// buffer until then.
FabricCheckpointReplicator::~FabricCheckpointReplicator() = default;

bool FabricCheckpointReplicator::is_dead(std::int32_t rank) const {
  return rank < 0 || static_cast<std::size_t>(rank) >= dead_.size() || dead_[static_cast<std::size_t>(rank)];
}

void FabricCheckpointReplicator::copy(std::int32_t holder, const CheckpointId& id, CheckpointBytesPtr bytes,
                                      std::function<void(const Status&)> done) {
  std::lock_guard lock(mutex_);
  to_offer_.push_back(Outgoing{holder, id, std::move(bytes), std::move(done)});
}

void FabricCheckpointReplicator::release(std::int32_t holder, const CheckpointId& id) {
  std::lock_guard lock(mutex_);
  to_release_.emplace_back(holder, id);
}

CheckpointReplicatorStats FabricCheckpointReplicator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

Status FabricCheckpointReplicator::post(std::int32_t to, const Notice& notice) {
  // MPI's behaviour towards a dead rank is not to be relied on.
  if (is_dead(to)) return make_error(StatusCode::kUnavailable, "daemon rank {} is dead", to);
  std::vector<std::uint8_t> bytes;
  proto::FieldWriter writer(bytes);
  Notice::fields(notice, writer);
  Status sent = mpi_.post_send(to, kTagCheckpointReplica, std::move(bytes));
  if (!sent.ok()) {
    log::get("checkpoint")->error("checkpoint {}: a replication notice to daemon rank {} could not be sent: {}",
                                  to_string(notice.id()), to, sent.to_string());
  }
  return sent;
}

void FabricCheckpointReplicator::offer(Outgoing outgoing, std::vector<std::function<void()>>& after) {
  const auto fail = [&](Status why) {
    after.push_back([done = std::move(outgoing.done), why = std::move(why)] { done(why); });
  };
  if (is_dead(outgoing.holder)) {
    fail(make_error(StatusCode::kUnavailable, "checkpoint {}: replica holder rank {} is dead",
                    to_string(outgoing.id), outgoing.holder));
    return;
  }
  const Key key{outgoing.holder, outgoing.id};
  if (offered_.contains(key)) {
    // The node never copies one version to one holder twice at once; refuse rather than
    // lose the first offer's answer.
    fail(make_error(StatusCode::kInternal, "checkpoint {}: already offered to rank {}", to_string(outgoing.id),
                    outgoing.holder));
    return;
  }
  const std::span<const std::uint8_t> bytes = outgoing.bytes->bytes();
  Notice notice;
  notice.kind = NoticeKind::kOffer;
  notice.name = outgoing.id.name;
  notice.version = outgoing.id.version;
  notice.length = bytes.size();
  Offered offered;
  if (!bytes.empty()) {
    Result<fabric::OfferedRegion> region = fabric_.offer_region(bytes.data(), bytes.size());
    if (!region.ok()) {
      fail(region.status().with_context(
          fmt::format("checkpoint {}: registering it for its replica holder", to_string(outgoing.id))));
      return;
    }
    offered.region = region->handle;
    notice.address = region->remote.address;
    notice.key = region->remote.key;
  }
  if (Status sent = post(outgoing.holder, notice); !sent.ok()) {
    // No answer can come: the node moves on to the next peer.
    if (offered.region >= 0) fabric_.withdraw_region(offered.region);
    fail(sent.with_context(fmt::format("checkpoint {}: offering it to rank {}", to_string(outgoing.id),
                                       outgoing.holder)));
    return;
  }
  offered.bytes = std::move(outgoing.bytes);
  offered.done = std::move(outgoing.done);
  offered_.emplace(key, std::move(offered));
  std::lock_guard lock(mutex_);
  ++stats_.offers_sent;
}

void FabricCheckpointReplicator::start_pull(std::int32_t owner, const Notice& offer) {
  const Key key{owner, offer.id()};
  if (pulling_.contains(key)) return;  // an offer repeated while the first is read
  auto pull = std::make_shared<Pull>();
  pull->owner = owner;
  pull->id = offer.id();
  const auto refuse = [&](const Status& why) {
    Notice refused;
    refused.kind = NoticeKind::kRefused;
    refused.name = offer.name;
    refused.version = offer.version;
    refused.error = why.message().substr(0, kMaxNoticeText);
    log::get("checkpoint")->warn("refusing the replica of checkpoint {} from daemon rank {}: {}", to_string(pull->id),
                                 owner, why.message());
    (void)post(owner, refused);  // unsent only to a dead owner, or on an MPI error (logged)
    std::lock_guard lock(mutex_);
    ++stats_.refusals;
  };
  if (offer.length > node_->options().capacity_bytes) {
    // Cannot fit whatever is evicted: not worth reading.
    refuse(make_error(StatusCode::kResourceExhausted,
                      "rank {}: a replica of {} bytes exceeds checkpoint.capacity ({} bytes)", mpi_.rank(),
                      offer.length, node_->options().capacity_bytes));
    return;
  }
  if (offer.length == 0) {
    pulling_.emplace(key, pull);
    finish_pull(pull);
    return;
  }
  Result<std::shared_ptr<CheckpointBuffer>> landing = node_->allocate(offer.length, to_string(pull->id));
  if (!landing.ok()) {
    refuse(landing.status());
    return;
  }
  pull->landing = std::move(*landing);
  const std::span<std::uint8_t> into = pull->landing->writable();
  Result<fabric::LocalRegion> region = fabric_.register_local(into.data(), into.size());
  if (!region.ok()) {
    refuse(region.status());
    return;
  }
  pull->region = *region;
  pull->remote = fabric::RemoteRegion{offer.address, offer.key, offer.length};
  pulling_.emplace(key, pull);
  for (std::size_t i = 0; i < kPullReadsInFlight; ++i) post_next_read(pull);
}

void FabricCheckpointReplicator::post_next_read(const std::shared_ptr<Pull>& pull) {
  std::uint64_t offset = 0;
  std::size_t length = 0;
  {
    std::lock_guard lock(mutex_);
    if (!pull->first_error.ok() || pull->next_offset >= pull->remote.length) return;
    offset = pull->next_offset;
    length = static_cast<std::size_t>(std::min<std::uint64_t>(kPullChunkBytes, pull->remote.length - offset));
    pull->next_offset += length;
    ++pull->in_flight;
    stats_.most_pull_reads_in_flight = std::max<std::uint64_t>(stats_.most_pull_reads_in_flight, pull->in_flight);
  }
  // The callback runs on the fabric's progress thread, never on this stack.
  fabric_.read_region(pull->owner, pull->remote, offset, length, pull->region, static_cast<std::size_t>(offset),
                      [this, pull](const Status& status) { on_read_landed(pull, status); });
}

void FabricCheckpointReplicator::on_read_landed(const std::shared_ptr<Pull>& pull, const Status& status) {
  {
    std::lock_guard lock(mutex_);
    --pull->in_flight;
    if (!status.ok() && pull->first_error.ok()) pull->first_error = status;
    const bool more = pull->first_error.ok() && pull->next_offset < pull->remote.length;
    if (!more) {
      // Done, or failed: finished once the reads already posted have landed too (the
      // landing buffer is theirs until then).
      if (pull->in_flight == 0) landed_.push_back(pull);
      return;
    }
  }
  post_next_read(pull);
}

void FabricCheckpointReplicator::finish_pull(const std::shared_ptr<Pull>& pull) {
  pulling_.erase(Key{pull->owner, pull->id});
  if (pull->landing) fabric_.unregister_local(pull->region);
  Status read;
  {
    std::lock_guard lock(mutex_);
    read = pull->first_error;
  }
  // The copy as the node keeps it: the landing buffer, read-only from here on (an empty
  // version has none).
  CheckpointBytesPtr copy = std::make_shared<OwnedCheckpointBytes>(std::vector<std::uint8_t>{});
  if (read.ok() && pull->landing) copy = std::move(pull->landing);
  pull->landing.reset();
  Notice answer;
  answer.name = pull->id.name;
  answer.version = pull->id.version;
  Status accepted = read;
  if (read.ok()) {
    const std::uint64_t size = copy->bytes().size();
    // From an owner already declared dead the node takes the copy over and drains it.
    accepted = node_->accept_replica(pull->owner, pull->id, std::move(copy));
    if (accepted.ok()) {
      std::lock_guard lock(mutex_);
      ++stats_.replicas_pulled;
      stats_.bytes_pulled += size;
    }
  }
  if (accepted.ok()) {
    answer.kind = NoticeKind::kCopied;
  } else {
    answer.kind = accepted.code() == StatusCode::kUnavailable ? NoticeKind::kBusy : NoticeKind::kRefused;
    answer.error = accepted.message().substr(0, kMaxNoticeText);
    log::get("checkpoint")->warn("refusing the replica of checkpoint {} from daemon rank {}: {}",
                                 to_string(pull->id), pull->owner, accepted.message());
    std::lock_guard lock(mutex_);
    ++stats_.refusals;
  }
  // Unsent (the owner died): a copy accepted from it is drained here; nothing else to do.
  (void)post(pull->owner, answer);
}

void FabricCheckpointReplicator::handle(std::int32_t source, const Notice& notice,
                                        std::vector<std::function<void()>>& after) {
  switch (notice.kind) {
    case NoticeKind::kOffer:
      start_pull(source, notice);
      return;
    case NoticeKind::kCopied:
    case NoticeKind::kRefused:
    case NoticeKind::kBusy: {
      const auto it = offered_.find(Key{source, notice.id()});
      if (it == offered_.end()) return;  // answered already (the holder was declared dead)
      if (it->second.region >= 0) fabric_.withdraw_region(it->second.region);
      // The node tells the two refusals apart by code: kUnavailable may be asked again.
      Status outcome = notice.kind == NoticeKind::kCopied ? Status::ok_status()
                       : notice.kind == NoticeKind::kBusy
                           ? make_error(StatusCode::kUnavailable, "daemon rank {} has no room now for the replica of {}: {}",
                                        source, to_string(notice.id()), notice.error)
                           : make_error(StatusCode::kResourceExhausted, "daemon rank {} refused the replica of {}: {}",
                                        source, to_string(notice.id()), notice.error);
      after.push_back([done = std::move(it->second.done), outcome = std::move(outcome)] { done(outcome); });
      offered_.erase(it);
      return;
    }
    case NoticeKind::kRelease:
      after.push_back([this, id = notice.id()] { node_->release_replica(id); });
      return;
  }
  log::get("checkpoint")->warn("ignoring a replication notice of unknown kind {} from daemon rank {}",
                               static_cast<int>(notice.kind), source);
  std::lock_guard lock(mutex_);
  ++stats_.malformed_notices;
}

void FabricCheckpointReplicator::pump() {
  std::deque<Outgoing> offers;
  std::deque<std::pair<std::int32_t, CheckpointId>> releases;
  std::deque<std::shared_ptr<Pull>> landed;
  {
    std::lock_guard lock(mutex_);
    offers.swap(to_offer_);
    releases.swap(to_release_);
    landed.swap(landed_);
  }
  // Completions run after the notices are handled and outside the mutex: a `done` makes
  // the node choose another holder, which calls copy() again.
  std::vector<std::function<void()>> after;
  for (Outgoing& outgoing : offers) offer(std::move(outgoing), after);
  for (const auto& [holder, id] : releases) {
    Notice notice;
    notice.kind = NoticeKind::kRelease;
    notice.name = id.name;
    notice.version = id.version;
    (void)post(holder, notice);  // best effort (CheckpointReplicator::release)
  }
  for (const std::shared_ptr<Pull>& pull : landed) finish_pull(pull);
  for (;;) {
    Result<std::optional<MpiSession::Message>> message = mpi_.try_receive(kTagCheckpointReplica);
    if (!message.ok()) {
      log::get("checkpoint")->error("receiving replication notices: {}", message.status().to_string());
      break;
    }
    if (!message->has_value()) break;
    const MpiSession::Message& m = **message;
    Notice notice;
    proto::FieldReader reader(m.bytes, "checkpoint replication notice");
    Notice::fields(notice, reader);
    const std::string error = reader.finish();
    if (!error.empty() || m.source < 0 || m.source >= mpi_.size() || m.source == mpi_.rank()) {
      log::get("checkpoint")->warn("ignoring a replication notice from daemon rank {}: {}", m.source,
                                   error.empty() ? "not a peer" : error);
      std::lock_guard lock(mutex_);
      ++stats_.malformed_notices;
      continue;
    }
    handle(m.source, notice, after);
  }
  for (auto& callback : after) callback();
  if (Status sends = mpi_.test_sends(); !sends.ok()) {
    log::get("checkpoint")->error("a control-plane message was not delivered: {}", sends.to_string());
  }
}

void FabricCheckpointReplicator::peer_died(std::int32_t rank) {
  if (rank < 0 || static_cast<std::size_t>(rank) >= dead_.size()) return;
  dead_[static_cast<std::size_t>(rank)] = true;
  std::vector<std::function<void()>> after;
  for (auto it = offered_.begin(); it != offered_.end();) {
    if (it->first.first != rank) {
      ++it;
      continue;
    }
    // Its reads of the region may still be with the provider: the registration goes with
    // the answer anyway (a read of a closed region fails at the dead reader's end).
    if (it->second.region >= 0) fabric_.withdraw_region(it->second.region);
    Status why = make_error(StatusCode::kUnavailable, "replica holder rank {} died before it held {}", rank,
                            to_string(it->first.second));
    after.push_back([done = std::move(it->second.done), why = std::move(why)] { done(why); });
    it = offered_.erase(it);
  }
  for (auto& callback : after) callback();
}

}  // namespace shardmix
