// shardmix-stat: asks a running shardmixd for its counters (GetStats on its trainer
// socket) and prints a human summary, or the raw Prometheus text with --prometheus.
//   shardmix-stat [--run-dir DIR] [--daemon N] [--prometheus]
// Without --daemon it asks the first daemon on this host (RUN_DIR/ready). Rank 0's reply
// also holds the whole job's latest complete epoch.
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "client/client.h"
#include "common/command_line.h"

namespace {

// name{labels} -> value, from Prometheus text (comments skipped).
std::map<std::string, double> parse_prometheus(const std::string& text, std::map<std::string, std::string>& info) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const std::size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    const std::string key = line.substr(0, space);
    const std::string value = line.substr(space + 1);
    out[key] = value == "NaN" ? std::nan("") : std::strtod(value.c_str(), nullptr);
    if (key.rfind("shardmix_info{", 0) == 0) {
      // labels: a="b",c="d"
      std::string labels = key.substr(14, key.size() - 15);
      std::size_t pos = 0;
      while (pos < labels.size()) {
        const std::size_t eq = labels.find('=', pos);
        if (eq == std::string::npos || eq + 1 >= labels.size()) break;
        const std::size_t end = labels.find('"', eq + 2);
        if (end == std::string::npos) break;
        info[labels.substr(pos, eq - pos)] = labels.substr(eq + 2, end - eq - 2);
        pos = end + 2;
      }
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardmix-stat: a running ShardMix daemon's counters, as a summary or Prometheus text"};
  std::string run_dir;
  int daemon = -1;
  bool prometheus = false;
  double timeout = 10;
  app.add_option("--run-dir", run_dir, "The daemons' run dir (default $SHARDMIX_RUN_DIR, else /tmp/shardmix-<uid>)");
  app.add_option("--daemon", daemon, "Ask the daemon of this node (default: the first on this host)");
  app.add_flag("--prometheus", prometheus, "Print the Prometheus text exposition as the daemon sent it");
  app.add_option("--timeout", timeout, "Seconds to wait for the daemon")->check(CLI::PositiveNumber);
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;

  shardmix::ClientOptions options;
  options.run_dir = run_dir;
  options.ready_timeout_s = timeout;
  options.receive_timeout_s = timeout;
  auto text = shardmix::query_daemon_stats(options, daemon);
  if (!text.ok()) {
    std::fprintf(stderr, "shardmix-stat: %s\n", text.status().to_string().c_str());
    return 1;
  }
  if (prometheus) {
    std::fputs(text->c_str(), stdout);
    return 0;
  }
  std::map<std::string, std::string> info;
  const auto m = parse_prometheus(*text, info);
  auto get = [&](const std::string& name, const std::string& labels = {}) {
    for (const auto& [key, value] : m) {
      if (key.rfind(name + "{", 0) == 0 && (labels.empty() || key.find(labels) != std::string::npos)) return value;
    }
    return std::nan("");
  };
  const double local = get("shardmix_samples_total", "tier=\"local\"");
  const double peer = get("shardmix_samples_total", "tier=\"peer\"");
  const double storage = get("shardmix_samples_total", "tier=\"storage\"");
  const double total = local + peer + storage;
  const double pct = total > 0 ? 100 / total : std::nan("");
  std::string node_label;
  for (const auto& [key, value] : m) {
    const std::size_t at = key.find("node=\"");
    if (at != std::string::npos) {
      node_label = key.substr(at + 6, key.find('"', at + 6) - at - 6);
      break;
    }
  }
  fmt::print("shardmixd node {} of {} on {} (provider {}, {} trainers per node): {}, {:.0f} trainer(s) connected\n",
             node_label, info["nodes"], info["host"], info["provider"], info["trainers_per_node"],
             get("shardmix_serving") > 0 ? "serving" : "not serving", get("shardmix_trainers_connected"));
  fmt::print("  cache:     {:.0f} of {:.0f} samples, {:.1f} of {:.1f} MB loaded in {:.2f} s\n",
             get("shardmix_load_samples"), get("shardmix_load_samples_target"), get("shardmix_load_bytes") / 1e6,
             get("shardmix_load_bytes_target") / 1e6, get("shardmix_load_seconds"));
  fmt::print("  delivered: {:.0f} samples (local {:.1f}%, peer {:.1f}%, storage {:.1f}%), {:.1f} MB, {:.0f} batches, "
             "{:.0f} trainer-epochs\n",
             total, local * pct, peer * pct, storage * pct, get("shardmix_bytes_total") / 1e6,
             get("shardmix_batches_total"), get("shardmix_trainer_epochs_total"));
  fmt::print("  waiting:   trainers stalled {:.2f} s in all; batches waited {:.2f} s on peer reads; {:.0f} errors, "
             "{:.0f} samples substituted (window)\n",
             get("shardmix_trainer_stall_seconds_total"), get("shardmix_fetch_wait_seconds_total"),
             get("shardmix_errors_total"), get("shardmix_substituted_samples_total"));
  if (!std::isnan(get("shardmix_last_epoch"))) {
    fmt::print("  last pass: epoch {:.0f}, Q {:.2f}, label entropy mean {:.3f} p5 {:.3f}, affinity {:.3f}\n",
               get("shardmix_last_epoch"), get("shardmix_last_exchange_fraction"),
               get("shardmix_last_label_entropy_mean"), get("shardmix_last_label_entropy_p5"),
               get("shardmix_last_affinity"));
  }
  if (!std::isnan(get("shardmix_checkpoint_ram_bytes"))) {
    const double drain_s = get("shardmix_checkpoint_drain_seconds_total");
    const double saves = get("shardmix_checkpoint_saves_total");
    fmt::print("  checkpoints: {:.1f} MB in RAM, {:.1f} MB not yet durable, {:.1f} MB drained ({} MB/s while "
               "writing), {:.0f} failed writes; {:.0f} saves, {:.3f} s each on average, {:.0f} waiting for room\n",
               get("shardmix_checkpoint_ram_bytes") / 1e6, get("shardmix_checkpoint_waiting_bytes") / 1e6,
               get("shardmix_checkpoint_drained_bytes_total") / 1e6,
               drain_s > 0 ? fmt::format("{:.1f}", get("shardmix_checkpoint_drained_bytes_total") / 1e6 / drain_s)
                           : std::string("-"),
               get("shardmix_checkpoint_drain_failures_total"), saves,
               saves > 0 ? get("shardmix_checkpoint_save_seconds_total") / saves : 0.0,
               get("shardmix_checkpoint_saves_waiting_for_room"));
  }
  if (!std::isnan(get("shardmix_checkpoint_pool_capacity_bytes"))) {
    // Overflows are the versions (trainers' saves, peers' replicas) that paid for fresh pages
    // (decision 0068): shown under the save times they may explain, with their share.
    const double pooled = get("shardmix_checkpoint_pool_buffers_total");
    const double overflows = get("shardmix_checkpoint_pool_overflows_total");
    fmt::print("  checkpoint pool: {:.1f} of {:.1f} MB in use, {:.1f} MB prefaulted; {:.0f} versions in reused "
               "pages, {:.0f} overflows ({} of versions) into {:.1f} MB of fresh pages\n",
               get("shardmix_checkpoint_pool_in_use_bytes") / 1e6, get("shardmix_checkpoint_pool_capacity_bytes") / 1e6,
               get("shardmix_checkpoint_pool_prefaulted_bytes") / 1e6, pooled, overflows,
               pooled + overflows > 0 ? fmt::format("{:.1f}%", 100 * overflows / (pooled + overflows))
                                      : std::string("-"),
               get("shardmix_checkpoint_pool_overflow_bytes_total") / 1e6);
  }
  if (!std::isnan(get("shardmix_job_epoch"))) {
    fmt::print("  job:       epoch {:.0f}: {:.0f} samples/s, {:.3f} GB/s, trainers stalled {:.1f}% of the time, "
               "label entropy mean {:.3f} p5(min) {:.3f}, affinity {:.3f}\n",
               get("shardmix_job_epoch"), get("shardmix_job_samples_per_second"),
               get("shardmix_job_bytes_per_second") / 1e9, 100 * get("shardmix_job_stall_fraction"),
               get("shardmix_job_label_entropy_mean"), get("shardmix_job_label_entropy_p5_min"),
               get("shardmix_job_affinity"));
  }
  return 0;
}
