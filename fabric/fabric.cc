#include "fabric/fabric.h"

#include <sys/random.h>

#include <sys/prctl.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <utility>

#include <fmt/ranges.h>

#include "common/log.h"
#include "fabric/endpoint_blob.h"
#include "fabric/provider.h"
#include "fabric/resource_wrapper.h"

namespace shardmix::fabric {
namespace {

// The API version we speak; matches the build's minimum (libfabric >= 1.14 in CMake).
// Everything used here (mr_mode bits, FI_CONTEXT2, fi_cq_signal) is older than that.
constexpr std::uint32_t kFabricApiVersion = FI_VERSION(1, 14);

// The portable MR mode set (what verbs/efa ask for). Whatever subset the provider returns
// is honoured: FI_MR_VIRT_ADDR decides the remote address, FI_MR_ENDPOINT adds bind+enable,
// FI_MR_LOCAL makes local descriptors mandatory, FI_MR_PROV_KEY makes fi_mr_key() the only
// source of keys (we always use it).
constexpr int kRequestedMrMode =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

// Completions taken per fi_cq_read call.
constexpr std::size_t kCqBatch = 16;
// kBlockingSread: the longest the progress thread sleeps in fi_cq_sread. Incoming
// traffic and fi_cq_signal wake it earlier; the timeout bounds how long provider work
// that raises no event (e.g. rxm's deferred sends) waits for the next progress call.
constexpr int kSreadTimeoutMs = 10;
// kPollWithBackoff: idle sleeps double from the minimum to the maximum, reset on activity.
constexpr auto kMinIdleBackoff = std::chrono::microseconds(20);
constexpr auto kMaxIdleBackoff = std::chrono::microseconds(1000);
// stop_progress waits this long for reads already handed to the provider.
constexpr auto kStopDrainTimeout = std::chrono::seconds(5);

Status fi_error(const char* call, int rc) {
  return make_error(StatusCode::kUnavailable, "{} failed: {} ({})", call, fi_strerror(-rc), rc);
}

// The hints every query uses; `prov_name` may be empty (any provider).
FiInfoPtr make_hints(const std::string& prov_name, std::optional<int> mr_mode = std::nullopt) {
  FiInfoPtr hints(fi_allocinfo());
  if (!hints) return hints;
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA | FI_READ | FI_REMOTE_READ;
  // Every op context points at a struct fi_context2 we own, so providers that need
  // scratch space in it may use it.
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = mr_mode.value_or(kRequestedMrMode);
  // Producers call fi_cq_signal from their own threads while the progress thread sits in
  // fi_cq_sread; FI_THREAD_SAFE makes that legal (tcp;ofi_rxm and shm default to it anyway).
  hints->domain_attr->threading = FI_THREAD_SAFE;
  if (!prov_name.empty()) hints->fabric_attr->prov_name = strdup(prov_name.c_str());
  return hints;
}

// "tcp;ofi_rxm (eth0, lo), shm (shm)": what this machine offers, for error messages.
std::string describe_rdm_rma_providers() {
  std::vector<std::pair<std::string, std::set<std::string>>> providers;
  for (const ProviderReport& report : query_rdm_rma_providers("", std::nullopt)) {
    auto it = std::find_if(providers.begin(), providers.end(),
                           [&](const auto& p) { return p.first == report.prov_name; });
    if (it == providers.end()) it = providers.insert(providers.end(), {report.prov_name, {}});
    it->second.insert(report.domain_name);
  }
  if (providers.empty()) return "none";
  std::string out;
  for (const auto& [prov, domains] : providers) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} ({})", prov, fmt::join(domains, ", "));
  }
  return out;
}

// "name|name" of the bits of `value` that `names` knows, or "none".
template <typename Bits>
std::string bit_names(Bits value, std::initializer_list<std::pair<Bits, const char*>> names) {
  std::string out;
  for (const auto& [bit, name] : names) {
    if ((value & bit) == 0) continue;
    if (!out.empty()) out += '|';
    out += name;
  }
  return out.empty() ? "none" : out;
}

// fi_tostr's name of an enum value (its buffer is static: copied at once).
std::string enum_name(const void* value, fi_type type) {
  const char* text = fi_tostr(value, type);
  return text != nullptr ? text : "?";
}

bool names_match(const char* name, const std::string& wanted) { return name != nullptr && wanted == name; }

// A read as queued by read() or read_many(): everything the progress thread needs to
// post it, as one fi_read (one segment) or one fi_readmsg (several).
struct ReadRequest {
  int peer = -1;
  std::array<ReadSegment, kMaxReadSegments> segments{};
  std::size_t segment_count = 0;
  std::uint8_t* local_base = nullptr;
  void* local_desc = nullptr;
  ReadCallback done;
  // A failure detector heartbeat (Fabric::heartbeat_read): goes to the front of its peer's
  // queue and is not held by max_outstanding_reads, so it never waits behind data reads.
  bool priority = false;
  // Set by read_region(): the peer's offered region to read instead of its exposed arena.
  std::optional<RemoteRegion> offered;
  // Set when read() already knows the read cannot run; delivered on the progress thread
  // so callbacks never run on the caller's stack (a caller may hold its own locks).
  Status rejection;

  std::size_t length() const {
    std::size_t total = 0;
    for (std::size_t i = 0; i < segment_count; ++i) total += segments[i].length;
    return total;
  }
  std::uint64_t remote_offset() const { return segment_count > 0 ? segments[0].remote_offset : 0; }
  // "117 bytes at offset 4096", or "3 segments, 9000 bytes, the first at offset 4096".
  std::string describe() const {
    if (segment_count <= 1) return fmt::format("{} bytes at offset {}", length(), remote_offset());
    return fmt::format("{} segments, {} bytes, the first at offset {}", segment_count, length(), remote_offset());
  }
};

// A peer as connect_peers learnt it from its blob.
struct PeerRegion {
  fi_addr_t address = FI_ADDR_NOTAVAIL;
  std::uint64_t region_address = 0;  // fi_read's `addr` for offset 0
  std::uint64_t region_key = 0;
  std::uint64_t region_length = 0;
};

enum class ProgressState { kNotStarted, kRunning, kStopped };

// The op_context of one posted fi_read. fi_context2 comes first so the pointer the CQ
// returns is this struct's address; `slot` then names the in-flight entry.
struct OpContext {
  fi_context2 provider_scratch;
  std::size_t slot = 0;
};

// A posted read and what it counts against.
struct InflightRead {
  ReadRequest request;
  bool busy = false;
  // Posted before its peer was failed (fail_peer): still with the provider, but no
  // longer counted against max_outstanding_reads.
  bool to_failed_peer = false;
};

}  // namespace

