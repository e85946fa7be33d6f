#include "control/app_context.h"

#include <cstdlib>
#include <vector>

namespace shardmix {

std::optional<AppContextRange> app_context_range(const char* num_procs, int appnum) {
  if (num_procs == nullptr || appnum < 0) return std::nullopt;
  std::vector<int> sizes;
  for (const char* p = num_procs; *p != '\0';) {
    char* end = nullptr;
    const long n = std::strtol(p, &end, 10);
    if (end == p || n < 0) break;
    sizes.push_back(static_cast<int>(n));
    p = end;
  }
  if (appnum >= static_cast<int>(sizes.size())) return std::nullopt;
  AppContextRange range;
  for (int a = 0; a < appnum; ++a) range.first += sizes[static_cast<std::size_t>(a)];
  range.count = sizes[static_cast<std::size_t>(appnum)];
  return range;
}

}  // namespace shardmix
