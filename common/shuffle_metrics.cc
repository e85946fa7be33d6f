#include "common/shuffle_metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>
#include <system_error>
#include <tuple>
#include <utility>

#include "common/rng.h"

namespace shardmix {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double clamp01(double x) { return std::isnan(x) ? x : std::clamp(x, 0.0, 1.0); }

// Histogram of a sorted sequence: the lengths of its runs of equal values.
template <class T>
std::vector<std::uint64_t> run_lengths(const std::vector<T>& sorted) {
  std::vector<std::uint64_t> counts;
  for (std::size_t i = 0; i < sorted.size();) {
    std::size_t j = i + 1;
    while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
    counts.push_back(j - i);
    i = j;
  }
  return counts;
}

// Fenwick tree over 0..n-1 holding 0/1 counts: which ranks of a stream are still undelivered.
class Fenwick {
 public:
  explicit Fenwick(std::size_t n) : tree_(n + 1, 0) {
    for (std::size_t i = 1; i <= n; ++i) {
      tree_[i] += 1;
      const std::size_t parent = i + (i & (~i + 1));
      if (parent <= n) tree_[parent] += tree_[i];
    }
  }
  // Sum over ranks 0..r.
  std::uint64_t prefix(std::size_t r) const {
    std::uint64_t sum = 0;
    for (std::size_t i = r + 1; i > 0; i -= i & (~i + 1)) sum += tree_[i];
    return sum;
  }
  void remove(std::size_t r) {
    for (std::size_t i = r + 1; i < tree_.size(); i += i & (~i + 1)) tree_[i] -= 1;
  }