std::string mr_mode_names(int mr_mode) {
  return bit_names<int>(mr_mode, {{FI_MR_LOCAL, "FI_MR_LOCAL"},
                                  {FI_MR_RAW, "FI_MR_RAW"},
                                  {FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"},
                                  {FI_MR_ALLOCATED, "FI_MR_ALLOCATED"},
                                  {FI_MR_PROV_KEY, "FI_MR_PROV_KEY"},
                                  {FI_MR_MMU_NOTIFY, "FI_MR_MMU_NOTIFY"},
                                  {FI_MR_RMA_EVENT, "FI_MR_RMA_EVENT"},
                                  {FI_MR_ENDPOINT, "FI_MR_ENDPOINT"},
                                  {FI_MR_HMEM, "FI_MR_HMEM"}});
}

std::string mode_names(std::uint64_t mode) {
  return bit_names<std::uint64_t>(mode, {{FI_CONTEXT, "FI_CONTEXT"},
                                         {FI_CONTEXT2, "FI_CONTEXT2"},
                                         {FI_MSG_PREFIX, "FI_MSG_PREFIX"},
                                         {FI_ASYNC_IOV, "FI_ASYNC_IOV"},
                                         {FI_RX_CQ_DATA, "FI_RX_CQ_DATA"},
                                         {FI_LOCAL_MR, "FI_LOCAL_MR"},
                                         {FI_NOTIFY_FLAGS_ONLY, "FI_NOTIFY_FLAGS_ONLY"},
                                         {FI_RESTRICTED_COMP, "FI_RESTRICTED_COMP"},
                                         {FI_BUFFERED_RECV, "FI_BUFFERED_RECV"}});
}

std::vector<ProviderReport> query_rdm_rma_providers(const std::string& prov_name, std::optional<int> mr_mode) {
  std::vector<ProviderReport> reports;
  FiInfoPtr hints = make_hints(prov_name, mr_mode);
  fi_info* list = nullptr;
  if (!hints || fi_getinfo(kFabricApiVersion, nullptr, nullptr, 0, hints.get(), &list) != 0 || list == nullptr) {
    return reports;
  }
  FiInfoPtr owner(list);
  for (const fi_info* info = list; info != nullptr; info = info->next) {
    ProviderReport& r = reports.emplace_back();
    r.prov_name = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : "?";
    r.fabric_name = info->fabric_attr->name ? info->fabric_attr->name : "?";
    r.domain_name = info->domain_attr->name ? info->domain_attr->name : "?";
    r.mr_mode = info->domain_attr->mr_mode;
    r.mode = info->mode;
    r.max_msg_size = info->ep_attr->max_msg_size;
    r.tx_size = info->tx_attr->size;
    r.rx_size = info->rx_attr->size;
    r.iov_limit = info->tx_attr->iov_limit;
    r.rma_iov_limit = info->tx_attr->rma_iov_limit;
    r.mr_key_size = info->domain_attr->mr_key_size;
    r.threading = enum_name(&info->domain_attr->threading, FI_TYPE_THREADING);
    r.data_progress = enum_name(&info->domain_attr->data_progress, FI_TYPE_PROGRESS);
    r.control_progress = enum_name(&info->domain_attr->control_progress, FI_TYPE_PROGRESS);
  }
  return reports;
}

FabricOptions fabric_options_from(const FabricConfig& config) {
  FabricOptions options;
  options.provider = config.provider;
  options.interface = config.interface;
  options.max_outstanding_reads = config.max_outstanding_reads;
  options.max_read_segments = config.max_read_segments;
  return options;
}

Result<ProviderChoice> choose_provider_for(const FabricOptions& options) {
  const int rdma_devices = options.provider == "auto" ? count_rdma_devices() : 0;
  return choose_provider(options.provider, rdma_devices, [&](const std::string& prov_name) {
    return !query_rdm_rma_providers(prov_name, options.requested_mr_mode).empty();
  });
}

void log_close_failure(const char* what, int rc) noexcept {
  try {
    log::get("fabric")->warn("fi_close of a {} failed: {} ({}); it stays open until the process exits", what,
                             fi_strerror(-rc), rc);
  } catch (...) {
    // Logging itself failed (out of memory): nothing more can be said from a destructor.
  }
}

// The state behind Fabric. A plain struct: Fabric's methods and the progress thread
// both work on it; the comments on each group say which thread may touch what.
struct Fabric::Impl {
  Status open(const FabricOptions& options);
  // fi_mr_reg, plus bind+enable when the provider wants FI_MR_ENDPOINT.
  Result<FidPtr<fid_mr>> register_memory(void* base, std::size_t length, std::uint64_t access, const char* what);
  // Registers [base, base+length) for remote reads and says how a peer reads it: the key
  // (refused when the provider has none to give, FI_MR_RAW) and the address per
  // FI_MR_VIRT_ADDR. The exposed arena and every offered region go through here.
  Result<std::pair<FidPtr<fid_mr>, RemoteRegion>> register_remote_readable(const void* base, std::size_t length,
                                                                            const char* what);
  void enqueue(std::vector<ReadRequest> requests);
  // `offered`: the peer's offered region the read targets (read_region), else its arena.
  Status validate(int peer, std::span<const ReadSegment> segments, const LocalRegion& local,
                  const RemoteRegion* offered) const;
  ReadRequest make_request(int peer, std::span<const ReadSegment> segments, const LocalRegion& local,
                           ReadCallback done, const RemoteRegion* offered = nullptr) const;
  // Posts one request to the provider (fi_read or fi_readmsg); the provider's return code.
  ssize_t post(ReadRequest& request, fi_context2* context);

  // Progress thread.
  void progress_loop();
  std::size_t take_queued();
  std::size_t post_pending();
  // Posts one read (the front of `peer`'s queue): 1 if it left the queue, 0 on -FI_EAGAIN.
  std::size_t post_one(int peer);
  std::size_t apply_peer_failures();
  // Completes a read for a failed peer with the reason; returns 1 (one request handled).
  std::size_t fail_request(ReadRequest& request);
  std::size_t allocate_slot();
  void release_slot(std::size_t slot);
  // The in-flight slot a CQ entry's op_context names, or nullopt for one that is not ours.
  std::optional<std::size_t> slot_of(void* op_context) const;
  std::size_t poll_completions();
  std::size_t handle_cq_result(ssize_t rc, const fi_cq_entry* entries);
  std::size_t handle_cq_error();
  void idle_wait(std::chrono::microseconds& backoff);
  void cancel_unposted_and_drain_inflight();
  void complete(ReadRequest& request, const Status& status);

  // --- Fixed after create() ---
  int rank = 0;
  int nranks = 1;
  std::string provider_name;
  std::string domain_name;
  CqWaitMode wait_mode = CqWaitMode::kPollWithBackoff;
  int mr_mode = 0;
  std::size_t max_inflight = 1;
  // Reads in flight to any one peer; max_inflight - 1 with 3+ ranks (FabricOptions).
  std::size_t max_inflight_per_peer = 1;
  std::size_t max_segments = 1;  // per read: the provider's iov limits, capped by options and kMaxReadSegments

  // --- libfabric objects, in creation order: members are destroyed in reverse, which
  // closes MRs before the endpoint, the endpoint before its AV and CQ, and so on. ---
  FiInfoPtr info;
  FidPtr<fid_fabric> fabric;
  FidPtr<fid_domain> domain;
  FidPtr<fid_cq> cq;
  FidPtr<fid_av> av;
  FidPtr<fid_ep> ep;
  FidPtr<fid_mr> exposed_mr;
  // Under registry_mutex (register_local, unregister_local, offer_region and
  // withdraw_region may run on any thread), with next_requested_key.
  std::mutex registry_mutex;
  std::vector<FidPtr<fid_mr>> local_mrs;  // indexed by LocalRegion::index; null once unregistered
  std::vector<int> free_local_indices;     // unregistered, for reuse
  std::map<int, FidPtr<fid_mr>> offered_mrs;  // by OfferedRegion::handle
  int next_offer_handle = 0;

  // --- Main thread only (set before start_progress; read() only reads them after
  // `connected` is published). ---
  bool exposed = false;
  EndpointBlob own_blob;
  // Providers without FI_MR_PROV_KEY (tcp, net) use our requested keys: random per daemon
  // start, so a key cannot be guessed from knowing ShardMix (docs/security.md).
  std::uint64_t next_requested_key = 1;
  std::vector<PeerRegion> peers;
  std::atomic<bool> connected{false};
  std::atomic<int> local_region_count{0};

  // --- Producers -> progress thread. queue_mutex guards queue, state and queue_cv. ---
  std::mutex queue_mutex;
  std::condition_variable queue_cv;  // kPollWithBackoff: wakes the idle progress thread
  std::vector<ReadRequest> queue;
  ProgressState state = ProgressState::kNotStarted;
  // kBlockingSread: true while the progress thread may be inside fi_cq_sread, so
  // producers only pay for fi_cq_signal when it is needed.
  std::atomic<bool> progress_sleeping{false};
  std::atomic<bool> stop_requested{false};
  std::thread progress_thread;
  // fail_peer() -> progress thread, also under queue_mutex.
  std::vector<std::pair<int, Status>> new_peer_failures;

  // --- Progress thread only. ---
  // Taken from the queue, not yet posted: one FIFO per peer, served round-robin, so a
  // peer whose fi_read keeps answering -FI_EAGAIN (tcp;ofi_rxm after its connection broke)
  // holds up only its own reads (decision 0032).
  std::vector<std::deque<ReadRequest>> pending_by_peer;
  std::size_t pending_count = 0;
  int next_peer = 0;                       // round-robin cursor over pending_by_peer
  std::vector<Status> peer_failure;        // per peer: ok, or why fail_peer() was called
  // Slots grow past max_inflight only for reads stuck with a failed peer; a deque keeps
  // the addresses handed to the provider stable while it grows.
  std::deque<OpContext> op_contexts;       // slot -> op_context of fi_read
  std::deque<InflightRead> inflight;       // slot -> posted request
  std::vector<std::size_t> free_slots;
  std::vector<std::size_t> inflight_by_peer;  // reads in flight per peer
  std::size_t live_inflight = 0;           // in flight, not to a failed peer

  // --- Statistics, written by the progress thread (and read()'s inline cancellations),
  // read by anyone. ---
  std::atomic<std::uint64_t> reads_posted{0};
  std::atomic<std::uint64_t> reads_completed{0};
  std::atomic<std::uint64_t> reads_failed{0};
  std::atomic<std::uint64_t> bytes_read{0};
};

Status Fabric::Impl::open(const FabricOptions& options) {
  if (options.max_outstanding_reads == 0) {
    return make_error(StatusCode::kInvalidArgument, "fabric.max_outstanding_reads must be at least 1");
  }
  SHARDMIX_ASSIGN_OR_RETURN(ProviderChoice choice, choose_provider_for(options));
  if (!choice.warning.empty()) log::get("fabric")->warn("{}", choice.warning);
  const std::string& wanted_provider = choice.prov_name;

  FiInfoPtr hints = make_hints(wanted_provider, options.requested_mr_mode);
  if (!hints) return make_error(StatusCode::kResourceExhausted, "fi_allocinfo failed");
  fi_info* list = nullptr;
  if (int rc = fi_getinfo(kFabricApiVersion, nullptr, nullptr, 0, hints.get(), &list); rc != 0 || list == nullptr) {
    return make_error(StatusCode::kUnavailable,
                      "fabric provider '{}' (fabric.provider = '{}'): fi_getinfo found no FI_EP_RDM endpoint "
                      "with FI_RMA|FI_READ|FI_REMOTE_READ: {}. Providers offering FI_EP_RDM+FI_RMA here: {}",
                      wanted_provider, options.provider, fi_strerror(-rc), describe_rdm_rma_providers());
  }
  FiInfoPtr candidates(list);

  const fi_info* chosen = nullptr;
  for (const fi_info* candidate = list; candidate != nullptr; candidate = candidate->next) {
    if (options.interface.empty() || names_match(candidate->domain_attr->name, options.interface) ||
        names_match(candidate->fabric_attr->name, options.interface)) {
      chosen = candidate;
      break;
    }
  }
  if (chosen == nullptr) {
    std::set<std::string> offered;
    for (const fi_info* c = list; c != nullptr; c = c->next) {
      offered.insert(fmt::format("{} ({})", c->domain_attr->name ? c->domain_attr->name : "?",
                                 c->fabric_attr->name ? c->fabric_attr->name : "?"));
    }
    return make_error(StatusCode::kNotFound,
                      "fabric provider '{}' has no domain or fabric named '{}' (fabric.interface); it offers: {}",
                      wanted_provider, options.interface, fmt::join(offered, ", "));
  }
  info.reset(fi_dupinfo(chosen));
  candidates.reset();
  if (!info) return make_error(StatusCode::kResourceExhausted, "fi_dupinfo failed");

  provider_name = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : wanted_provider;
  domain_name = info->domain_attr->name ? info->domain_attr->name : "";
  mr_mode = info->domain_attr->mr_mode;
  {
    // As wide as the domain's keys are (mr_key_size bytes, at most 8), never 0.
    const std::size_t key_bytes = std::clamp<std::size_t>(info->domain_attr->mr_key_size, 1, 8);
    std::uint64_t random = 0;
    if (::getrandom(&random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) random = 0;
    const std::uint64_t mask = key_bytes >= 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * key_bytes)) - 1;
    // Leave room for the few registrations that follow (arena, staging) without wrapping.
    next_requested_key = std::max<std::uint64_t>(1, (random & mask) >> 1);
  }
  wait_mode = cq_wait_mode_for(provider_name);
  max_inflight = options.max_outstanding_reads;
  if (info->tx_attr->size > 0) max_inflight = std::min<std::size_t>(max_inflight, info->tx_attr->size);
  // With two ranks there is only one peer to read; with more, keep one slot for the others.
  // That needs at least two slots: with one, a peer that stops answering holds the whole
  // budget and every read of the live peers waits until it is declared dead.
  if (nranks > 2 && max_inflight < 2) {
    return make_error(StatusCode::kInvalidArgument,
                      "fabric.max_outstanding_reads = {} with {} ranks: at least 2 reads must be allowed in flight "
                      "with 3 or more ranks, so that one unresponsive peer cannot hold them all (provider {} allows "
                      "{} outstanding operations)",
                      options.max_outstanding_reads, nranks,
                      info->fabric_attr->prov_name ? info->fabric_attr->prov_name : "?", info->tx_attr->size);
  }
  max_inflight_per_peer = nranks > 2 ? std::max<std::size_t>(1, max_inflight - 1) : max_inflight;
  max_segments = read_segments_for(info->fabric_attr->prov_name ? info->fabric_attr->prov_name : "",
                                   options.max_read_segments, kMaxReadSegments, info->tx_attr->iov_limit,
                                   info->tx_attr->rma_iov_limit);

  // From here on errors say which provider and domain they are about.
  auto failed = [this](const char* call, int rc) {
    return fi_error(call, rc).with_context(fmt::format("fabric provider {} domain {}", provider_name, domain_name));
  };
  fid_fabric* raw_fabric = nullptr;
  if (int rc = fi_fabric(info->fabric_attr, &raw_fabric, nullptr); rc != 0) return failed("fi_fabric", rc);
  fabric.reset(raw_fabric);

  fid_domain* raw_domain = nullptr;
  if (int rc = fi_domain(fabric.get(), info.get(), &raw_domain, nullptr); rc != 0) return failed("fi_domain", rc);
  domain.reset(raw_domain);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_CONTEXT;
  cq_attr.wait_obj = wait_mode == CqWaitMode::kBlockingSread ? FI_WAIT_UNSPEC : FI_WAIT_NONE;
  fid_cq* raw_cq = nullptr;
  int cq_rc = fi_cq_open(domain.get(), &cq_attr, &raw_cq, nullptr);
  if (cq_rc != 0 && wait_mode == CqWaitMode::kBlockingSread) {
    // A provider that cannot give us a wait object still works by polling.
    log::get("fabric")->warn("{}: fi_cq_open with a wait object failed ({}); polling the CQ instead",
                             provider_name, fi_strerror(-cq_rc));
    wait_mode = CqWaitMode::kPollWithBackoff;
    cq_attr.wait_obj = FI_WAIT_NONE;
    cq_rc = fi_cq_open(domain.get(), &cq_attr, &raw_cq, nullptr);
  }
  if (cq_rc != 0) return failed("fi_cq_open", cq_rc);
  cq.reset(raw_cq);

  fi_av_attr av_attr{};
  av_attr.type = info->domain_attr->av_type != FI_AV_UNSPEC ? info->domain_attr->av_type : FI_AV_TABLE;
  av_attr.count = static_cast<std::size_t>(nranks);
  fid_av* raw_av = nullptr;
  if (int rc = fi_av_open(domain.get(), &av_attr, &raw_av, nullptr); rc != 0) return failed("fi_av_open", rc);
  av.reset(raw_av);

  fid_ep* raw_ep = nullptr;
  if (int rc = fi_endpoint(domain.get(), info.get(), &raw_ep, nullptr); rc != 0) return failed("fi_endpoint", rc);
  ep.reset(raw_ep);
  if (int rc = fi_ep_bind(ep.get(), &av->fid, 0); rc != 0) return failed("fi_ep_bind (av)", rc);
  // One CQ for both directions: RDM providers want a receive CQ bound even for RMA only,
  // and polling a single CQ also drives target-side progress for peers' reads.
  if (int rc = fi_ep_bind(ep.get(), &cq->fid, FI_TRANSMIT | FI_RECV); rc != 0) return failed("fi_ep_bind (cq)", rc);
  if (int rc = fi_enable(ep.get()); rc != 0) return failed("fi_enable", rc);

  std::size_t name_length = 0;
  int rc = fi_getname(&ep->fid, nullptr, &name_length);
  if (rc != 0 && rc != -FI_ETOOSMALL) return failed("fi_getname (size)", rc);
  own_blob.endpoint_name.resize(name_length);
  if (rc = fi_getname(&ep->fid, own_blob.endpoint_name.data(), &name_length); rc != 0) {
    return failed("fi_getname", rc);
  }
  own_blob.endpoint_name.resize(name_length);

  pending_by_peer.resize(static_cast<std::size_t>(nranks));
  peer_failure.resize(static_cast<std::size_t>(nranks));
  inflight_by_peer.resize(static_cast<std::size_t>(nranks), 0);
  for (std::size_t slot = 0; slot < max_inflight; ++slot) {
    op_contexts.emplace_back().slot = slot;
    inflight.emplace_back();
  }
  for (std::size_t slot = max_inflight; slot-- > 0;) free_slots.push_back(slot);

  log::get("fabric")->info("provider {} domain {} mr_mode {} cq wait {} max outstanding reads {}, segments per read {}",
                           provider_name, domain_name, mr_mode_names(mr_mode),
                           wait_mode == CqWaitMode::kBlockingSread ? "fi_cq_sread" : "poll+backoff", max_inflight,
                           max_segments);
  return Status::ok_status();
}

