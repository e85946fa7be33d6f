#include "common/shuffle_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <unistd.h>

#include "common/rng.h"

namespace shardmix {
namespace shuffle_metrics_test {

using ::testing::HasSubstr;

// ---- Hand-made epochs ----
//
// A class-sorted dataset of N = trainers * per_trainer samples: ids 0..N-1, label = id / class_size
// (ImageFolder order). An "order" is a permutation of the ids; it is dealt in consecutive chunks
// of per_trainer ids to the trainers, and each chunk is cut into batches of batch_size.
struct Layout {
  std::size_t trainers = 8;
  std::size_t per_trainer = 1000;
  std::size_t batch_size = 8;
  std::size_t classes = 2;
  std::size_t n() const { return trainers * per_trainer; }
  std::int32_t label(std::uint64_t id) const { return static_cast<std::int32_t>(id / (n() / classes)); }
};

EpochDelivery deal(const Layout& l, const std::vector<std::uint64_t>& order) {
  EpochDelivery epoch(l.trainers);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::size_t t = i / l.per_trainer;
    const std::size_t pos = i % l.per_trainer;
    epoch[t].push_back(DeliveredSample{pos / l.batch_size, order[i], l.label(order[i]), 100, DeliveryTier::kLocal});
  }
  return epoch;
}

std::vector<std::uint64_t> sorted_order(const Layout& l) {
  std::vector<std::uint64_t> ids(l.n());
  std::iota(ids.begin(), ids.end(), std::uint64_t{0});
  return ids;
}

std::vector<std::uint64_t> full_shuffle(const Layout& l, std::uint64_t seed) {
  std::vector<std::uint64_t> ids = sorted_order(l);
  Rng rng(seed);
  shuffle(std::span<std::uint64_t>(ids), rng);
  return ids;
}

// Blocks of `block` consecutive ids, block order shuffled, ids inside a block kept in order.
std::vector<std::uint64_t> block_shuffle(const Layout& l, std::size_t block, std::uint64_t seed) {
  std::vector<std::uint64_t> blocks(l.n() / block);
  std::iota(blocks.begin(), blocks.end(), std::uint64_t{0});
  Rng rng(seed);
  shuffle(std::span<std::uint64_t>(blocks), rng);
  std::vector<std::uint64_t> ids;
  for (std::uint64_t b : blocks)
    for (std::size_t i = 0; i < block; ++i) ids.push_back(b * block + i);
  return ids;
}

// Each trainer's contiguous partition, then a buffer shuffle of `window` items over it (the
// tf.data / DALI style): fill the buffer in id order, emit a random buffered item, refill.
std::vector<std::uint64_t> window_shuffle(const Layout& l, std::size_t window, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::uint64_t> out;
  for (std::size_t t = 0; t < l.trainers; ++t) {
    std::vector<std::uint64_t> buffer;
    std::uint64_t next = t * l.per_trainer;
    const std::uint64_t end = next + l.per_trainer;
    while (out.size() < (t + 1) * l.per_trainer) {
      while (buffer.size() < window && next < end) buffer.push_back(next++);
      const std::size_t j = static_cast<std::size_t>(rng.below(buffer.size()));
      out.push_back(buffer[j]);
      buffer[j] = buffer.back();
      buffer.pop_back();
    }
  }
  return out;
}

EpochMetrics score(const EpochDelivery& epoch, std::uint64_t classes, const EpochDelivery* previous = nullptr) {
  MetricsContext ctx;
  ctx.num_classes = classes;
  ctx.seed = 7;
  ctx.epoch = 1;
  Result<EpochMetrics> m = compute_epoch_metrics(epoch, ctx, previous);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? *m : EpochMetrics{};
}

// E[H(batch)/ln 2] for a batch of n drawn without replacement from `per_class` samples of each
// of two classes: the hypergeometric distribution of the count of class 1.
double expected_two_class_entropy(std::uint64_t n, std::uint64_t per_class) {
  auto log_choose = [](double a, double b) { return std::lgamma(a + 1) - std::lgamma(b + 1) - std::lgamma(a - b + 1); };
  double expected = 0;
  for (std::uint64_t k = 0; k <= n; ++k) {
    const double p = std::exp(log_choose(per_class, k) + log_choose(per_class, n - k) - log_choose(2.0 * per_class, n));
    const double q = static_cast<double>(k) / n;
    const double h = (k == 0 || k == n) ? 0.0 : -(q * std::log(q) + (1 - q) * std::log(1 - q)) / std::log(2.0);
    expected += p * h;
  }
  return expected;
}

// ---- Formulas on hand-computed examples ----

TEST(ShuffleMetricsFormula, TwoClassBatchEntropyIsExact) {
  const std::vector<std::int32_t> even = {0, 0, 1, 1};
  const std::vector<std::int32_t> skewed = {0, 0, 0, 1};
  const std::vector<std::int32_t> pure = {1, 1, 1, 1};
  EXPECT_DOUBLE_EQ(normalized_label_entropy(even, 2), 1.0);
  // H(0.75, 0.25) / ln 2 = 0.811278...
  const double h = -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)) / std::log(2.0);
  EXPECT_NEAR(normalized_label_entropy(skewed, 2), h, 1e-12);
  EXPECT_NEAR(normalized_label_entropy(skewed, 2), 0.8112781245, 1e-9);
  EXPECT_DOUBLE_EQ(normalized_label_entropy(pure, 2), 0.0);
  // Normalised by ln(min(n, C)): a batch of 2 distinct labels out of 10 classes scores 1,
  // so does 3 distinct labels in a batch of 3.
  EXPECT_DOUBLE_EQ(normalized_label_entropy(std::vector<std::int32_t>{3, 9}, 10), 1.0);
  EXPECT_DOUBLE_EQ(normalized_label_entropy(std::vector<std::int32_t>{4, 0, 7}, 10), 1.0);
  // Batch of 4 over 10 classes, labels {0,0,1,2}: H = 1.5 bits, normalised by log2 4 = 2.
  EXPECT_NEAR(normalized_label_entropy(std::vector<std::int32_t>{0, 0, 1, 2}, 10), 0.75, 1e-12);
  // Skipped: n < 2, or a single class.
  EXPECT_TRUE(std::isnan(normalized_label_entropy(std::vector<std::int32_t>{5}, 10)));
  EXPECT_TRUE(std::isnan(normalized_label_entropy(std::vector<std::int32_t>{0, 0, 0}, 1)));
}

