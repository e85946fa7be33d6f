// Fuzz target: the trace CSV parser (common/shuffle_metrics: parse_trace_csv), which
// shardmix-entropy runs on trace files written by any loader.
//
// Checks beyond "no crash, no UB": a failure is kCorrupt and names the file; parsed rows
// carry consecutive sequence numbers from the given first one and a known tier; writing
// the rows back as CSV (canonical columns) parses to the same rows; grouping keeps every row.
#include <string>
#include <tuple>

#include "common/shuffle_metrics.h"
#include "tests/fuzz/fuzz.h"

namespace {

using namespace shardmix;

constexpr std::uint64_t kFirstSequence = 1000;

auto as_tuple(const TraceRow& r) {
  return std::make_tuple(r.epoch, r.rank, r.batch, r.position, r.sample_id, r.label, r.bytes, r.tier, r.sequence);
}

std::string to_csv(const std::vector<TraceRow>& rows) {
  std::string out = "epoch,rank,batch,position,sample_id,label,bytes,tier\n";
  for (const TraceRow& r : rows) {
    out += std::to_string(r.epoch) + "," + std::to_string(r.rank) + "," + std::to_string(r.batch) + "," +
           std::to_string(r.position) + "," + std::to_string(r.sample_id) + "," + std::to_string(r.label) + "," +
           std::to_string(r.bytes) + "," +
           (r.tier == DeliveryTier::kUnknown ? std::string() : std::string(delivery_tier_name(r.tier))) + "\n";
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto rows = parse_trace_csv(text, "fuzz.csv", kFirstSequence);
  if (!rows.ok()) {
    FUZZ_CHECK(rows.status().code() == StatusCode::kCorrupt, rows.status().to_string());
    FUZZ_CHECK(rows.status().message().starts_with("fuzz.csv"), "error does not name the file: " +
                                                                     rows.status().message());
    return 0;
  }
  for (std::size_t i = 0; i < rows->size(); ++i) {
    const TraceRow& r = (*rows)[i];
    FUZZ_CHECK(r.sequence == kFirstSequence + i, "row " + std::to_string(i) + " has sequence " +
                                                     std::to_string(r.sequence));
    FUZZ_CHECK(r.tier == DeliveryTier::kLocal || r.tier == DeliveryTier::kPeer || r.tier == DeliveryTier::kStorage ||
                   r.tier == DeliveryTier::kUnknown,
               "unknown tier value " + std::to_string(static_cast<int>(r.tier)));
  }
  const std::string canonical = to_csv(*rows);
  auto again = parse_trace_csv(canonical, "canonical.csv", kFirstSequence);
  FUZZ_CHECK(again.ok(), "rows written back do not parse: " + again.status().to_string() + "\n" + canonical);
  FUZZ_CHECK(again->size() == rows->size(), "rows written back parse to a different count");
  for (std::size_t i = 0; i < rows->size(); ++i) {
    FUZZ_CHECK(as_tuple((*again)[i]) == as_tuple((*rows)[i]), "row " + std::to_string(i) + " does not round-trip");
  }
  const TraceSet set = group_trace_rows(std::move(*rows));
  std::uint64_t grouped = 0;
  for (const EpochTrace& e : set.epochs) {
    FUZZ_CHECK(e.per_trainer.size() == set.ranks.size(), "epoch without a stream per rank");
    for (const TrainerStream& s : e.per_trainer) grouped += s.size();
  }
  FUZZ_CHECK(grouped == set.rows && set.rows == again->size(), "grouping lost or invented rows");
  return 0;
}

namespace shardmix::fuzz {

Seeds seeds() {
  return {
      {"consume", to_bytes("epoch,rank,batch,position,sample_id,label,bytes,tier,path,xxh64\n"
                           "0,0,0,0,17,3,114688,local,cat/1.jpg,0123456789abcdef\n"
                           "0,0,0,1,5,1,100,peer,\"comma,and \"\"quote\"\".bin\",fedcba9876543210\n"
                           "0,1,0,0,9,-1,,,\"new\nline.bin\",00\n")},
      {"minimal", to_bytes("\xEF\xBB\xBFlabel,sample_id,batch,rank,epoch\r\n3,4,0,1,2\r\n\r\n+7, 8 ,1,1,2\r\n")},
      {"tiers", to_bytes("epoch,rank,batch,sample_id,label,tier\n1,0,0,1,0,0\n1,0,0,2,0,1\n1,0,0,3,0,2\n1,0,0,4,0,storage\n")},
  };
}

}  // namespace shardmix::fuzz
