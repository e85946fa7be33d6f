// The sample-journey trace recorder (common/trace.h): the sampling rule is a pure function
// of the batch (so daemon and trainer keep the same batches), the per-thread cap drops and
// counts what does not fit, a hold and its ids are kept or dropped together, threads
// record into their own buffers, and the ready-file keys round-trip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/trace.h"

namespace shardmix::trace {
namespace trace_test {  // named, not anonymous: the unit tests may be built as one unity translation unit

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

Settings settings_with_cap(std::uint64_t cap, double fraction = 1.0) {
  Settings s;
  s.process_name = "daemon 0";
  s.role = "daemon";
  s.pid = daemon_pid(0);
  s.sample_fraction = fraction;
  s.max_events_per_thread = cap;
  s.peers = 4;
  return s;
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Event staging_wait(std::int64_t t) { return Event{t, t + 10, What::kStagingWait, 0, 1, {0, 2, 3, 4096, 0}}; }

TEST(TraceSampling, DependsOnlyOnTheBatchAndKeepsTheRequestedShare) {
  std::uint64_t kept = 0;
  constexpr std::uint64_t kBatches = 20000;
  for (std::uint64_t b = 0; b < kBatches; ++b) {
    const Key key{b % 7, b % 13, b};
    const bool first = keep(key, 0.25);
    EXPECT_EQ(first, keep(Key{b % 7, b % 13, b}, 0.25)) << "batch " << b;  // same batch, same answer
    kept += first ? 1 : 0;
    EXPECT_TRUE(keep(key, 1.0));
    EXPECT_FALSE(keep(key, 0.0));
    // A smaller fraction keeps a subset of a larger one's batches (one threshold on one hash).
    if (keep(key, 0.1)) {
      EXPECT_TRUE(first) << "batch " << b;
    }
  }
  EXPECT_GT(kept, kBatches * 22 / 100);
  EXPECT_LT(kept, kBatches * 28 / 100);
  EXPECT_TRUE(keep(kAlways, 0.0)) << "planning and epoch boundaries are never sampled out";
}

TEST(TraceSampling, TheTrainerAndTheEpochChangeTheDecision) {
  // Otherwise every trainer would keep the same batch numbers, and the kept share of an
  // epoch would be all or nothing for some batch indexes.
  std::uint64_t differ_by_trainer = 0, differ_by_epoch = 0;
  for (std::uint64_t b = 0; b < 1000; ++b) {
    differ_by_trainer += keep({0, 0, b}, 0.5) != keep({0, 1, b}, 0.5) ? 1 : 0;
    differ_by_epoch += keep({0, 0, b}, 0.5) != keep({1, 0, b}, 0.5) ? 1 : 0;
  }
  EXPECT_GT(differ_by_trainer, 300u);
  EXPECT_GT(differ_by_epoch, 300u);
}

TEST(TraceRecorder, DropsAndCountsEventsPastTheCap) {
  Recorder recorder(settings_with_cap(10));
  for (int i = 0; i < 25; ++i) recorder.record(staging_wait(1000 * (i + 1)));
  EXPECT_EQ(recorder.recorded_events(), 10u);
  EXPECT_EQ(recorder.dropped_events(), 15u);
  const std::string json = recorder.to_json();
  EXPECT_EQ(count(json, "\"name\":\"wait for staging space\""), 10u);
  EXPECT_NE(json.find("\"dropped_events\":15"), std::string::npos) << json.substr(0, 400);
}

TEST(TraceRecorder, AHoldAndItsIdsAreKeptOrDroppedTogether) {
  Recorder recorder(settings_with_cap(4));
  const Event hold{5000, 9000, What::kHoldBatch, 0, 0, {1, 7, 6, 0, 0}};
  Event ids[2] = {Event{5000, 5000, What::kIds, 5, 0, {10, 11, 12, 13, 14}},
                  Event{5000, 5000, What::kIds, 1, 0, {15, 0, 0, 0, 0}}};
  EXPECT_TRUE(recorder.record(hold, ids, 2));
  EXPECT_FALSE(recorder.record(hold, ids, 2)) << "3 more events do not fit under a cap of 4";
  EXPECT_EQ(recorder.recorded_events(), 3u);
  EXPECT_EQ(recorder.dropped_events(), 3u);
  const std::string json = recorder.to_json();
  EXPECT_NE(json.find("\"epoch\":1,\"batch\":7,\"size\":6,\"samples\":[10,11,12,13,14,15]"), std::string::npos)
      << json;
}

// Model checkpoints: a trainer's save and a daemon's drain each on a named track of their
// own, with their version and bytes; a failed write says so.
TEST(TraceRecorder, CheckpointSavesAndDrainsHaveTheirOwnTracks) {
  Recorder trainer(settings_with_cap(8));
  trainer.record(Event{1000, 251000, What::kCheckpointSave, 0, 0, {3, 1u << 30, 0, 0, 0}});
  const std::string saves = trainer.to_json();
  EXPECT_NE(saves.find("\"name\":\"save checkpoint\",\"cat\":\"trainer\""), std::string::npos) << saves;
  EXPECT_NE(saves.find("\"dur\":250.000,\"args\":{\"version\":3,\"bytes\":1073741824}"), std::string::npos) << saves;
  EXPECT_NE(saves.find("\"args\":{\"name\":\"checkpoints\"}"), std::string::npos) << saves;

  Recorder daemon(settings_with_cap(8));
  daemon.record(Event{2000, 902000, What::kCheckpointDrain, 0, 0, {3, 1u << 30, 1, 0, 0}});
  daemon.record(Event{3000, 4000, What::kCheckpointDrain, 0, 0, {4, 10, 0, 1, 0}});
  const std::string drains = daemon.to_json();
  EXPECT_NE(drains.find("\"name\":\"drain checkpoint\",\"cat\":\"daemon\""), std::string::npos) << drains;
  EXPECT_NE(drains.find("\"args\":{\"version\":3,\"bytes\":1073741824,\"ok\":true}"), std::string::npos) << drains;
  EXPECT_NE(drains.find("\"name\":\"write checkpoint through\""), std::string::npos) << drains;
  EXPECT_NE(drains.find("\"args\":{\"version\":4,\"bytes\":10,\"ok\":false}"), std::string::npos) << drains;
  EXPECT_NE(drains.find("\"args\":{\"name\":\"checkpoint drain\"}"), std::string::npos) << drains;
}

TEST(TraceRecorder, EachThreadRecordsIntoItsOwnBuffer) {
  // More events than one chunk per thread: chunks are added while others record.
  constexpr int kThreads = 4;
  constexpr int kEach = static_cast<int>(Recorder::kChunkEvents) * 2 + 17;
  Recorder recorder(settings_with_cap(1 << 20));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&recorder, t] {
      for (int i = 0; i < kEach; ++i) {
        recorder.record(Event{1000 + i, 1000 + i, What::kReadsInFlight, 0, static_cast<std::uint32_t>(t), {1}});
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(recorder.recorded_events(), static_cast<std::uint64_t>(kThreads) * kEach);
  EXPECT_EQ(recorder.dropped_events(), 0u);
  const std::string json = recorder.to_json();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(count(json, "\"name\":\"reads in flight, peer " + std::to_string(t) + "\""),
              static_cast<std::size_t>(kEach));
  }
}

TEST(TraceRecorder, WritesMicrosecondsSinceTheOriginWithNanosecondDigits) {
  Settings s = settings_with_cap(8);
  s.origin_ns = 1'764'300'000'000'000'000LL;
  Recorder recorder(s);
  recorder.record(Event{1'764'300'000'123'456'789LL, 1'764'300'000'123'458'790LL, What::kStagingWait, 0, 2, {}});
  const std::string json = recorder.to_json();
  EXPECT_NE(json.find("\"ts\":123456.789,\"dur\":2.001"), std::string::npos) << json;
  EXPECT_NE(json.find("\"clock_origin_ns\":1764300000000000000"), std::string::npos);
  EXPECT_NE(json.find("\"clock\":\"CLOCK_REALTIME\""), std::string::npos);
  EXPECT_NE(json.find("\"name\":\"thread_name\",\"pid\":1,\"tid\":105"), std::string::npos)
      << "trainer slot 2's staging track is named";
}

TEST(TraceRecorder, WriteReplacesTheFileAtomicallyAndOnlyWhenSomethingIsNew) {
  const auto dir = std::filesystem::temp_directory_path() / ("shardmix-trace-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Settings s = settings_with_cap(8);
  s.path = (dir / "daemon-0.json").string();
  Recorder recorder(s);
  recorder.record(staging_wait(1000));
  ASSERT_TRUE(recorder.write().ok());
  EXPECT_EQ(file_text(s.path), recorder.to_json());
  EXPECT_FALSE(std::filesystem::exists(s.path + ".tmp"));
  // Nothing new: a second write (a trainer's exit after its Client's) leaves the file alone.
  std::ofstream(s.path) << "marker";
  ASSERT_TRUE(recorder.write().ok());
  EXPECT_EQ(std::filesystem::file_size(s.path), 6u);
  recorder.record(staging_wait(2000));
  ASSERT_TRUE(recorder.write().ok());
  EXPECT_EQ(file_text(s.path), recorder.to_json());
  Settings bad = s;
  bad.path = (dir / "no-such-dir" / "x.json").string();
  const Status failed = Recorder(bad).write();
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("no-such-dir"), std::string::npos) << failed.message();
  std::filesystem::remove_all(dir);
}

TEST(TraceReadyFile, KeysRoundTripAndBadOnesAreNamed) {
  std::map<std::string, std::string> ready;
  EXPECT_FALSE(parse_ready(ready)->has_value()) << "no trace_dir: tracing is off";
  std::istringstream lines(ready_lines("/tmp/t", 0.5, 1234));
  for (std::string line; std::getline(lines, line);) ready[line.substr(0, line.find('='))] = line.substr(line.find('=') + 1);
  auto parsed = parse_ready(ready);
  ASSERT_TRUE(parsed.ok() && parsed->has_value());
  EXPECT_EQ((*parsed)->dir, "/tmp/t");
  EXPECT_EQ((*parsed)->sample_fraction, 0.5);
  EXPECT_EQ((*parsed)->max_events, 1234u);
  ready["trace_sample_fraction"] = "1.5";
  auto bad = parse_ready(ready);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("trace_sample_fraction '1.5'"), std::string::npos);
  EXPECT_TRUE(ready_lines("", 1, 1).empty());
}

}  // namespace trace_test
}  // namespace shardmix::trace