Result<FidPtr<fid_mr>> Fabric::Impl::register_memory(void* base, std::size_t length, std::uint64_t access,
                                                     const char* what) {
  auto failed = [&](const char* call, int rc) {
    return fi_error(call, rc).with_context(fmt::format("registering {} bytes ({})", length, what));
  };
  fid_mr* raw_mr = nullptr;
  std::uint64_t requested_key = 0;
  {
    std::lock_guard lock(registry_mutex);
    requested_key = next_requested_key++;
  }
  // Providers without FI_MR_PROV_KEY use the requested key, which must be unique per domain.
  if (int rc = fi_mr_reg(domain.get(), base, length, access, 0, requested_key, 0, &raw_mr, nullptr); rc != 0) {
    return failed("fi_mr_reg", rc);
  }
  FidPtr<fid_mr> mr(raw_mr);
  if (mr_mode & FI_MR_ENDPOINT) {
    if (int rc = fi_mr_bind(mr.get(), &ep->fid, 0); rc != 0) return failed("fi_mr_bind", rc);
    if (int rc = fi_mr_enable(mr.get()); rc != 0) return failed("fi_mr_enable", rc);
  }
  return mr;
}

Result<std::pair<FidPtr<fid_mr>, RemoteRegion>> Fabric::Impl::register_remote_readable(const void* base,
                                                                                       std::size_t length,
                                                                                       const char* what) {
  // Registered for FI_REMOTE_READ only: nothing ever writes through it.
  SHARDMIX_ASSIGN_OR_RETURN(FidPtr<fid_mr> mr,
                            register_memory(const_cast<void*>(base), length, FI_REMOTE_READ, what));
  const std::uint64_t key = fi_mr_key(mr.get());
  if (key == FI_KEY_NOTAVAIL) {
    return make_error(StatusCode::kUnavailable, "fabric provider {} needs raw MR keys (FI_MR_RAW), not supported",
                      provider_name);
  }
  RemoteRegion remote;
  remote.address = (mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<std::uintptr_t>(base) : 0;
  remote.key = key;
  remote.length = length;
  return std::make_pair(std::move(mr), remote);
}

Status Fabric::Impl::validate(int peer, std::span<const ReadSegment> segments, const LocalRegion& local,
                              const RemoteRegion* offered) const {
  if (peer < 0 || peer >= nranks) {
    return make_error(StatusCode::kInvalidArgument, "read from peer {}: no such rank (ranks are 0..{})", peer,
                      nranks - 1);
  }
  if (!connected.load(std::memory_order_acquire)) {
    return make_error(StatusCode::kInvalidArgument, "read from peer {}: connect_peers has not run", peer);
  }
  if (segments.empty() || segments.size() > max_segments) {
    return make_error(StatusCode::kInvalidArgument,
                      "read from peer {}: {} segments in one read; provider {} takes 1 to {} (max_segments_per_read)",
                      peer, segments.size(), provider_name, max_segments);
  }
  const std::uint64_t region_length =
      offered != nullptr ? offered->length : peers[static_cast<std::size_t>(peer)].region_length;
  const char* region_name = offered != nullptr ? "offered" : "exposed";
  if (region_length == 0) {
    return make_error(StatusCode::kInvalidArgument, "read from peer {}: the peer's {} region is empty", peer,
                      region_name);
  }
  if (local.index < 0 || local.index >= local_region_count.load(std::memory_order_acquire) || local.base == nullptr) {
    return make_error(StatusCode::kInvalidArgument,
                      "read from peer {}: the local target region was not registered with this fabric", peer);
  }
  for (const ReadSegment& segment : segments) {
    const std::uint64_t remote_offset = segment.remote_offset;
    const std::size_t length = segment.length;
    if (remote_offset > region_length || length > region_length - remote_offset) {
      return make_error(StatusCode::kInvalidArgument,
                        "read from peer {}: bytes [{}, {}+{}) lie outside its {} region of {} bytes", peer,
                        remote_offset, remote_offset, length, region_name, region_length);
    }
    if (segment.local_offset > local.length || length > local.length - segment.local_offset) {
      return make_error(StatusCode::kInvalidArgument,
                        "read from peer {}: {} bytes at local offset {} overflow the local region of {} bytes", peer,
                        length, segment.local_offset, local.length);
    }
    if (length == 0 && segments.size() > 1) {
      // Providers differ on empty iovs; a single empty read completes without one.
      return make_error(StatusCode::kInvalidArgument, "read from peer {}: an empty segment in a vectored read", peer);
    }
  }
  return Status::ok_status();
}

ReadRequest Fabric::Impl::make_request(int peer, std::span<const ReadSegment> segments, const LocalRegion& local,
                                       ReadCallback done, const RemoteRegion* offered) const {
  ReadRequest request;
  request.peer = peer;
  request.local_desc = local.desc;
  request.done = std::move(done);
  if (offered != nullptr) request.offered = *offered;
  request.rejection = validate(peer, segments, local, offered);
  if (request.rejection.ok()) {
    std::copy(segments.begin(), segments.end(), request.segments.begin());
    request.segment_count = segments.size();
    request.local_base = static_cast<std::uint8_t*>(local.base);
  }
  return request;
}

void Fabric::Impl::enqueue(std::vector<ReadRequest> requests) {
  if (requests.empty()) return;
  {
    std::unique_lock lock(queue_mutex);
    if (state == ProgressState::kStopped) {
      lock.unlock();
      // No progress thread will ever run them: fail here, on the caller's thread.
      for (ReadRequest& request : requests) {
        ReadCallback done = std::move(request.done);
        reads_failed.fetch_add(1, std::memory_order_relaxed);
        if (done) {
          done(make_error(StatusCode::kCancelled, "read from peer {}: the fabric has stopped", request.peer));
        }
      }
      return;
    }
    for (ReadRequest& request : requests) queue.push_back(std::move(request));
  }
  // One wake-up for the whole hand-over.
  if (wait_mode == CqWaitMode::kBlockingSread) {
    if (progress_sleeping.load()) (void)fi_cq_signal(cq.get());
  } else {
    queue_cv.notify_one();
  }
}

// ---------------------------------------------------------------------------
// Progress thread

void Fabric::Impl::progress_loop() {
  // kPollWithBackoff sleeps for tens of microseconds; the default 50 us timer slack
  // would stretch each of those sleeps to ~70 us.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  // A name for top -H, perf and /proc/PID/task: profiles of the daemon are read per thread.
  prctl(PR_SET_NAME, "smx-fabric", 0UL, 0UL, 0UL);
  auto backoff = kMinIdleBackoff;
  for (;;) {
    // Read the flag before the work so everything queued before stop_progress is seen.
    const bool stopping = stop_requested.load(std::memory_order_acquire);
    std::size_t activity = take_queued();
    activity += post_pending();
    activity += poll_completions();
    if (stopping) break;
    if (activity > 0) {
      backoff = kMinIdleBackoff;
      continue;
    }
    idle_wait(backoff);
  }
  cancel_unposted_and_drain_inflight();
}

std::size_t Fabric::Impl::take_queued() {
  std::vector<ReadRequest> taken;
  {
    std::lock_guard lock(queue_mutex);
    taken.swap(queue);
  }
  std::size_t handled = apply_peer_failures();
  for (ReadRequest& request : taken) {
    // Rejected (validated on the caller's thread), empty, or for a failed peer: these
    // never reach the provider, so they complete now and queue behind nothing.
    if (!request.rejection.ok()) {
      complete(request, request.rejection);
    } else if (request.length() == 0) {
      complete(request, Status::ok_status());
    } else if (!peer_failure[static_cast<std::size_t>(request.peer)].ok()) {
      fail_request(request);
    } else {
      auto& waiting = pending_by_peer[static_cast<std::size_t>(request.peer)];
      if (request.priority) {
        waiting.push_front(std::move(request));
      } else {
        waiting.push_back(std::move(request));
      }
      ++pending_count;
      continue;
    }
    ++handled;
  }
  return handled;
}

std::size_t Fabric::Impl::apply_peer_failures() {
  std::vector<std::pair<int, Status>> failures;
  {
    std::lock_guard lock(queue_mutex);
    failures.swap(new_peer_failures);
  }
  std::size_t handled = 0;
  for (auto& [peer, why] : failures) {
    const auto p = static_cast<std::size_t>(peer);
    if (!peer_failure[p].ok()) continue;  // failed already
    peer_failure[p] = std::move(why);
    // Reads already with the provider keep their slots (the provider may still write their
    // targets) but stop counting against max_outstanding_reads: a dead peer's reads must
    // not hold back the live ones.
    for (InflightRead& entry : inflight) {
      if (entry.busy && !entry.to_failed_peer && entry.request.peer == peer) {
        entry.to_failed_peer = true;
        --live_inflight;
      }
    }
    std::deque<ReadRequest> queued = std::move(pending_by_peer[p]);
    pending_by_peer[p].clear();
    pending_count -= queued.size();
    for (ReadRequest& request : queued) handled += fail_request(request);
  }
  return handled;
}

std::size_t Fabric::Impl::fail_request(ReadRequest& request) {
  const Status& why = peer_failure[static_cast<std::size_t>(request.peer)];
  complete(request, make_error(StatusCode::kUnavailable, "read from peer {}: not posted, the peer was failed: {}",
                               request.peer, why.message()));
  return 1;
}

std::size_t Fabric::Impl::allocate_slot() {
  if (!free_slots.empty()) {
    const std::size_t slot = free_slots.back();
    free_slots.pop_back();
    return slot;
  }
  // Every slot is busy although fewer than max_inflight reads are live: the others wait
  // for failed peers. A new slot keeps the live capacity at max_inflight.
  const std::size_t slot = op_contexts.size();
  op_contexts.emplace_back().slot = slot;
  inflight.emplace_back();
  return slot;
}

void Fabric::Impl::release_slot(std::size_t slot) {
  InflightRead& entry = inflight[slot];
  const auto peer = static_cast<std::size_t>(entry.request.peer);
  --inflight_by_peer[peer];
  if (!entry.to_failed_peer) --live_inflight;
  entry.busy = false;
  entry.to_failed_peer = false;
  free_slots.push_back(slot);
}

std::optional<std::size_t> Fabric::Impl::slot_of(void* op_context) const {
  if (op_context == nullptr) return std::nullopt;
  const auto* context = static_cast<const OpContext*>(op_context);
  const std::size_t slot = context->slot;
  if (slot >= op_contexts.size() || &op_contexts[slot] != context || !inflight[slot].busy) return std::nullopt;
  return slot;
}

std::size_t Fabric::Impl::post_pending() {
  std::size_t handled = 0;
  // Peers whose fi_read answered -FI_EAGAIN in this pass: tried again on the next one.
  std::vector<bool> deferred(pending_by_peer.size(), false);
  // Heartbeats first, whatever is in flight: a peer that stops answering may hold all but
  // one slot and another hung one the last, and a live peer's heartbeat queued behind them
  // would time out and get a live rank declared dead (decision 0032). A heartbeat is one
  // byte and the monitor has at most one outstanding per peer, so this exceeds
  // max_outstanding_reads by at most one read per peer.
  for (std::size_t peer = 0; peer < pending_by_peer.size(); ++peer) {
    while (!pending_by_peer[peer].empty() && pending_by_peer[peer].front().priority) {
      const std::size_t posted = post_one(static_cast<int>(peer));
      if (posted == 0) {
        deferred[peer] = true;
        handled += poll_completions();
        break;
      }
      handled += posted;
    }
  }
  while (pending_count > 0 && live_inflight < max_inflight) {
    // The next peer after the cursor with a read that may go now.
    int chosen = -1;
    for (std::size_t step = 0; step < pending_by_peer.size(); ++step) {
      const auto peer = static_cast<std::size_t>((next_peer + static_cast<int>(step)) % nranks);
      if (!pending_by_peer[peer].empty() && !deferred[peer] && inflight_by_peer[peer] < max_inflight_per_peer) {
        chosen = static_cast<int>(peer);
        break;
      }
    }
    if (chosen < 0) break;  // every waiting peer is deferred or at its share
    next_peer = (chosen + 1) % nranks;
    const std::size_t posted = post_one(chosen);
    if (posted == 0) {
      // The provider's queues are full or it needs progress (a connection being set up,
      // or, with tcp;ofi_rxm, re-set up to a peer that died): progress it, and go on with
      // the other peers' reads instead of waiting behind this one.
      deferred[static_cast<std::size_t>(chosen)] = true;
      handled += poll_completions();
      continue;
    }
    handled += posted;
  }
  return handled;
}

std::size_t Fabric::Impl::post_one(int peer) {
  std::deque<ReadRequest>& waiting = pending_by_peer[static_cast<std::size_t>(peer)];
  ReadRequest& request = waiting.front();
  const std::size_t slot = allocate_slot();
  const ssize_t rc = post(request, &op_contexts[slot].provider_scratch);
  if (rc == -FI_EAGAIN) {
    free_slots.push_back(slot);
    return 0;
  }
  ReadRequest posted = std::move(request);
  waiting.pop_front();
  --pending_count;
  if (rc != 0) {
    free_slots.push_back(slot);
    complete(posted, make_error(StatusCode::kUnavailable, "read from peer {}: fi_read of {} failed: {}", posted.peer,
                                posted.describe(), fi_strerror(static_cast<int>(-rc))));
    return 1;
  }
  InflightRead& entry = inflight[slot];
  entry.request = std::move(posted);
  entry.busy = true;
  entry.to_failed_peer = false;
  ++inflight_by_peer[static_cast<std::size_t>(peer)];
  ++live_inflight;
  reads_posted.fetch_add(1, std::memory_order_relaxed);
  return 1;
}

ssize_t Fabric::Impl::post(ReadRequest& request, fi_context2* context) {
  const PeerRegion& peer = peers[static_cast<std::size_t>(request.peer)];
  const std::uint64_t region_address = request.offered ? request.offered->address : peer.region_address;
  const std::uint64_t region_key = request.offered ? request.offered->key : peer.region_key;
  if (request.segment_count == 1) {
    const ReadSegment& segment = request.segments[0];
    return fi_read(ep.get(), request.local_base + segment.local_offset, segment.length, request.local_desc,
                   peer.address, region_address + segment.remote_offset, region_key, context);
  }
  // Several segments of one peer: one operation, one completion (fewer provider round
  // trips, and with shm one process_vm_readv and one lock of the target's region).
  std::array<iovec, kMaxReadSegments> local_iov{};
  std::array<void*, kMaxReadSegments> descs{};
  std::array<fi_rma_iov, kMaxReadSegments> remote_iov{};
  for (std::size_t i = 0; i < request.segment_count; ++i) {
    const ReadSegment& segment = request.segments[i];
    local_iov[i] = iovec{request.local_base + segment.local_offset, segment.length};
    descs[i] = request.local_desc;
    remote_iov[i] = fi_rma_iov{region_address + segment.remote_offset, segment.length, region_key};
  }
  fi_msg_rma message{};
  message.msg_iov = local_iov.data();
  message.desc = descs.data();
  message.iov_count = request.segment_count;
  message.addr = peer.address;
  message.rma_iov = remote_iov.data();
  message.rma_iov_count = request.segment_count;
  message.context = context;
  return fi_readmsg(ep.get(), &message, FI_COMPLETION);
}

std::size_t Fabric::Impl::poll_completions() {
  std::size_t handled = 0;
  fi_cq_entry entries[kCqBatch];
  for (;;) {
    const ssize_t rc = fi_cq_read(cq.get(), entries, kCqBatch);
    const std::size_t n = handle_cq_result(rc, entries);
    handled += n;
    // Go on after a full batch or a handled error entry (more may follow); anything
    // else means the CQ is (momentarily) empty.
    const bool maybe_more = rc == static_cast<ssize_t>(kCqBatch) || (rc == -FI_EAVAIL && n > 0);
    if (!maybe_more) break;
  }
  return handled;
}

std::size_t Fabric::Impl::handle_cq_result(ssize_t rc, const fi_cq_entry* entries) {
  if (rc > 0) {
    for (ssize_t i = 0; i < rc; ++i) {
      const std::optional<std::size_t> slot = slot_of(entries[i].op_context);
      if (!slot) {
        log::get("fabric")->error("completion with an unknown op_context {}; ignored", entries[i].op_context);
        continue;
      }
      ReadRequest done = std::move(inflight[*slot].request);
      release_slot(*slot);
      bytes_read.fetch_add(done.length(), std::memory_order_relaxed);
      complete(done, Status::ok_status());
    }
    return static_cast<std::size_t>(rc);
  }
  if (rc == -FI_EAVAIL) return handle_cq_error();
  if (rc != -FI_EAGAIN && rc != -FI_ECANCELED) {  // ECANCELED: fi_cq_sread woken by fi_cq_signal
    log::get("fabric")->error("fi_cq_read failed: {} ({})", fi_strerror(static_cast<int>(-rc)), rc);
  }
  return 0;
}

std::size_t Fabric::Impl::handle_cq_error() {
  fi_cq_err_entry error{};  // err_data_size 0: the provider lends its own err_data buffer
  const ssize_t rc = fi_cq_readerr(cq.get(), &error, 0);
  if (rc != 1) {
    if (rc != -FI_EAGAIN) log::get("fabric")->error("fi_cq_readerr failed: {}", fi_strerror(static_cast<int>(-rc)));
    return 0;
  }
  char provider_text[256] = {};
  const char* detail = fi_cq_strerror(cq.get(), error.prov_errno, error.err_data, provider_text, sizeof(provider_text));
  const std::optional<std::size_t> slot = slot_of(error.op_context);
  if (!slot) {
    log::get("fabric")->error("CQ error without a read of ours: {} ({})", fi_strerror(error.err),
                              detail ? detail : "");
    return 1;
  }
  ReadRequest failed = std::move(inflight[*slot].request);
  release_slot(*slot);
  complete(failed, make_error(StatusCode::kUnavailable,
                              "read from peer {}: {} failed: {} (provider {}: {})", failed.peer,
                              failed.describe(), fi_strerror(error.err), provider_name,
                              detail ? detail : "no detail"));
  return 1;
}

void Fabric::Impl::idle_wait(std::chrono::microseconds& backoff) {
  if (wait_mode == CqWaitMode::kBlockingSread) {
    // Publish "sleeping" before the final queue check: a producer that pushes after the
    // check sees the flag and signals; one that pushed before it is found by the check.
    progress_sleeping.store(true);
    bool work_waiting = false;
    {
      std::lock_guard lock(queue_mutex);
      work_waiting = !queue.empty() || !new_peer_failures.empty();
    }
    if (!work_waiting && !stop_requested.load()) {
      fi_cq_entry entries[kCqBatch];
      const ssize_t rc = fi_cq_sread(cq.get(), entries, kCqBatch, nullptr, kSreadTimeoutMs);
      handle_cq_result(rc, entries);
    }
    progress_sleeping.store(false);
    return;
  }
  std::unique_lock lock(queue_mutex);
  queue_cv.wait_for(lock, backoff,
                    [&] { return !queue.empty() || !new_peer_failures.empty() || stop_requested.load(); });
  backoff = std::min(backoff * 2, kMaxIdleBackoff);
}

void Fabric::Impl::cancel_unposted_and_drain_inflight() {
  // stop_progress set kStopped under queue_mutex, so the queue can no longer grow.
  take_queued();
  for (std::deque<ReadRequest>& waiting : pending_by_peer) {
    while (!waiting.empty()) {
      ReadRequest request = std::move(waiting.front());
      waiting.pop_front();
      complete(request, make_error(StatusCode::kCancelled, "read from peer {}: cancelled by stop_progress",
                                   request.peer));
    }
  }
  pending_count = 0;
  // Reads the provider already has may still land in caller memory: wait for them (not
  // for those to failed peers, which may never answer).
  const auto deadline = std::chrono::steady_clock::now() + kStopDrainTimeout;
  while (live_inflight > 0 && std::chrono::steady_clock::now() < deadline) {
    if (poll_completions() == 0) std::this_thread::sleep_for(kMinIdleBackoff);
  }
  for (std::size_t slot = 0; slot < inflight.size(); ++slot) {
    if (!inflight[slot].busy) continue;
    if (!inflight[slot].to_failed_peer) {
      log::get("fabric")->warn("read from peer {} still in flight {} s after stop_progress; reporting it cancelled",
                               inflight[slot].request.peer, kStopDrainTimeout.count());
    }
    ReadRequest stuck = std::move(inflight[slot].request);
    release_slot(slot);
    complete(stuck, make_error(StatusCode::kCancelled, "read from peer {}: did not complete before stop_progress",
                               stuck.peer));
  }
}

void Fabric::Impl::complete(ReadRequest& request, const Status& status) {
  if (status.ok()) {
    reads_completed.fetch_add(1, std::memory_order_relaxed);
  } else {
    reads_failed.fetch_add(1, std::memory_order_relaxed);
  }
  ReadCallback done = std::move(request.done);
  if (!done) return;
  // An exception escaping here would terminate the progress thread and with it every
  // peer's reads from this rank; log it instead.
  try {
    done(status);
  } catch (const std::exception& e) {
    log::get("fabric")->error("read callback (peer {}) threw: {}", request.peer, e.what());
  } catch (...) {
    log::get("fabric")->error("read callback (peer {}) threw a non-exception", request.peer);
  }
}

// ---------------------------------------------------------------------------
// Fabric

Fabric::Fabric() : impl_(std::make_unique<Impl>()) {}

Fabric::~Fabric() {
  if (impl_) stop_progress();
}

Result<std::unique_ptr<Fabric>> Fabric::create(const FabricOptions& options, int rank, int nranks) {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return make_error(StatusCode::kInvalidArgument, "fabric: rank {} of {} ranks is not valid", rank, nranks);
  }
  std::unique_ptr<Fabric> fabric(new Fabric());
  fabric->impl_->rank = rank;
  fabric->impl_->nranks = nranks;
  SHARDMIX_RETURN_IF_ERROR(fabric->impl_->open(options));
  return fabric;
}

