// A fabric reading its own exposed region through the provider (one rank, its own
// endpoint in the AV): the self-test and bandwidth probe of shardmix-doctor and the
// mr_mode test. It goes through Fabric's own create/expose/register_local/connect_peers/
// read path, so it fails where that code assumes something the provider did not grant
// (virtual addresses vs offsets, requested vs provider keys, local descriptors).
// Thread-safety: the functions block the caller; no shared state.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "fabric/fabric.h"

namespace shardmix::fabric {

struct BandwidthSample {
  std::size_t read_bytes = 0;   // bytes per fi_read
  std::size_t total_bytes = 0;  // bytes read at this size
  double seconds = 0;
  double gigabytes_per_second() const { return seconds > 0 ? total_bytes / seconds / 1e9 : 0; }
};

struct LoopbackReport {
  std::string provider_name;
  std::string domain_name;
  int granted_mr_mode = 0;
  std::size_t reads_checked = 0;       // self-test reads whose bytes matched
  std::size_t bytes_checked = 0;
  std::vector<BandwidthSample> bandwidth;  // one per requested size, in order
};

// Opens a one-rank fabric with `options`, exposes a patterned region, reads it back at
// unaligned offsets (single and vectored reads) and compares every byte; then, for each
// of `probe_sizes`, reads `probe_total_bytes` in reads of that size and times them. An
// error names the provider and the first mismatching offset.
Result<LoopbackReport> run_loopback(const FabricOptions& options, std::span<const std::size_t> probe_sizes = {},
                                    std::size_t probe_total_bytes = 0);

}  // namespace shardmix::fabric
