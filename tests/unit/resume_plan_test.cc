// Checkpoint and resume (docs/decisions/0022): properties of resuming one trainer's pass
// and of re-dealing an epoch's rest to another number of trainers, over generated job
// shapes and positions (windows with early and late samples included); the checkpoint
// blob's codec; and the start-up loader of resume.checkpoint_dir.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/epoch_plan.h"
#include "common/placement.h"
#include "common/resume_plan.h"
#include "proto/checkpoint.h"
#include "server/resume_loader.h"
#include "tests/support/sample_checkpoint.h"

namespace shardmix {
namespace resume_plan_test {

struct Job {
  std::uint64_t n = 0;
  JobShape job;
  ShuffleConfig shuffle;
};

rc::Gen<JobShape> gen_job() {
  return rc::gen::exec([] {
    JobShape job;
    job.nodes = *rc::gen::inRange<std::uint32_t>(1, 6);
    job.trainers_per_node = *rc::gen::inRange<std::uint32_t>(1, 4);
    job.batch_size = *rc::gen::oneOf(rc::gen::inRange<std::uint32_t>(1, 5), rc::gen::inRange<std::uint32_t>(1, 40));
    job.drop_last = *rc::gen::arbitrary<bool>();
    return job;
  });
}

rc::Gen<Job> gen_plan_job() {
  return rc::gen::exec([] {
    Job j;
    j.n = *rc::gen::oneOf(rc::gen::inRange<std::uint64_t>(0, 5), rc::gen::inRange<std::uint64_t>(0, 400));
    j.job = *gen_job();
    j.shuffle.seed = *rc::gen::arbitrary<std::uint64_t>();
    j.shuffle.exchange_fraction = *rc::gen::element(0.0, 0.3, 1.0);
    return j;
  });
}

std::vector<TrainerPlan> plans_of(const Job& j, std::uint64_t epoch) {
  const PlanShape shape = make_plan_shape(j.n, j.job);
  const Placement placement = make_placement(std::vector<std::uint64_t>(j.n, 100), shape, PlacementPolicy::kBalanced,
                                             j.shuffle.seed);
  const EpochPlanner planner(shape, placement, j.shuffle);
  return planner.plan_all(epoch);
}

// A position a trainer can be at: k batches yielded, and up to W samples of later
// planned batches delivered in place of as many earlier ones (what shuffle.window does).
ResumePoint gen_point(const TrainerPlan& plan) {
  ResumePoint point;
  point.batches_consumed = *rc::gen::inRange<std::uint64_t>(0, plan.num_batches() + 1);
  point.samples_consumed = plan.batch_begin[point.batches_consumed];
  const std::uint64_t b = point.samples_consumed;
  const std::uint64_t w = *rc::gen::inRange<std::uint64_t>(0, 9);
  const std::uint64_t late_room = std::min(b, w);
  const std::uint64_t early_room = std::min<std::uint64_t>(plan.order.size() - b, w);
  const std::uint64_t swaps = *rc::gen::inRange<std::uint64_t>(0, std::min(late_room, early_room) + 1);
  std::set<std::uint64_t> late, early;
  while (late.size() < swaps) late.insert(b - 1 - *rc::gen::inRange<std::uint64_t>(0, late_room));
  while (early.size() < swaps) early.insert(b + *rc::gen::inRange<std::uint64_t>(0, early_room));
  point.late.assign(late.begin(), late.end());
  point.early.assign(early.begin(), early.end());
  return point;
}

RC_GTEST_PROP(ResumePlanTest, AResumedPassDeliversExactlyTheRestInThePlannedBatches, ()) {
  const Job j = *gen_plan_job();
  const auto plans = plans_of(j, 3);
  const auto t = *rc::gen::inRange<std::size_t>(0, plans.size());
  const TrainerPlan& plan = plans[t];
  const ResumePoint point = gen_point(plan);
  auto resumed = resume_trainer_plan(plan, point, 8);
  RC_ASSERT(resumed.ok());
  // Delivered before + delivered by the resumed pass = the trainer's plan, each once.
  std::multiset<SampleId> all;
  for (SampleId id : delivered_samples(plan, point)) all.insert(id);
  for (SampleId id : resumed->plan.order) all.insert(id);
  RC_ASSERT(all == std::multiset<SampleId>(plan.order.begin(), plan.order.end()));
  // Batches k.. of the plan, with their planned sizes.
  RC_ASSERT(resumed->first_batch == point.batches_consumed);
  RC_ASSERT(resumed->plan.num_batches() == plan.num_batches() - point.batches_consumed);
  for (std::uint64_t b = 0; b < resumed->plan.num_batches(); ++b) {
    const std::uint64_t k = point.batches_consumed + b;
    RC_ASSERT(resumed->plan.batch_begin[b + 1] - resumed->plan.batch_begin[b] ==
              plan.batch_begin[k + 1] - plan.batch_begin[k]);
  }
  // Positions map back to the trainer's plan; the late samples come first.
  RC_ASSERT(resumed->planned_position.size() == resumed->plan.order.size());
  for (std::size_t p = 0; p < resumed->plan.order.size(); ++p) {
    RC_ASSERT(plan.order[resumed->planned_position[p]] == resumed->plan.order[p]);
  }
  for (std::size_t i = 0; i < point.late.size(); ++i) RC_ASSERT(resumed->planned_position[i] == point.late[i]);
}

RC_GTEST_PROP(ResumePlanTest, PositionsThatDoNotFitThePlanAreRefused, ()) {
  const Job j = *gen_plan_job();
  const auto plans = plans_of(j, 0);
  const TrainerPlan& plan = plans[*rc::gen::inRange<std::size_t>(0, plans.size())];
  ResumePoint point = gen_point(plan);
  const int how = *rc::gen::inRange(0, 4);
  if (how == 0) {
    point.batches_consumed = plan.num_batches() + 1;
  } else if (how == 1) {
    point.samples_consumed += 1;  // not a batch boundary of the plan
  } else if (how == 2) {
    point.early.push_back(plan.order.size() + 5);  // unpaired, outside the plan
  } else {
    point.late.push_back(point.samples_consumed + 1);
    point.early.push_back(plan.order.size() + 1);
  }
  RC_ASSERT(!resume_trainer_plan(plan, point, 100).ok());
}

RC_GTEST_PROP(ResumePlanTest, RedealingToAnotherWorldSizeDeliversEverySampleOnceWithEqualBatches, ()) {
  const Job old_job = *gen_plan_job();
  JobShape new_job = *gen_job();
  new_job.batch_size = *rc::gen::element(old_job.job.batch_size, *rc::gen::inRange<std::uint32_t>(1, 40));
  const std::uint64_t epoch = *rc::gen::inRange<std::uint64_t>(0, 5);
  const auto plans = plans_of(old_job, epoch);
  std::vector<SampleId> delivered, dealt;
  for (const TrainerPlan& plan : plans) {
    const ResumePoint point = gen_point(plan);
    for (SampleId id : delivered_samples(plan, point)) delivered.push_back(id);
    dealt.insert(dealt.end(), plan.order.begin(), plan.order.end());
  }
  std::set<SampleId> before(delivered.begin(), delivered.end());
  RC_ASSERT(before.size() == delivered.size());
  std::vector<SampleId> remaining;
  for (SampleId id : dealt) {
    if (before.count(id) == 0) remaining.push_back(id);
  }
  const auto redealt = redeal_epoch(remaining, new_job, old_job.shuffle.seed, epoch);
  RC_ASSERT(redealt.size() == new_job.trainers());
  const std::uint64_t nb = redealt[0].num_batches();
  std::multiset<SampleId> after;
  for (const TrainerPlan& plan : redealt) {
    RC_ASSERT(plan.num_batches() == nb);  // equal batch counts on every new trainer
    for (std::uint64_t b = 0; b < nb; ++b) {
      const std::uint64_t len = plan.batch_begin[b + 1] - plan.batch_begin[b];
      RC_ASSERT(len <= new_job.batch_size);
      if (b + 1 < nb || new_job.drop_last) RC_ASSERT(len == new_job.batch_size);
    }
    RC_ASSERT(plan.batch_begin.back() == plan.order.size());
    after.insert(plan.order.begin(), plan.order.end());
  }
  for (SampleId id : after) {
    RC_ASSERT(after.count(id) == 1u);  // nothing repeated in the rest
    RC_ASSERT(before.count(id) == 0u);  // nor anything delivered before the checkpoint
  }
  const std::uint64_t step = std::uint64_t{new_job.trainers()} * new_job.batch_size;
  if (new_job.drop_last) {
    RC_ASSERT(after.size() == remaining.size() / step * step);  // the skipped remainder only
  } else {
    RC_ASSERT(after.size() == remaining.size());  // nothing lost
  }
  // Deterministic, whatever order the remaining samples are listed in.
  std::vector<SampleId> reversed(remaining.rbegin(), remaining.rend());
  const auto again = redeal_epoch(reversed, new_job, old_job.shuffle.seed, epoch);
  for (std::size_t t = 0; t < redealt.size(); ++t) RC_ASSERT(again[t].order == redealt[t].order);
}

TEST(CheckpointBlobTest, RoundTripsAndRefusesDamage) {
  const proto::Checkpoint c = test_support::sample_checkpoint();
  const auto blob = proto::encode_checkpoint(c);
  proto::Checkpoint back;
  ASSERT_EQ(proto::decode_checkpoint(blob, back), "");
  EXPECT_EQ(back, c);
  // Every truncation and every single flipped byte is an error, never a wrong position.
  for (std::size_t n = 0; n < blob.size(); ++n) {
    EXPECT_NE(proto::decode_checkpoint(std::span(blob).first(n), back), "") << n;
    auto flipped = blob;
    flipped[n] ^= 0x40;
    EXPECT_NE(proto::decode_checkpoint(flipped, back), "") << n;
  }
  // Well-formed but inconsistent: named.
  auto bad = c;
  bad.late = {20};
  EXPECT_NE(proto::decode_checkpoint(proto::encode_checkpoint(bad), back).find("pair up"), std::string::npos);
  bad = c;
  bad.early = {30, 25};
  EXPECT_NE(proto::decode_checkpoint(proto::encode_checkpoint(bad), back).find("ascending"), std::string::npos);
  bad = c;
  bad.rank = 4;
  EXPECT_NE(proto::decode_checkpoint(proto::encode_checkpoint(bad), back).find("job shape"), std::string::npos);
}

TEST(PlanDigestTest, ChangesWithEverythingThePlanDependsOn) {
  const JobShape job{2, 2, 8, false};
  ShuffleConfig shuffle;
  const std::uint64_t base = plan_digest(1, 100, job, shuffle, PlacementPolicy::kBalanced);
  EXPECT_EQ(base, plan_digest(1, 100, job, shuffle, PlacementPolicy::kBalanced));
  EXPECT_NE(base, plan_digest(2, 100, job, shuffle, PlacementPolicy::kBalanced));
  EXPECT_NE(base, plan_digest(1, 101, job, shuffle, PlacementPolicy::kBalanced));
  EXPECT_NE(base, plan_digest(1, 100, JobShape{4, 1, 8, false}, shuffle, PlacementPolicy::kBalanced));
  EXPECT_NE(base, plan_digest(1, 100, JobShape{2, 2, 8, true}, shuffle, PlacementPolicy::kBalanced));
  EXPECT_NE(base, plan_digest(1, 100, job, shuffle, PlacementPolicy::kSorted));
  ShuffleConfig other = shuffle;
  other.seed = 1;
  EXPECT_NE(base, plan_digest(1, 100, job, other, PlacementPolicy::kBalanced));
  other = shuffle;
  other.exchange_fraction = 0.5;
  EXPECT_NE(base, plan_digest(1, 100, job, other, PlacementPolicy::kBalanced));
  other = shuffle;
  other.window = 16;  // the window changes the order of delivery, not the plan
  EXPECT_EQ(base, plan_digest(1, 100, job, other, PlacementPolicy::kBalanced));
}

// load_redealt_epoch over real files: what the daemons do at start-up.
class RedealLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / ("redeal-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::vector<CatalogEntry> entries;
    for (int i = 0; i < 97; ++i) entries.push_back({"c/" + std::to_string(i), 100 + std::uint64_t(i), i % 3});
    catalog_ = std::move(Catalog::from_entries(std::move(entries), {}).value());
    config_.shuffle.seed = 11;
    config_.shuffle.exchange_fraction = 0.5;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Checkpoints of every trainer of `old_job` after `k` batches of `epoch` (rank `skip` left out).
  void write_checkpoints(const JobShape& old_job, std::uint64_t epoch, std::uint64_t k, int skip = -1) {
    const PlanShape shape = make_plan_shape(catalog_.size(), old_job);
    const Placement placement = make_placement(catalog_.sizes(), shape, config_.dataset.placement, config_.shuffle.seed);
    const EpochPlanner planner(shape, placement, config_.shuffle, catalog_.labels());
    old_plans_ = planner.plan_all(epoch);
    for (std::uint32_t t = 0; t < old_job.trainers(); ++t) {
      if (static_cast<int>(t) == skip) continue;
      proto::Checkpoint c;
      c.plan_digest = plan_digest(catalog_digest(catalog_), catalog_.size(), old_job, config_.shuffle,
                                  config_.dataset.placement);
      c.num_samples = catalog_.size();
      c.seed = config_.shuffle.seed;
      c.nodes = old_job.nodes;
      c.trainers_per_node = old_job.trainers_per_node;
      c.batch_size = old_job.batch_size;
      c.rank = t;
      c.world_size = old_job.trainers();
      c.epoch = epoch;
      c.batches_consumed = std::min<std::uint64_t>(k, old_plans_[t].num_batches());
      c.samples_consumed = old_plans_[t].batch_begin[c.batches_consumed];
      const auto blob = proto::encode_checkpoint(c);
      std::ofstream(dir_ / ("rank-" + std::to_string(t) + ".ckpt"), std::ios::binary)
          .write(reinterpret_cast<const char*>(blob.data()), static_cast<std::streamsize>(blob.size()));
    }
  }

  std::filesystem::path dir_;
  Catalog catalog_;
  Config config_;
  std::vector<TrainerPlan> old_plans_;
};

TEST_F(RedealLoaderTest, ReDealsTheRestOfTheEpochToTheNewTrainers) {
  const JobShape old_job{2, 2, 5, false}, new_job{3, 1, 5, false};
  write_checkpoints(old_job, 2, 2);
  auto redealt = load_redealt_epoch(dir_.string(), config_, catalog_, new_job, 99);
  ASSERT_TRUE(redealt.ok()) << redealt.status().to_string();
  EXPECT_EQ(redealt->epoch, 2u);
  EXPECT_EQ(redealt->old_world_size, 4u);
  std::multiset<SampleId> seen;
  for (std::uint32_t t = 0; t < 4; ++t) {
    seen.insert(old_plans_[t].order.begin(), old_plans_[t].order.begin() + 10);  // 2 batches of 5
  }
  ASSERT_EQ(redealt->plans.size(), 3u);
  for (const auto& plan : redealt->plans) {
    EXPECT_EQ(plan.num_batches(), redealt->batches_per_trainer);
    seen.insert(plan.order.begin(), plan.order.end());
  }
  EXPECT_EQ(seen.size(), catalog_.size());
  for (SampleId id = 0; id < catalog_.size(); ++id) EXPECT_EQ(seen.count(id), 1u) << id;
}

// Owner-side metadata (decision 0067): with the spread ownership and the class runs instead
// of the catalog, the re-deal is the catalog form's, plan for plan, entropy floor on.
TEST_F(RedealLoaderTest, WithoutTheCatalogItReDealsAsTheCatalogFormDoes) {
  config_.dataset.placement = PlacementPolicy::kSpread;
  config_.shuffle.min_entropy = 0.5;
  const JobShape old_job{2, 2, 5, false}, new_job{3, 1, 5, false};
  write_checkpoints(old_job, 2, 2);
  std::vector<SampleId> runs;
  for (SampleId id = 0; id < catalog_.size(); ++id) {
    if (id == 0 || catalog_.label(id) != catalog_.label(id - 1)) runs.push_back(id);
  }
  ASSERT_EQ(runs.size(), 3u);
  auto with = load_redealt_epoch(dir_.string(), config_, catalog_, new_job, 99);
  auto without = load_redealt_epoch(dir_.string(), config_, catalog_digest(catalog_), catalog_.size(), runs, new_job, 99);
  ASSERT_TRUE(with.ok()) << with.status().to_string();
  ASSERT_TRUE(without.ok()) << without.status().to_string();
  EXPECT_EQ(without->digest, with->digest);
  EXPECT_EQ(without->samples, with->samples);
  EXPECT_EQ(without->batches_per_trainer, with->batches_per_trainer);
  ASSERT_EQ(without->plans.size(), with->plans.size());
  for (std::size_t t = 0; t < with->plans.size(); ++t) {
    EXPECT_EQ(without->plans[t].order, with->plans[t].order) << "trainer " << t;
    EXPECT_EQ(without->plans[t].batch_begin, with->plans[t].batch_begin) << "trainer " << t;
  }
  // Another dataset digest: the checkpoints are refused as another plan's.
  auto other = load_redealt_epoch(dir_.string(), config_, catalog_digest(catalog_) + 1, catalog_.size(), runs, new_job, 99);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("was taken with another plan"), std::string::npos) << other.status().message();
}

TEST_F(RedealLoaderTest, AMissingRankAMixedDirectoryOrAnotherSeedAreErrorsNamingTheProblem) {
  const JobShape old_job{2, 2, 5, false}, new_job{3, 1, 5, false};
  write_checkpoints(old_job, 2, 2, /*skip=*/1);
  auto r = load_redealt_epoch(dir_.string(), config_, catalog_, new_job, 99);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rank 1 is missing"), std::string::npos) << r.status().message();

  write_checkpoints(old_job, 2, 2);
  std::filesystem::copy_file(dir_ / "rank-0.ckpt", dir_ / "copy.ckpt");
  r = load_redealt_epoch(dir_.string(), config_, catalog_, new_job, 99);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("are both rank 0"), std::string::npos) << r.status().message();
  std::filesystem::remove(dir_ / "copy.ckpt");

  Config other = config_;
  other.shuffle.seed = 12;
  r = load_redealt_epoch(dir_.string(), other, catalog_, new_job, 99);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("shuffle.seed"), std::string::npos) << r.status().message();

  r = load_redealt_epoch((dir_ / "nothing-here").string(), config_, catalog_, new_job, 99);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("resume.checkpoint_dir"), std::string::npos) << r.status().message();
}

}  // namespace resume_plan_test
}  // namespace shardmix
