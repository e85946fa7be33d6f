#include "common/json_text.h"

#include <fmt/format.h>

namespace shardmix {

std::string json_quote(std::string_view text) {
  std::string q = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') q += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      q += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      continue;
    }
    q += c;
  }
  return q + "\"";
}

}  // namespace shardmix
