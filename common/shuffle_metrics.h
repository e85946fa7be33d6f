// Shuffle-quality and locality metrics computed from what was actually delivered in one
// epoch, plus a reader for per-rank delivery traces (the CSV that shardmix-consume --trace
// writes, or any loader's trace with the same columns). Formulas, typical values and the
// trace format: docs/shuffle-quality.md; why these metrics: docs/decisions/0007.
//
//   batch label entropy  H(labels of one trainer's micro-batch) / ln(min(n, C)); mean, p5
//   order entropy        H(|id gaps| of each trainer's stream) / same on a seeded full shuffle
//   randomization level  DeepIO-style: sum ln(candidates per pick) / sum ln(remaining per pick)
//   affinity             |this epoch's set ∩ previous epoch's set| / |this epoch's set|, per trainer
//   locality             fractions served from local RAM / peer RAM / storage, bytes per sample
//
// Every function here is pure (no I/O except read_trace_dir, no global state) and therefore
// thread-safe; the daemon may call compute_epoch_metrics from any thread once per epoch.
// Cost: O(S log S) time and O(S) extra memory for S delivered samples.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace shardmix {

// Where a delivered sample came from. The numeric values match proto::Tier, so the daemon
// can static_cast; kUnknown is for traces without a tier column.
enum class DeliveryTier : std::uint8_t { kLocal = 0, kPeer = 1, kStorage = 2, kUnknown = 255 };

// "local", "peer", "storage", "unknown".
std::string_view delivery_tier_name(DeliveryTier tier);
// Accepts "local"/"peer"/"storage" or "0"/"1"/"2"; an empty string is kUnknown;
// anything else is nullopt.
std::optional<DeliveryTier> parse_delivery_tier(std::string_view text);

struct DeliveredSample {
  std::uint64_t batch = 0;      // the trainer's micro-batch index within the epoch
  std::uint64_t sample_id = 0;  // dataset-wide id; id order is taken as the storage order
  std::int32_t label = 0;       // opaque class value (any int32, e.g. -1 for "none")
  std::uint64_t bytes = 0;      // payload size; 0 if unknown
  DeliveryTier tier = DeliveryTier::kUnknown;
};

// One trainer's epoch in delivery order.
using TrainerStream = std::vector<DeliveredSample>;
// One epoch: element t is trainer rank t's stream (empty if the rank received nothing).
using EpochDelivery = std::vector<TrainerStream>;

struct MetricsContext {
  // C, the number of classes in the dataset. 0: the number of distinct labels delivered in
  // this epoch. A non-zero value smaller than the delivered distinct labels is an error.
  std::uint64_t num_classes = 0;
  // N, the dataset size, only used for `coverage`. 0: unknown (coverage is NaN).
  std::uint64_t dataset_size = 0;
  // Seed and epoch of the reference permutation for order entropy
  // (Rng::for_stream(seed, {kOrderReferenceStream, epoch})).
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
};

// Stream tag of the order-entropy reference permutation ("ORDERREF").
inline constexpr std::uint64_t kOrderReferenceStream = 0x4f5244455252454full;

// All ratios are in [0, 1] or NaN when undefined (no scoreable data, or no previous epoch).
struct EpochMetrics {
  // Per (trainer, batch) normalised label entropy, over batches with n >= 2 and min(n, C) >= 2.
  double batch_label_entropy_mean = 0;
  double batch_label_entropy_p5 = 0;  // nearest-rank 5th percentile
  std::uint64_t batches_scored = 0;
  std::uint64_t batches_skipped = 0;  // n < 2 or min(n, C) < 2
  double order_entropy = 0;
  double randomization_level = 0;
  double affinity = 0;  // NaN without a previous epoch; 1/trainers is ideal, 1.0 = same partition
  // Fractions of delivered samples by tier; they sum to 1.
  double local_fraction = 0;
  double peer_fraction = 0;
  double storage_fraction = 0;
  double unknown_tier_fraction = 0;
  double network_bytes_per_sample = 0;  // bytes of peer-tier samples / samples
  double storage_bytes_per_sample = 0;  // bytes of storage-tier samples / samples
  double coverage = 0;                  // distinct delivered ids / N (NaN if N unknown)
  std::uint64_t samples = 0;            // delivered, all trainers
  std::uint64_t distinct_samples = 0;   // distinct ids delivered (< samples means duplicates)
  std::uint64_t trainers = 0;           // trainers with a non-empty stream
  std::uint64_t classes = 0;            // the C used
};

// Computes every metric for one epoch. `previous_epoch` (same rank indexing) gives affinity;
// nullptr or an epoch without samples leaves affinity NaN. Error (kInvalidArgument) only if
// ctx.num_classes is non-zero and fewer than the distinct labels delivered.
Result<EpochMetrics> compute_epoch_metrics(const EpochDelivery& per_trainer, const MetricsContext& ctx,
                                           const EpochDelivery* previous_epoch = nullptr);

// ---- Building blocks (exposed for tests and for callers that want one metric) ----

// Shannon entropy in nats of a histogram given as counts (zeros ignored); 0 if empty.
double shannon_entropy(std::span<const std::uint64_t> counts);

// H(labels) / ln(min(n, C)) for one micro-batch, clamped to [0, 1]; NaN if n < 2 or
// min(n, C) < 2 (the batch is skipped).
double normalized_label_entropy(std::span<const std::int32_t> labels, std::uint64_t num_classes);

