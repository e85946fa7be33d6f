// The one logging facade: spdlog underneath, lines prefixed "[rank r][component]".
// Thread-safe (spdlog loggers are). The client library stays quiet (warn) unless
// SHARDMIX_LOG_LEVEL or set_level says otherwise.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

namespace shardmix::log {

// Sets the rank printed in every line and the default level ("info", "debug", ...).
void init(int rank, std::string_view level);
// A named component logger, e.g. get("fabric"); created on first use.
std::shared_ptr<spdlog::logger> get(const std::string& component);
void set_level(std::string_view level);

}  // namespace shardmix::log
