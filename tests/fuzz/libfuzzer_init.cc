// Linked into the libFuzzer binaries only: with SHARDMIX_FUZZ_WRITE_SEEDS=DIR in the
// environment, writes the target's generated seeds into DIR before libFuzzer reads its
// corpus dirs (pass DIR as the first corpus dir; libFuzzer also adds new inputs there).
#include <cstdio>
#include <cstdlib>

#include "tests/fuzz/fuzz.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (const char* dir = std::getenv("SHARDMIX_FUZZ_WRITE_SEEDS"); dir != nullptr && *dir != '\0') {
    const std::size_t n = shardmix::fuzz::write_seeds(dir);
    std::fprintf(stderr, "wrote %zu generated seeds to %s\n", n, dir);
  }
  return 0;
}
