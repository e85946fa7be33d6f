#include "fabric/provider.h"

#include <infiniband/verbs.h>

#include <algorithm>

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

int count_rdma_devices() {
  int count = 0;
  // Returns nullptr (errno ENOSYS) when the kernel has no verbs support: that is "no devices".
  ibv_device** devices = ibv_get_device_list(&count);
  if (devices == nullptr) return 0;
  ibv_free_device_list(devices);
  return count;
}

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
