// libfabric RMA adapter: one RDM endpoint per daemon, one exposed region (the cache
// arena) that peers read with one-sided fi_read, local target regions (staging slots),
// and a progress thread that owns every post and CQ poll for the endpoint's whole life
// (tcp/shm/net need manual progress on the *target* too; see docs/decisions).
//
// Lifecycle (main thread): create -> expose -> register_local* -> endpoint_blob ->
//   (MPI allgather of blobs) -> connect_peers -> start_progress -> read()* -> stop_progress.
// Thread-safety: read() and stats() are safe from any thread; everything else is
// main-thread only. Completion callbacks run on the progress thread: keep them short.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "fabric/provider.h"

namespace shardmix::fabric {

// The most segments one read carries, whatever the provider allows: enough to turn a
// batch's reads from one peer into a few operations (tcp and shm allow 4 here).
inline constexpr std::size_t kMaxReadSegments = 4;

struct FabricOptions {
  // "auto": verbs when an RDMA device is present (rdma-core's ibv_get_device_list) and
  // fi_getinfo offers it, else tcp (choose_provider; a fallback is logged as a warning). Otherwise a libfabric provider name: "tcp" (used as tcp;ofi_rxm), "shm",
  // "verbs" (as verbs;ofi_rxm), or any name fi_info lists.
  std::string provider = "auto";
  std::string interface;                 // domain name filter, e.g. "lo"; "" = first match
  // Reads handed to the provider at once (also capped by the provider's tx size). With 3
  // or more ranks one peer may hold at most all but one of them, so a peer that stops
  // answering cannot starve reads to the others; create() therefore refuses fewer than 2
  // with 3 or more ranks. Heartbeats (heartbeat_read) are not counted against it.
  std::uint32_t max_outstanding_reads = 8;
  // Segments per read (fabric.max_read_segments): 1 posts every sample as its own fi_read.
  std::uint32_t max_read_segments = kMaxReadSegments;
  // The mr_mode bits asked of fi_getinfo (FI_MR_* from rdma/fi_domain.h); unset = the
  // portable set (LOCAL|VIRT_ADDR|ALLOCATED|PROV_KEY|ENDPOINT). Not a config key: the
  // mr_mode test and shardmix-doctor set it to check that every mode a provider grants
  // works. Whatever subset the provider grants is honoured either way.
  std::optional<int> requested_mr_mode;
};

// The daemon's fabric options from its [fabric] config section (requested_mr_mode unset).
FabricOptions fabric_options_from(const FabricConfig& config);

// The provider Fabric::create opens for these options, and why: resolve_provider_name's
// mapping plus choose_provider's verbs-to-tcp fallback, with fi_getinfo as the judge of
// "usable" (the hints Fabric::create uses).
Result<ProviderChoice> choose_provider_for(const FabricOptions& options);

// One fi_getinfo answer for FI_EP_RDM with RMA reads, as shardmix-doctor reports it.
struct ProviderReport {
  std::string prov_name;     // e.g. "tcp;ofi_rxm"
  std::string fabric_name;
  std::string domain_name;
  int mr_mode = 0;           // granted FI_MR_* bits; mr_mode_names() spells them
  std::uint64_t mode = 0;    // FI_CONTEXT etc. the provider requires; mode_names()
  std::size_t max_msg_size = 0;                   // ep_attr
  std::size_t tx_size = 0, rx_size = 0;           // tx_attr->size, rx_attr->size
  std::size_t iov_limit = 0, rma_iov_limit = 0;   // tx_attr: segments per read, local and remote
  std::size_t mr_key_size = 0;                    // domain_attr: bytes in a key
  std::string threading;         // e.g. "FI_THREAD_SAFE"
  std::string data_progress;     // e.g. "FI_PROGRESS_MANUAL"
  std::string control_progress;
};

// Every FI_EP_RDM+FI_RMA answer fi_getinfo gives for `prov_name` ("" = any provider) with
// the hints Fabric::create uses, `mr_mode` replacing the default mr_mode bits when set.
// An empty vector when there is none (a refused mr_mode included).
std::vector<ProviderReport> query_rdm_rma_providers(const std::string& prov_name, std::optional<int> mr_mode);

// "FI_MR_LOCAL|FI_MR_VIRT_ADDR", or "none".
std::string mr_mode_names(int mr_mode);
// "FI_CONTEXT|FI_RX_CQ_DATA", or "none".
std::string mode_names(std::uint64_t mode);

// A locally registered region that can be the target of reads.
struct LocalRegion {
  void* base = nullptr;
  std::size_t length = 0;
  void* desc = nullptr;       // fi_mr_desc, passed to fi_read
  int index = -1;             // internal handle
};

// A region registered for remote reads after connect_peers (a checkpoint version offered
// to its replica holder, docs/decisions/0059): what a peer needs to read it, learnt from a
// message rather than from the endpoint blob. `address` is fi_read's `addr` for offset 0
// (the virtual address under FI_MR_VIRT_ADDR, else 0), as for the exposed arena.
struct RemoteRegion {
  std::uint64_t address = 0, key = 0, length = 0;
};

// A region this rank offered with offer_region(): `handle` names it to withdraw_region().
struct OfferedRegion {
  int handle = -1;
  RemoteRegion remote;
};

struct FabricStats {
  std::uint64_t reads_posted = 0;
  std::uint64_t reads_completed = 0;
  std::uint64_t reads_failed = 0;
  std::uint64_t bytes_read = 0;      // bytes this rank pulled from peers
};

using ReadCallback = std::function<void(const Status&)>;

// One piece of a vectored read: `length` bytes at `remote_offset` of the peer's exposed
// region into `local_offset` of the local target region.
struct ReadSegment {
  std::uint64_t remote_offset = 0;
  std::size_t length = 0;
  std::size_t local_offset = 0;
};


// A read of up to max_segments_per_read() segments of one peer's exposed region, posted
// as one provider operation (fi_readmsg) with one completion.
struct VectorRead {
  int peer = -1;
  std::array<ReadSegment, kMaxReadSegments> segments{};
  std::size_t segment_count = 0;
  ReadCallback done;
};

class Fabric {
 public:
  static Result<std::unique_ptr<Fabric>> create(const FabricOptions& options, int rank, int nranks);
  ~Fabric();  // stops progress, closes libfabric objects in reverse creation order