TEST(ShuffleMetricsFormula, BatchEntropyMeanAndNearestRankP5) {
  // One trainer, 20 two-sample batches: 2 single-class (0.0) and 18 mixed (1.0), plus one
  // one-sample batch that must be skipped. p5 by nearest rank = the 1st smallest of 20 = 0.
  TrainerStream s;
  for (std::uint64_t b = 0; b < 20; ++b) {
    const bool mixed = b >= 2;
    s.push_back({b, 2 * b, 0, 1, DeliveryTier::kLocal});
    s.push_back({b, 2 * b + 1, mixed ? 1 : 0, 1, DeliveryTier::kLocal});
  }
  s.push_back({20, 40, 1, 1, DeliveryTier::kLocal});
  const EpochMetrics m = score({s}, 2);
  EXPECT_EQ(m.batches_scored, 20u);
  EXPECT_EQ(m.batches_skipped, 1u);
  EXPECT_DOUBLE_EQ(m.batch_label_entropy_mean, 0.9);
  EXPECT_DOUBLE_EQ(m.batch_label_entropy_p5, 0.0);
  // With only one single-class batch among 21 scored, p5 = 2nd smallest (ceil(1.05) = 2).
  TrainerStream t = s;
  t[1].label = 1;  // batch 0 becomes mixed
  t.push_back({20, 41, 0, 1, DeliveryTier::kLocal});  // batch 20 now has {1, 0}: mixed
  const EpochMetrics m2 = score({t}, 2);
  EXPECT_EQ(m2.batches_scored, 21u);
  EXPECT_DOUBLE_EQ(m2.batch_label_entropy_p5, 1.0);
}