 private:
  std::vector<std::uint64_t> tree_;
};

std::uint64_t distinct_labels(const EpochDelivery& per_trainer) {
  std::vector<std::int32_t> labels;
  for (const TrainerStream& s : per_trainer)
    for (const DeliveredSample& d : s) labels.push_back(d.label);
  std::sort(labels.begin(), labels.end());
  return static_cast<std::uint64_t>(std::unique(labels.begin(), labels.end()) - labels.begin());
}

std::vector<std::uint64_t> sorted_unique_ids(const TrainerStream& s) {
  std::vector<std::uint64_t> ids;
  ids.reserve(s.size());
  for (const DeliveredSample& d : s) ids.push_back(d.sample_id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace

std::string_view delivery_tier_name(DeliveryTier tier) {
  switch (tier) {
    case DeliveryTier::kLocal: return "local";
    case DeliveryTier::kPeer: return "peer";
    case DeliveryTier::kStorage: return "storage";
    case DeliveryTier::kUnknown: return "unknown";
  }
  return "unknown";
}

std::optional<DeliveryTier> parse_delivery_tier(std::string_view text) {
  if (text.empty()) return DeliveryTier::kUnknown;
  if (text == "local" || text == "0") return DeliveryTier::kLocal;
  if (text == "peer" || text == "1") return DeliveryTier::kPeer;
  if (text == "storage" || text == "2") return DeliveryTier::kStorage;
  return std::nullopt;
}

double shannon_entropy(std::span<const std::uint64_t> counts) {
  long double total = 0;
  for (std::uint64_t c : counts) total += static_cast<long double>(c);
  if (total <= 0) return 0.0;
  long double h = 0;
  for (std::uint64_t c : counts) {
    if (c == 0) continue;
    const long double p = static_cast<long double>(c) / total;
    h -= p * std::log(p);
  }
  return static_cast<double>(std::max<long double>(h, 0));
}

double normalized_label_entropy(std::span<const std::int32_t> labels, std::uint64_t num_classes) {
  // The per-batch figure of compute_epoch_metrics, bit for bit (a mean of one value is it).
  BatchLabelEntropy one(num_classes);
  one.add_batch(labels);
  const LabelEntropySummary summary = one.summary();
  return summary.scored == 1 ? summary.mean : kNaN;
}

void BatchLabelEntropy::add_counts(std::span<const std::uint64_t> counts, std::uint64_t n) {
  const std::uint64_t k = std::min<std::uint64_t>(n, num_classes_);
  if (n < 2 || k < 2) {
    ++skipped_;
    return;
  }
  // shannon_entropy(counts), summed in ascending count order (so the figure depends only on
  // the multiset of counts, not on label values or their order) with the terms
  // p ln p, p = c / n, computed once per (c, n): the same operations on the same values.
  counts_.assign(counts.begin(), counts.end());
  std::sort(counts_.begin(), counts_.end());
  if (n != terms_n_) {
    terms_n_ = n;
    terms_.assign(std::min<std::uint64_t>(n, kMaxCachedBatch) + 1, kNaN);
  }
  long double h = 0;
  for (std::uint64_t c : counts_) {
    if (c == 0) continue;
    if (c < terms_.size()) {
      long double& term = terms_[c];
      if (std::isnan(term)) {
        const long double p = static_cast<long double>(c) / static_cast<long double>(n);
        term = p * std::log(p);
      }
      h -= term;
    } else {
      const long double p = static_cast<long double>(c) / static_cast<long double>(n);
      h -= p * std::log(p);
    }
  }
  const double entropy = static_cast<double>(std::max<long double>(h, 0));
  values_.push_back(clamp01(entropy / std::log(static_cast<double>(k))));
}

void BatchLabelEntropy::add_batch(std::span<const std::int32_t> labels) {
  sorted_.assign(labels.begin(), labels.end());
  std::sort(sorted_.begin(), sorted_.end());
  std::vector<std::uint64_t>& counts = batch_counts_;
  counts.clear();
  for (std::size_t i = 0; i < sorted_.size(); ++i) {
    if (i == 0 || sorted_[i] != sorted_[i - 1]) counts.push_back(0);
    ++counts.back();
  }
  add_counts(counts, sorted_.size());
}

LabelEntropySummary BatchLabelEntropy::summary() {
  LabelEntropySummary out;
  out.scored = values_.size();
  out.skipped = skipped_;
  if (values_.empty()) {
    out.mean = kNaN;
    out.p5 = kNaN;
    return out;
  }
  // Summed in ascending order, so the figure does not depend on the order batches came in.
  std::sort(values_.begin(), values_.end());
  long double sum = 0;
  for (double h : values_) sum += h;
  out.mean = clamp01(static_cast<double>(sum / values_.size()));
  // Nearest rank: the smallest value with at least 5% of the values at or below it.
  const std::size_t count = values_.size();
  const std::size_t nearest_rank = std::max<std::size_t>(1, (5 * count + 99) / 100);
  out.p5 = values_[nearest_rank - 1];
  return out;
}

double gap_entropy(std::span<const std::uint64_t> ids) {
  if (ids.size() < 2) return 0.0;
  std::vector<std::uint64_t> gaps(ids.size() - 1);
  for (std::size_t i = 0; i + 1 < ids.size(); ++i) {
    gaps[i] = ids[i + 1] >= ids[i] ? ids[i + 1] - ids[i] : ids[i] - ids[i + 1];
  }
  std::sort(gaps.begin(), gaps.end());
  const std::vector<std::uint64_t> counts = run_lengths(gaps);
  return shannon_entropy(counts);
}

double order_entropy(const EpochDelivery& per_trainer, std::uint64_t seed, std::uint64_t epoch) {
  // The reference: the same multiset of ids, fully shuffled, dealt in consecutive chunks to
  // streams of the same lengths.
  std::vector<std::uint64_t> all;
  for (const TrainerStream& s : per_trainer)
    for (const DeliveredSample& d : s) all.push_back(d.sample_id);
  Rng rng = Rng::for_stream(seed, {kOrderReferenceStream, epoch});
  shuffle(std::span<std::uint64_t>(all), rng);

  long double observed = 0, reference = 0;
  std::size_t offset = 0;
  std::vector<std::uint64_t> ids;
  for (const TrainerStream& s : per_trainer) {
    const std::size_t n = s.size();
    if (n >= 2) {
      ids.clear();
      for (const DeliveredSample& d : s) ids.push_back(d.sample_id);
      const long double weight = static_cast<long double>(n - 1);
      observed += weight * gap_entropy(ids);
      reference += weight * gap_entropy(std::span<const std::uint64_t>(all).subspan(offset, n));
    }
    offset += n;
  }
  if (reference <= 0) return kNaN;
  return clamp01(static_cast<double>(observed / reference));
}

double randomization_level(const EpochDelivery& per_trainer) {
  long double picked = 0, full = 0;
  std::vector<std::size_t> order;
  std::vector<std::size_t> rank;
  for (const TrainerStream& s : per_trainer) {
    const std::size_t n = s.size();
    if (n < 2) continue;
    // rank[i]: position of pick i in the stream's id order (ties by delivery order).
    order.resize(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return s[a].sample_id < s[b].sample_id; });
    rank.assign(n, 0);
    for (std::size_t r = 0; r < n; ++r) rank[order[r]] = r;
    Fenwick remaining(n);
    std::size_t max_rank = 0;
    for (std::size_t i = 0; i < n; ++i) {
      max_rank = std::max(max_rank, rank[i]);
      // Candidates: undelivered samples of this stream at or below the highest id seen so
      // far (including this pick): what a reader scanning the stream's ids in ascending order
      // must already hold. Always >= 1 (the pick itself).
      const std::uint64_t candidates = remaining.prefix(max_rank);
      picked += std::log(static_cast<long double>(candidates));
      remaining.remove(rank[i]);
    }
    full += std::lgamma(static_cast<long double>(n) + 1);  // sum of ln(remaining) = ln n!
  }
  if (full <= 0) return kNaN;
  return clamp01(static_cast<double>(picked / full));
}

double affinity(const EpochDelivery& current, const EpochDelivery& previous) {
  bool previous_has_samples = false;
  for (const TrainerStream& s : previous) previous_has_samples |= !s.empty();
  if (!previous_has_samples) return kNaN;
  long double sum = 0;
  std::uint64_t trainers = 0;
  for (std::size_t t = 0; t < current.size(); ++t) {
    if (current[t].empty()) continue;
    const std::vector<std::uint64_t> now = sorted_unique_ids(current[t]);
    std::uint64_t again = 0;
    if (t < previous.size()) {
      const std::vector<std::uint64_t> before = sorted_unique_ids(previous[t]);
      std::size_t i = 0, j = 0;
      while (i < now.size() && j < before.size()) {
        if (now[i] < before[j]) {
          ++i;
        } else if (before[j] < now[i]) {
          ++j;
        } else {
          ++again, ++i, ++j;
        }
      }
    }
    sum += static_cast<long double>(again) / static_cast<long double>(now.size());
    ++trainers;
  }
  if (trainers == 0) return kNaN;
  return clamp01(static_cast<double>(sum / trainers));
}

Result<EpochMetrics> compute_epoch_metrics(const EpochDelivery& per_trainer, const MetricsContext& ctx,
                                           const EpochDelivery* previous_epoch) {
  EpochMetrics m;
  const std::uint64_t delivered_classes = distinct_labels(per_trainer);
  if (ctx.num_classes != 0 && delivered_classes > ctx.num_classes) {
    return make_error(StatusCode::kInvalidArgument,
                      "shuffle metrics: epoch {} delivered {} distinct labels but num_classes is {}", ctx.epoch,
                      delivered_classes, ctx.num_classes);
  }
  m.classes = ctx.num_classes != 0 ? ctx.num_classes : delivered_classes;

  // 1. Per (trainer, batch) label entropy.
  // A batch is every sample of a trainer with the same batch index, contiguous or not.
  BatchLabelEntropy batch_entropy(m.classes);
  std::vector<std::pair<std::uint64_t, std::int32_t>> keyed;  // (batch, label), sorted
  std::vector<std::uint64_t> counts;
  for (const TrainerStream& s : per_trainer) {
    keyed.clear();
    for (const DeliveredSample& d : s) keyed.emplace_back(d.batch, d.label);
    std::sort(keyed.begin(), keyed.end());
    for (std::size_t begin = 0; begin < keyed.size();) {
      std::size_t end = begin;
      counts.clear();
      while (end < keyed.size() && keyed[end].first == keyed[begin].first) {
        if (end == begin || keyed[end].second != keyed[end - 1].second) counts.push_back(0);
        ++counts.back();
        ++end;
      }
      batch_entropy.add_counts(counts, end - begin);
      begin = end;
    }
  }
  const LabelEntropySummary label_summary = batch_entropy.summary();
  m.batches_scored = label_summary.scored;
  m.batches_skipped = label_summary.skipped;
  m.batch_label_entropy_mean = label_summary.mean;
  m.batch_label_entropy_p5 = label_summary.p5;

  // 2, 3. Order entropy and randomization level.
  m.order_entropy = order_entropy(per_trainer, ctx.seed, ctx.epoch);
  m.randomization_level = randomization_level(per_trainer);

  // 4. Affinity.
  m.affinity = previous_epoch != nullptr ? affinity(per_trainer, *previous_epoch) : kNaN;

  // 5. Locality and counts.
  std::uint64_t by_tier[4] = {0, 0, 0, 0};  // local, peer, storage, unknown
  std::uint64_t peer_bytes = 0, storage_bytes = 0;
  std::vector<std::uint64_t> ids;
  for (const TrainerStream& s : per_trainer) {
    if (!s.empty()) ++m.trainers;
    for (const DeliveredSample& d : s) {
      ids.push_back(d.sample_id);
      switch (d.tier) {
        case DeliveryTier::kLocal: ++by_tier[0]; break;
        case DeliveryTier::kPeer: ++by_tier[1]; peer_bytes += d.bytes; break;
        case DeliveryTier::kStorage: ++by_tier[2]; storage_bytes += d.bytes; break;
        default: ++by_tier[3]; break;
      }
    }
  }
  m.samples = ids.size();
  std::sort(ids.begin(), ids.end());
  m.distinct_samples = static_cast<std::uint64_t>(std::unique(ids.begin(), ids.end()) - ids.begin());
  if (m.samples == 0) {
    m.local_fraction = m.peer_fraction = m.storage_fraction = m.unknown_tier_fraction = kNaN;
    m.network_bytes_per_sample = m.storage_bytes_per_sample = kNaN;
  } else {
    const double n = static_cast<double>(m.samples);
    m.local_fraction = by_tier[0] / n;
    m.peer_fraction = by_tier[1] / n;
    m.storage_fraction = by_tier[2] / n;
    m.unknown_tier_fraction = by_tier[3] / n;
    m.network_bytes_per_sample = static_cast<double>(peer_bytes) / n;
    m.storage_bytes_per_sample = static_cast<double>(storage_bytes) / n;
  }
  m.coverage = ctx.dataset_size == 0
                   ? kNaN
                   : clamp01(static_cast<double>(m.distinct_samples) / static_cast<double>(ctx.dataset_size));
  return m;
}

// ---------------------------------------------------------------------------------------
// Trace CSV
// ---------------------------------------------------------------------------------------
namespace {

// Reads RFC 4180 records from a text; tracks physical line numbers for error messages.
class CsvReader {
 public:
  CsvReader(std::string_view text, std::string_view source) : text_(text), source_(source) {
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") text_.remove_prefix(3);  // UTF-8 byte-order mark
  }

  // Reads the next non-blank record into `fields`; false at the end of the text.
  Result<bool> next(std::vector<std::string>& fields, std::uint64_t& record_line) {
    fields.clear();
    // Skip blank lines (also a trailing newline at the end of the file).
    while (pos_ < text_.size() && (text_[pos_] == '\n' || text_[pos_] == '\r')) {
      if (text_[pos_] == '\n') ++line_;
      ++pos_;
    }
    if (pos_ >= text_.size()) return false;
    record_line = line_;
    while (true) {
      std::string field;
      if (pos_ < text_.size() && text_[pos_] == '"') {
        const std::uint64_t quote_line = line_;
        ++pos_;
        while (true) {
          if (pos_ >= text_.size()) {
            return make_error(StatusCode::kCorrupt, "{}:{}: unterminated quoted field (column {}, opened on line {})",
                              source_, record_line, fields.size() + 1, quote_line);
          }
          const char c = text_[pos_++];
          if (c == '"') {
            if (pos_ < text_.size() && text_[pos_] == '"') {
              field += '"';
              ++pos_;
            } else {
              break;
            }
          } else {
            if (c == '\n') ++line_;
            field += c;
          }
        }
        if (pos_ < text_.size() && !is_field_end(text_[pos_])) {
          return make_error(StatusCode::kCorrupt, "{}:{}: unexpected '{}' after the closing quote of column {}{}",
                            source_, record_line, text_[pos_], fields.size() + 1, spanned(record_line));
        }
      } else {
        while (pos_ < text_.size() && !is_field_end(text_[pos_])) {
          if (text_[pos_] == '"') {
            return make_error(StatusCode::kCorrupt,
                              "{}:{}: quote inside an unquoted field (column {}); quote the whole field{}", source_,
                              record_line, fields.size() + 1, spanned(record_line));
          }
          field += text_[pos_++];
        }
      }
      fields.push_back(std::move(field));
      if (pos_ >= text_.size()) return true;
      const char c = text_[pos_++];
      if (c == ',') continue;
      if (c == '\r' && pos_ < text_.size() && text_[pos_] == '\n') ++pos_;
      ++line_;  // '\n', "\r\n" or a lone '\r' ends the record
      return true;
    }
  }

 private:
  static bool is_field_end(char c) { return c == ',' || c == '\n' || c == '\r'; }

  // Errors are reported at the line where the record starts; if a quoted field carried the
  // record over several lines, say where the problem was seen (usually an unbalanced quote).
  std::string spanned(std::uint64_t record_line) const {
    if (line_ == record_line) return "";
    return fmt::format(" (seen on line {}: a quoted field runs from line {}; is a quote unbalanced?)", line_,
                       record_line);
  }

  std::string_view text_;
  std::string_view source_;
  std::size_t pos_ = 0;
  std::uint64_t line_ = 1;
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

template <class T>
bool parse_integer(std::string_view text, T& out) {
  text = trim(text);
  if (text.empty()) return false;
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

enum Column { kEpoch, kRank, kBatch, kPosition, kSampleId, kLabel, kBytes, kTier, kColumnCount };
constexpr std::string_view kColumnNames[kColumnCount] = {"epoch",     "rank",  "batch", "position",
                                                         "sample_id", "label", "bytes", "tier"};
constexpr bool kRequired[kColumnCount] = {true, true, true, false, true, true, false, false};

}  // namespace

Result<std::vector<TraceRow>> parse_trace_csv(std::string_view text, std::string_view source,
                                              std::uint64_t first_sequence) {
  CsvReader reader(text, source);
  std::vector<std::string> fields;
  std::uint64_t line = 0;
  SHARDMIX_ASSIGN_OR_RETURN(const bool has_header, reader.next(fields, line));
  if (!has_header) return make_error(StatusCode::kCorrupt, "{}: empty file (expected a header row)", source);

  std::size_t index_of[kColumnCount];
  std::fill(std::begin(index_of), std::end(index_of), SIZE_MAX);
  const std::size_t width = fields.size();
  for (std::size_t i = 0; i < width; ++i) {
    const std::string_view name = trim(fields[i]);
    for (int c = 0; c < kColumnCount; ++c) {
      if (name != kColumnNames[c]) continue;
      if (index_of[c] != SIZE_MAX) {
        return make_error(StatusCode::kCorrupt, "{}:{}: column '{}' appears twice in the header", source, line,
                          name);
      }
      index_of[c] = i;
    }
  }
  for (int c = 0; c < kColumnCount; ++c) {
    if (kRequired[c] && index_of[c] == SIZE_MAX) {
      return make_error(StatusCode::kCorrupt,
                        "{}:{}: header lacks the required column '{}' (required: epoch, rank, batch, sample_id, "
                        "label)",
                        source, line, kColumnNames[c]);
    }
  }

  std::vector<TraceRow> rows;
  std::uint64_t sequence = first_sequence;
  while (true) {
    SHARDMIX_ASSIGN_OR_RETURN(const bool more, reader.next(fields, line));
    if (!more) break;
    if (fields.size() != width) {
      return make_error(StatusCode::kCorrupt, "{}:{}: {} fields, the header has {}", source, line, fields.size(),
                        width);
    }
    TraceRow row;
    row.sequence = sequence++;
    auto field = [&](Column c) -> std::string_view { return fields[index_of[c]]; };
    auto bad = [&](Column c, std::string_view expected) {
      return make_error(StatusCode::kCorrupt, "{}:{}: column '{}': '{}' is not {}", source, line, kColumnNames[c],
                        field(c), expected);
    };
    if (!parse_integer(field(kEpoch), row.epoch)) return bad(kEpoch, "an unsigned integer");
    if (!parse_integer(field(kRank), row.rank)) return bad(kRank, "an unsigned integer");
    if (!parse_integer(field(kBatch), row.batch)) return bad(kBatch, "an unsigned integer");
    if (!parse_integer(field(kSampleId), row.sample_id)) return bad(kSampleId, "an unsigned integer");
    if (!parse_integer(field(kLabel), row.label)) return bad(kLabel, "a 32-bit integer");
    if (index_of[kPosition] != SIZE_MAX && !parse_integer(field(kPosition), row.position)) {
      return bad(kPosition, "an unsigned integer");
    }
    if (index_of[kBytes] != SIZE_MAX && !trim(field(kBytes)).empty() &&
        !parse_integer(field(kBytes), row.bytes)) {
      return bad(kBytes, "an unsigned integer (or empty)");
    }
    if (index_of[kTier] != SIZE_MAX) {
      const std::optional<DeliveryTier> tier = parse_delivery_tier(trim(field(kTier)));
      if (!tier) return bad(kTier, "local, peer, storage, 0, 1, 2 or empty");
      row.tier = *tier;
    }
    rows.push_back(row);
  }
  return rows;
}

TraceSet group_trace_rows(std::vector<TraceRow> rows) {
  TraceSet set;
  set.rows = rows.size();
  std::vector<std::int32_t> labels;
  std::vector<std::uint64_t> ids;
  for (const TraceRow& r : rows) {
    set.ranks.push_back(r.rank);
    labels.push_back(r.label);
    ids.push_back(r.sample_id);
  }
  std::sort(set.ranks.begin(), set.ranks.end());
  set.ranks.erase(std::unique(set.ranks.begin(), set.ranks.end()), set.ranks.end());
  std::sort(labels.begin(), labels.end());
  set.distinct_labels = static_cast<std::uint64_t>(std::unique(labels.begin(), labels.end()) - labels.begin());
  std::sort(ids.begin(), ids.end());
  set.distinct_samples = static_cast<std::uint64_t>(std::unique(ids.begin(), ids.end()) - ids.begin());

  std::sort(rows.begin(), rows.end(), [](const TraceRow& a, const TraceRow& b) {
    return std::tie(a.epoch, a.rank, a.batch, a.position, a.sequence) <
           std::tie(b.epoch, b.rank, b.batch, b.position, b.sequence);
  });
  for (const TraceRow& r : rows) {
    if (set.epochs.empty() || set.epochs.back().epoch != r.epoch) {
      set.epochs.push_back(EpochTrace{r.epoch, EpochDelivery(set.ranks.size())});
    }
    const std::size_t t = static_cast<std::size_t>(
        std::lower_bound(set.ranks.begin(), set.ranks.end(), r.rank) - set.ranks.begin());
    set.epochs.back().per_trainer[t].push_back(DeliveredSample{r.batch, r.sample_id, r.label, r.bytes, r.tier});
  }
  return set;
}

Result<TraceSet> read_trace_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return make_error(StatusCode::kNotFound, "{}: not a directory{}", dir, ec ? ": " + ec.message() : "");
  }
  std::vector<std::string> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 9 && name.rfind("rank-", 0) == 0 && name.substr(name.size() - 4) == ".csv" &&
        it->is_regular_file(ec)) {
      files.push_back(it->path().string());
    }
  }
  if (ec) return make_error(StatusCode::kIoError, "{}: cannot list: {}", dir, ec.message());
  if (files.empty()) return make_error(StatusCode::kNotFound, "{}: no rank-*.csv trace files", dir);
  std::sort(files.begin(), files.end());

  std::vector<TraceRow> rows;
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in.is_open()) return make_error(StatusCode::kIoError, "{}: cannot open for reading", file);
    std::ostringstream text;
    if (in.peek() != std::ifstream::traits_type::eof()) text << in.rdbuf();
    if (in.bad()) return make_error(StatusCode::kIoError, "{}: read failed", file);
    SHARDMIX_ASSIGN_OR_RETURN(std::vector<TraceRow> file_rows, parse_trace_csv(text.str(), file, rows.size()));
    rows.insert(rows.end(), file_rows.begin(), file_rows.end());
  }
  TraceSet set = group_trace_rows(std::move(rows));
  set.files = std::move(files);
  return set;
}

}  // namespace shardmix
