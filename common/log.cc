#include "common/log.h"

#include <cstdlib>
#include <mutex>
#include <optional>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace shardmix::log {
namespace {

std::mutex g_mutex;  // guards g_rank, g_level, g_components and logger creation
int g_rank = -1;
spdlog::level::level_enum g_level = spdlog::level::warn;
std::map<std::string, spdlog::level::level_enum> g_components;

std::string pattern_for(const std::string& component) {
  std::string rank = g_rank >= 0 ? std::to_string(g_rank) : "-";
  return "%Y-%m-%dT%H:%M:%S.%e %^%L%$ [rank " + rank + "][" + component + "] %v";
}

spdlog::level::level_enum level_for(const std::string& component) {
  auto it = g_components.find(component);
  return it != g_components.end() ? it->second : g_level;
}

std::optional<spdlog::level::level_enum> level_from_name(std::string_view name) {
  static const std::pair<std::string_view, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},       {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"warning", spdlog::level::warn},      {"error", spdlog::level::err},
      {"critical", spdlog::level::critical}, {"off", spdlog::level::off},
  };
  for (const auto& [n, l] : kLevels) {
    if (n == name) return l;
  }
  return std::nullopt;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<std::map<std::string, std::string>> parse_component_levels(std::string_view spec) {
  std::map<std::string, std::string> out;
  while (!trim(spec).empty()) {
    const std::size_t comma = spec.find(',');
    const std::string_view pair = trim(spec.substr(0, comma));
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    const std::string_view component = eq == std::string_view::npos ? pair : trim(pair.substr(0, eq));
    const std::string_view level = eq == std::string_view::npos ? std::string_view() : trim(pair.substr(eq + 1));
    if (eq == std::string_view::npos || component.empty() || !level_from_name(level)) {
      return make_error(StatusCode::kInvalidArgument,
                        "log.components: '{}' is not component=level (levels: trace, debug, info, warn, error, "
                        "critical, off)",
                        pair);
    }
    out[std::string(component)] = std::string(level);
  }
  return out;
}

void init(int rank, std::string_view level, std::string_view components) {
  std::lock_guard lock(g_mutex);
  g_rank = rank;
  g_level = level_from_name(level).value_or(spdlog::level::info);
  g_components.clear();
  if (auto parsed = parse_component_levels(components); parsed.ok()) {
    for (const auto& [component, l] : *parsed) g_components[component] = *level_from_name(l);
  }
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& logger) {
    logger->set_pattern(pattern_for(logger->name()));
    logger->set_level(level_for(logger->name()));
  });
}

void set_level(std::string_view level) {
  std::lock_guard lock(g_mutex);
  g_level = level_from_name(level).value_or(g_level);
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->set_level(level_for(l->name())); });
}

std::shared_ptr<spdlog::logger> get(const std::string& component) {
  std::lock_guard lock(g_mutex);
  if (auto logger = spdlog::get(component)) return logger;
  if (const char* env = std::getenv("SHARDMIX_LOG_LEVEL"); env != nullptr && g_rank < 0) {
    g_level = level_from_name(env).value_or(g_level);
  }
  auto logger = spdlog::stderr_color_mt(component);
  logger->set_pattern(pattern_for(component));
  logger->set_level(level_for(component));
  return logger;
}

}  // namespace shardmix::log