TEST(ShuffleMetricsFormula, GapEntropyAndRandomizationLevelByHand) {
  // Gaps 2,1,2,1: two equally likely values, H = ln 2.
  EXPECT_NEAR(gap_entropy(std::vector<std::uint64_t>{0, 2, 3, 5, 6}), std::log(2.0), 1e-12);
  // |gap| is used: a descending scan is as ordered as an ascending one.
  EXPECT_DOUBLE_EQ(gap_entropy(std::vector<std::uint64_t>{9, 8, 7, 6}), 0.0);
  EXPECT_DOUBLE_EQ(gap_entropy(std::vector<std::uint64_t>{4}), 0.0);

  // [1, 0]: pick 1 with candidates {0, 1} (ln 2), then 0 alone: level = ln 2 / ln 2! = 1.
  auto stream = [](std::vector<std::uint64_t> ids) {
    TrainerStream s;
    for (std::uint64_t id : ids) s.push_back({0, id, 0, 0, DeliveryTier::kUnknown});
    return s;
  };
  EXPECT_DOUBLE_EQ(randomization_level({stream({1, 0})}), 1.0);
  // [0, 2, 1]: candidates 1, 2 ({1, 2} once 2 was seen), 1: ln 2 / ln 3! = 0.38685...
  EXPECT_NEAR(randomization_level({stream({0, 2, 1})}), std::log(2.0) / std::log(6.0), 1e-12);
  // Sorted: a single candidate at every pick.
  EXPECT_DOUBLE_EQ(randomization_level({stream({3, 5, 8, 13})}), 0.0);
  // Two trainers pool numerators and denominators: (ln 2 + 0) / (ln 2 + ln 2).
  EXPECT_NEAR(randomization_level({stream({1, 0}), stream({0, 1})}), 0.5, 1e-12);
  // Nothing to score.
  EXPECT_TRUE(std::isnan(randomization_level({stream({4}), {}})));
}

// ---- Sorted, full, block and window orders on a class-sorted dataset ----

TEST(ShuffleMetricsOrders, SortedOrderScoresZero) {
  const Layout l;  // 8 trainers x 1000 samples, batches of 8, 2 classes of 4000
  const EpochMetrics m = score(deal(l, sorted_order(l)), l.classes);
  EXPECT_EQ(m.samples, 8000u);
  EXPECT_EQ(m.trainers, 8u);
  EXPECT_EQ(m.batches_scored, 1000u);
  EXPECT_DOUBLE_EQ(m.batch_label_entropy_mean, 0.0);  // every batch is single-class
  EXPECT_DOUBLE_EQ(m.batch_label_entropy_p5, 0.0);
  EXPECT_DOUBLE_EQ(m.order_entropy, 0.0);  // every gap is 1
  EXPECT_DOUBLE_EQ(m.randomization_level, 0.0);
  EXPECT_TRUE(std::isnan(m.affinity));  // first epoch
}

TEST(ShuffleMetricsOrders, FullShuffleScoresNearOne) {
  const Layout l;
  const double expected = expected_two_class_entropy(l.batch_size, l.n() / 2);
  EXPECT_NEAR(expected, 0.902, 0.002);  // ~ the binomial value for n = 8
  for (std::uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    const EpochMetrics m = score(deal(l, full_shuffle(l, seed)), l.classes);
    // Mean of 1000 per-batch values whose standard deviation is < 0.25: standard error < 0.008.
    // 0.03 is > 3.5 standard errors.
    EXPECT_NEAR(m.batch_label_entropy_mean, expected, 0.03) << "seed " << seed;
    // 5% of batches of 8 are 7:1 or worse (P(k <= 1 or k >= 7) = 0.070): p5 = H(1/8)/ln 2.
    EXPECT_NEAR(m.batch_label_entropy_p5, 0.5435644, 1e-6) << "seed " << seed;
    // The observed and the reference order are two independent full shuffles; the ratio of
    // their gap entropies (~6.8 nats over 999 gaps per stream) had a standard deviation of
    // 0.0008 over 200 simulated pairs of this layout, so 0.01 is > 10 sd, and still far from
    // the block (< 0.4) and sorted (0) values. The ratio is clamped at 1.
    EXPECT_GE(m.order_entropy, 0.99) << "seed " << seed;
    EXPECT_LE(m.order_entropy, 1.0) << "seed " << seed;
    // Deficit of the running-maximum estimator ~ (ln n + 1) nats out of ln(1000!) ~ 5912.
    EXPECT_GT(m.randomization_level, 0.995) << "seed " << seed;
    EXPECT_LE(m.randomization_level, 1.0);
  }
}

