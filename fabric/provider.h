// Pure decisions about libfabric providers, kept apart from Fabric so they can be
// unit-tested without a network: which provider string to ask fi_getinfo for, and how
// the progress thread may sleep on a provider's completion queue.
// Thread-safety: free functions without shared state.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace shardmix::fabric {

// Maps FabricOptions::provider to the prov_name passed to fi_getinfo:
//   "auto"  -> "verbs;ofi_rxm" if rdma_device_count > 0, else "tcp;ofi_rxm"
//   "tcp"   -> "tcp;ofi_rxm"     (plain tcp has no FI_EP_RDM; rxm layers it)
//   "verbs" -> "verbs;ofi_rxm"
//   anything else (e.g. "shm", "efa", "tcp;ofi_rxm") is passed through unchanged.
// An empty string is an invalid argument.
Result<std::string> resolve_provider_name(std::string_view requested, int rdma_device_count);

// Which prov_name a job asks fi_getinfo for, and why (shardmix-doctor prints both).
struct ProviderChoice {
  std::string prov_name;  // e.g. "tcp;ofi_rxm"
  std::string reason;     // one sentence: the config value and what decided it
  std::string warning;    // non-empty when "auto" fell back from a present but unusable verbs
};

// Whether fi_getinfo offers an FI_EP_RDM endpoint with RMA reads for a prov_name.
using ProviderUsable = std::function<bool(const std::string& prov_name)>;

// resolve_provider_name, plus the fallback: under "auto" with RDMA devices present, a
// verbs;ofi_rxm that `usable` rejects (no usable port, rdma-core without the provider,
// a libfabric built without verbs) falls back to tcp;ofi_rxm with a warning. A provider
// the config names ("verbs" included) never falls back: Fabric::create then fails and
// names it (docs/decisions/0049). `usable` is asked only in that one case.
Result<ProviderChoice> choose_provider(std::string_view requested, int rdma_device_count,
                                       const ProviderUsable& usable);

// Names of the RDMA devices rdma-core sees (ibv_get_device_list), e.g. "mlx5_0"; empty
// when there are none or the verbs stack is unusable.
std::vector<std::string> rdma_device_names();
// rdma_device_names().size().
int count_rdma_devices();

// How the progress thread idles on a provider's CQ.
enum class CqWaitMode {
  // CQ opened with wait_obj=FI_WAIT_UNSPEC; sleep in fi_cq_sread with a short timeout,
  // woken early by fi_cq_signal when a read is queued. Measured to run at full speed
  // on tcp/net on the development machine; verbs wakes on its completion channel.
  kBlockingSread,
  // CQ opened with FI_WAIT_NONE; poll fi_cq_read with exponential backoff. Required for
  // shm, whose fi_cq_sread ignores its timeout and never returns; the safe default for
  // providers we have not measured.
  kPollWithBackoff,
};

// Decides from the prov_name fi_getinfo returned (e.g. "tcp;ofi_rxm", "shm").
CqWaitMode cq_wait_mode_for(std::string_view returned_prov_name);

// Segments one vectored read may carry on a provider: the smallest of `configured`
// (fabric.max_read_segments), `cap` and the provider's local and remote iov limits (a
// segment needs one of each), at least 1. shm gets 1: its fast path (the reader copies
// with one process_vm_readv under the target's lock) takes only reads with one remote
// segment; any more go through the target's progress thread, which measured 2.4x slower
// with 3.1x the fabric thread's CPU on the delivery benchmark (docs/decisions/0031).
std::size_t read_segments_for(std::string_view returned_prov_name, std::size_t configured, std::size_t cap,
                              std::size_t iov_limit, std::size_t rma_iov_limit);

}  // namespace shardmix::fabric
