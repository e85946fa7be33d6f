// main() of the fuzz_<name>_replay tests: runs LLVMFuzzerTestOneInput once on every
// generated seed and on every file of the corpus dirs (or files) given as arguments.
// Each input is copied into a buffer of exactly its size, so a sanitizer build catches an
// over-read as libFuzzer would. Exit 0 = every check held; a failed check aborts.
//   fuzz_<name>_replay CORPUS_DIR_OR_FILE...
//   fuzz_<name>_replay --write-seeds DIR      (writes the generated seeds as files)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz.h"

namespace shardmix::fuzz {
extern std::string current_input;
}

namespace {

namespace fs = std::filesystem;
using shardmix::fuzz::Bytes;

void run_one(const std::string& name, const Bytes& input) {
  shardmix::fuzz::current_input = name;
  Bytes exact(input);  // a fresh allocation of exactly input.size() bytes
  LLVMFuzzerTestOneInput(exact.data(), exact.size());
}

bool read_file(const fs::path& path, Bytes& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string self = fs::path(argv[0]).filename().string();
  if (argc == 3 && std::string(argv[1]) == "--write-seeds") {
    const std::size_t n = shardmix::fuzz::write_seeds(argv[2]);
    std::printf("%s: wrote %zu seeds to %s\n", self.c_str(), n, argv[2]);
    return 0;
  }
  std::size_t seeds = 0;
  for (const auto& [name, bytes] : shardmix::fuzz::seeds()) {
    run_one("generated seed " + name, bytes);
    ++seeds;
  }
  if (seeds == 0) {
    std::fprintf(stderr, "%s: the target generated no seeds\n", self.c_str());
    return 1;
  }
  std::size_t files = 0;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg(argv[i]);
    std::vector<fs::path> inputs;
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      for (const fs::directory_entry& e : fs::recursive_directory_iterator(arg, ec)) {
        if (e.is_regular_file()) inputs.push_back(e.path());
      }
      if (ec) {
        std::fprintf(stderr, "%s: cannot list %s: %s\n", self.c_str(), argv[i], ec.message().c_str());
        return 1;
      }
      if (inputs.empty()) {  // a corpus that vanished must not pass silently
        std::fprintf(stderr, "%s: corpus dir %s holds no files\n", self.c_str(), argv[i]);
        return 1;
      }
      std::sort(inputs.begin(), inputs.end());
    } else if (fs::is_regular_file(arg, ec)) {
      inputs.push_back(arg);
    } else {
      std::fprintf(stderr, "%s: %s is neither a corpus dir nor a file\n", self.c_str(), argv[i]);
      return 1;
    }
    for (const fs::path& path : inputs) {
      Bytes bytes;
      if (!read_file(path, bytes)) {
        std::fprintf(stderr, "%s: cannot read %s\n", self.c_str(), path.c_str());
        return 1;
      }
      run_one(path.string(), bytes);
      ++files;
    }
  }
  std::printf("%s: %zu generated seeds and %zu corpus files replayed; every check held\n", self.c_str(), seeds,
              files);
  return 0;
}
