// shardmix-bench-plan-scaling: plan CPU per node per epoch as the cluster grows
// (docs/decisions/0040). For one node, "plan CPU" is the thread CPU time of computing all
// of its trainers' plans for one epoch from a fresh planner (so the epoch's O(P) tables
// are paid too), as a daemon does; the figure is the median over a few nodes spread over
// the job. Two series, each with the current planner (EpochPlanner::plan_trainer) next to
// the algorithm it replaced (a copy of the old node_streams, kept here as the baseline):
//  - weak scaling: P nodes at a fixed number of samples per node, P = 16 .. 1024;
//  - strong scaling: a fixed N, P = 16 .. 16384.
// The placement is built directly (node k owns a contiguous id range of its node_owned
// share), not with make_placement: the planner reads only Placement::owned, and
// make_placement's per-sample work at 100 M samples would dominate the run.
// Prints a table; the figures are for one thread on whatever machine runs it.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <span>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/command_line.h"
#include "common/epoch_plan.h"
#include "common/placement.h"
#include "common/rng.h"

namespace {

using shardmix::EpochPlanner;
using shardmix::JobShape;
using shardmix::PlanShape;
using shardmix::Placement;
using shardmix::Rng;
using shardmix::SampleId;
using shardmix::ShuffleConfig;
using shardmix::TrainerPlan;

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

Placement contiguous_placement(const PlanShape& shape) {
  Placement placement;
  placement.owned.resize(shape.job.nodes);
  SampleId next = 0;
  for (std::uint32_t k = 0; k < shape.job.nodes; ++k) {
    placement.owned[k].resize(shape.node_owned[k]);
    for (auto& id : placement.owned[k]) id = next++;
  }
  return placement;
}

// The planner before decision 0040, for one node: copies every node's owned list and
// permutes the whole pool (O(N) time and memory), then mixes and deals the node's samples.
std::vector<TrainerPlan> old_plan_node(const PlanShape& shape, const Placement& placement, const ShuffleConfig& shuffle,
                                       std::uint64_t epoch, std::uint32_t node) {
  const std::uint32_t nodes = shape.job.nodes;
  const double q = shuffle.exchange_fraction;
  std::vector<SampleId> stream;
  std::vector<SampleId> pool;
  pool.reserve(shape.num_samples);
  std::vector<std::uint64_t> kept(nodes, 0);
  for (std::uint32_t k = 0; k < nodes; ++k) {
    const auto& owned = placement.owned[k];
    kept[k] = shardmix::kept_count(shape.node_quota[k], q);
    if (kept[k] == 0) {
      pool.insert(pool.end(), owned.begin(), owned.end());
      continue;
    }
    std::vector<SampleId> mine(owned.begin(), owned.end());
    Rng rng = Rng::for_stream(shuffle.seed, {epoch, 1, k});
    for (std::uint64_t i = 0; i < kept[k]; ++i) std::swap(mine[i], mine[i + rng.below(mine.size() - i)]);
    if (k == node) stream.assign(mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(kept[k]));
    pool.insert(pool.end(), mine.begin() + static_cast<std::ptrdiff_t>(kept[k]), mine.end());
  }
  Rng pool_rng = Rng::for_stream(shuffle.seed, {epoch, 2});
  shardmix::shuffle(std::span<SampleId>(pool), pool_rng);
  std::uint64_t cursor = 0;
  for (std::uint32_t k = 0; k < nodes; ++k) {
    const std::uint64_t need = shape.node_quota[k] - kept[k];
    if (k == node) {
      stream.insert(stream.end(), pool.begin() + static_cast<std::ptrdiff_t>(cursor),
                    pool.begin() + static_cast<std::ptrdiff_t>(cursor + need));
    }
    cursor += need;
  }
  Rng node_rng = Rng::for_stream(shuffle.seed, {epoch, 3, node});
  shardmix::shuffle(std::span<SampleId>(stream), node_rng);
  std::vector<TrainerPlan> plans(shape.job.trainers_per_node);
  std::uint64_t begin = 0;
  for (std::uint32_t local = 0; local < shape.job.trainers_per_node; ++local) {
    const std::uint32_t trainer = shape.job.first_trainer_of_node(node) + local;
    const std::uint64_t quota = shape.trainer_quota[trainer];
    plans[local].order.assign(stream.begin() + static_cast<std::ptrdiff_t>(begin),
                              stream.begin() + static_cast<std::ptrdiff_t>(begin + quota));
    begin += quota;
    std::uint64_t b = 0;
    plans[local].batch_begin.push_back(0);
    for (std::uint64_t j = 0; j < shape.batches_per_trainer; ++j) {
      b += shape.batch_length(trainer, j);
      plans[local].batch_begin.push_back(b);
    }
  }
  return plans;
}

// `count` nodes spread evenly over [0, nodes).
std::vector<std::uint32_t> sample_nodes(std::uint32_t nodes, std::uint32_t count) {
  std::vector<std::uint32_t> out;
  count = std::min(count, nodes);
  for (std::uint32_t i = 0; i < count; ++i) {
    out.push_back(static_cast<std::uint32_t>(static_cast<std::uint64_t>(i) * nodes / count));
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Row {
  double new_cpu = 0;
  double spread_cpu = 0;  // the same planner reading spread ownership (a function, no lists)
  double old_cpu = 0;
  std::uint32_t old_nodes = 0;
  std::uint64_t checksum = 0;  // keeps the plans observable
};

// Median over `measured` nodes of the CPU time of all the node's trainers' plans of one
// epoch, each from a fresh planner (so the epoch's O(P) tables are paid in it).
double median_plan_cpu(const PlanShape& shape, const shardmix::Ownership& ownership, const ShuffleConfig& shuffle,
                       std::uint32_t measured, std::uint64_t& checksum) {
  std::vector<double> times;
  for (std::uint32_t node : sample_nodes(shape.job.nodes, measured)) {
    const EpochPlanner planner(shape, ownership, shuffle);
    const double start = thread_cpu_seconds();
    for (std::uint32_t local = 0; local < shape.job.trainers_per_node; ++local) {
      const TrainerPlan plan = planner.plan_trainer(1, shape.job.first_trainer_of_node(node) + local);
      checksum += plan.order.empty() ? 0 : plan.order.front();
    }
    times.push_back(thread_cpu_seconds() - start);
  }
  return median(times);
}

Row measure(std::uint64_t n, std::uint32_t nodes, std::uint32_t tpn, std::uint32_t batch, const ShuffleConfig& shuffle,
            std::uint32_t new_nodes, std::uint32_t old_nodes) {
  const PlanShape shape = shardmix::make_plan_shape(n, JobShape{nodes, tpn, batch, false});
  const Placement placement = contiguous_placement(shape);
  Row row;
  row.new_cpu = median_plan_cpu(shape, shardmix::ownership_of(placement), shuffle, new_nodes, row.checksum);
  row.spread_cpu = median_plan_cpu(shape, shardmix::Ownership::spread(n, shape.node_owned, shuffle.seed), shuffle,
                                   new_nodes, row.checksum);
  std::vector<double> times;
  for (std::uint32_t node : sample_nodes(nodes, old_nodes)) {
    const double start = thread_cpu_seconds();
    const auto plans = old_plan_node(shape, placement, shuffle, 1, node);
    times.push_back(thread_cpu_seconds() - start);
    row.checksum += plans.front().order.empty() ? 0 : plans.front().order.front();
  }
  row.old_cpu = median(times);
  row.old_nodes = static_cast<std::uint32_t>(times.size());
  return row;
}

void print_row(const char* series, std::uint32_t nodes, std::uint64_t n, std::uint32_t tpn, std::uint32_t new_nodes,
               const Row& row) {
  std::printf("%-7s %6u %12llu %10llu %12.6f %12.6f %12.6f %13.6f %8.1fx   %u/%u\n", series, nodes,
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(n / nodes), row.new_cpu,
              row.spread_cpu, row.old_cpu,
              row.old_cpu * tpn, row.new_cpu > 0 ? row.old_cpu / row.new_cpu : 0.0, std::min(new_nodes, nodes),
              row.old_nodes);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardmix-bench-plan-scaling: plan CPU per node per epoch, weak and strong scaling, new vs old planner"};
  std::uint64_t per_node = 100000;
  std::uint64_t strong_n = 100000000;
  std::uint32_t tpn = 8;
  std::uint32_t batch = 32;
  std::uint32_t new_nodes = 5;
  std::uint32_t old_nodes = 3;
  std::vector<std::uint32_t> weak_nodes{16, 64, 256, 1024};
  std::vector<std::uint32_t> strong_nodes{16, 256, 1024, 16384};
  ShuffleConfig shuffle;
  shuffle.seed = 1;
  shuffle.exchange_fraction = 1.0;
  app.add_option("--samples-per-node", per_node, "Weak scaling: samples per node");
  app.add_option("--strong-n", strong_n, "Strong scaling: total samples");
  app.add_option("--weak-nodes", weak_nodes, "Weak scaling: node counts");
  app.add_option("--strong-nodes", strong_nodes, "Strong scaling: node counts");
  app.add_option("--trainers-per-node", tpn, "Trainers per node");
  app.add_option("--batch", batch, "Micro-batch size");
  app.add_option("--exchange-fraction", shuffle.exchange_fraction, "shuffle.exchange_fraction (Q)");
  app.add_option("--nodes-measured", new_nodes, "Nodes timed per row, new planner (median reported)");
  app.add_option("--old-nodes-measured", old_nodes, "Nodes timed per row, old planner (it costs O(N) each)");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;

  std::printf("plan CPU seconds per node per epoch: thread CPU time of all %u trainers' plans of one node,\n"
              "median over the nodes timed; Q = %.3g, batch %u, drop_last = false, seed %llu.\n"
              "Placement built directly as contiguous id ranges per node (the planner reads only\n"
              "Placement::owned). new = EpochPlanner::plan_trainer (seeded bijections, decision 0040);\n"
              "spread = the same from Ownership::spread (dataset.placement = spread: the share is a\n"
              "function of the id, no lists read, decision 0055);\n"
              "old = the replaced node_streams algorithm (copies and permutes all N samples) run once for\n"
              "the node, timed on fewer nodes per row since each costs O(N) (last column: nodes timed\n"
              "new/old); the old scheduler ran it once per trainer (plan_of -> plan_node), which\n"
              "old_x_T_cpu_s shows (old_cpu_s x T, not timed separately). old/new = old_cpu_s / new_cpu_s.\n\n",
              tpn, shuffle.exchange_fraction, batch, static_cast<unsigned long long>(shuffle.seed));
  std::printf("%-7s %6s %12s %10s %12s %12s %12s %13s %9s   %s\n", "series", "P", "N", "N/P", "new_cpu_s",
              "spread_cpu_s", "old_cpu_s",
              "old_x_T_cpu_s", "old/new", "timed");
  double weak_first = 0, weak_last = 0, spread_first = 0, spread_last = 0;
  for (std::uint32_t nodes : weak_nodes) {
    const Row row = measure(per_node * nodes, nodes, tpn, batch, shuffle, new_nodes, old_nodes);
    print_row("weak", nodes, per_node * nodes, tpn, new_nodes, row);
    if (weak_first == 0) weak_first = row.new_cpu;
    weak_last = row.new_cpu;
    if (spread_first == 0) spread_first = row.spread_cpu;
    spread_last = row.spread_cpu;
  }
  for (std::uint32_t nodes : strong_nodes) {
    const Row row = measure(strong_n, nodes, tpn, batch, shuffle, new_nodes, old_nodes);
    print_row("strong", nodes, strong_n, tpn, new_nodes, row);
  }
  if (weak_first > 0) {
    std::printf("\nweak scaling, new planner: P = %u costs %.2fx P = %u per node\n", weak_nodes.back(),
                weak_last / weak_first, weak_nodes.front());
  }
  if (spread_first > 0) {
    std::printf("weak scaling, spread ownership: P = %u costs %.2fx P = %u per node\n", weak_nodes.back(),
                spread_last / spread_first, weak_nodes.front());
  }
  return 0;
}
