// What this process's mappings look like to the kernel (/proc/self/smaps), for tests of
// code that maps memory: which mapping holds an address, and its VmFlags ("hg" =
// MADV_HUGEPAGE). Tests judge mappings by where they lie and what they say, not by how
// many the process has (a sanitizer's runtime maps memory of its own at any moment).
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace shardmix::test {

struct MappingEntry {
  std::uintptr_t begin = 0, end = 0;  // [begin, end); both 0 when nothing maps the address
  std::string header;                 // the mapping's first line (range, mode, offset, path)
  std::string vm_flags;               // " rd wr sh mr ... hg " (spaces around every flag)
  bool advised_huge() const { return vm_flags.find(" hg ") != std::string::npos; }
};

inline MappingEntry mapping_holding(const void* address) {
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  MappingEntry found;
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t begin = 0, end = 0;
    char dash = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "%c%" SCNxPTR, &begin, &dash, &end) == 3 && dash == '-') {
      if (inside) break;  // the holding mapping's lines are over
      inside = at >= begin && at < end;
      if (inside) found = MappingEntry{begin, end, line, ""};
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      found.vm_flags = line.substr(8) + " ";
    }
  }
  return found;
}

}  // namespace shardmix::test
