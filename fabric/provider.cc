#include "fabric/provider.h"

#include <infiniband/verbs.h>

#include <algorithm>

#include <fmt/format.h>

namespace shardmix::fabric {
namespace {

// "tcp;ofi_rxm" -> "tcp": the core provider is what decides how its CQ can wait.
std::string_view core_provider(std::string_view prov_name) {
  return prov_name.substr(0, prov_name.find(';'));
}

}  // namespace

Result<std::string> resolve_provider_name(std::string_view requested, int rdma_device_count) {
  if (requested.empty()) {
    return make_error(StatusCode::kInvalidArgument,
                      "fabric.provider is empty; use auto, tcp, verbs, shm or a libfabric provider name");
  }
  if (requested == "auto") return std::string(rdma_device_count > 0 ? "verbs;ofi_rxm" : "tcp;ofi_rxm");
  if (requested == "tcp") return std::string("tcp;ofi_rxm");
  if (requested == "verbs") return std::string("verbs;ofi_rxm");
  return std::string(requested);
}

Result<ProviderChoice> choose_provider(std::string_view requested, int rdma_device_count,
                                       const ProviderUsable& usable) {
  SHARDMIX_ASSIGN_OR_RETURN(std::string prov_name, resolve_provider_name(requested, rdma_device_count));
  ProviderChoice choice;
  if (requested != "auto") {
    choice.reason = fmt::format("fabric.provider = \"{}\" names it; no fallback", requested);
  } else if (rdma_device_count == 0) {
    choice.reason = "fabric.provider = \"auto\" and rdma-core sees no RDMA device";
  } else if (usable(prov_name)) {
    choice.reason = fmt::format("fabric.provider = \"auto\" and rdma-core sees {} RDMA device(s)", rdma_device_count);
  } else {
    const std::string fallback = "tcp;ofi_rxm";
    choice.reason = fmt::format("fabric.provider = \"auto\": rdma-core sees {} RDMA device(s) but libfabric's {} "
                                "offers no FI_EP_RDM endpoint with RMA reads",
                                rdma_device_count, prov_name);
    choice.warning = fmt::format("{} RDMA device(s) present but {} is unusable; falling back to {} (set "
                                 "fabric.provider = \"verbs\" to fail instead)",
                                 rdma_device_count, prov_name, fallback);
    prov_name = fallback;
  }
  choice.prov_name = std::move(prov_name);
  return choice;
}

std::vector<std::string> rdma_device_names() {
  std::vector<std::string> names;
  int count = 0;
  // Returns nullptr (errno ENOSYS) when the kernel has no verbs support: that is "no devices".
  ibv_device** devices = ibv_get_device_list(&count);
  if (devices == nullptr) return names;
  for (int i = 0; i < count; ++i) {
    const char* name = ibv_get_device_name(devices[i]);
    names.emplace_back(name != nullptr ? name : "?");
  }
  ibv_free_device_list(devices);
  return names;
}

int count_rdma_devices() { return static_cast<int>(rdma_device_names().size()); }

CqWaitMode cq_wait_mode_for(std::string_view returned_prov_name) {
  const std::string_view core = core_provider(returned_prov_name);
  if (core == "tcp" || core == "net" || core == "verbs") return CqWaitMode::kBlockingSread;
  return CqWaitMode::kPollWithBackoff;
}

std::size_t read_segments_for(std::string_view returned_prov_name, std::size_t configured, std::size_t cap,
                              std::size_t iov_limit, std::size_t rma_iov_limit) {
  if (core_provider(returned_prov_name) == "shm") return 1;
  const std::size_t limit = std::min({configured, cap, iov_limit, rma_iov_limit});
  return std::max<std::size_t>(limit, 1);
}

}  // namespace shardmix::fabric