const std::string& Fabric::provider_name() const { return impl_->provider_name; }
const std::string& Fabric::domain_name() const { return impl_->domain_name; }
int Fabric::mr_mode() const { return impl_->mr_mode; }

Status Fabric::expose(void* base, std::size_t length) {
  Impl& impl = *impl_;
  if (impl.exposed) return make_error(StatusCode::kInvalidArgument, "fabric: expose() may only be called once");
  if (length > 0 && base == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "fabric: expose() of {} bytes at a null address", length);
  }
  if (length == 0) {
    impl.exposed = true;
    log::get("fabric")->info("exposing nothing (length 0)");
    return Status::ok_status();
  }
  SHARDMIX_ASSIGN_OR_RETURN(auto registered, impl.register_remote_readable(base, length, "exposed region"));
  impl.exposed_mr = std::move(registered.first);
  impl.exposed = true;
  impl.own_blob.region_address = registered.second.address;
  impl.own_blob.region_key = registered.second.key;
  impl.own_blob.region_length = length;
  // The key goes to peers over MPI only; logs (often world-readable files) never show it.
  log::get("fabric")->info("exposed {} bytes ({} key, remote address {:#x})", length,
                           (impl.mr_mode & FI_MR_PROV_KEY) ? "provider-chosen" : "random requested",
                           impl.own_blob.region_address);
  return Status::ok_status();
}

