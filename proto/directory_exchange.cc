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
  return decode_enveloped(r, kDirectoryAskMagic, kDirectoryExchangeVersion, what, "directory request", out);
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
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out.labels[i] < 0) {
      return what + ": entry " + std::to_string(i) + " of request " + std::to_string(out.request) +
             " has negative label " + std::to_string(out.labels[i]);
    }
  }
  return {};
}

}  // namespace shardmix::proto
