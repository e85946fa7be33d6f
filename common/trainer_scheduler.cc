#include "common/trainer_scheduler.h"

#include <time.h>

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "common/metadata_footprint.h"
#include "common/trace.h"
#include "proto/checkpoint.h"

namespace shardmix {

TrainerScheduler::TrainerScheduler(const SchedulerContext& context, std::uint32_t local_trainer,
                                   std::shared_ptr<StagingAllocator> staging, PeerFetcher& fetcher, FrameSink& sink)
    : context_(context), local_trainer_(local_trainer), staging_(std::move(staging)), fetcher_(fetcher), sink_(sink) {}

TrainerPlan TrainerScheduler::plan_of(std::uint64_t epoch) const {
  const std::uint32_t trainer = trainer_rank();
  if (context_.redealt != nullptr && context_.redealt->epoch == epoch) return context_.redealt->plans[trainer];
  // Only this trainer's slice: O(its quota), never the other trainers' or nodes' plans.
  return context_.planner->plan_trainer(epoch, trainer);
}

std::shared_ptr<TrainerScheduler::Pass> TrainerScheduler::new_pass(std::uint64_t epoch) {
  auto pass = std::make_shared<Pass>();
  pass->epoch = epoch;
  const std::int64_t traced = trace::start();
  if (context_.on_plan_cpu) {
    timespec begin{};
    timespec end{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &begin);
    set_plan(*pass, plan_of(epoch));
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
    const std::int64_t ns = (end.tv_sec - begin.tv_sec) * 1'000'000'000LL + (end.tv_nsec - begin.tv_nsec);
    context_.on_plan_cpu(epoch, static_cast<std::uint64_t>(std::max<std::int64_t>(ns, 0)));
  } else {
    set_plan(*pass, plan_of(epoch));
  }
  trace::span(trace::What::kPlanEpoch, local_trainer_, traced, trace::kAlways, {epoch, trainer_rank()});
  return pass;
}

void TrainerScheduler::set_plan(Pass& pass, TrainerPlan plan) const {
  pass.plan = std::move(plan);
  auto where = context_.directory->resolve(pass.plan.order);
  if (where.ok()) {
    pass.where = std::move(*where);
    return;
  }
  // An owner could not be asked where the plan's samples are: nothing of this pass can be
  // staged. It fails the trainer when it is (or becomes) the current pass, like a fetch error.
  pass.error = where.status();
  pass.error_position = 0;
}

std::uint64_t TrainerScheduler::metadata_bytes() const {
  std::uint64_t bytes =
      sizeof(*this) + (received_.capacity() + received_before_.capacity()) * sizeof(SampleId);
  for (const auto& pass : {current_, ahead_}) {
    if (!pass) continue;
    bytes += sizeof(Pass) + plan_memory_bytes(pass->plan) + pass->slots.size() * sizeof(Slot) +
             pass->planned_position.capacity() * sizeof(std::uint64_t) +
             (pass->where ? pass->where->memory_bytes() : 0);
  }
  return bytes;
}

std::uint64_t TrainerScheduler::staged_samples() const {
  return (current_ ? current_->undelivered : 0) + (ahead_ ? ahead_->undelivered : 0);
}

std::uint64_t TrainerScheduler::budget_used() const { return staged_samples() + sent_samples_; }

void TrainerScheduler::abandon(const std::shared_ptr<Pass>& pass) {
  pass->abandoned = true;
  // Delivered slots belong to sent batches (freed with sent_); slots still being fetched
  // are freed by on_fetched once their reads have landed.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (Slot& slot : pass->slots) {
    if (slot.state == SlotState::kReady) take_bytes(*pass, slot, ranges);
    slot.arena_pin.reset();  // never delivered: the trainer holds no view of it
  }
  staging_->release_all(ranges);
}

void TrainerScheduler::free_sent() {
  auto sent = std::move(sent_);
  sent_.clear();
  sent_samples_ = 0;
  for (const auto& [index, batch] : sent) release_sent(batch);
}

void TrainerScheduler::release_sent(const SentBatch& batch) {
  staging_->release_all(batch.staging);
  if (batch.stale_staging.empty()) return;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> landed;
  for (const auto& [seq, range] : batch.stale_staging) {
    if (batch.pass->stale_reads.count(seq) > 0) {
      batch.pass->quarantine[seq].push_back(range);  // freed by on_fetched when it lands
    } else {
      landed.push_back(range);
    }
  }
  staging_->release_all(landed);
}