TEST(ShuffleMetricsOrders, BlockShuffleScoresStrictlyBetween) {
  const Layout l;
  const EpochMetrics sorted = score(deal(l, sorted_order(l)), l.classes);
  const EpochMetrics full = score(deal(l, full_shuffle(l, 11)), l.classes);
  // Blocks of 4 consecutive ids: every batch of 8 holds two single-class blocks, so a batch is
  // either pure (0) or 4:4 (1); about half are mixed.
  const EpochMetrics block = score(deal(l, block_shuffle(l, 4, 11)), l.classes);
  EXPECT_GT(block.batch_label_entropy_mean, sorted.batch_label_entropy_mean + 0.3);
  EXPECT_LT(block.batch_label_entropy_mean, full.batch_label_entropy_mean - 0.2);
  EXPECT_DOUBLE_EQ(block.batch_label_entropy_p5, 0.0);
  EXPECT_GT(block.order_entropy, sorted.order_entropy + 0.1);
  EXPECT_LT(block.order_entropy, full.order_entropy - 0.2);
  EXPECT_GT(block.randomization_level, 0.0);
  EXPECT_LT(block.randomization_level, 1.0);
  // Larger blocks are more ordered.
  const EpochMetrics big = score(deal(l, block_shuffle(l, 64, 11)), l.classes);
  EXPECT_LT(big.order_entropy, block.order_entropy);
  EXPECT_LT(big.batch_label_entropy_mean, block.batch_label_entropy_mean);
}

TEST(ShuffleMetricsOrders, WindowShuffleOverSortedPartitions) {
  // The case the metrics exist for: a local buffer shuffle over class-sorted partitions.
  const Layout l;
  const EpochMetrics full = score(deal(l, full_shuffle(l, 3)), l.classes);
  const EpochMetrics w16 = score(deal(l, window_shuffle(l, 16, 3)), l.classes);
  const EpochMetrics w256 = score(deal(l, window_shuffle(l, 256, 3)), l.classes);
  // Each trainer's partition is single-class: label entropy stays 0 whatever the window.
  EXPECT_DOUBLE_EQ(w16.batch_label_entropy_mean, 0.0);
  EXPECT_DOUBLE_EQ(w256.batch_label_entropy_mean, 0.0);
  // Order entropy and randomization level grow with the window and stay below a full shuffle.
  EXPECT_GT(w16.order_entropy, 0.0);
  EXPECT_LT(w16.order_entropy, w256.order_entropy);
  EXPECT_LT(w256.order_entropy, full.order_entropy);
  EXPECT_GT(w16.randomization_level, 0.0);
  EXPECT_LT(w16.randomization_level, w256.randomization_level);
  EXPECT_LT(w256.randomization_level, full.randomization_level);
  // ~ ln W / (ln n - 1) (ln n! ~ n ln n - n): a log-cardinality measure. The estimator sees
  // slightly fewer candidates than the buffer holds (loaded ids above the running maximum
  // are not counted) and the draining tail has fewer, hence the loose 0.08.
  EXPECT_NEAR(w16.randomization_level, std::log(16.0) / (std::log(1000.0) - 1), 0.08);
  EXPECT_NEAR(w256.randomization_level, std::log(256.0) / (std::log(1000.0) - 1), 0.08);
}

// ---- Affinity ----

TEST(ShuffleMetricsAffinity, IdenticalPartitionsScoreOne) {
  const Layout l;
  const EpochDelivery first = deal(l, full_shuffle(l, 1));
  // Same partition, different order inside every trainer.
  EpochDelivery second = first;
  Rng rng(99);
  for (TrainerStream& s : second) shuffle(std::span<DeliveredSample>(s), rng);
  EXPECT_DOUBLE_EQ(affinity(second, first), 1.0);
  EXPECT_DOUBLE_EQ(score(second, l.classes, &first).affinity, 1.0);
}