Result<LocalRegion> Fabric::register_local(void* base, std::size_t length) {
  Impl& impl = *impl_;
  if (base == nullptr || length == 0) {
    return make_error(StatusCode::kInvalidArgument, "fabric: register_local() needs a non-empty region");
  }
  // Registered even when the provider does not require FI_MR_LOCAL: the descriptor is
  // then optional but harmless, and callers need not care which provider runs.
  SHARDMIX_ASSIGN_OR_RETURN(FidPtr<fid_mr> mr, impl.register_memory(base, length, FI_READ, "local region"));
  LocalRegion region;
  region.base = base;
  region.length = length;
  region.desc = fi_mr_desc(mr.get());
  std::lock_guard lock(impl.registry_mutex);
  if (!impl.free_local_indices.empty()) {
    region.index = impl.free_local_indices.back();
    impl.free_local_indices.pop_back();
    impl.local_mrs[static_cast<std::size_t>(region.index)] = std::move(mr);
  } else {
    region.index = static_cast<int>(impl.local_mrs.size());
    impl.local_mrs.push_back(std::move(mr));
    impl.local_region_count.store(static_cast<int>(impl.local_mrs.size()), std::memory_order_release);
  }
  return region;
}

void Fabric::unregister_local(const LocalRegion& region) {
  Impl& impl = *impl_;
  FidPtr<fid_mr> closing;
  {
    std::lock_guard lock(impl.registry_mutex);
    const auto index = static_cast<std::size_t>(region.index);
    if (region.index < 0 || index >= impl.local_mrs.size() || !impl.local_mrs[index]) return;
    closing = std::move(impl.local_mrs[index]);
    impl.free_local_indices.push_back(region.index);
  }
  // Closed outside the lock: fi_close may take the provider's own locks.
}

