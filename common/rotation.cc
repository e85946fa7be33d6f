#include "common/rotation.h"

#include "common/placement.h"

namespace shardmix {

ResidencyTable::ResidencyTable(std::vector<ArenaLayout> initial, GenerationClock clock) : clock_(clock) {
  views_.reserve(initial.size());
  for (ArenaLayout& layout : initial) {
    auto view = std::make_shared<ArenaView>();
    view->layout = std::make_shared<const ArenaLayout>(std::move(layout));
    view->pin = std::make_shared<const int>(0);
    views_.push_back(std::move(view));
  }
}

ResidencyTable::Snapshot ResidencyTable::snapshot() const {
  std::lock_guard lock(mutex_);
  return views_;
}

std::shared_ptr<const ArenaView> ResidencyTable::view(std::uint32_t node) const {
  std::lock_guard lock(mutex_);
  return views_[node];
}

std::optional<ResidencyTable::ArenaRead> ResidencyTable::locate(const Snapshot& views, std::uint32_t node,
                                                                SampleId id) {
  const ArenaView& view = *views[node];
  const auto at = view.layout->offset_of(id);
  if (!at) return std::nullopt;
  if (view.next) {
    // The reload writes only entering samples, into holes: a sample at the same offset in
    // both generations is never written. Any other slot may be.
    const auto after = view.next->offset_of(id);
    if (!after || *after != *at) return std::nullopt;
  }
  return ArenaRead{*at, view.pin};
}

void ResidencyTable::note_staged(std::uint64_t epoch, std::uint64_t batch) {
  const std::uint64_t g = clock_.generation(epoch, batch);
  std::uint64_t seen = furthest_generation_plus_one_.load(std::memory_order_relaxed);
  while (seen < g + 1 &&
         !furthest_generation_plus_one_.compare_exchange_weak(seen, g + 1, std::memory_order_relaxed)) {
  }
}

std::optional<std::uint64_t> ResidencyTable::furthest_generation_staged() const {
  const std::uint64_t v = furthest_generation_plus_one_.load(std::memory_order_relaxed);
  if (v == 0) return std::nullopt;
  return v - 1;
}

std::weak_ptr<const int> ResidencyTable::begin_transition(std::uint32_t node,
                                                          std::shared_ptr<const ArenaLayout> next) {
  std::lock_guard lock(mutex_);
  const std::shared_ptr<const ArenaView> old = views_[node];
  auto view = std::make_shared<ArenaView>();
  view->layout = old->layout;
  view->next = std::move(next);
  // Reads of kept samples taken from now on are reads of the next generation too (same
  // offset), so they hold a new pin: the next fence waits for them, this one does not.
  view->pin = std::make_shared<const int>(0);
  views_[node] = std::move(view);
  return old->pin;
}

void ResidencyTable::finish_transition(std::uint32_t node) {
  std::lock_guard lock(mutex_);
  const std::shared_ptr<const ArenaView> old = views_[node];
  auto view = std::make_shared<ArenaView>();
  view->layout = old->next;
  view->pin = old->pin;
  views_[node] = std::move(view);
}

RotationCoordinator::RotationCoordinator(std::uint32_t self, std::uint32_t nodes,
                                         const std::vector<std::uint64_t>& sizes, ResidencyTable& table, Hooks hooks)
    : self_(self), sizes_(sizes), table_(table), hooks_(std::move(hooks)), nodes_(nodes) {
  for (std::uint32_t k = 0; k < nodes; ++k) {
    nodes_[k].current = table_.view(k)->layout;
    nodes_[k].generation = nodes_[k].current->generation;
  }
}

Status RotationCoordinator::poll() {
  if (!table_.clock().enabled()) return Status::ok_status();
  const std::uint64_t target = table_.furthest_generation_staged().value_or(0);
  for (std::uint32_t k = 0; k < nodes_.size(); ++k) {
    NodeState& n = nodes_[k];
    // One generation at a time: a jump of several epochs goes through each fence in turn.
    if (!n.next && n.generation < target) {
      n.next = std::make_shared<const ArenaLayout>(
          next_arena_layout(*n.current, sizes_, hooks_.wanted(k, n.generation + 1, *n.current)));
      n.retired_pin = table_.begin_transition(k, n.next);
      n.done_sent = false;
    }
    if (n.next && !n.done_sent && n.retired_pin.expired()) {
      n.done_sent = true;
      if (k == self_) {
        on_done(self_, k, n.generation);
      } else {
        hooks_.send_done(k, n.generation);
      }
    }
  }
  NodeState& me = nodes_[self_];
  if (me.next && !reloading_ && !reload_error_ && done_count_[me.generation] == nodes_.size()) {
    reloading_ = true;
    hooks_.start_reload(*me.next);
  }
  if (reloading_) {
    if (auto outcome = hooks_.reload_finished()) {
      reloading_ = false;
      if (!outcome->ok()) {
        reload_error_ = true;  // stay in transition: the changing samples keep coming from storage
        return outcome->with_context("reloading the cache for generation " + std::to_string(me.generation + 1));
      }
      ++stats_.generations_loaded;
      stats_.samples_loaded += me.next->entering.size();
      stats_.samples_unplaced += me.next->unplaced;
      done_count_.erase(me.generation);
      const std::uint64_t readable = me.generation + 1;
      hooks_.announce_readable(readable);
      on_readable(self_, readable);
    }
  }
  return Status::ok_status();
}

void RotationCoordinator::on_done(std::uint32_t /*from*/, std::uint32_t node, std::uint64_t generation) {
  if (node != self_) {
    ++stats_.unexpected_messages;
    return;
  }
  ++done_count_[generation];
}

void RotationCoordinator::on_readable(std::uint32_t node, std::uint64_t generation) {
  if (node >= nodes_.size()) {
    ++stats_.unexpected_messages;
    return;
  }
  NodeState& n = nodes_[node];
  // Node k reloads only after this daemon's Done, which follows its own transition.
  if (!n.next || n.next->generation != generation) {
    ++stats_.unexpected_messages;
    return;
  }
  table_.finish_transition(node);
  n.current = std::move(n.next);
  n.next = nullptr;
  n.generation = generation;
}

}  // namespace shardmix