  // e.g. "tcp;ofi_rxm", "shm"
  const std::string& provider_name() const;
  const std::string& domain_name() const;
  // The FI_MR_* bits the provider granted (a subset of those requested).
  int mr_mode() const;

  // Registers [base, base+length) once for remote reads by peers. length may be 0
  // (a node that owns nothing); the blob then says so and reads of it fail cleanly.
  Status expose(void* base, std::size_t length);
  // Registers a local region as read target (needed when the provider wants FI_MR_LOCAL).
  Result<LocalRegion> register_local(void* base, std::size_t length);

  // Gives back a region from register_local (one registered for one transfer, e.g. a
  // replica's landing buffer). The caller guarantees no read into it is still queued or
  // in flight. Safe from any thread.
  void unregister_local(const LocalRegion& region);

  // Registers [base, base+length) for remote reads by peers, like expose(), but at any time
  // and as many as needed, each with its own key: a peer reads it with read_region() once
  // it learnt the RemoteRegion (by a control-plane message). length must be > 0. Safe from
  // any thread.
  Result<OfferedRegion> offer_region(const void* base, std::size_t length);
  // Deregisters an offered region: a peer's later read of it fails. Safe from any thread.
  void withdraw_region(int handle);

  // This rank's endpoint name + exposed region (address per mr_mode, key, length).
  std::vector<std::uint8_t> endpoint_blob() const;
  // Inserts every rank's blob (indexed by rank, including our own) into the AV.
  Status connect_peers(const std::vector<std::vector<std::uint8_t>>& blobs);

  void start_progress();
  // Idempotent; pending reads complete with kCancelled. Reads still posted to a peer that
  // fail_peer() gave up on (e.g. a hung one), and any posted read that does not complete
  // within the drain timeout, are reported cancelled too, but the provider may still write
  // their target buffers until the endpoint is closed: callers must keep those buffers
  // (staging, heartbeat bytes) alive until this Fabric is destroyed, not only until
  // stop_progress() returns.
  void stop_progress();

  // Reads `length` bytes at `remote_offset` of `peer`'s exposed region into
  // `local.base + local_offset`. `done` runs once on the progress thread. Errors
  // (bad peer, out of range, provider failure) are reported through `done`, naming the peer rank.
  void read(int peer, std::uint64_t remote_offset, std::size_t length, const LocalRegion& local,
            std::size_t local_offset, ReadCallback done);

  // Like read(), but of a region `peer` offered with offer_region() rather than of its
  // exposed arena: `length` bytes at `remote_offset` of `remote`.
  void read_region(int peer, const RemoteRegion& remote, std::uint64_t remote_offset, std::size_t length,
                   const LocalRegion& local, std::size_t local_offset, ReadCallback done);

  // A failure detector heartbeat (common/peer_monitor.h): like read(), but it goes to the
  // front of `peer`'s queue and is posted whatever max_outstanding_reads allows, so a live
  // peer's heartbeat never waits behind data reads (its own, or those a hung peer holds)
  // and the monitor's timeout measures the peer, not our queue. Keep it to one small read
  // per peer at a time: each may exceed max_outstanding_reads by one.
  void heartbeat_read(int peer, std::uint64_t remote_offset, std::size_t length, const LocalRegion& local,
                      std::size_t local_offset, ReadCallback done);

  // Stops reading from `peer` for good (a daemon declared dead, fault.peer_death =
  // degrade): reads queued for it, and every later read(), complete with `why` on the
  // progress thread without reaching the provider. Needed because tcp;ofi_rxm answers
  // fi_read to a peer whose connection broke with -FI_EAGAIN forever (it reconnects on
  // every call and the connect is refused; decision 0032). Reads already posted to it stay
  // with the provider until it completes them (their target memory may still be written),
  // but no longer count against max_outstanding_reads. `why` must be an error (an ok
  // status or an unknown rank is ignored). Safe from any thread.
  void fail_peer(int peer, Status why);

  // Segments one VectorRead may carry on this provider: the smaller of its local and
  // remote iov limits, at most kMaxReadSegments, at least 1.
  std::size_t max_segments_per_read() const;
  // Hands several reads to the progress thread at once (one queue lock, one wake-up),
  // each into `local`. Each read's `done` runs once on the progress thread, as for read().
  // A read with more segments than max_segments_per_read(), or none, fails through its
  // `done`, as does any segment out of range.
  void read_many(std::vector<VectorRead> reads, const LocalRegion& local);

  FabricStats stats() const;

 private:
  Fabric();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardmix::fabric
