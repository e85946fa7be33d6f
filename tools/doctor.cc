// shardmix-doctor: what the peer path would run on this machine, and whether it works.
//   shardmix-doctor [--config FILE] [--set fabric.provider=...] [--provider NAME]...
//                   [--probe-mib N] [--json]
// Lists the libfabric providers offering FI_EP_RDM with RMA reads (with what fi_getinfo
// reports for each) and the RDMA devices rdma-core sees, says which provider a job with
// the config would open and why (the daemon's own choice code), then runs a loopback
// self-test (register, fi_read back, compare) and a bandwidth probe through the daemon's
// fabric code on each chosen provider (default: every one listed).
// Exit status: 0 when every self-test passed, 1 when one failed (or none could run),
// 2 on a bad config or argument.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/huge_pages.h"
#include "common/command_line.h"
#include "common/config.h"
#include "fabric/fabric.h"
#include "fabric/loopback.h"

namespace {

using shardmix::fabric::LoopbackReport;
using shardmix::fabric::ProviderReport;

// Read sizes of the bandwidth probe.
constexpr std::size_t kProbeSizes[] = {4096, 65536, 1 << 20};

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string json_strings(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i > 0 ? "," : "") + json_string(items[i]);
  return out + "]";
}

std::string provider_json(const ProviderReport& r) {
  return fmt::format(
      "{{\"provider\":{},\"fabric\":{},\"domain\":{},\"mr_mode\":{},\"mode\":{},\"max_msg_size\":{},"
      "\"tx_size\":{},\"rx_size\":{},\"iov_limit\":{},\"rma_iov_limit\":{},\"mr_key_size\":{},\"threading\":{},"
      "\"data_progress\":{},\"control_progress\":{}}}",
      json_string(r.prov_name), json_string(r.fabric_name), json_string(r.domain_name),
      json_string(shardmix::fabric::mr_mode_names(r.mr_mode)), json_string(shardmix::fabric::mode_names(r.mode)),
      r.max_msg_size, r.tx_size, r.rx_size, r.iov_limit, r.rma_iov_limit, r.mr_key_size, json_string(r.threading),
      json_string(r.data_progress), json_string(r.control_progress));
}

void print_provider(const ProviderReport& r) {
  fmt::print("  {} fabric {} domain {}\n", r.prov_name, r.fabric_name, r.domain_name);
  fmt::print("    mr_mode {}; mode {}\n", shardmix::fabric::mr_mode_names(r.mr_mode),
             shardmix::fabric::mode_names(r.mode));
  fmt::print("    max_msg_size {}, tx size {}, rx size {}, iov_limit {}, rma_iov_limit {}, mr_key_size {}\n",
             r.max_msg_size, r.tx_size, r.rx_size, r.iov_limit, r.rma_iov_limit, r.mr_key_size);
  fmt::print("    threading {}, data progress {}, control progress {}\n", r.threading, r.data_progress,
             r.control_progress);
}

// One self-test's outcome, for both output forms.
struct SelfTest {
  std::string requested;  // the provider name given to FabricOptions
  shardmix::Result<LoopbackReport> result;
};

std::string self_test_json(const SelfTest& test) {
  if (!test.result.ok()) {
    return fmt::format("{{\"requested\":{},\"passed\":false,\"error\":{}}}", json_string(test.requested),
                       json_string(test.result.status().to_string()));
  }
  const LoopbackReport& r = *test.result;
  std::string bandwidth = "[";
  for (std::size_t i = 0; i < r.bandwidth.size(); ++i) {
    const auto& b = r.bandwidth[i];
    bandwidth += fmt::format("{}{{\"read_bytes\":{},\"total_bytes\":{},\"seconds\":{:.6f},\"gb_per_s\":{:.3f}}}",
                             i > 0 ? "," : "", b.read_bytes, b.total_bytes, b.seconds, b.gigabytes_per_second());
  }
  bandwidth += "]";
  return fmt::format(
      "{{\"requested\":{},\"passed\":true,\"provider\":{},\"domain\":{},\"granted_mr_mode\":{},"
      "\"reads_checked\":{},\"bytes_checked\":{},\"bandwidth\":{}}}",
      json_string(test.requested), json_string(r.provider_name), json_string(r.domain_name),
      json_string(shardmix::fabric::mr_mode_names(r.granted_mr_mode)), r.reads_checked, r.bytes_checked, bandwidth);
}

