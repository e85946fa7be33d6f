// Catalog::from_entries skips its sort when the input is already in catalog order
// (docs/decisions/0029): the catalog must not depend on the order entries arrive in, and
// duplicates must be found whether or not the sort ran.
#include <algorithm>
#include <set>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "common/catalog.h"

namespace shardmix {
namespace catalog_order_test {

rc::Gen<std::vector<CatalogEntry>> distinct_entries() {
  return rc::gen::map(
      rc::gen::container<std::set<std::pair<std::string, std::int32_t>>>(
          rc::gen::pair(rc::gen::nonEmpty(rc::gen::container<std::string>(rc::gen::elementOf(std::string("ab/_x")))),
                        rc::gen::inRange<std::int32_t>(0, 4))),
      [](const std::set<std::pair<std::string, std::int32_t>>& items) {
        std::vector<CatalogEntry> out;
        std::set<std::string> paths;
        for (const auto& [path, label] : items) {
          if (paths.insert(path).second) out.push_back(CatalogEntry{path, path.size() * 3, label});
        }
        return out;
      });
}

std::vector<std::string> names() { return {"c0", "c1", "c2", "c3"}; }

RC_GTEST_PROP(CatalogOrderTest, CatalogDoesNotDependOnInputOrder, ()) {
  auto entries = *distinct_entries();
  RC_PRE(!entries.empty());
  auto shuffled = entries;
  // A random permutation: swap each position with a drawn one (Fisher-Yates).
  for (std::size_t i = shuffled.size(); i > 1; --i) {
    std::swap(shuffled[i - 1], shuffled[*rc::gen::inRange<std::size_t>(0, i)]);
  }
  auto sorted = entries;
  std::sort(sorted.begin(), sorted.end(), [](const CatalogEntry& a, const CatalogEntry& b) {
    return a.label != b.label ? a.label < b.label : a.path < b.path;
  });
  auto from_shuffled = Catalog::from_entries(shuffled, names());
  auto from_sorted = Catalog::from_entries(sorted, names());
  RC_ASSERT(from_shuffled.ok());
  RC_ASSERT(from_sorted.ok());
  RC_ASSERT(from_shuffled->serialize() == from_sorted->serialize());
}

RC_GTEST_PROP(CatalogOrderTest, DuplicatePathsAreRejectedNamingTheBytewiseFirst, ()) {
  auto entries = *distinct_entries();
  RC_PRE(entries.size() >= 2);
  // Duplicate one or two paths (with any label), in sorted or shuffled input.
  std::set<std::string> duplicated;
  const std::size_t dups = *rc::gen::inRange<std::size_t>(1, 3);
  for (std::size_t d = 0; d < dups; ++d) {
    const CatalogEntry& e = entries[*rc::gen::inRange<std::size_t>(0, entries.size())];
    duplicated.insert(e.path);
    entries.push_back(CatalogEntry{e.path, 1, *rc::gen::inRange<std::int32_t>(0, 4)});
  }
  if (*rc::gen::arbitrary<bool>()) {
    std::sort(entries.begin(), entries.end(), [](const CatalogEntry& a, const CatalogEntry& b) {
      return a.label != b.label ? a.label < b.label : a.path < b.path;
    });
  }
  auto c = Catalog::from_entries(entries, names());
  RC_ASSERT(!c.ok());
  RC_ASSERT(c.status().message().find("duplicate sample path '" + *duplicated.begin() + "'") != std::string::npos);
}

}  // namespace catalog_order_test
}  // namespace shardmix
