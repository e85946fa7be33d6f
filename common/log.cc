#include "common/log.h"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace shardmix::log {
namespace {

std::mutex g_mutex;  // guards g_rank, g_level and logger creation
int g_rank = -1;
spdlog::level::level_enum g_level = spdlog::level::warn;

std::string pattern_for(const std::string& component) {
  std::string rank = g_rank >= 0 ? std::to_string(g_rank) : "-";
  return "%Y-%m-%dT%H:%M:%S.%e %^%L%$ [rank " + rank + "][" + component + "] %v";
}

}  // namespace

void init(int rank, std::string_view level) {
  std::lock_guard lock(g_mutex);
  g_rank = rank;
  g_level = spdlog::level::from_str(std::string(level));
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& logger) {
    logger->set_pattern(pattern_for(logger->name()));
    logger->set_level(g_level);
  });
}

void set_level(std::string_view level) {
  std::lock_guard lock(g_mutex);
  g_level = spdlog::level::from_str(std::string(level));
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->set_level(g_level); });
}

std::shared_ptr<spdlog::logger> get(const std::string& component) {
  std::lock_guard lock(g_mutex);
  if (auto logger = spdlog::get(component)) return logger;
  if (const char* env = std::getenv("SHARDMIX_LOG_LEVEL"); env != nullptr && g_rank < 0) {
    g_level = spdlog::level::from_str(env);
  }
  auto logger = spdlog::stderr_color_mt(component);
  logger->set_pattern(pattern_for(component));
  logger->set_level(g_level);
  return logger;
}

}  // namespace shardmix::log
