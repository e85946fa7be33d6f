// Text for JSON output written by hand (the stats file, the trace files): one quoting
// rule everywhere, so a path or host name with a quote or a control character never
// breaks a file.
#pragma once

#include <string>
#include <string_view>

namespace shardmix {

// `text` as a JSON string literal: quotes and backslashes escaped, control characters as \uXXXX.
std::string json_quote(std::string_view text);

}  // namespace shardmix