void print_self_test(const SelfTest& test) {
  if (!test.result.ok()) {
    fmt::print("  {}: FAILED: {}\n", test.requested, test.result.status().to_string());
    return;
  }
  const LoopbackReport& r = *test.result;
  fmt::print("  {}: passed on {} domain {} (mr_mode granted {}): {} reads, {} bytes compared\n", test.requested,
             r.provider_name, r.domain_name, shardmix::fabric::mr_mode_names(r.granted_mr_mode), r.reads_checked,
             r.bytes_checked);
  for (const auto& b : r.bandwidth) {
    fmt::print("    {:>8} B reads: {:.2f} GB/s ({} MiB in {:.3f} s)\n", b.read_bytes, b.gigabytes_per_second(),
               b.total_bytes >> 20, b.seconds);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardmix-doctor: libfabric providers, RDMA devices, provider choice and a loopback fi_read test"};
  std::string config_file;
  std::vector<std::string> sets;
  std::vector<std::string> providers_to_test;
  std::size_t probe_mib = 64;
  bool json = false;
  app.add_option("-c,--config", config_file, "TOML config file, as shardmixd takes it");
  app.add_option("--set", sets, "Override a key: --set section.key=value (repeatable)");
  app.add_option("--provider", providers_to_test,
                 "Self-test this provider (a fabric.provider value; repeatable). Default: every one listed");
  app.add_option("--probe-mib", probe_mib, "MiB read at each size by the bandwidth probe; 0 = no probe");
  app.add_flag("--json", json, "One JSON object on stdout instead of text");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;

  // Only [fabric] matters here; without a config file the one required key of a daemon
  // (dataset.path) gets a placeholder so that the defaults load.
  if (config_file.empty()) sets.insert(sets.begin(), "dataset.path=unused-by-shardmix-doctor");
  auto config = shardmix::load_config(config_file, shardmix::environment_map(), sets);
  if (!config.ok()) {
    std::fprintf(stderr, "shardmix-doctor: %s\n", config.status().to_string().c_str());
    return 2;
  }
  // A loopback test on one host: keep tcp on loopback, as shardmixd does when every
  // daemon runs on one host (a caller's FI_TCP_IFACE wins).
  ::setenv("FI_TCP_IFACE", "lo", 0);

  const shardmix::fabric::FabricOptions job_options = shardmix::fabric::fabric_options_from(config->fabric);
  const std::vector<ProviderReport> providers = shardmix::fabric::query_rdm_rma_providers("", std::nullopt);
  const std::vector<std::string> devices = shardmix::fabric::rdma_device_names();
  const auto choice = shardmix::fabric::choose_provider_for(job_options);
  const std::vector<ProviderReport> chosen_offers =
      choice.ok() ? shardmix::fabric::query_rdm_rma_providers(choice->prov_name, std::nullopt)
                  : std::vector<ProviderReport>{};

  if (providers_to_test.empty()) {
    for (const ProviderReport& p : providers) {
      if (std::find(providers_to_test.begin(), providers_to_test.end(), p.prov_name) == providers_to_test.end()) {
        providers_to_test.push_back(p.prov_name);
      }
    }
  }
  std::vector<SelfTest> tests;
  std::vector<std::size_t> sizes;
  if (probe_mib > 0) sizes.assign(std::begin(kProbeSizes), std::end(kProbeSizes));
  bool all_passed = !providers_to_test.empty();
  for (const std::string& name : providers_to_test) {
    shardmix::fabric::FabricOptions options = job_options;
    options.provider = name;
    tests.push_back({name, shardmix::fabric::run_loopback(options, sizes, probe_mib << 20)});
    all_passed = all_passed && tests.back().result.ok();
  }

  const std::string huge_pages = shardmix::shmem_huge_page_setting();
  if (json) {
    std::string out = "{\"providers\":[";
    for (std::size_t i = 0; i < providers.size(); ++i) out += (i > 0 ? "," : "") + provider_json(providers[i]);
    out += "],\"rdma_devices\":" + json_strings(devices);
    out += ",\"shmem_huge_pages\":" + json_string(huge_pages);
    if (choice.ok()) {
      out += fmt::format(",\"choice\":{{\"fabric.provider\":{},\"provider\":{},\"reason\":{},\"warning\":{},"
                         "\"available\":{}}}",
                         json_string(job_options.provider), json_string(choice->prov_name),
                         json_string(choice->reason), json_string(choice->warning),
                         chosen_offers.empty() ? "false" : "true");
    } else {
      out += ",\"choice\":{\"error\":" + json_string(choice.status().to_string()) + "}";
    }
    out += ",\"self_tests\":[";
    for (std::size_t i = 0; i < tests.size(); ++i) out += (i > 0 ? "," : "") + self_test_json(tests[i]);
    out += fmt::format("],\"passed\":{}}}\n", all_passed ? "true" : "false");
    std::fputs(out.c_str(), stdout);
    return all_passed ? 0 : 1;
  }

  fmt::print("libfabric providers with FI_EP_RDM and RMA reads ({}):\n", providers.size());
  if (providers.empty()) fmt::print("  none\n");
  for (const ProviderReport& p : providers) print_provider(p);
  if (devices.empty()) {
    fmt::print("RDMA devices (rdma-core, ibv_get_device_list): none\n");
  } else {
    fmt::print("RDMA devices (rdma-core, ibv_get_device_list): {}\n", fmt::join(devices, ", "));
  }
  if (choice.ok()) {
    fmt::print("A job with fabric.provider = \"{}\" opens {}: {}\n", job_options.provider, choice->prov_name,
               choice->reason);
    if (!choice->warning.empty()) fmt::print("  warning: {}\n", choice->warning);
    if (chosen_offers.empty()) fmt::print("  but fi_getinfo offers no FI_EP_RDM endpoint with RMA reads for it\n");
  } else {
    fmt::print("Provider choice failed: {}\n", choice.status().to_string());
  }
  fmt::print("Huge pages for shared memory (checkpoint pool and leases): shmem_enabled = {}{}\n",
             huge_pages.empty() ? "unknown (no /sys/kernel/mm/transparent_hugepage/shmem_enabled)" : huge_pages,
             huge_pages == "never" || huge_pages == "deny"
                 ? "; \"advise\" lets checkpoints use 2 MiB pages (docs/operations.md, \"Huge pages\")"
                 : "");
  fmt::print("Loopback self-test{}:\n", probe_mib > 0 ? fmt::format(" and {} MiB bandwidth probe", probe_mib) : "");
  if (tests.empty()) fmt::print("  no provider to test: FAILED\n");
  for (const SelfTest& test : tests) print_self_test(test);
  return all_passed ? 0 : 1;
}
