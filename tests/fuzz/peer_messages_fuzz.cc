// Fuzz target: the daemon-to-daemon metadata layouts of owner-side metadata, which a daemon
// reads from its peers over the control plane: the start-up entry batch
// (proto/catalog_exchange.h) and the per-plan directory ask and answer
// (proto/directory_exchange.h). Every input goes through all three decoders.
//
// Checks beyond "no crash, no UB": a failure names the sending rank; a decoded value
// re-encodes to exactly the input (one encoding per value) and keeps the invariants its
// decoder promises (path lengths add up, no negative label, an answer with an error has
// no entries).
#include <numeric>
#include <string>

#include "proto/catalog_exchange.h"
#include "proto/directory_exchange.h"
#include "tests/fuzz/fuzz.h"

using namespace shardmix;
using Span = std::span<const std::uint8_t>;

namespace {

void check_named(const std::string& err) {
  FUZZ_CHECK(err.find("daemon rank 5") != std::string::npos, "error does not name the sender: " + err);
}

void entry_batch(Span input) {
  proto::EntryBatch batch;
  const std::string err = proto::decode_entry_batch(input, "daemon rank 5", batch);
  if (!err.empty()) return check_named(err);
  const std::uint64_t path_bytes = std::accumulate(batch.path_bytes.begin(), batch.path_bytes.end(), std::uint64_t{0});
  FUZZ_CHECK(path_bytes == batch.paths.size(), "path lengths do not add up");
  for (std::int32_t label : batch.labels) FUZZ_CHECK(label >= 0, "negative label accepted");
  FUZZ_CHECK(proto::encode_entry_batch(batch) == std::vector<std::uint8_t>(input.begin(), input.end()),
             "entry batch: encode(decode(x)) != x");
}

void directory_ask(Span input) {
  proto::DirectoryAsk ask;
  const std::string err = proto::decode_directory_ask(input, "daemon rank 5", ask);
  if (!err.empty()) return check_named(err);
  FUZZ_CHECK(proto::encode_directory_ask(ask) == std::vector<std::uint8_t>(input.begin(), input.end()),
             "directory ask: encode(decode(x)) != x");
}

void directory_answer(Span input) {
  proto::DirectoryAnswer answer;
  const std::string err = proto::decode_directory_answer(input, "daemon rank 5", answer);
  if (!err.empty()) return check_named(err);
  FUZZ_CHECK(answer.error.empty() || answer.size() == 0, "an answer with an error carries entries");
  for (std::int32_t label : answer.labels) FUZZ_CHECK(label >= 0, "negative label accepted");
  // Every cold entry (every entry with every_entry) has exactly one storage location, and
  // every location's path is inside.
  std::size_t wanted = 0;
  for (std::uint64_t at : answer.arena_offset) wanted += answer.every_entry || at == proto::kDirectoryNotResident;
  FUZZ_CHECK(wanted == answer.located_entry.size(), "located entries and storage locations differ in number");
  for (std::size_t k = 0; k < answer.located_entry.size(); ++k) {
    FUZZ_CHECK(answer.located_entry[k] < answer.size(), "a location names no entry");
    FUZZ_CHECK(answer.every_entry || answer.arena_offset[answer.located_entry[k]] == proto::kDirectoryNotResident,
               "a location for a resident entry accepted");
    FUZZ_CHECK(answer.located_path_end[k] <= answer.located_paths.size(), "a path outside located_paths accepted");
    (void)answer.located_path(k);
  }
  FUZZ_CHECK(proto::encode_directory_answer(answer) == std::vector<std::uint8_t>(input.begin(), input.end()),
             "directory answer: encode(decode(x)) != x");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Span input(data, size);
  entry_batch(input);
  directory_ask(input);
  directory_answer(input);
  return 0;
}

namespace shardmix::fuzz {

Seeds seeds() {
  proto::EntryBatch files;
  files.add(3, 100, 0, 0, "dog/1.jpg", 7);
  files.add(4, 200, 0, 0, "emu/2.jpg", 8);
  proto::EntryBatch shards;
  shards.add(0, 4096, 2, 512, "", 1);
  proto::DirectoryAsk ask;
  ask.request = 9;
  ask.indices = {0, 5, 17};
  proto::DirectoryAnswer answer;
  answer.request = 9;
  answer.bytes = {100, 200, 300};
  answer.arena_offset = {0, ~std::uint64_t{0}, 4096};
  answer.labels = {1, 0, 2};
  answer.located_entry = {1};  // a shard format's location: shard 3, offset 1536
  answer.located_shard = {3};
  answer.located_offset = {1536};
  answer.located_path_end = {0};
  proto::DirectoryAnswer files_answer = answer;  // a whole-file format's: a path
  files_answer.located_shard = {0};
  files_answer.located_offset = {0};
  files_answer.located_paths = "emu/2.jpg";
  files_answer.located_path_end = {9};
  proto::DirectoryAnswer every = files_answer;  // every entry located (a GetCatalog's ask)
  every.every_entry = true;
  every.located_entry = {0, 1, 2};
  every.located_shard = {0, 0, 0};
  every.located_offset = {0, 0, 0};
  every.located_paths = "dog/1.jpgemu/2.jpgemu/3.jpg";
  every.located_path_end = {9, 18, 27};
  proto::DirectoryAsk ask_every = ask;
  ask_every.flags = proto::kAskEveryLocation;
  proto::DirectoryAnswer refused;
  refused.request = 10;
  refused.error = "owner daemon rank 2: daemon rank 0 asked for index 99 (request entry 0) of a share of 10 samples";
  return {{"entries-files", proto::encode_entry_batch(files)},
          {"entries-shards", proto::encode_entry_batch(shards)},
          {"ask", proto::encode_directory_ask(ask)},
          {"answer", proto::encode_directory_answer(answer)},
          {"answer-paths", proto::encode_directory_answer(files_answer)},
          {"answer-every", proto::encode_directory_answer(every)},
          {"ask-every", proto::encode_directory_ask(ask_every)},
          {"answer-error", proto::encode_directory_answer(refused)}};
}

}  // namespace shardmix::fuzz