TEST(ShuffleMetricsAffinity, IndependentFullShufflesScoreOneOverT) {
  const Layout l;  // T = 8
  const EpochDelivery first = deal(l, full_shuffle(l, 1));
  const EpochDelivery second = deal(l, full_shuffle(l, 2));
  // Per trainer the overlap is hypergeometric: mean 125 of 1000, sd ~ 9.8; the mean of 8
  // ratios has sd ~ 0.0035, and 0.015 is > 4 sd.
  EXPECT_NEAR(affinity(second, first), 1.0 / 8, 0.015);
  // Disjoint partitions: 0. An empty previous epoch: undefined.
  EpochDelivery rotated(first.begin() + 1, first.end());
  rotated.push_back(first.front());
  EXPECT_DOUBLE_EQ(affinity(rotated, first), 0.0);
  EXPECT_TRUE(std::isnan(affinity(first, EpochDelivery(8))));
  // Exact on a small case: trainer 0 keeps 1 of {1,2}, trainer 1 keeps both of {3,4}.
  auto s = [](std::vector<std::uint64_t> ids) {
    TrainerStream out;
    for (std::uint64_t id : ids) out.push_back({0, id, 0, 0, DeliveryTier::kUnknown});
    return out;
  };
  EXPECT_DOUBLE_EQ(affinity({s({1, 2}), s({4, 3})}, {s({1, 5}), s({3, 4, 6})}), 0.75);
}

// ---- Locality ----

TEST(ShuffleMetricsLocality, FractionsAndBytesAreExact) {
  TrainerStream a = {{0, 1, 0, 10, DeliveryTier::kLocal},
                     {0, 2, 1, 20, DeliveryTier::kLocal},
                     {1, 3, 0, 100, DeliveryTier::kPeer}};
  TrainerStream b = {{0, 4, 1, 30, DeliveryTier::kLocal},
                     {0, 5, 0, 200, DeliveryTier::kPeer},
                     {1, 6, 1, 1000, DeliveryTier::kStorage}};
  MetricsContext ctx;
  ctx.dataset_size = 12;
  Result<EpochMetrics> r = compute_epoch_metrics({a, b}, ctx);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const EpochMetrics& m = *r;
  EXPECT_EQ(m.samples, 6u);
  EXPECT_EQ(m.trainers, 2u);
  EXPECT_EQ(m.classes, 2u);  // derived from the delivered labels
  EXPECT_DOUBLE_EQ(m.local_fraction, 0.5);
  EXPECT_DOUBLE_EQ(m.peer_fraction, 2.0 / 6);
  EXPECT_DOUBLE_EQ(m.storage_fraction, 1.0 / 6);
  EXPECT_DOUBLE_EQ(m.unknown_tier_fraction, 0.0);
  EXPECT_DOUBLE_EQ(m.network_bytes_per_sample, 300.0 / 6);   // peer bytes only
  EXPECT_DOUBLE_EQ(m.storage_bytes_per_sample, 1000.0 / 6);  // storage reported apart
  EXPECT_DOUBLE_EQ(m.coverage, 0.5);
}

TEST(ShuffleMetricsContext, TooFewClassesIsAnError) {
  TrainerStream a = {{0, 1, 0, 0, DeliveryTier::kLocal}, {0, 2, 1, 0, DeliveryTier::kLocal},
                     {0, 3, 2, 0, DeliveryTier::kLocal}};
  MetricsContext ctx;
  ctx.num_classes = 2;
  ctx.epoch = 4;
  Result<EpochMetrics> r = compute_epoch_metrics({a}, ctx);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("epoch 4 delivered 3 distinct labels but num_classes is 2"));
}

// ---- Trace CSV ----

