#include "server/trainer_scheduler.h"

#include <fmt/format.h>

namespace shardmix {

TrainerScheduler::TrainerScheduler(const SchedulerContext& context, std::uint32_t local_trainer,
                                   std::shared_ptr<StagingRing> ring, PeerFetcher& fetcher, FrameSink& sink)
    : context_(context), local_trainer_(local_trainer), ring_(std::move(ring)), fetcher_(fetcher), sink_(sink) {}

void TrainerScheduler::abandon(Pass& pass) {
  auto previous = std::move(pass.live);
  pass.live.clear();
  for (auto& [index, assembly] : previous) {
    assembly->released = true;
    if (!assembly->fetching) retire(assembly);
  }
}

void TrainerScheduler::start_epoch(std::uint64_t epoch, std::uint64_t stream) {
  // Our own waiter (if the old pass was blocked on staging) must not fire while we
  // retire the old pass: it would pump the old plan.
  ring_->wait_for_release(nullptr);
  // Implicitly release what the trainer still held of the previous pass; batches still
  // being fetched free their staging when the fetches land.
  abandon(current_);
  ++generation_;
  if (ahead_ && ahead_->epoch == epoch) {
    current_ = std::move(*ahead_);  // assembled ahead with generation_ + 1: now current
  } else {
    if (ahead_) abandon(*ahead_);
    current_ = Pass{};
    current_.epoch = epoch;
    current_.generation = generation_;
    current_.plan = std::move(context_.planner->plan_node(epoch, context_.node)[local_trainer_]);
  }
  ahead_.reset();
  started_ = true;
  stream_ = stream;
  next_to_send_ = 0;
  end_sent_ = false;
  failed_ = false;
  stats_ = proto::EpochStats{};
  stats_.epoch = epoch;
  stats_.stream = stream;
  pump();
  flush();
}

Status TrainerScheduler::release(std::uint64_t stream, std::uint64_t batch) {
  if (stream != stream_) return Status::ok_status();  // a late release of an abandoned pass
  auto it = current_.live.find(batch);
  if (it == current_.live.end() || !it->second->sent) {
    return make_error(StatusCode::kProtocol, "release of epoch {} batch {} (stream {}) that is not outstanding",
                      current_.epoch, batch, stream);
  }
  auto assembly = it->second;
  current_.live.erase(it);
  assembly->released = true;
  retire(assembly);
  pump();
  flush();
  return Status::ok_status();
}

void TrainerScheduler::close() {
  closed_ = true;  // first: a waiter fired by the releases below finds us closed
  abandon(current_);
  if (ahead_) abandon(*ahead_);
}

void TrainerScheduler::retire(const std::shared_ptr<Assembly>& assembly) {
  if (assembly->staging_offset) {
    ring_->release(*assembly->staging_offset);
    assembly->staging_offset.reset();
  }
}

void TrainerScheduler::pump() {
  if (closed_ || failed_ || !started_) return;
  while (live_batches() < context_.prefetch) {
    if (current_.next_to_assemble < current_.plan.num_batches()) {
      if (!assemble_next(current_)) return;
      continue;
    }
    // The current pass is fully assembled: work ahead on the next epoch.
    if (!ahead_) {
      ahead_.emplace();
      ahead_->epoch = current_.epoch + 1;
      ahead_->generation = generation_ + 1;
      ahead_->plan = std::move(context_.planner->plan_node(ahead_->epoch, context_.node)[local_trainer_]);
    }
    if (ahead_->next_to_assemble >= ahead_->plan.num_batches()) return;
    if (!assemble_next(*ahead_)) return;
  }
}

bool TrainerScheduler::assemble_next(Pass& pass) {
  const std::uint64_t b = pass.next_to_assemble;
  const std::uint64_t begin = pass.plan.batch_begin[b];
  const std::uint64_t end = pass.plan.batch_begin[b + 1];
  const Catalog& catalog = *context_.catalog;
  const Placement& placement = *context_.placement;

  std::uint64_t staging_needed = 0;
  for (std::uint64_t i = begin; i < end; ++i) {
    const SampleId id = pass.plan.order[i];
    if (placement.owner[id] != context_.node) staging_needed += align_to_arena(catalog.sample_bytes(id));
  }
  auto assembly = std::make_shared<Assembly>();
  if (staging_needed > 0) {
    assembly->staging_offset = ring_->allocate(staging_needed);
    if (!assembly->staging_offset) {
      if (live_batches() == 0 && ring_->empty()) {
        failed_ = true;
        sink_.send_error(make_error(StatusCode::kResourceExhausted,
                                    "batch {} needs {} staging bytes but service.staging_bytes_per_trainer is {}",
                                    b, staging_needed, ring_->capacity()));
        return false;
      }
      // Wait for staging bytes. They may be freed by this scheduler's own releases or
      // by a previous scheduler of the same trainer slot whose reads are still landing
      // (a restarted trainer): the ring wakes whoever waits.
      std::weak_ptr<TrainerScheduler> weak = weak_from_this();
      ring_->wait_for_release([weak] {
        if (auto self = weak.lock()) {
          self->pump();
          self->flush();
        }
      });
      return false;
    }
  }
  assembly->generation = pass.generation;
  assembly->started = std::chrono::steady_clock::now();
  assembly->frame.epoch = pass.epoch;
  assembly->frame.batch = b;
  assembly->frame.samples.reserve(end - begin);
  pass.live.emplace(b, assembly);
  ++pass.next_to_assemble;

  std::uint64_t staging_cursor = assembly->staging_offset.value_or(0);
  std::vector<PeerRead> reads;
  for (std::uint64_t i = begin; i < end; ++i) {
    const SampleId id = pass.plan.order[i];
    const std::uint32_t owner = placement.owner[id];
    const std::uint64_t length = catalog.sample_bytes(id);
    proto::SampleDescriptor d{};
    d.sample_id = id;
    d.label = catalog.label(id);
    d.owner = owner;
    d.length = length;
    if (owner == context_.node) {
      d.region = static_cast<std::uint8_t>(proto::Region::kArena);
      d.tier = static_cast<std::uint8_t>(proto::Tier::kLocal);
      d.offset = placement.arena_offset[id];
    } else {
      d.region = static_cast<std::uint8_t>(proto::Region::kStaging);
      d.tier = static_cast<std::uint8_t>(proto::Tier::kPeer);
      d.offset = staging_cursor;
      if (length > 0) reads.push_back({owner, placement.arena_offset[id], length, staging_cursor});
      staging_cursor += align_to_arena(length);
    }
    assembly->frame.samples.push_back(d);
  }
  if (!reads.empty()) {
    assembly->fetching = true;
    auto self = shared_from_this();
    fetcher_.fetch(std::move(reads), [self, assembly](const Status& status) { self->on_fetched(assembly, status); });
  }
  return true;
}

void TrainerScheduler::on_fetched(const std::shared_ptr<Assembly>& assembly, const Status& status) {
  assembly->error = status;
  assembly->fetching = false;
  if (assembly->released || closed_) {
    retire(assembly);  // abandoned pass or gone trainer: only the staging bytes matter
    pump();            // the freed bytes may unblock the current pass
    flush();
    return;
  }
  if (assembly->generation != generation_) return;  // assembled ahead: waits for its StartEpoch
  stats_.fetch_wait_us += static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - assembly->started)
          .count());
  flush();
  pump();
  flush();
}

void TrainerScheduler::flush() {
  if (closed_ || failed_ || !started_) return;
  while (true) {
    auto it = current_.live.find(next_to_send_);
    if (it == current_.live.end() || it->second->fetching) break;
    Assembly& a = *it->second;
    if (!a.error.ok()) {
      failed_ = true;
      sink_.send_error(a.error.with_context(fmt::format("epoch {} batch {}", current_.epoch, next_to_send_)));
      return;
    }
    for (const auto& d : a.frame.samples) {
      ++stats_.samples;
      stats_.bytes += d.length;
      if (d.tier == static_cast<std::uint8_t>(proto::Tier::kLocal)) {
        ++stats_.local_samples;
      } else {
        ++stats_.peer_samples;
        stats_.peer_bytes += d.length;
      }
    }
    ++stats_.batches;
    a.sent = true;
    a.frame.stream = stream_;  // known only now for batches assembled ahead of their pass
    sink_.send_batch(a.frame);
    ++next_to_send_;
  }
  if (!end_sent_ && next_to_send_ == current_.plan.num_batches()) {
    end_sent_ = true;
    sink_.send_epoch_end(stats_);
  }
}

}  // namespace shardmix