void TrainerScheduler::start_epoch(std::uint64_t epoch, std::uint64_t stream) {
  begin_pass(nullptr, epoch, stream);
}

Status TrainerScheduler::start_epoch(std::uint64_t epoch, std::uint64_t stream, const ResumePoint& resume) {
  // The window bound was checked against the checkpoint's own job (accept_checkpoint): a
  // position taken under one shuffle.window resumes correctly under any other.
  auto resumed = resume_trainer_plan(plan_of(epoch), resume, proto::kMaxCheckpointExceptions);
  if (!resumed.ok()) return resumed.status().with_context(fmt::format("resuming epoch {}", epoch));
  auto pass = std::make_shared<Pass>();
  pass->epoch = epoch;
  set_plan(*pass, std::move(resumed->plan));
  pass->first_batch = resumed->first_batch;
  pass->planned_position = std::move(resumed->planned_position);
  begin_pass(std::move(pass), epoch, stream);
  return Status::ok_status();
}

void TrainerScheduler::begin_pass(std::shared_ptr<Pass> pass, std::uint64_t epoch, std::uint64_t stream) {
  // Our own waiter (if the old pass was blocked on staging) must not fire while we
  // retire the old pass: it would pump the old plan.
  staging_->wait_for_release(nullptr);
  // Implicitly release what the trainer still held of the previous pass; samples still
  // being fetched free their staging when the fetches land.
  free_sent();
  if (current_) abandon(current_);
  if (!pass && ahead_ && ahead_->epoch == epoch) {
    current_ = std::move(ahead_);  // staged ahead of its StartEpoch: adopt it
  } else {
    if (ahead_) abandon(ahead_);
    current_ = pass ? std::move(pass) : new_pass(epoch);
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
  stats_.window = context_.window;
  stats_.exchange_fraction = context_.planner->choice(epoch).exchange_fraction;
  label_entropy_.emplace(context_.num_classes);
  received_.clear();
  received_again_ = 0;
  trace::instant(trace::What::kEpochStart, local_trainer_, trace::kAlways, {epoch, trainer_rank()});
  pump();
}

Status TrainerScheduler::release(std::uint64_t stream, std::uint64_t batch) {
  if (stream != stream_) return Status::ok_status();  // a late release of an abandoned pass
  auto it = sent_.find(batch);
  if (it == sent_.end()) {
    return make_error(StatusCode::kProtocol, "release of epoch {} batch {} (stream {}) that is not outstanding",
                      current_ ? current_->epoch : 0, batch, stream);
  }
  const SentBatch done = std::move(it->second);
  sent_.erase(it);
  sent_samples_ -= done.samples;
  release_sent(done);
  pump();
  return Status::ok_status();
}

void TrainerScheduler::close() {
  closed_ = true;  // first: a waiter fired by the releases below finds us closed
  free_sent();
  if (current_) abandon(current_);
  if (ahead_) abandon(ahead_);
}

void TrainerScheduler::fail(const Status& status) {
  failed_ = true;
  // A failed scheduler delivers nothing more until the trainer starts an epoch or
  // disconnects, which a trainer that catches the error and idles may never do. Its staged
  // but undelivered local slots would keep their arena pins all that time and hold up this
  // node's cache rotation (the fence waits for every pin of the retiring view). Delivered
  // slots' pins stay with their sent batches: the trainer still holds those views.
  for (const std::shared_ptr<Pass>& pass : {current_, ahead_}) {
    if (!pass) continue;
    for (Slot& slot : pass->slots) {
      if (slot.state != SlotState::kDelivered) slot.arena_pin.reset();
    }
  }
  sink_.send_error(status);
}

void TrainerScheduler::pump() {
  if (closed_ || failed_ || !started_) return;
  if (pumping_) {
    repump_ = true;  // e.g. a fetch that completed inline: go round once more
    return;
  }
  pumping_ = true;
  const std::uint64_t ahead_batches =
      std::uint64_t{context_.prefetch} +
      (context_.directory->has_cold_samples() ? context_.cold_readahead_batches : 0);
  const std::uint64_t budget = ahead_batches * context_.planner->shape().job.batch_size + context_.window;
  bool progress = true;
  while ((progress || repump_) && !closed_ && !failed_) {
    progress = false;
    repump_ = false;
    staging_blocked_ = false;
    if (!current_->error.ok()) {
      fail(current_->error.with_context(
          fmt::format("epoch {} plan position {}", current_->epoch, current_->error_position)));
      break;
    }
    while (!failed_ && deliver_next()) progress = true;
    // Stage planned batches within the budget: the current pass first, then the next epoch.
    while (!failed_) {
      std::shared_ptr<Pass> pass = current_;
      if (pass->next_to_stage >= pass->plan.num_batches()) {
        if (!ahead_) ahead_ = new_pass(current_->epoch + 1);
        pass = ahead_;
        if (!pass->error.ok() || pass->next_to_stage >= pass->plan.num_batches()) break;
      }
      const std::uint64_t b = pass->next_to_stage;
      const std::uint64_t length = pass->plan.batch_begin[b + 1] - pass->plan.batch_begin[b];
      const std::uint64_t used = budget_used();
      if (used > 0 && used + length > budget) break;
      if (!stage_next(pass)) {
        staging_blocked_ = pass == current_;
        break;
      }
      progress = true;
    }
  }
  pumping_ = false;
  trace::counter(trace::What::kStagedBytes, local_trainer_, static_cast<std::int64_t>(staging_->bytes_in_use()),
                 {current_->epoch, trainer_rank(), current_->first_batch + next_to_send_});
  if (closed_ || failed_) return;
  if (staging_blocked_) fail_if_stuck();
  if (!failed_ && !end_sent_ && next_to_send_ == current_->plan.num_batches()) {
    end_sent_ = true;
    trace::instant(trace::What::kEpochEnd, local_trainer_, trace::kAlways, {current_->epoch, trainer_rank()});
    finish_quality_figures();
    sink_.send_epoch_end(stats_);
  }
}

void TrainerScheduler::fail_if_stuck() {
  // Quiescent and the current pass cannot stage its next batch. Stuck if nothing can free
  // bytes: the trainer holds no batch, no read of ours is landing, and no one else (a
  // previous scheduler of this trainer slot) holds bytes that will come back.
  if (!sent_.empty()) return;
  // A stale read (from a peer declared dead, its positions re-posted to storage) may never
  // land: it frees only quarantined bytes, so it does not count as progress.
  for (const auto& q : {current_, ahead_}) {
    if (q && q->fetches_in_flight > q->stale_reads.size()) return;
  }
  std::uint64_t held = 0;
  for (const auto& q : {current_, ahead_}) {
    if (!q) continue;
    for (const auto& [seq, ranges] : q->quarantine) {
      for (const auto& range : ranges) held += range.second;
    }
    for (const Slot& slot : q->slots) {
      if (slot.state != SlotState::kDelivered) held += slot.staged_bytes;
    }
  }
  if (staging_->bytes_in_use() != held) return;
  const Pass& p = *current_;
  const std::uint64_t b = p.next_to_stage;
  std::uint64_t needed = 0;
  for (std::uint64_t i = p.plan.batch_begin[b]; i < p.plan.batch_begin[b + 1]; ++i) {
    const SampleInfo info = p.where->at(i, p.plan.order[i]);
    if (!is_local(info)) needed += align_to_arena(info.bytes);
  }
  fail(make_error(StatusCode::kResourceExhausted,
                  "epoch {} batch {} needs {} contiguous staging bytes; {} are held by samples staged ahead "
                  "(shuffle.window = {}) and service.staging_bytes_per_trainer is {}: raise it{}",
                  p.epoch, p.first_batch + b, needed, held, context_.window, staging_->capacity(),
                  context_.window > 0 ? " or lower shuffle.window" : ""));
}

bool TrainerScheduler::stage_next(const std::shared_ptr<Pass>& pass) {
  Pass& p = *pass;
  const std::uint64_t b = p.next_to_stage;
  const std::uint64_t begin = p.plan.batch_begin[b];
  const std::uint64_t end = p.plan.batch_begin[b + 1];

  // Where each position is read from: this node's arena (zero-copy), a peer's arena, or
  // storage. Under cache rotation the residency table says where a sample is *now*.
  struct Source {
    SampleInfo info;
    bool local = false;
    bool cold = false;
    std::uint64_t offset = 0;  // in the owner's arena
    std::shared_ptr<const int> pin;
  };
  std::vector<Source> sources(end - begin);
  ResidencyTable::Snapshot views;
  if (context_.residency != nullptr) {
    context_.residency->note_staged(p.epoch, p.first_batch + b);
    views = context_.residency->snapshot();
  }
  for (std::uint64_t i = begin; i < end; ++i) {
    const SampleId id = p.plan.order[i];
    Source& source = sources[i - begin];
    source.info = p.where->at(i, id);
    const std::uint32_t owner = source.info.owner;
    if (context_.residency != nullptr) {
      if (auto at = ResidencyTable::locate(views, owner, id)) {
        source.local = owner == context_.node;
        source.offset = at->offset;
        source.pin = std::move(at->pin);
      } else {
        source.cold = true;
      }
    } else {
      source.local = is_local(source.info);
      source.cold = !source.info.resident();
      source.offset = source.info.arena_offset;
    }
  }

  // The batch's peer and cold bytes as one extent (freed sample by sample as batches are
  // released).
  std::uint64_t peer_bytes = 0;
  for (std::uint64_t i = begin; i < end; ++i) {
    if (!sources[i - begin].local) peer_bytes += align_to_arena(sources[i - begin].info.bytes);
  }
  std::uint64_t cursor = 0;
  if (peer_bytes > 0) {
    std::optional<std::uint64_t> extent;
    if (peer_bytes <= staging_->bytes_free()) extent = staging_->allocate(peer_bytes);
    if (!extent) {
      // Wait for bytes. They may be freed by this scheduler's own releases or by a previous
      // scheduler of the same trainer slot whose reads are still landing (a restarted
      // trainer): the allocator wakes whoever waits. pump() decides whether we are stuck.
      std::weak_ptr<TrainerScheduler> weak = weak_from_this();
      staging_->wait_for_release([weak] {
        if (auto self = weak.lock()) self->pump();
      });
      staging_wait_.open();
      return false;
    }
    cursor = *extent;
  }
  const trace::Key traced{p.epoch, trainer_rank(), p.first_batch + b};
  staging_wait_.close(trace::What::kStagingWait, local_trainer_, traced, {p.epoch, traced.trainer, traced.batch,
                                                                          peer_bytes});
  const trace::KeyScope trace_posts(traced);  // the fetchers' reads below belong to this batch

  std::vector<Slot> slots;
  slots.reserve(end - begin);
  // With a window, one fetch per owner, so that a slow peer holds back only its own
  // samples; without one the batch waits for all its reads anyway, and one completion
  // per batch means fewer wake-ups of the service thread. A batch's cold samples are one
  // more group (storage, kStorageGroup), read by the storage pool in parallel.
  constexpr std::uint32_t kStorageGroup = ~std::uint32_t{0};
  std::map<std::uint32_t, std::vector<PeerRead>> reads;
  std::vector<StorageRead> cold_reads;
  std::map<std::uint32_t, std::vector<std::uint64_t>> positions;
  std::map<std::uint32_t, std::vector<std::shared_ptr<const int>>> pins;  // cache rotation, per peer group
  std::map<std::uint32_t, std::uint64_t> seqs;  // group -> fetch_seq, assigned in group order
  std::vector<std::uint32_t> group_of(end - begin, 0);
  for (std::uint64_t i = begin; i < end; ++i) {
    const SampleId id = p.plan.order[i];
    Source& source = sources[i - begin];
    const std::uint32_t owner = source.info.owner;
    const std::uint64_t length = source.info.bytes;
    Slot slot;
    proto::SampleDescriptor& d = slot.descriptor;
    d.sample_id = id;
    d.label = source.info.label;
    d.owner = owner;  // for a cold sample: the node whose share it is (none caches it)
    d.length = length;
    if (source.local) {
      d.region = static_cast<std::uint8_t>(proto::Region::kArena);
      d.tier = static_cast<std::uint8_t>(proto::Tier::kLocal);
      d.offset = source.offset;
      slot.arena_pin = std::move(source.pin);
    } else {
      // A dead peer's sample (degraded mode) is read from storage, like a cold one.
      const bool dead_owner = !source.cold && is_dead(owner);
      const bool cold = source.cold || dead_owner;
      if (dead_owner && length > 0) {
        ++rerouted_samples_;
        if (context_.rerouted_samples != nullptr) context_.rerouted_samples->fetch_add(1, std::memory_order_relaxed);
      }
      d.region = static_cast<std::uint8_t>(proto::Region::kStaging);
      d.tier = static_cast<std::uint8_t>(cold ? proto::Tier::kStorage : proto::Tier::kPeer);
      if (length > 0) {
        const std::uint64_t bytes = align_to_arena(length);
        d.offset = cursor;
        cursor += bytes;
        slot.staged_bytes = bytes;
        slot.state = SlotState::kFetching;
        const std::uint32_t group = cold ? kStorageGroup : context_.window > 0 ? owner : 0;
        if (cold) {
          cold_reads.push_back({id, length, d.offset, p.where->storage_location(i)});
        } else {
          reads[group].push_back({owner, source.offset, length, d.offset});
          if (source.pin) pins[group].push_back(std::move(source.pin));
          slot.peer = owner;
        }
        positions[group].push_back(i);
        seqs.emplace(group, 0);
        group_of[i - begin] = group;
      }
    }
    slots.push_back(slot);
  }
  for (auto& [group, seq] : seqs) {
    seq = next_fetch_seq_++;
    auto held = pins.find(group);
    if (held != pins.end()) p.read_pins[seq] = std::move(held->second);
  }
  for (std::size_t k = 0; k < slots.size(); ++k) {
    Slot& slot = slots[k];
    if (slot.state == SlotState::kFetching) slot.fetch_seq = seqs.at(group_of[k]);
    p.slots.push_back(slot);
  }
  p.undelivered += slots.size();
  ++p.next_to_stage;
  const auto now = std::chrono::steady_clock::now();
  auto completion = [&](std::uint32_t group) {
    ++p.fetches_in_flight;
    return [self = shared_from_this(), pass, where = std::move(positions[group]), seq = seqs.at(group),
            now](const Status& s) { self->on_fetched(pass, where, seq, now, s); };
  };
  for (auto& [group, group_reads] : reads) fetcher_.fetch(std::move(group_reads), completion(group));
  if (!cold_reads.empty()) {
    if (context_.storage != nullptr) {
      ++p.fetches_in_flight;
      context_.storage->fetch(std::move(cold_reads),
                              [self = shared_from_this(), pass, where = std::move(positions[kStorageGroup]),
                               seq = seqs.at(kStorageGroup), now](const StorageOutcome& outcome) {
                                self->on_fetched(pass, where, seq, now, outcome.first_error(), &outcome);
                              });
    } else {
      // Not reachable from the daemon (it always has a storage pool); a clear error
      // rather than a sample that never arrives.
      const SampleId first = cold_reads.front().sample;
      completion(kStorageGroup)(make_error(StatusCode::kInternal,
                                           "sample {} is cached on no node and this scheduler has no storage reader",
                                           first));
    }
  }
  return true;
}

bool TrainerScheduler::deliver_next() {
  Pass& p = *current_;
  const std::uint64_t j = next_to_send_;
  if (j >= p.plan.num_batches() || sent_.size() >= context_.prefetch) return false;
  const std::uint64_t plan_begin = p.plan.batch_begin[j];
  const std::uint64_t n = p.plan.batch_begin[j + 1] - plan_begin;

  // Planned composition: the first n undelivered positions, if they are all ready.
  std::vector<std::size_t> chosen;  // indices into p.slots
  chosen.reserve(n);
  bool ready = true;
  for (std::size_t k = 0; k < p.slots.size() && chosen.size() < n; ++k) {
    if (p.slots[k].state == SlotState::kDelivered) continue;
    if (p.slots[k].state != SlotState::kReady) {
      ready = false;
      break;
    }
    chosen.push_back(k);
  }
  if (chosen.size() < n) ready = false;
  if (!ready) {
    // Opportunistic: only when the trainer is about to starve, so that an unhurried
    // pipeline keeps the planned order.
    if (context_.window == 0 || sent_.size() > 1) return false;
    if (!substitute(n, plan_begin, chosen)) return false;
  }

  proto::BatchFrame frame;
  frame.epoch = p.epoch;
  frame.batch = p.first_batch + j;
  frame.stream = stream_;
  frame.samples.reserve(n);
  frame.positions.reserve(n);
  SentBatch sent;
  sent.samples = n;
  for (const std::size_t k : chosen) {
    Slot& slot = p.slots[k];
    slot.state = SlotState::kDelivered;
    const proto::SampleDescriptor& d = slot.descriptor;
    frame.samples.push_back(d);
    frame.positions.push_back(p.planned_position.empty() ? p.base + k : p.planned_position[p.base + k]);
    take_bytes(p, slot, sent.staging, &sent);
    if (slot.arena_pin) sent.arena_pins.push_back(std::move(slot.arena_pin));
    const std::uint64_t position = p.base + k;
    if (position < plan_begin || position >= plan_begin + n) ++stats_.substituted_samples;
    if ((d.flags & proto::kSampleSkipped) != 0) {
      ++stats_.unreadable_samples;
      auto error = p.skip_errors.find(position);
      if (error != p.skip_errors.end()) {
        if (context_.on_skipped) context_.on_skipped(p.epoch, d.sample_id, error->second);
        p.skip_errors.erase(error);
      }
      continue;
    }
    ++stats_.samples;
    stats_.bytes += d.length;
    if (d.tier == static_cast<std::uint8_t>(proto::Tier::kLocal)) {
      ++stats_.local_samples;
    } else if (d.tier == static_cast<std::uint8_t>(proto::Tier::kStorage)) {
      ++stats_.storage_samples;
    } else {
      ++stats_.peer_samples;
      stats_.peer_bytes += d.length;
    }
  }
  labels_scratch_.clear();
  for (const auto& d : frame.samples) {
    if ((d.flags & proto::kSampleSkipped) != 0) continue;  // not received
    labels_scratch_.push_back(d.label);
    if (!previous_epoch_ || *previous_epoch_ + 1 != p.epoch) continue;
    if (std::binary_search(received_before_.begin(), received_before_.end(), d.sample_id)) ++received_again_;
  }
  for (const auto& d : frame.samples) {
    if ((d.flags & proto::kSampleSkipped) == 0) received_.push_back(d.sample_id);
  }
  label_entropy_->add_batch(labels_scratch_);
  p.undelivered -= n;
  while (!p.slots.empty() && p.slots.front().state == SlotState::kDelivered) {
    p.slots.pop_front();
    ++p.base;
  }
  ++stats_.batches;
  if (!sent.stale_staging.empty()) sent.pass = current_;
  sent_.emplace(frame.batch, std::move(sent));
  sent_samples_ += n;
  ++next_to_send_;
  sink_.send_batch(frame);
  return true;
}

void TrainerScheduler::finish_quality_figures() {
  const LabelEntropySummary summary = label_entropy_->summary();
  stats_.batches_scored = summary.scored;
  stats_.label_entropy_mean = summary.mean;
  stats_.label_entropy_p5 = summary.p5;
  const bool has_previous = previous_epoch_ && *previous_epoch_ + 1 == current_->epoch;
  stats_.affinity = has_previous && stats_.samples > 0
                        ? static_cast<double>(received_again_) / static_cast<double>(stats_.samples)
                        : std::numeric_limits<double>::quiet_NaN();
  std::sort(received_.begin(), received_.end());
  received_before_.swap(received_);
  received_.clear();
  previous_epoch_ = current_->epoch;
}

bool TrainerScheduler::substitute(std::uint64_t n, std::uint64_t plan_begin, std::vector<std::size_t>& chosen) {
  // The planned composition F is the first n undelivered positions. Keep its ready
  // members; a member still fetching is late once a read posted after its own has landed
  // (until then, wait: its read may simply not have had time). Stand in for each late one
  // with a ready sample *of the same label* from
  // later in the window if there is one, else with the earliest ready sample. So the
  // batch keeps its planned label mix as far as the ready samples allow: a label-blind
  // pick fills batches with whichever owner answered first, which on class-sorted
  // placement clusters batches by class (measured: label-entropy p5 0.85 -> 0.49 at
  // W = 1024 in bench/sweep.sh before this rule).
  Pass& p = *current_;
  const std::uint64_t window_end = std::min<std::uint64_t>(plan_begin + n + context_.window, p.plan.order.size());
  chosen.clear();
  std::vector<std::int32_t> late_labels;
  std::size_t k = 0;
  std::uint64_t in_f = 0;
  for (; k < p.slots.size() && in_f < n; ++k) {
    const Slot& slot = p.slots[k];
    if (slot.state == SlotState::kDelivered) continue;
    ++in_f;
    if (slot.state == SlotState::kReady) {
      chosen.push_back(k);
    } else if (slot.fetch_seq < p.max_completed_seq) {
      late_labels.push_back(slot.descriptor.label);  // overtaken by a later read: late
    } else {
      return false;  // its read may simply not have had time yet: wait for it
    }
  }
  if (in_f < n) return false;  // members of F not even staged: nothing after F is staged either
  // Ready stand-ins after F, inside the window, by label (in position order).
  std::map<std::int32_t, std::deque<std::size_t>> by_label;
  std::vector<std::size_t> rest;
  for (; k < p.slots.size() && p.base + k < window_end; ++k) {
    // A skipped placeholder stands in for nothing: it carries no sample.
    if (p.slots[k].state != SlotState::kReady || (p.slots[k].descriptor.flags & proto::kSampleSkipped) != 0) continue;
    by_label[p.slots[k].descriptor.label].push_back(k);
    rest.push_back(k);
  }
  std::vector<bool> taken(p.slots.size(), false);
  std::size_t unmatched = 0;
  for (const std::int32_t label : late_labels) {
    auto it = by_label.find(label);
    if (it == by_label.end() || it->second.empty()) {
      ++unmatched;
      continue;
    }
    taken[it->second.front()] = true;
    chosen.push_back(it->second.front());
    it->second.pop_front();
  }
  for (std::size_t i = 0; i < rest.size() && unmatched > 0; ++i) {
    if (taken[rest[i]]) continue;
    chosen.push_back(rest[i]);
    --unmatched;
  }
  if (chosen.size() < n) return false;
  std::sort(chosen.begin(), chosen.end());  // deliver in plan order
  return true;
}

void TrainerScheduler::on_fetched(const std::shared_ptr<Pass>& pass, const std::vector<std::uint64_t>& positions,
                                  std::uint64_t seq, std::chrono::steady_clock::time_point started,
                                  const Status& status, const StorageOutcome* storage) {
  --pass->fetches_in_flight;
  pass->read_pins.erase(seq);  // the read has landed (or failed): it no longer touches the peer's arena
  if (pass->stale_reads.erase(seq) > 0) {
    // A read from a dead peer whose positions were re-posted to storage: they no longer
    // wait for it (they may be delivered already); only the bytes it could have written
    // into are released now.
    auto it = pass->quarantine.find(seq);
    if (it != pass->quarantine.end()) {
      auto ranges = std::move(it->second);
      pass->quarantine.erase(it);
      staging_->release_all(ranges);
      pump();
    }
    return;
  }
  pass->max_completed_seq = std::max(pass->max_completed_seq, seq);
  if (pass->abandoned || closed_) {
    // Abandoned pass or gone trainer: only the staging bytes matter now.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    for (const std::uint64_t position : positions) take_bytes(*pass, pass->slot(position), ranges);
    staging_->release_all(ranges);
    pump();  // the freed bytes may unblock the current pass
    return;
  }
  if (!status.ok() && context_.degrade_dead_peers && context_.storage != nullptr &&
      pass->slot(positions.front()).peer != kNoPeer) {
    // Degraded mode: a failed peer read (the peer died, or is dying) is retried from
    // storage for exactly these positions. The group has completed: nothing else writes
    // into their bytes. A failing storage read then reaches the trainer as usual.
    reroute_to_storage(pass, positions, /*stale=*/false);
    return;
  }
  if (storage != nullptr && !storage->ok() && retry_or_skip_storage(pass, positions, *storage)) {
    pump();
    return;
  }
  for (const std::uint64_t position : positions) pass->slot(position).state = SlotState::kReady;
  if (!status.ok() && pass->error.ok()) {
    pass->error = status;
    pass->error_position = positions.front();
  }
  if (pass == current_) {
    stats_.fetch_wait_us += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started).count());
  }
  pump();
}