TEST(ShuffleMetricsTrace, ParsesQuotedPathsWithCommasQuotesAndNewlines) {
  const std::string text =
      "epoch,rank,batch,position,sample_id,path,label,bytes,xxh64,tier,owner\r\n"
      "0,1,0,0,17,\"cats, big/a \"\"b\"\".jpg\",3,1234,00000000deadbeef,peer,2\r\n"
      "0,1,0,1,18,plain/b.jpg,4,10,0000000000000001,local,1\n"
      "\n"
      "0,1,1,0,19,\"two\nlines.jpg\",5,,0000000000000002,storage,0\n"
      "0,1,1,1,20,\"\",5,7,0000000000000003,,0";  // no final newline; empty tier = unknown
  Result<std::vector<TraceRow>> r = parse_trace_csv(text, "rank-1.csv");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const std::vector<TraceRow>& rows = *r;
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].sample_id, 17u);
  EXPECT_EQ(rows[0].label, 3);
  EXPECT_EQ(rows[0].bytes, 1234u);
  EXPECT_EQ(rows[0].tier, DeliveryTier::kPeer);
  EXPECT_EQ(rows[1].tier, DeliveryTier::kLocal);
  EXPECT_EQ(rows[2].sample_id, 19u);
  EXPECT_EQ(rows[2].bytes, 0u);  // empty bytes
  EXPECT_EQ(rows[2].tier, DeliveryTier::kStorage);
  EXPECT_EQ(rows[3].tier, DeliveryTier::kUnknown);
  EXPECT_EQ(rows[3].position, 1u);
  EXPECT_EQ(rows[3].sequence, 3u);

  // A bad record is reported at the physical line where it starts: 8 (the header, a blank
  // line and 4 rows, one of which spans two lines, come before it).
  Result<std::vector<TraceRow>> bad = parse_trace_csv(text + "\n0,1,2,0,x21,p,5,1,0,local,0\n", "rank-1.csv");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("rank-1.csv:8: column 'sample_id': 'x21' is not an unsigned integer"));
}

TEST(ShuffleMetricsTrace, MinimalHeaderInAnyOrderWithExtraColumns) {
  const std::string text =
      "label,sample_id,note,rank,batch,epoch\n"
      "2,5,whatever,0,0,3\n"
      "-1,6,\"a,b\",0,0,3\n";
  Result<std::vector<TraceRow>> r = parse_trace_csv(text, "x.csv");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].epoch, 3u);
  EXPECT_EQ((*r)[0].sample_id, 5u);
  EXPECT_EQ((*r)[1].label, -1);
  EXPECT_EQ((*r)[1].tier, DeliveryTier::kUnknown);
  EXPECT_EQ((*r)[1].bytes, 0u);
}

TEST(ShuffleMetricsTrace, MalformedInputNamesFileAndLine) {
  const std::string header = "epoch,rank,batch,position,sample_id,path,label,bytes,xxh64,tier,owner\n";
  const std::string good = "0,0,0,0,1,a.jpg,0,10,0,local,0\n";
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {header + good + "0,0,0,1,2,b.jpg,0,10,0,local\n", "rank-0.csv:3: 10 fields, the header has 11"},
      {header + good + good + "0,0,0,1,2,b.jpg,zero,10,0,local,0\n",
       "rank-0.csv:4: column 'label': 'zero' is not a 32-bit integer"},
      {header + "0,0,0,0,1,a.jpg,0,10,0,remote,0\n",
       "rank-0.csv:2: column 'tier': 'remote' is not local, peer, storage"},
      {header + "0,0,0,0,1,\"a.jpg,0,10,0,local,0\n", "rank-0.csv:2: unterminated quoted field (column 6"},
      // An unbalanced quote swallows the next line; the error names the record's first line.
      {header + "0,0,0,0,1,\"a.jpg,0,10,0,local,0\n0,0,0,1,2,\"b.jpg\",0,10,0,local,0\n",
       "rank-0.csv:2: unexpected 'b' after the closing quote of column 6 (seen on line 3"},
      {header + "0,0,0,0,1,\"a\"x,0,10,0,local,0\n", "rank-0.csv:2: unexpected 'x' after the closing quote"},
      {header + "0,0,0,0,1,a\"b,0,10,0,local,0\n", "rank-0.csv:2: quote inside an unquoted field (column 6)"},
      {header + "0,-1,0,0,1,a,0,10,0,local,0\n", "rank-0.csv:2: column 'rank': '-1' is not an unsigned integer"},
      {header + "0,0,0,0,1,a,99999999999,10,0,local,0\n", "rank-0.csv:2: column 'label'"},
      {"epoch,rank,batch,sample_id\n0,0,0,1\n", "rank-0.csv:1: header lacks the required column 'label'"},
      {"epoch,rank,batch,sample_id,label,rank\n", "rank-0.csv:1: column 'rank' appears twice"},
      {"", "rank-0.csv: empty file"},
  };
  for (const Case& c : cases) {
    Result<std::vector<TraceRow>> r = parse_trace_csv(c.text, "rank-0.csv");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.text;
  }
}

