#include "control/directory_exchange.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "proto/directory_exchange.h"

namespace shardmix {
static_assert(proto::kDirectoryNotResident == kNotResident);
namespace {

// Hands each message waiting with `tag` to `handle` (which returns a Status) until none is
// left; the first receive or handler failure stops it and is returned. Main thread only.
template <typename Handle>
Status for_each_waiting(const MpiSession& mpi, int tag, Handle&& handle) {
  for (;;) {
    auto m = mpi.try_receive(tag);
    if (!m.ok()) return m.status();
    if (!m->has_value()) return Status::ok_status();
    if (Status s = handle(**m); !s.ok()) return s;
  }
}

// An owner's answer from describe_from's entries and locations (indices ascending).
Status fill_answer(std::span<const SampleInfo> entries, StorageLocations cold, proto::DirectoryAnswer& answer) {
  if (cold.paths.size() > proto::kMaxDirectoryPathBytes) {
    return make_error(StatusCode::kResourceExhausted,
                      "the paths of the {} samples located come to {} bytes, over the {} one answer carries",
                      cold.size(), cold.paths.size(), proto::kMaxDirectoryPathBytes);
  }
  answer.bytes.reserve(entries.size());
  answer.arena_offset.reserve(entries.size());
  answer.labels.reserve(entries.size());
  for (const SampleInfo& e : entries) {
    answer.bytes.push_back(e.bytes);
    answer.arena_offset.push_back(e.arena_offset);
    answer.labels.push_back(e.label);
  }
  answer.located_entry.assign(cold.index.begin(), cold.index.end());  // < the ask's 2^24 indices
  answer.located_shard = std::move(cold.shard);
  answer.located_offset = std::move(cold.offset);
  answer.located_path_end = std::move(cold.path_end);
  answer.located_paths = std::move(cold.paths);
  return Status::ok_status();
}

}  // namespace

MpiDirectoryExchange::MpiDirectoryExchange(const MpiSession& mpi, const OwnerShard& own,
                                           std::chrono::milliseconds timeout)
    : mpi_(mpi), own_(own), timeout_(timeout), main_thread_(std::this_thread::get_id()) {}

Status MpiDirectoryExchange::describe(std::span<const DescribeRequest> requests) const {
  if (std::this_thread::get_id() == main_thread_) {
    // The main thread moves the answers: waiting here would wait for ourselves.
    return make_error(StatusCode::kInternal, "a plan was resolved on the main thread, which answers the exchange");
  }
  Call call;
  std::unique_lock lock(mutex_);
  if (closed_) return *closed_;
  // Every request is checked before any is queued: a queued ask points into `call`.
  for (const DescribeRequest& r : requests) {
    if (r.owner >= static_cast<std::uint32_t>(mpi_.size()) || r.local.size() != r.out.size()) {
      return make_error(StatusCode::kInternal, "a directory request to owner {} of {} ranks with {} indices for {} entries",
                        r.owner, mpi_.size(), r.local.size(), r.out.size());
    }
    if (auto dead = dead_owners_.find(r.owner); dead != dead_owners_.end()) return dead->second;
  }
  std::vector<std::uint64_t> mine;  // this call's request numbers, to forget them on a timeout
  for (const DescribeRequest& r : requests) {
    for (std::uint64_t begin = 0; begin < r.local.size(); begin += kMaxAskEntries) {
      const std::uint64_t n = std::min<std::uint64_t>(kMaxAskEntries, r.local.size() - begin);
      proto::DirectoryAsk ask;
      ask.request = next_request_++;
      ask.indices.assign(r.local.begin() + static_cast<std::ptrdiff_t>(begin),
                         r.local.begin() + static_cast<std::ptrdiff_t>(begin + n));
      ask.flags = r.every_location ? proto::kAskEveryLocation : 0;
      pending_[ask.request] = Pending{&call, r.owner, r.out.subspan(begin, n), r.located, begin, r.every_location};
      outgoing_.push_back(Outgoing{r.owner, proto::encode_directory_ask(ask)});
      mine.push_back(ask.request);
      ++call.remaining;
    }
  }
  if (call.remaining == 0) return Status::ok_status();
  asks_queued_.notify_one();
  if (!answered_.wait_for(lock, timeout_, [&] { return call.remaining == 0; })) {
    std::vector<std::uint32_t> silent;
    for (std::uint64_t request : mine) {
      auto it = pending_.find(request);
      if (it == pending_.end()) continue;
      silent.push_back(it->second.owner);
      pending_.erase(it);  // a late answer finds no one waiting and is dropped
    }
    std::sort(silent.begin(), silent.end());
    silent.erase(std::unique(silent.begin(), silent.end()), silent.end());
    return make_error(StatusCode::kUnavailable, "no directory answer within {} ms from owner daemon rank(s) {}",
                      timeout_.count(), fmt::join(silent, ", "));
  }
  return call.error;
}

void MpiDirectoryExchange::finish_locked(std::uint64_t request, const Status& error) const {
  auto it = pending_.find(request);
  if (it == pending_.end()) return;
  Call& call = *it->second.call;
  if (!error.ok() && call.error.ok()) call.error = error;
  pending_.erase(it);
  if (--call.remaining == 0) answered_.notify_all();
}

Status MpiDirectoryExchange::pump() {
  std::vector<Outgoing> sending;
  {
    std::lock_guard lock(mutex_);
    if (closed_) return Status::ok_status();
    sending.swap(outgoing_);
  }
  for (Outgoing& o : sending) {
    Status s = mpi_.post_send(static_cast<int>(o.owner), kTagDirectoryAsk, std::move(o.bytes));
    if (!s.ok()) {
      close(s);
      return s;
    }
    std::lock_guard lock(mutex_);
    ++counters_.asks_sent;
  }
  for (Status s : {answer_asks(), take_answers(), mpi_.test_sends()}) {
    if (!s.ok()) {
      close(s);
      return s;
    }
  }
  return Status::ok_status();
}

// The other daemons' asks, answered from this node's shard. A malformed ask or an index
// outside the share gets an answer carrying the error, so the asker fails with it instead
// of waiting out its timeout; neither harms this daemon.
Status MpiDirectoryExchange::answer_asks() {
  return for_each_waiting(mpi_, kTagDirectoryAsk, [this](const MpiSession::Message& msg) {
    const std::string asker = fmt::format("daemon rank {}", msg.source);
    proto::DirectoryAsk ask;
    proto::DirectoryAnswer answer;
    std::string error = proto::decode_directory_ask(msg.bytes, asker, ask);
    answer.request = ask.request;
    if (error.empty()) {
      std::vector<SampleInfo> entries(ask.indices.size());
      StorageLocations located;
      const bool every = (ask.flags & proto::kAskEveryLocation) != 0;
      Status s = describe_from(own_, ask.indices, entries, asker, &located, every);
      answer.every_entry = every;
      if (s.ok()) s = fill_answer(entries, std::move(located), answer);
      if (!s.ok()) error = s.message();
    }
    answer.error = error.empty() ? std::string() : fmt::format("owner daemon rank {}: {}", mpi_.rank(), error);
    const std::size_t sent = answer.size();
    Status s = mpi_.post_send(msg.source, kTagDirectoryAnswer, proto::encode_directory_answer(answer));
    if (!s.ok()) return s;
    std::lock_guard lock(mutex_);
    ++counters_.asks_answered;
    counters_.entries_sent += sent;
    return Status::ok_status();
  });
}

Status MpiDirectoryExchange::take_answers() {
  return for_each_waiting(mpi_, kTagDirectoryAnswer, [this](const MpiSession::Message& msg) {
    proto::DirectoryAnswer answer;
    const std::string error = proto::decode_directory_answer(msg.bytes, fmt::format("daemon rank {}", msg.source), answer);
    std::lock_guard lock(mutex_);
    auto it = pending_.find(answer.request);
    // Unknown: the asker timed out and forgot it, or the message is too damaged to name
    // its request; nobody waits for it either way.
    if (it == pending_.end()) return Status::ok_status();
    Pending& p = it->second;
    if (!error.empty()) {
      finish_locked(answer.request, Status(StatusCode::kProtocol, error));
    } else if (msg.source != static_cast<int>(p.owner)) {
      finish_locked(answer.request, make_error(StatusCode::kInternal, "daemon rank {} answered request {} sent to rank {}",
                                               msg.source, answer.request, p.owner));
    } else if (!answer.error.empty()) {
      finish_locked(answer.request, Status(StatusCode::kUnavailable, answer.error));
    } else if (answer.every_entry != p.every_location) {
      finish_locked(answer.request, make_error(StatusCode::kProtocol,
                                               "owner daemon rank {} answered request {} with {} locations, asked for {}",
                                               msg.source, answer.request, answer.every_entry ? "every entry's" : "the cold "
                                               "entries'", p.every_location ? "every entry's" : "the cold ones'"));
    } else if (answer.size() != p.out.size()) {
      finish_locked(answer.request, make_error(StatusCode::kProtocol,
                                               "owner daemon rank {} answered {} entries for a request of {}",
                                               msg.source, answer.size(), p.out.size()));
    } else {
      for (std::size_t i = 0; i < answer.size(); ++i) {
        p.out[i] = SampleInfo{answer.bytes[i], answer.arena_offset[i], p.owner, answer.labels[i]};
      }
      if (p.located != nullptr) {
        for (std::size_t k = 0; k < answer.located_entry.size(); ++k) {
          p.located->add(p.first + answer.located_entry[k], answer.located_shard[k], answer.located_offset[k],
                      answer.located_path(k));
        }
      }
      counters_.entries_received += answer.size();
      finish_locked(answer.request, Status::ok_status());
    }
    return Status::ok_status();
  });
}

void MpiDirectoryExchange::wait_for_asks(std::chrono::milliseconds max) {
  std::unique_lock lock(mutex_);
  asks_queued_.wait_for(lock, max, [&] { return !outgoing_.empty() || closed_.has_value(); });
}

void MpiDirectoryExchange::fail_owner(std::uint32_t owner, const Status& why) {
  std::lock_guard lock(mutex_);
  dead_owners_.emplace(owner, why);
  std::vector<std::uint64_t> theirs;
  for (const auto& [request, p] : pending_) {
    if (p.owner == owner) theirs.push_back(request);
  }
  for (std::uint64_t request : theirs) finish_locked(request, why);
}

void MpiDirectoryExchange::close(const Status& why) {
  std::lock_guard lock(mutex_);
  if (!closed_) closed_ = why;
  while (!pending_.empty()) finish_locked(pending_.begin()->first, why);
  outgoing_.clear();
  asks_queued_.notify_all();
}

MpiDirectoryExchange::Counters MpiDirectoryExchange::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

}  // namespace shardmix
