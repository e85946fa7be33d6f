#include "server/startup_report.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <sstream>

#include <fmt/format.h>

namespace shardmix {

void PhaseClock::mark(std::string_view name, Clock::time_point now) {
  const double seconds = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  auto it = std::find_if(phases_.begin(), phases_.end(), [&](const auto& p) { return p.first == name; });
  if (it != phases_.end()) {
    it->second += seconds;
  } else {
    phases_.emplace_back(std::string(name), seconds);
  }
}

namespace {

bool valid_key(std::string_view key) {
  return !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

bool valid_value(std::string_view value) {
  return !value.empty() && std::none_of(value.begin(), value.end(), [](char c) {
    return std::isspace(static_cast<unsigned char>(c)) != 0 || c == '=';
  });
}

}  // namespace

Result<std::string> format_report_line(std::string_view tag, const ReportFields& fields) {
  if (!valid_key(tag)) return make_error(StatusCode::kInvalidArgument, "report tag '{}' is not [a-z0-9_]+", tag);
  std::string line = fmt::format("{}:", tag);
  for (const auto& [key, value] : fields) {
    if (!valid_key(key)) {
      return make_error(StatusCode::kInvalidArgument, "{} report: key '{}' is not [a-z0-9_]+", tag, key);
    }
    if (!valid_value(value)) {
      return make_error(StatusCode::kInvalidArgument, "{} report: value '{}' of key {} is empty or has whitespace or '='",
                        tag, value, key);
    }
    line += fmt::format(" {}={}", key, value);
  }
  return line;
}

Result<std::map<std::string, std::string>> parse_report_line(std::string_view line, std::string_view tag) {
  // The tag starts a word ("restartup:" is not "startup:") and is followed by a space or
  // ends the line (a report without fields).
  const std::string marker = fmt::format("{}:", tag);
  auto starts_report = [&](std::size_t at) {
    const std::size_t after = at + marker.size();
    return (at == 0 || !valid_key(line.substr(at - 1, 1))) && (after == line.size() || line[after] == ' ');
  };
  std::size_t at = line.find(marker);
  while (at != std::string_view::npos && !starts_report(at)) at = line.find(marker, at + 1);
  if (at == std::string_view::npos) return make_error(StatusCode::kNotFound, "no '{} ' in the line", marker);
  std::istringstream tokens{std::string(line.substr(at + marker.size()))};
  std::map<std::string, std::string> fields;
  std::string token;
  while (tokens >> token) {
    const auto eq = token.find('=');
    if (eq == std::string::npos || !valid_key(std::string_view(token).substr(0, eq)) ||
        !valid_value(std::string_view(token).substr(eq + 1))) {
      return make_error(StatusCode::kInvalidArgument, "{} report: malformed field '{}' (want key=value)", tag, token);
    }
    if (!fields.emplace(token.substr(0, eq), token.substr(eq + 1)).second) {
      return make_error(StatusCode::kInvalidArgument, "{} report: key '{}' given twice", tag, token.substr(0, eq));
    }
  }
  return fields;
}

ReportFields startup_fields(int rank, const PhaseClock& clock) {
  ReportFields fields{{"rank", std::to_string(rank)},
                      {"t_begin", fmt::format("{:.6f}", clock.begin_monotonic_seconds())},
                      {"t_end", fmt::format("{:.6f}", clock.last_monotonic_seconds())}};
  for (const auto& [name, seconds] : clock.phases()) fields.emplace_back(name, fmt::format("{:.3f}", seconds));
  fields.emplace_back("total", fmt::format("{:.3f}", clock.total_seconds()));
  return fields;
}

std::optional<std::uint64_t> proc_status_bytes(std::string_view status_text, std::string_view key) {
  std::istringstream in{std::string(status_text)};
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() <= key.size() || line.compare(0, key.size(), key) != 0 || line[key.size()] != ':') continue;
    std::istringstream rest(line.substr(key.size() + 1));
    std::uint64_t value = 0;
    std::string unit;
    if (!(rest >> value)) return std::nullopt;
    rest >> unit;
    // The kernel prints memory sizes in kB (KiB); a field without a unit is a count.
    return unit == "kB" ? value * 1024 : value;
  }
  return std::nullopt;
}

std::optional<std::uint64_t> self_status_bytes(std::string_view key) {
  std::ifstream in("/proc/self/status");
  if (!in) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return proc_status_bytes(text, key);
}

}  // namespace shardmix