TEST(ShuffleMetricsTrace, ReadsADirectoryAndGroupsByEpochAndRank) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("shardmix-metrics-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string header = "epoch,rank,batch,position,sample_id,path,label,bytes,xxh64,tier,owner\n";
  {
    // Rank 3 wrote its rows out of order; (batch, position) restores the delivery order.
    std::ofstream(dir / "rank-3.csv") << header << "0,3,1,0,2,\"c,1\",1,5,0,peer,0\n"
                                      << "0,3,0,1,1,b,0,5,0,local,0\n"
                                      << "0,3,0,0,0,a,0,5,0,local,0\n"
                                      << "1,3,0,0,0,a,0,5,0,local,0\n";
    std::ofstream(dir / "rank-10.csv") << header << "0,10,0,0,3,d,1,7,0,storage,0\n"
                                       << "1,10,0,0,3,d,1,7,0,local,0\n"
                                       << "1,10,0,1,2,c,1,7,0,peer,0\n";
    std::ofstream(dir / "notes.txt") << "not a trace\n";
  }
  Result<TraceSet> r = read_trace_dir(dir.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const TraceSet& set = *r;
  EXPECT_EQ(set.files.size(), 2u);
  EXPECT_EQ(set.rows, 7u);
  EXPECT_EQ(set.ranks, (std::vector<std::uint64_t>{3, 10}));
  EXPECT_EQ(set.distinct_labels, 2u);
  EXPECT_EQ(set.distinct_samples, 4u);
  ASSERT_EQ(set.epochs.size(), 2u);
  const EpochDelivery& e0 = set.epochs[0].per_trainer;
  ASSERT_EQ(e0.size(), 2u);
  ASSERT_EQ(e0[0].size(), 3u);
  EXPECT_EQ(e0[0][0].sample_id, 0u);
  EXPECT_EQ(e0[0][1].sample_id, 1u);
  EXPECT_EQ(e0[0][2].sample_id, 2u);
  EXPECT_EQ(e0[0][2].tier, DeliveryTier::kPeer);
  EXPECT_EQ(e0[1][0].tier, DeliveryTier::kStorage);
  // Epoch 1 against epoch 0: rank 3 {0} ⊂ {0,1,2} -> 1; rank 10 {3,2} vs {3} -> 1/2.
  EXPECT_DOUBLE_EQ(affinity(set.epochs[1].per_trainer, e0), 0.75);

  // A malformed file fails the whole directory with its name and line.
  std::ofstream(dir / "rank-4.csv") << header << "0,4,0,0,9,e,0,1,0,local\n";
  Result<TraceSet> bad = read_trace_dir(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("rank-4.csv:2: 10 fields, the header has 11"));
  std::filesystem::remove_all(dir);

  Result<TraceSet> missing = read_trace_dir(dir.string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// ---- Properties ----

// A random epoch: 1-5 trainers, 0-60 samples each, ids < 200 (duplicates allowed), batches of
// 1-9, labels < 6, random tiers and sizes.
EpochDelivery random_epoch() {
  const std::size_t trainers = *rc::gen::inRange<std::size_t>(1, 6);
  EpochDelivery epoch(trainers);
  for (TrainerStream& s : epoch) {
    const std::size_t n = *rc::gen::inRange<std::size_t>(0, 61);
    const std::uint64_t batch_size = *rc::gen::inRange<std::uint64_t>(1, 10);
    for (std::size_t i = 0; i < n; ++i) {
      const auto tier = static_cast<DeliveryTier>(*rc::gen::inRange<int>(0, 3));
      s.push_back(DeliveredSample{i / batch_size, *rc::gen::inRange<std::uint64_t>(0, 200),
                                  *rc::gen::inRange<std::int32_t>(0, 6), *rc::gen::inRange<std::uint64_t>(0, 5000),
                                  tier});
    }
  }
  return epoch;
}

bool unit_or_nan(double x) { return std::isnan(x) || (x >= 0.0 && x <= 1.0); }

RC_GTEST_PROP(ShuffleMetricsProperty, EveryRatioIsInTheUnitIntervalOrUndefined, ()) {
  const EpochDelivery current = random_epoch();
  const EpochDelivery previous = random_epoch();
  MetricsContext ctx;
  ctx.seed = *rc::gen::arbitrary<std::uint64_t>();
  ctx.dataset_size = 200;
  Result<EpochMetrics> r = compute_epoch_metrics(current, ctx, &previous);
  RC_ASSERT(r.ok());
  const EpochMetrics& m = *r;
  RC_ASSERT(unit_or_nan(m.batch_label_entropy_mean));
  RC_ASSERT(unit_or_nan(m.batch_label_entropy_p5));
  RC_ASSERT(unit_or_nan(m.order_entropy));
  RC_ASSERT(unit_or_nan(m.randomization_level));
  RC_ASSERT(unit_or_nan(m.affinity));
  RC_ASSERT(unit_or_nan(m.coverage));
  // (p5 may exceed the mean: with nearest rank, one 0 among twenty 1s gives p5 = 1, mean 0.95.)
  if (m.samples > 0) {
    RC_ASSERT(std::abs(m.local_fraction + m.peer_fraction + m.storage_fraction + m.unknown_tier_fraction - 1.0) <
              1e-12);
    RC_ASSERT(m.network_bytes_per_sample >= 0.0 && m.network_bytes_per_sample < 5000.0);
  }
}

RC_GTEST_PROP(ShuffleMetricsProperty, BatchEntropyIgnoresOrderWithinBatchesAndLabelNames, ()) {
  const EpochDelivery original = random_epoch();
  // Permute the samples inside every batch (batches are contiguous in random_epoch) and rename
  // the classes by a fixed bijection.
  EpochDelivery permuted = original;
  Rng rng(*rc::gen::arbitrary<std::uint64_t>());
  for (TrainerStream& s : permuted) {
    for (std::size_t begin = 0; begin < s.size();) {
      std::size_t end = begin;
      while (end < s.size() && s[end].batch == s[begin].batch) ++end;
      shuffle(std::span<DeliveredSample>(s).subspan(begin, end - begin), rng);
      begin = end;
    }
    for (DeliveredSample& d : s) d.label = 100 - 3 * d.label;
  }
  MetricsContext ctx;
  Result<EpochMetrics> a = compute_epoch_metrics(original, ctx);
  Result<EpochMetrics> b = compute_epoch_metrics(permuted, ctx);
  RC_ASSERT(a.ok() && b.ok());
  RC_ASSERT(a->batches_scored == b->batches_scored);
  if (a->batches_scored > 0) {
    RC_ASSERT(std::abs(a->batch_label_entropy_mean - b->batch_label_entropy_mean) < 1e-12);
    RC_ASSERT(a->batch_label_entropy_p5 == b->batch_label_entropy_p5);
  }
}

RC_GTEST_PROP(ShuffleMetricsProperty, CsvRoundTripsAnyPath, ()) {
  // Any path, quoted the way shardmix-consume quotes it, parses back to the same row.
  const std::string path = *rc::gen::container<std::string>(
      rc::gen::element('a', 'Z', '/', ',', '"', ' ', '\n', '\r', '.', '7'));
  std::string quoted = path;
  if (path.find_first_of(",\"\n\r") != std::string::npos) {
    quoted = "\"";
    for (char c : path) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    quoted += "\"";
  }
  const std::uint64_t id = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
  const std::string text = "epoch,rank,batch,position,sample_id,path,label,bytes,xxh64,tier,owner\n0,2,5,1," +
                           std::to_string(id) + "," + quoted + ",7,99,0,peer,3\n";
  Result<std::vector<TraceRow>> r = parse_trace_csv(text, "p.csv");
  RC_ASSERT(r.ok());
  RC_ASSERT(r->size() == 1u);
  RC_ASSERT((*r)[0].sample_id == id);
  RC_ASSERT((*r)[0].label == 7);
  RC_ASSERT((*r)[0].bytes == 99u);
}

}  // namespace shuffle_metrics_test
}  // namespace shardmix
