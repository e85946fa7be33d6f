// The per-plan directory exchange over the real control plane (decision 0062). Every rank
// builds the same catalog and the spread ownership, holds only its own OwnerShard, and
// resolves its trainers' plans through a ShardedDirectory over MpiDirectoryExchange from
// several threads at once, while its main thread moves the asks and answers the other
// ranks'. Each resolved entry must equal what the global catalog and the tabulated
// placement say (GlobalDirectory), cold samples included, and each cold sample's storage
// location (its file) must come with it. Every rank assembles the whole catalog from the
// shares, as a trainer's GetCatalog does, and it must equal the global one. Then the failures: an index
// outside an owner's share, an owner declared dead, and an owner that does not answer in
// time, each an error naming the owner's rank, with no rank hanging.
// Prints PASS/FAIL on rank 0; exits non-zero on every rank on failure.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/catalog.h"
#include "common/epoch_plan.h"
#include "common/ownership.h"
#include "common/placement.h"
#include "common/sample_directory.h"
#include "control/directory_exchange.h"
#include "control/mpi_comm.h"
#include "tests/mpi/mpi_check.h"

namespace shardmix {
namespace {

using mpi_check::Checker;
using mpi_check::mix;

using namespace std::chrono_literals;

constexpr std::uint64_t kSamples = 30011;
constexpr std::uint32_t kTrainersPerNode = 3;
constexpr std::uint64_t kSeed = 9;

struct Job {
  Catalog catalog;
  PlanShape shape;
  std::uint64_t capacity = 0;
  Placement placement;  // tabulated spread: the reference
  Ownership ownership;
  OwnerShard own;
};

Job make_job(int ranks, int rank) {
  std::vector<CatalogEntry> entries;
  for (std::uint64_t i = 0; i < kSamples; ++i) {
    entries.push_back({fmt::format("c{}/s{:06}", mix(i) % 11, i), 1 + mix(i + 3) % 9000,
                       static_cast<std::int32_t>(mix(i) % 11)});
  }
  Job j{std::move(Catalog::from_entries(std::move(entries), {}).value())};
  j.shape = make_plan_shape(kSamples, JobShape{static_cast<std::uint32_t>(ranks), kTrainersPerNode, 16, false});
  // 60% of a node's share fits its arena: cold samples on every node.
  j.capacity = static_cast<std::uint64_t>(0.6 * static_cast<double>(j.catalog.total_bytes()) / ranks);
  j.placement = make_placement(j.catalog.sizes(), j.shape, PlacementPolicy::kSpread, kSeed, j.capacity);
  j.ownership = Ownership::spread(kSamples, j.shape.node_owned, kSeed);
  j.own = OwnerShard::build(j.catalog, j.ownership, static_cast<std::uint32_t>(rank), j.capacity, kSeed);
  return j;
}

// Pumps the exchange on the main thread until `done` (local work) and then until every rank
// is past the same point, so no rank stops answering while another still asks.
void serve_until(const MpiSession& mpi, MpiDirectoryExchange& exchange, Checker& c, const std::atomic<bool>& done) {
  while (!done.load()) {
    Status s = exchange.pump();
    c.check(s.ok(), "pump: " + s.to_string());
    exchange.wait_for_asks(2ms);
  }
  Status s = mpi.barrier([&] {
    Status p = exchange.pump();
    c.check(p.ok(), "pump in barrier: " + p.to_string());
  });
  c.check(s.ok(), "barrier: " + s.to_string());
}

bool same(const SampleInfo& a, const SampleInfo& b) {
  return a.bytes == b.bytes && a.arena_offset == b.arena_offset && a.owner == b.owner && a.label == b.label;
}

void check_plans(Checker& c, const Job& j) {
  const auto me = static_cast<std::uint32_t>(c.mpi.rank());
  MpiDirectoryExchange exchange(c.mpi, j.own, 60s);
  std::vector<std::uint64_t> cold(j.shape.node_owned.size());
  cold[me] = j.own.cold_samples();
  const ShardedDirectory sharded(me, j.ownership, j.own, exchange, cold, 0);
  const GlobalDirectory global(j.catalog, j.placement);
  const EpochPlanner planner(j.shape, j.ownership, ShuffleConfig{.seed = kSeed});
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> resolved{0}, foreign{0}, cold_seen{0}, foreign_cold{0};
  std::vector<std::thread> trainers;
  for (std::uint32_t t = 0; t < kTrainersPerNode; ++t) {
    trainers.emplace_back([&, t] {
      for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
        const TrainerPlan plan = planner.plan_node(epoch, me)[t];
        auto where = sharded.resolve(plan.order);
        c.check(where.ok(), fmt::format("epoch {} trainer {}: {}", epoch, t, where.ok() ? "" : where.status().to_string()));
        if (!where.ok()) continue;
        const auto looked_up = global.resolve(plan.order);
        const PlanDirectory* reference = looked_up->get();
        for (std::uint64_t p = 0; p < plan.order.size(); ++p) {
          const SampleId id = plan.order[p];
          const SampleInfo got = (*where)->at(p, id);
          if (!same(got, reference->at(p, id))) {
            c.check(false, fmt::format("epoch {} trainer {} position {} (sample {}): owner {} offset {} bytes {}, "
                                       "expected owner {} offset {} bytes {}",
                                       epoch, t, p, id, got.owner, got.arena_offset, got.bytes,
                                       reference->at(p, id).owner, reference->at(p, id).arena_offset,
                                       reference->at(p, id).bytes));
            break;
          }
          // A cold sample's file comes with it, from whichever node owns it.
          const std::optional<CatalogEntry> stored = (*where)->storage_location(p);
          if (got.resident() == stored.has_value() ||
              (stored && (stored->path != j.catalog.path(id) || stored->size != got.bytes ||
                                     stored->label != got.label))) {
            c.check(false, fmt::format("epoch {} trainer {} position {} (sample {}, owner {}, {}): storage location "
                                       "'{}', expected {}",
                                       epoch, t, p, id, got.owner, got.resident() ? "resident" : "cold",
                                       stored ? stored->path : "(none)",
                                       got.resident() ? "none" : std::string(j.catalog.path(id))));
            break;
          }
          foreign += got.owner != me;
          cold_seen += !got.resident();
          foreign_cold += !got.resident() && got.owner != me;
        }
        ++resolved;
      }
    });
  }
  std::thread joiner([&] {
    for (auto& t : trainers) t.join();
    done = true;
  });
  serve_until(c.mpi, exchange, c, done);
  joiner.join();
  c.check(resolved == 3 * kTrainersPerNode, fmt::format("{} plans resolved", resolved.load()));
  if (c.mpi.size() > 1) c.check(foreign > 0, "no plan held a foreign sample: the exchange was not exercised");
  c.check(cold_seen > 0, "no cold sample in any plan");
  if (c.mpi.size() > 1) c.check(foreign_cold > 0, "no foreign cold sample in any plan: no location crossed the wire");
  const auto n = exchange.counters();
  if (c.mpi.size() > 1) {
    c.check(n.asks_sent == 3 * kTrainersPerNode * (c.mpi.size() - 1),
            fmt::format("{} asks sent, expected one per plan per other owner", n.asks_sent));
    c.check(n.entries_received == foreign, fmt::format("{} entries received for {} foreign samples",
                                                       n.entries_received, foreign.load()));
  }
}

// Run on a worker thread while the main thread serves: `work` gets the exchange.
void with_worker(Checker& c, const Job& j, std::chrono::milliseconds timeout,
                 const std::function<void(MpiDirectoryExchange&)>& work, std::chrono::milliseconds serve_delay = 0ms) {
  MpiDirectoryExchange exchange(c.mpi, j.own, timeout);
  std::atomic<bool> done{false};
  std::thread worker([&] {
    work(exchange);
    done = true;
  });
  std::this_thread::sleep_for(serve_delay);  // an owner busy elsewhere: nothing is answered meanwhile
  serve_until(c.mpi, exchange, c, done);
  worker.join();
}

// A trainer's GetCatalog under owner-side metadata (decision 0066): every rank assembles the
// whole catalog from the shares at once, over the wire, and it serializes to the global
// catalog's bytes.
void check_catalog(Checker& c, const Job& j) {
  const Catalog files = Catalog::of_share({}, {}, j.catalog.class_names());
  with_worker(c, j, 60s, [&](MpiDirectoryExchange& exchange) {
    auto assembled = assemble_catalog(static_cast<std::uint32_t>(c.mpi.rank()), j.ownership, j.own, exchange, files);
    c.check(assembled.ok(), "assemble_catalog: " + (assembled.ok() ? std::string() : assembled.status().to_string()));
    if (assembled.ok()) {
      c.check(assembled->serialize() == j.catalog.serialize(),
              fmt::format("the assembled catalog of {} samples differs from the global one of {}", assembled->size(),
                          j.catalog.size()));
    }
  });
}

void check_failures(Checker& c, const Job& j) {
  const int me = c.mpi.rank(), n = c.mpi.size();
  if (n < 2) return;
  const auto next = static_cast<std::uint32_t>((me + 1) % n);
  const std::uint64_t past = j.ownership.owned_count(next);
  // An index past the owner's share: the owner answers with an error that names it and us.
  with_worker(c, j, 60s, [&](MpiDirectoryExchange& exchange) {
    std::vector<std::uint64_t> local{0, past};
    std::vector<SampleInfo> out(2);
    const DescribeRequest r{next, local, out};
    const Status s = exchange.describe(std::span(&r, 1));
    c.check(!s.ok(), "an index outside the owner's share was answered");
    c.check(s.message().find(fmt::format("owner daemon rank {}", next)) != std::string::npos &&
                s.message().find(fmt::format("daemon rank {} asked for index {}", me, past)) != std::string::npos,
            "out-of-share error: " + s.to_string());
  });
  // An owner declared dead: asks to it fail at once with the detector's reason.
  with_worker(c, j, 60s, [&](MpiDirectoryExchange& exchange) {
    exchange.fail_owner(next, make_error(StatusCode::kUnavailable, "peer daemon rank {} is dead", next));
    std::vector<std::uint64_t> local{0};
    std::vector<SampleInfo> out(1);
    const DescribeRequest r{next, local, out};
    const Status s = exchange.describe(std::span(&r, 1));
    c.check(!s.ok() && s.message().find(fmt::format("rank {} is dead", next)) != std::string::npos,
            "dead owner: " + s.to_string());
  });
  // Rank 1 serves nothing for 1.5 s; rank 0 gives up after 200 ms, naming rank 1, and the
  // late answer that arrives afterwards is dropped.
  with_worker(
      c, j, 200ms,
      [&](MpiDirectoryExchange& exchange) {
        if (me != 0) return;
        std::vector<std::uint64_t> local{0, 1};
        std::vector<SampleInfo> out(2);
        const DescribeRequest r{1, local, out};
        const Status s = exchange.describe(std::span(&r, 1));
        c.check(!s.ok() && s.message().find("within 200 ms from owner daemon rank(s) 1") != std::string::npos,
                "silent owner: " + s.to_string());
      },
      me == 1 ? 1500ms : 0ms);
}

}  // namespace
}  // namespace shardmix

int main(int argc, char** argv) {
  using namespace shardmix;
  MpiSession mpi(&argc, &argv);
  Checker c{mpi};
  const Job job = make_job(mpi.size(), mpi.rank());
  check_plans(c, job);
  check_catalog(c, job);
  check_failures(c, job);
  return mpi_check::verdict(c, "directory_mpitest");
}
