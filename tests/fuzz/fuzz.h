// Shared by the fuzz targets in this directory (docs/decisions/0012).
//
// Each target is one LLVMFuzzerTestOneInput plus seeds(): valid inputs made with the real
// encoders/writers, so they follow format changes without anyone regenerating files.
// The same source builds two ways:
//   - fuzz_<name>_replay (every build, ctest label unit;fuzz_replay): feeds the seeds and
//     every file of the given corpus dirs to LLVMFuzzerTestOneInput once (replay_main.cc);
//   - fuzz_<name> (SHARDMIX_FUZZ=ON, clang): a libFuzzer binary; with the environment
//     variable SHARDMIX_FUZZ_WRITE_SEEDS=DIR it first writes the seeds into DIR.
// A target checks behaviour, not only "no crash": FUZZ_CHECK aborts (libFuzzer saves the
// input as a crash artifact; the replay test fails) when a decoded value does not
// round-trip or breaks a documented invariant.
// Thread-safety: single-threaded harness code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace shardmix::fuzz {

using Bytes = std::vector<std::uint8_t>;
using Seeds = std::vector<std::pair<std::string, Bytes>>;  // file name -> contents

// Defined by each target.
Seeds seeds();

Bytes to_bytes(std::string_view text);
std::string hex_prefix(const std::uint8_t* data, std::size_t size, std::size_t max_bytes = 64);

// Prints what failed and aborts.
[[noreturn]] void fail(const char* file, int line, const char* condition, const std::string& detail);

// Writes seeds() into `dir` (created if missing) as seed-<name> files; returns how many.
std::size_t write_seeds(const std::string& dir);

}  // namespace shardmix::fuzz

#define FUZZ_CHECK(condition, detail)                                                \
  do {                                                                               \
    if (!(condition)) ::shardmix::fuzz::fail(__FILE__, __LINE__, #condition, (detail)); \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
