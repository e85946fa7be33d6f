#include "proto/directory_exchange.h"

namespace shardmix::proto {

std::vector<std::uint8_t> encode_directory_ask(const DirectoryAsk& ask) {
  return encode_enveloped(kDirectoryAskMagic, kDirectoryExchangeVersion, ask);
}

std::vector<std::uint8_t> encode_directory_answer(const DirectoryAnswer& answer) {
  if (answer.error.size() <= kMaxDirectoryErrorBytes) {
    return encode_enveloped(kDirectoryAnswerMagic, kDirectoryExchangeVersion, answer);
  }
  // An error is a sentence; one longer than the layout allows is cut, not refused.
  DirectoryAnswer cut;
  cut.request = answer.request;
  cut.error = answer.error.substr(0, kMaxDirectoryErrorBytes);
  return encode_enveloped(kDirectoryAnswerMagic, kDirectoryExchangeVersion, cut);
}

std::string decode_directory_ask(std::span<const std::uint8_t> bytes, std::string_view from, DirectoryAsk& out) {
  const std::string what = "directory request from " + std::string(from);
  FieldReader r(bytes, what, "message");
  std::string err = decode_enveloped(r, kDirectoryAskMagic, kDirectoryExchangeVersion, what, "directory request", out);
  if (err.empty() && (out.flags & ~kAskEveryLocation) != 0) {
    err = what + ": request " + std::to_string(out.request) + " sets unknown flags " + std::to_string(out.flags);
  }
  return err;
}

std::string decode_directory_answer(std::span<const std::uint8_t> bytes, std::string_view from,
                                    DirectoryAnswer& out) {
  const std::string what = "directory answer from " + std::string(from);
  FieldReader r(bytes, what, "message");
  std::string err = decode_enveloped(r, kDirectoryAnswerMagic, kDirectoryExchangeVersion, what, "directory answer", out);
  if (!err.empty()) return err;
  if (!out.error.empty() && out.size() > 0) {
    return what + ": request " + std::to_string(out.request) + " carries an error and " + std::to_string(out.size()) +
           " entries";
  }
  const std::string of_request = " of request " + std::to_string(out.request);
  std::size_t k = 0;  // the next location
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out.labels[i] < 0) {
      return what + ": entry " + std::to_string(i) + of_request + " has negative label " + std::to_string(out.labels[i]);
    }
    const bool wanted = out.every_entry || out.arena_offset[i] == kDirectoryNotResident;
    const bool located = k < out.located_entry.size() && out.located_entry[k] == i;
    if (wanted != located) {
      return what + ": entry " + std::to_string(i) + of_request +
             (wanted ? (out.every_entry ? " has no storage location in an answer of every location"
                                        : " is cold but has no storage location")
                     : " is resident but has a storage location");
    }
    if (located) {
      const std::uint64_t begin = k == 0 ? 0 : out.located_path_end[k - 1];
      if (out.located_path_end[k] < begin || out.located_path_end[k] > out.located_paths.size()) {
        return what + ": located entry " + std::to_string(i) + of_request + " has its path at [" + std::to_string(begin) +
               ", " + std::to_string(out.located_path_end[k]) + ") of " + std::to_string(out.located_paths.size()) +
               " path bytes";
      }
      ++k;
    }
  }
  if (k != out.located_entry.size()) {
    return what + ": location " + std::to_string(k) + of_request + " names entry " +
           std::to_string(out.located_entry[k]) + " out of order or beyond the " + std::to_string(out.size()) +
           " entries";
  }
  if (!out.located_entry.empty() && out.located_path_end.back() != out.located_paths.size()) {
    return what + ": request " + std::to_string(out.request) + " carries " +
           std::to_string(out.located_paths.size() - out.located_path_end.back()) + " path bytes past its last path";
  }
  return {};
}

}  // namespace shardmix::proto
