// The one logging facade: spdlog underneath, one line format everywhere:
//   2026-11-22T01:49:03.123 I [rank 3][fabric] message
// (local time, level letter, the daemon's rank or "-", the component).
// Levels: a default level, and per-component overrides ("fabric=debug,service=warn").
// Thread-safe (spdlog loggers are; our registry is guarded by one mutex). The client
// library stays quiet (warn) unless SHARDMIX_LOG_LEVEL or set_level says otherwise.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "common/status.h"

namespace shardmix::log {

// Parses "component=level,component=level" (spaces allowed, "" = none). Levels: trace,
// debug, info, warn, error, critical, off. The error names the offending pair.
Result<std::map<std::string, std::string>> parse_component_levels(std::string_view spec);

// Sets the rank printed in every line, the default level ("info", "debug", ...) and the
// per-component overrides (as parse_component_levels accepts; a malformed spec is ignored,
// so check it first).
void init(int rank, std::string_view level, std::string_view components = {});
// A named component logger, e.g. get("fabric"); created on first use.
std::shared_ptr<spdlog::logger> get(const std::string& component);
// Sets the default level (components with an override keep theirs).
void set_level(std::string_view level);

}  // namespace shardmix::log