Result<OfferedRegion> Fabric::offer_region(const void* base, std::size_t length) {
  Impl& impl = *impl_;
  if (base == nullptr || length == 0) {
    return make_error(StatusCode::kInvalidArgument, "fabric: offer_region() needs a non-empty region");
  }
  SHARDMIX_ASSIGN_OR_RETURN(auto registered, impl.register_remote_readable(base, length, "offered region"));
  OfferedRegion offered;
  offered.remote = registered.second;
  std::lock_guard lock(impl.registry_mutex);
  offered.handle = impl.next_offer_handle++;
  impl.offered_mrs.emplace(offered.handle, std::move(registered.first));
  return offered;
}

void Fabric::withdraw_region(int handle) {
  Impl& impl = *impl_;
  FidPtr<fid_mr> closing;
  {
    std::lock_guard lock(impl.registry_mutex);
    const auto it = impl.offered_mrs.find(handle);
    if (it == impl.offered_mrs.end()) return;
    closing = std::move(it->second);
    impl.offered_mrs.erase(it);
  }
}

std::vector<std::uint8_t> Fabric::endpoint_blob() const { return encode_endpoint_blob(impl_->own_blob); }

Status Fabric::connect_peers(const std::vector<std::vector<std::uint8_t>>& blobs) {
  Impl& impl = *impl_;
  if (impl.connected.load()) return make_error(StatusCode::kInvalidArgument, "fabric: connect_peers() ran already");
  if (blobs.size() != static_cast<std::size_t>(impl.nranks)) {
    return make_error(StatusCode::kInvalidArgument, "fabric: connect_peers() got {} blobs for {} ranks", blobs.size(),
                      impl.nranks);
  }
  std::vector<PeerRegion> peers(blobs.size());
  for (std::size_t rank = 0; rank < blobs.size(); ++rank) {
    SHARDMIX_ASSIGN_OR_RETURN(EndpointBlob blob, decode_endpoint_blob(blobs[rank], static_cast<int>(rank)));
    PeerRegion& peer = peers[rank];
    const int inserted = fi_av_insert(impl.av.get(), blob.endpoint_name.data(), 1, &peer.address, 0, nullptr);
    if (inserted != 1) {
      return make_error(StatusCode::kUnavailable, "fi_av_insert of rank {}'s endpoint failed: {}", rank,
                        inserted < 0 ? fi_strerror(-inserted) : "address not inserted");
    }
    peer.region_address = blob.region_address;
    peer.region_key = blob.region_key;
    peer.region_length = blob.region_length;
  }
  impl.peers = std::move(peers);
  impl.connected.store(true, std::memory_order_release);
  return Status::ok_status();
}