void TrainerScheduler::take_bytes(Pass& pass, Slot& slot,
                                  std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges, SentBatch* sent) {
  if (slot.staged_bytes == 0) return;
  const std::pair<std::uint64_t, std::uint64_t> range{slot.descriptor.offset, std::exchange(slot.staged_bytes, 0)};
  if (slot.stale_seq != 0 && pass.stale_reads.count(slot.stale_seq) > 0) {
    if (sent != nullptr) {
      // The trainer reads these bytes until it releases the batch: not the quarantine,
      // which frees its bytes as soon as the stale read lands (decision 0032).
      sent->stale_staging.emplace_back(slot.stale_seq, range);
    } else {
      pass.quarantine[slot.stale_seq].push_back(range);
    }
  } else {
    ranges.push_back(range);
  }
}

bool TrainerScheduler::retry_or_skip_storage(const std::shared_ptr<Pass>& pass,
                                             const std::vector<std::uint64_t>& positions,
                                             const StorageOutcome& outcome) {
  // The group has completed: no read of it still writes into these bytes, so a retry may
  // read into the same ones. Only the reads that failed are retried or skipped.
  std::vector<bool> bad(positions.size(), false);
  std::vector<std::uint64_t> retry;
  std::vector<std::pair<std::uint64_t, const Status*>> failed;  // failed again after a retry
  for (const auto& [index, error] : outcome.failed) {
    if (index >= positions.size() || bad[index]) continue;
    bad[index] = true;
    const std::uint64_t position = positions[index];
    if (pass->slot(position).storage_retried) {
      failed.emplace_back(position, &error);
    } else {
      retry.push_back(position);
    }
  }
  if (!failed.empty() && !context_.skip_unreadable_samples) {
    // dataset.strict: the pass fails at this sample, with its own error.
    for (const std::uint64_t position : positions) pass->slot(position).state = SlotState::kReady;
    if (pass->error.ok()) {
      pass->error = *failed.front().second;
      pass->error_position = failed.front().first;
    }
    return true;
  }
  for (std::size_t i = 0; i < positions.size(); ++i) {
    if (!bad[i]) pass->slot(positions[i]).state = SlotState::kReady;
  }
  for (const std::uint64_t position : retry) {
    pass->slot(position).storage_retried = true;
    reroute_to_storage(pass, {position}, /*stale=*/false, /*rerouted=*/false);
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& [position, error] : failed) {
    Slot& slot = pass->slot(position);
    take_bytes(*pass, slot, ranges);
    slot.descriptor.flags |= proto::kSampleSkipped;
    slot.descriptor.offset = 0;
    slot.descriptor.length = 0;
    slot.state = SlotState::kReady;
    pass->skip_errors.emplace(position, *error);  // reported when the placeholder is delivered
  }
  staging_->release_all(ranges);
  return true;
}

