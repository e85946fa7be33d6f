#include "server/startup_report.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

namespace shardmix {
namespace startup_report_test {

using namespace std::chrono_literals;

TEST(PhaseClockTest, EachMarkClosesThePhaseSinceThePreviousOne) {
  const PhaseClock::Clock::time_point t0{10s};
  PhaseClock clock(t0);
  clock.mark("scan", t0 + 2s);
  clock.mark("load", t0 + 5s);
  clock.mark("scan", t0 + 6s);  // a second mark of the same phase accumulates
  ASSERT_EQ(clock.phases().size(), 2u);
  EXPECT_EQ(clock.phases()[0].first, "scan");
  EXPECT_DOUBLE_EQ(clock.phases()[0].second, 3.0);
  EXPECT_EQ(clock.phases()[1].first, "load");
  EXPECT_DOUBLE_EQ(clock.phases()[1].second, 3.0);
  EXPECT_DOUBLE_EQ(clock.total_seconds(), 6.0);
  EXPECT_DOUBLE_EQ(clock.begin_monotonic_seconds(), 10.0);
  EXPECT_DOUBLE_EQ(clock.last_monotonic_seconds(), 16.0);
}

TEST(ReportLineTest, StartupLineRoundTripsThroughTheParserBehindALogPrefix) {
  const PhaseClock::Clock::time_point t0{100s};
  PhaseClock clock(t0);
  clock.mark("scan", t0 + 1500ms);
  clock.mark("catalog_exchange", t0 + 1750ms);
  auto line = format_report_line("startup", startup_fields(3, clock));
  ASSERT_TRUE(line.ok()) << line.status().to_string();
  // What spdlog puts in front must not matter.
  auto fields = parse_report_line("[2026-11-24 15:00:00.000] [daemon] [info] [r3] " + *line, "startup");
  ASSERT_TRUE(fields.ok()) << fields.status().to_string();
  EXPECT_EQ(fields->at("rank"), "3");
  EXPECT_EQ(fields->at("scan"), "1.500");
  EXPECT_EQ(fields->at("catalog_exchange"), "0.250");
  EXPECT_EQ(fields->at("total"), "1.750");
  EXPECT_EQ(fields->at("t_begin"), "100.000000");
  EXPECT_EQ(fields->at("t_end"), "101.750000");
}

TEST(ReportLineTest, RejectsMalformedInputNamingIt) {
  EXPECT_FALSE(format_report_line("memory", {{"Bad-Key", "1"}}).ok());
  EXPECT_FALSE(format_report_line("memory", {{"rss", "1 2"}}).ok());
  EXPECT_FALSE(format_report_line("memory", {{"rss", ""}}).ok());
  auto missing = parse_report_line("memory: rss=1", "startup");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  auto not_a_word = parse_report_line("restartup: a=1", "startup");
  EXPECT_EQ(not_a_word.status().code(), StatusCode::kNotFound);
  auto malformed = parse_report_line("startup: scan=1 load", "startup");
  ASSERT_EQ(malformed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(malformed.status().message().find("'load'"), std::string::npos);
  auto twice = parse_report_line("startup: scan=1 scan=2", "startup");
  ASSERT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("scan"), std::string::npos);
}

RC_GTEST_PROP(ReportLineTest, AnyValidFieldsRoundTrip, ()) {
  const auto keys = *rc::gen::container<std::vector<std::string>>(
      rc::gen::nonEmpty(rc::gen::container<std::string>(rc::gen::elementOf(std::string("abcxyz019_")))));
  std::map<std::string, std::string> expected;
  ReportFields fields;
  for (const auto& key : keys) {
    if (expected.count(key) != 0) continue;
    const auto value = *rc::gen::nonEmpty(rc::gen::container<std::string>(rc::gen::inRange<char>('!', '~' + 1)))
                            .as("value");
    if (value.find('=') != std::string::npos) continue;
    expected[key] = value;
    fields.emplace_back(key, value);
  }
  auto line = format_report_line("memory", fields);
  RC_ASSERT(line.ok());
  auto parsed = parse_report_line(*line, "memory");
  RC_ASSERT(parsed.ok());
  RC_ASSERT(*parsed == expected);
}

TEST(ProcStatusTest, ReadsKilobyteFieldsAsBytesAndCountsAsIs) {
  const std::string text =
      "Name:\tshardmixd\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nRssAnon:\t    2048 kB\nThreads:\t9\n";
  EXPECT_EQ(proc_status_bytes(text, "VmRSS"), std::uint64_t{102400} * 1024);
  EXPECT_EQ(proc_status_bytes(text, "RssAnon"), std::uint64_t{2048} * 1024);
  EXPECT_EQ(proc_status_bytes(text, "Threads"), 9u);
  EXPECT_EQ(proc_status_bytes(text, "VmRS"), std::nullopt);  // a prefix is not the key
  EXPECT_EQ(proc_status_bytes(text, "RssShmem"), std::nullopt);
  EXPECT_TRUE(self_status_bytes("VmRSS").has_value());
}

}  // namespace startup_report_test
}  // namespace shardmix