void Fabric::start_progress() {
  Impl& impl = *impl_;
  std::lock_guard lock(impl.queue_mutex);
  if (impl.state != ProgressState::kNotStarted) return;
  impl.state = ProgressState::kRunning;
  impl.progress_thread = std::thread([&impl] { impl.progress_loop(); });
}

void Fabric::stop_progress() {
  Impl& impl = *impl_;
  if (std::this_thread::get_id() == impl.progress_thread.get_id()) {
    // From a read callback: joining ourselves would throw; the owner must stop us.
    log::get("fabric")->error("stop_progress() called from a read callback; ignored");
    return;
  }
  std::vector<ReadRequest> never_started;
  {
    std::lock_guard lock(impl.queue_mutex);
    const ProgressState previous = impl.state;
    impl.state = ProgressState::kStopped;
    if (previous == ProgressState::kStopped) return;
    if (previous == ProgressState::kNotStarted) never_started.swap(impl.queue);
  }
  if (impl.progress_thread.joinable()) {
    impl.stop_requested.store(true, std::memory_order_release);
    if (impl.wait_mode == CqWaitMode::kBlockingSread) (void)fi_cq_signal(impl.cq.get());
    impl.queue_cv.notify_one();
    impl.progress_thread.join();
  }
  // Reads queued before start_progress that never got a thread to run them.
  for (ReadRequest& request : never_started) {
    impl.complete(request, make_error(StatusCode::kCancelled, "read from peer {}: the fabric stopped before "
                                                              "start_progress", request.peer));
  }
}