// The batch label entropy figures of §1 over a set of micro-batches.
struct LabelEntropySummary {
  double mean = 0;  // NaN if no batch was scored
  double p5 = 0;    // nearest-rank 5th percentile; NaN if no batch was scored
  std::uint64_t scored = 0;
  std::uint64_t skipped = 0;  // n < 2 or min(n, C) < 2
};

// Accumulates micro-batches one at a time and summarises them exactly as
// compute_epoch_metrics does (it uses this class): the same per-batch formula, the same
// summation order, the same percentile. The epoch planner's entropy-aware mode scores
// planned batches with it, so a planned figure and the figure measured on the same batches
// are bit-identical. A batch's entropy is summed over its label counts in ascending count
// order, and the summary over batches in ascending value order, so the result does not
// depend on label values, on the order of samples in a batch or on the order batches are
// added. The terms p ln p are cached per batch size. Not thread-safe (a value with
// scratch buffers; use one per thread).
class BatchLabelEntropy {
 public:
  // C as in MetricsContext::num_classes, but already resolved (no "0 = distinct delivered").
  explicit BatchLabelEntropy(std::uint64_t num_classes) : num_classes_(num_classes) {}

  // One micro-batch, its labels in any order.
  void add_batch(std::span<const std::int32_t> labels);
  // One micro-batch given as its label histogram (counts in any order; zeros are ignored)
  // and its size n = sum of counts.
  void add_counts(std::span<const std::uint64_t> counts, std::uint64_t n);

  // Mean and p5 over the batches added so far. Sorts the collected values in place.
  LabelEntropySummary summary();

 private:
  static constexpr std::uint64_t kMaxCachedBatch = 4096;  // larger counts are not cached

  std::uint64_t num_classes_;
  std::vector<double> values_;  // scored batches
  std::uint64_t skipped_ = 0;
  std::uint64_t terms_n_ = 0;           // the batch size terms_ holds
  std::vector<long double> terms_;      // terms_[c] = (c/n) ln(c/n) or NaN if not computed yet
  std::vector<std::uint64_t> counts_;   // scratch: sorted counts
  std::vector<std::int32_t> sorted_;    // scratch for add_batch
  std::vector<std::uint64_t> batch_counts_;  // scratch for add_batch
};

// Entropy in nats of the histogram of exact |id[i+1] - id[i]| values; 0 for fewer than 2 ids.
double gap_entropy(std::span<const std::uint64_t> ids);

// Order entropy of an epoch (see the file comment); NaN if no stream has 2 or more samples.
double order_entropy(const EpochDelivery& per_trainer, std::uint64_t seed, std::uint64_t epoch);

// DeepIO-style randomization level of an epoch; NaN if no stream has 2 or more samples.
double randomization_level(const EpochDelivery& per_trainer);

// Mean over trainers with samples of |S_t ∩ P_t| / |S_t| (sets of ids); NaN if the previous
// epoch has no samples or the current one has none.
double affinity(const EpochDelivery& current, const EpochDelivery& previous);

// ---- Trace files ----
//
// CSV with a header row naming the columns, in any order. Required: epoch, rank, batch,
// sample_id, label. Optional: position (order within a batch), bytes, tier; any other
// column (path, xxh64, owner, ...) is accepted and ignored. RFC 4180 quoting: a field may be
// enclosed in double quotes and then contain commas, newlines and "" for a quote.

struct TraceRow {
  std::uint64_t epoch = 0;
  std::uint64_t rank = 0;
  std::uint64_t batch = 0;
  std::uint64_t position = 0;  // 0 if the column is absent
  std::uint64_t sample_id = 0;
  std::int32_t label = 0;
  std::uint64_t bytes = 0;  // 0 if absent or empty
  DeliveryTier tier = DeliveryTier::kUnknown;
  std::uint64_t sequence = 0;  // row order across everything read; breaks ties
};

// Parses one trace file's text. `source` names the file in errors, which read
// "<source>:<line>: <problem>" (the line where the bad record starts, 1-based).
// Rows get sequence numbers first_sequence, first_sequence + 1, ...
Result<std::vector<TraceRow>> parse_trace_csv(std::string_view text, std::string_view source,
                                              std::uint64_t first_sequence = 0);

struct EpochTrace {
  std::uint64_t epoch = 0;
  EpochDelivery per_trainer;  // index = position of the rank in TraceSet::ranks
};

struct TraceSet {
  std::vector<std::string> files;    // the files read, in name order
  std::vector<std::uint64_t> ranks;  // distinct ranks, ascending; EpochDelivery index -> rank
  std::vector<EpochTrace> epochs;    // ascending epoch
  std::uint64_t rows = 0;
  std::uint64_t distinct_labels = 0;   // over all epochs
  std::uint64_t distinct_samples = 0;  // over all epochs
};

// Groups rows by epoch and rank; each stream is ordered by (batch, position, sequence).
TraceSet group_trace_rows(std::vector<TraceRow> rows);

// Reads every regular file named rank-*.csv directly in `dir` (name order) and groups them.
// Errors: no such directory, no rank-*.csv file, unreadable file, or any parse error.
Result<TraceSet> read_trace_dir(const std::string& dir);

}  // namespace shardmix
