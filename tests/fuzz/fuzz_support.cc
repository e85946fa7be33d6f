#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tests/fuzz/fuzz.h"

namespace shardmix::fuzz {

std::string current_input;  // set by replay_main.cc, named in failure messages

Bytes to_bytes(std::string_view text) { return Bytes(text.begin(), text.end()); }

std::string hex_prefix(const std::uint8_t* data, std::size_t size, std::size_t max_bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < size && i < max_bytes; ++i) {
    out += kDigits[data[i] >> 4];
    out += kDigits[data[i] & 15];
  }
  if (size > max_bytes) out += "...";
  return out;
}

void fail(const char* file, int line, const char* condition, const std::string& detail) {
  std::fprintf(stderr, "\nFUZZ CHECK FAILED at %s:%d: %s\n  %s\n", file, line, condition, detail.c_str());
  if (!current_input.empty()) std::fprintf(stderr, "  input: %s\n", current_input.c_str());
  std::fflush(stderr);
  std::abort();
}

std::size_t write_seeds(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "cannot create seed dir %s: %s\n", dir.c_str(), ec.message().c_str());
    std::exit(2);
  }
  std::size_t n = 0;
  for (const auto& [name, bytes] : seeds()) {
    const std::string path = dir + "/seed-" + name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write seed %s\n", path.c_str());
      std::exit(2);
    }
    ++n;
  }
  return n;
}

}  // namespace shardmix::fuzz