void Fabric::read(int peer, std::uint64_t remote_offset, std::size_t length, const LocalRegion& local,
                  std::size_t local_offset, ReadCallback done) {
  const ReadSegment segment{remote_offset, length, local_offset};
  std::vector<ReadRequest> one;
  one.push_back(impl_->make_request(peer, std::span(&segment, 1), local, std::move(done)));
  impl_->enqueue(std::move(one));
}

void Fabric::read_region(int peer, const RemoteRegion& remote, std::uint64_t remote_offset, std::size_t length,
                         const LocalRegion& local, std::size_t local_offset, ReadCallback done) {
  const ReadSegment segment{remote_offset, length, local_offset};
  std::vector<ReadRequest> one;
  one.push_back(impl_->make_request(peer, std::span(&segment, 1), local, std::move(done), &remote));
  impl_->enqueue(std::move(one));
}

void Fabric::heartbeat_read(int peer, std::uint64_t remote_offset, std::size_t length, const LocalRegion& local,
                            std::size_t local_offset, ReadCallback done) {
  const ReadSegment segment{remote_offset, length, local_offset};
  std::vector<ReadRequest> one;
  one.push_back(impl_->make_request(peer, std::span(&segment, 1), local, std::move(done)));
  one.back().priority = true;
  impl_->enqueue(std::move(one));
}

std::size_t Fabric::max_segments_per_read() const { return impl_->max_segments; }

void Fabric::read_many(std::vector<VectorRead> reads, const LocalRegion& local) {
  std::vector<ReadRequest> requests;
  requests.reserve(reads.size());
  for (VectorRead& read : reads) {
    const std::size_t count = std::min(read.segment_count, read.segments.size());
    ReadRequest request =
        impl_->make_request(read.peer, std::span(read.segments.data(), count), local, std::move(read.done));
    if (read.segment_count > read.segments.size()) {
      request.rejection = make_error(StatusCode::kInvalidArgument, "read from peer {}: {} segments in one read; at "
                                                                   "most {}",
                                     read.peer, read.segment_count, read.segments.size());
    }
    requests.push_back(std::move(request));
  }
  impl_->enqueue(std::move(requests));
}

void Fabric::fail_peer(int peer, Status why) {
  Impl& impl = *impl_;
  if (peer < 0 || peer >= impl.nranks || why.ok()) return;
  {
    std::lock_guard lock(impl.queue_mutex);
    impl.new_peer_failures.emplace_back(peer, std::move(why));
  }
  if (impl.wait_mode == CqWaitMode::kBlockingSread) {
    if (impl.progress_sleeping.load()) (void)fi_cq_signal(impl.cq.get());
  } else {
    impl.queue_cv.notify_one();
  }
}

FabricStats Fabric::stats() const {
  FabricStats stats;
  stats.reads_posted = impl_->reads_posted.load(std::memory_order_relaxed);
  stats.reads_completed = impl_->reads_completed.load(std::memory_order_relaxed);
  stats.reads_failed = impl_->reads_failed.load(std::memory_order_relaxed);
  stats.bytes_read = impl_->bytes_read.load(std::memory_order_relaxed);
  return stats;
}

}  // namespace shardmix::fabric