void TrainerScheduler::reroute_to_storage(const std::shared_ptr<Pass>& pass,
                                          const std::vector<std::uint64_t>& positions, bool stale, bool rerouted) {
  std::vector<StorageRead> reads;
  reads.reserve(positions.size());
  const std::uint64_t seq = next_fetch_seq_++;
  for (const std::uint64_t position : positions) {
    Slot& slot = pass->slot(position);
    if (stale) {
      slot.stale_seq = slot.fetch_seq;
      pass->stale_reads.insert(slot.fetch_seq);
    }
    slot.fetch_seq = seq;
    slot.peer = kNoPeer;
    slot.state = SlotState::kFetching;
    slot.descriptor.tier = static_cast<std::uint8_t>(proto::Tier::kStorage);
    reads.push_back({slot.descriptor.sample_id, slot.descriptor.length, slot.descriptor.offset,
                     pass->where->storage_location(position)});
  }
  if (rerouted) {
    rerouted_samples_ += positions.size();
    if (context_.rerouted_samples != nullptr) {
      context_.rerouted_samples->fetch_add(positions.size(), std::memory_order_relaxed);
    }
  }
  ++pass->fetches_in_flight;
  const auto now = std::chrono::steady_clock::now();
  if (context_.storage == nullptr) {
    on_fetched(pass, positions, seq, now,
               make_error(StatusCode::kInternal,
                          "sample {} of a dead peer cannot be read: this scheduler has no storage reader",
                          reads.front().sample));
    return;
  }
  context_.storage->fetch(std::move(reads), [self = shared_from_this(), pass, positions, seq,
                                             now](const StorageOutcome& outcome) {
    self->on_fetched(pass, positions, seq, now, outcome.first_error(), &outcome);
  });
}

void TrainerScheduler::peer_dead(std::uint32_t peer) {
  if (is_dead(peer)) return;
  if (dead_.size() <= peer) dead_.resize(peer + 1, false);
  dead_[peer] = true;
  if (closed_ || failed_) return;  // in-flight reads only free bytes when they land
  // Reads from it still in flight may never complete (a hung node) or fail later: re-post
  // their whole fetch group to storage now (a group waits for all its reads, so its other
  // positions would wait for the dead peer too; storage holds the same bytes).
  for (const auto& pass : {current_, ahead_}) {
    if (!pass || pass->abandoned) continue;
    std::set<std::uint64_t> groups;
    for (const Slot& slot : pass->slots) {
      if (slot.state == SlotState::kFetching && slot.peer == peer) groups.insert(slot.fetch_seq);
    }
    for (const std::uint64_t group : groups) {
      std::vector<std::uint64_t> positions;
      for (std::size_t k = 0; k < pass->slots.size(); ++k) {
        const Slot& slot = pass->slots[k];
        if (slot.state == SlotState::kFetching && slot.fetch_seq == group) positions.push_back(pass->base + k);
      }
      reroute_to_storage(pass, positions, /*stale=*/true);
    }
  }
  pump();
}

}  // namespace shardmix
