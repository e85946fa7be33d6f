// The one place a program's command line is parsed (every tool, benchmark, shardmixd and
// the simulator call it instead of CLI11_PARSE).
//
// Why a function of its own: CLI11 (Debian 12 ships 2.1, header-only, without its
// precompiled mode) defines App::parse, its error handling and the help formatter inline,
// so every program that calls parse compiled them again: about 7 CPU seconds of each
// program's -O3 build, twenty programs per test stage (docs/decisions/0054). Here they are
// compiled once, in this file.
#pragma once

#include <optional>

#include <CLI/CLI.hpp>

namespace shardmix {

// Parses argv into `app`. Returns the status the program should exit with now (0 after
// --help or --version, CLI11's usage-error status after a bad argument, with the message
// printed as CLI11_PARSE prints it), or nothing when the program should go on.
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv);

}  // namespace shardmix
