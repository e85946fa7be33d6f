// Start-up phase times and memory figures, logged by shardmixd as one line each so that
// bench/startup.sh and bench/cost.sh read what the daemon measured instead of guessing
// from the outside (docs/decisions/0029-startup-and-cost-figures.md).
//
// Line format: "<tag>: key=value key=value ..." where keys are [a-z0-9_]+ and values
// contain no whitespace, e.g.
//   startup: rank=0 t_begin=1234.500000 scan=0.812 catalog_exchange=0.104 ... total=3.2
// Whatever the logger puts in front of the tag (time, rank, component) is ignored by the
// parser, which looks for the tag followed by ": ".
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace shardmix {

// Splits a run of steps into named phases: each mark() closes the phase that began at
// the previous mark (or at construction).
class PhaseClock {
 public:
  using Clock = std::chrono::steady_clock;
  explicit PhaseClock(Clock::time_point begin = Clock::now()) : begin_(begin), last_(begin) {}
  // Ends the phase `name` now. A name marked twice accumulates (a phase interrupted by
  // another, e.g. two collectives of the same exchange).
  void mark(std::string_view name, Clock::time_point now = Clock::now());
  // Phases in the order they were first marked, seconds each.
  const std::vector<std::pair<std::string, double>>& phases() const { return phases_; }
  double total_seconds() const { return std::chrono::duration<double>(last_ - begin_).count(); }
  // CLOCK_MONOTONIC seconds of the first phase's start: comparable with other processes'
  // steady_clock on the same machine (the benchmark measures mpirun -> begin with it).
  double begin_monotonic_seconds() const { return std::chrono::duration<double>(begin_.time_since_epoch()).count(); }
  double last_monotonic_seconds() const { return std::chrono::duration<double>(last_.time_since_epoch()).count(); }

 private:
  Clock::time_point begin_;
  Clock::time_point last_;
  std::vector<std::pair<std::string, double>> phases_;
};

using ReportFields = std::vector<std::pair<std::string, std::string>>;

// "<tag>: k=v k=v". Keys must match [a-z0-9_]+ and values must be non-empty without
// whitespace or '='; anything else is a programming error reported as kInvalidArgument.
Result<std::string> format_report_line(std::string_view tag, const ReportFields& fields);
// The fields of the first "<tag>: " in `line`; kNotFound if the tag is absent,
// kInvalidArgument (naming the token) for a malformed field or a key given twice.
Result<std::map<std::string, std::string>> parse_report_line(std::string_view line, std::string_view tag);

// The "startup" line: rank, t_begin / t_end (monotonic seconds), each phase's seconds
// (3 decimals), total.
ReportFields startup_fields(int rank, const PhaseClock& clock);

// A "<Key>:   123 kB" field of /proc/<pid>/status text, in bytes; nullopt if absent.
std::optional<std::uint64_t> proc_status_bytes(std::string_view status_text, std::string_view key);
// The same from /proc/self/status; nullopt if unreadable.
std::optional<std::uint64_t> self_status_bytes(std::string_view key);

}  // namespace shardmix
