// The S3 client's logic without a server: the retry policy and its backoff, the credential
// chain, listing pages, and the engine over a scripted transport (retries that lose and
// repeat nothing, integrity checks, final errors that name the endpoint and the access key
// id but never the secret). The real server is exercised by tests/e2e/s3_e2e.sh.
#include "common/s3_client.h"

#include "common/catalog.h"
#include "common/s3_dataset.h"
#include "common/shard_formats.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>

namespace shardmix {
namespace s3_client_test {

TEST(S3Url, SplitsBucketAndPrefix) {
  auto a = parse_s3_url("s3://bucket/some/prefix/", "dataset.path");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->bucket, "bucket");
  EXPECT_EQ(a->key, "some/prefix");
  auto whole = parse_s3_url("s3://bucket", "dataset.path");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->key, "");
  auto bad = parse_s3_url("s3:///x", "dataset.path");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("dataset.path"), std::string::npos);
  EXPECT_EQ(s3_join("s3://b/p/", "c/x.bin"), "s3://b/p/c/x.bin");
}

TEST(RetryPolicy, RetriesThrottlingServerErrorsAndResetsOnly) {
  RetryPolicy p(3, std::chrono::milliseconds(50), std::chrono::milliseconds(400));
  EXPECT_TRUE(p.should_retry({503, 0, ""}, 1));
  EXPECT_TRUE(p.should_retry({500, 0, ""}, 2));
  EXPECT_TRUE(p.should_retry({429, 0, ""}, 1));
  EXPECT_TRUE(p.should_retry({0, 56, "Connection reset"}, 1));  // CURLE_RECV_ERROR
  EXPECT_FALSE(p.should_retry({503, 0, ""}, 3)) << "attempts are bounded";
  EXPECT_FALSE(p.should_retry({404, 0, ""}, 1));
  EXPECT_FALSE(p.should_retry({403, 0, ""}, 1));
}

TEST(RetryPolicy, BackoffIsFullJitterUnderADoublingCeiling) {
  RetryPolicy p(10, std::chrono::milliseconds(50), std::chrono::milliseconds(400));
  EXPECT_EQ(p.backoff(1, 0.0).count(), 0);
  EXPECT_EQ(p.backoff(1, 0.999999).count(), 49999);
  EXPECT_EQ(p.backoff(2, 0.5).count(), 50000);   // ceiling 100 ms
  EXPECT_EQ(p.backoff(3, 0.5).count(), 100000);  // ceiling 200 ms
  EXPECT_EQ(p.backoff(4, 0.5).count(), 200000);  // ceiling 400 ms = the cap
  EXPECT_EQ(p.backoff(9, 0.5).count(), 200000);  // still the cap
}

class CredentialChain : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("s3cred-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_ / ".aws");
    std::ofstream(dir_ / ".aws" / "credentials") << "[default]\naws_access_key_id = DEFAULTID\n"
                                                    "aws_secret_access_key = defaultsecret\n\n"
                                                    "[ci]\naws_access_key_id=CIID\naws_secret_access_key=cisecret\n"
                                                    "aws_session_token = citoken\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(CredentialChain, EnvironmentKeysThenAwsProfileThenDefault) {
  const std::string home = dir_.string();
  S3Config config;
  auto env_keys = resolve_s3_settings(config, {{"HOME", home}, {"AWS_ACCESS_KEY_ID", "ENVID"},
                                               {"AWS_SECRET_ACCESS_KEY", "envsecret"}, {"AWS_PROFILE", "ci"}});
  ASSERT_TRUE(env_keys.ok()) << env_keys.status().message();
  EXPECT_EQ(env_keys->access_key_id, "ENVID");
  EXPECT_EQ(env_keys->secret_access_key, "envsecret");
  auto profile = resolve_s3_settings(config, {{"HOME", home}, {"AWS_PROFILE", "ci"}});
  ASSERT_TRUE(profile.ok()) << profile.status().message();
  EXPECT_EQ(profile->access_key_id, "CIID");
  EXPECT_EQ(profile->session_token, "citoken");
  auto fallback = resolve_s3_settings(config, {{"HOME", home}});
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(fallback->access_key_id, "DEFAULTID");
  config.profile = "ci";  // the config's profile wins over the environment's keys
  auto configured = resolve_s3_settings(config, {{"HOME", home}, {"AWS_ACCESS_KEY_ID", "ENVID"},
                                                 {"AWS_SECRET_ACCESS_KEY", "envsecret"}});
  ASSERT_TRUE(configured.ok());
  EXPECT_EQ(configured->access_key_id, "CIID");
}

TEST_F(CredentialChain, EndpointRegionAndAddressing) {
  S3Config config;
  auto local = resolve_s3_settings(config, {{"HOME", dir_.string()}, {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"}});
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local->endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(local->region, "us-east-1");
  EXPECT_TRUE(local->path_style);
  auto aws = resolve_s3_settings(config, {{"HOME", dir_.string()}, {"AWS_REGION", "eu-west-1"}});
  ASSERT_TRUE(aws.ok());
  EXPECT_EQ(aws->endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_FALSE(aws->path_style);
  config.addressing = "path";
  config.endpoint = "https://store.example";
  auto forced = resolve_s3_settings(config, {{"HOME", dir_.string()}});
  ASSERT_TRUE(forced.ok());
  EXPECT_TRUE(forced->path_style);
  EXPECT_EQ(forced->endpoint, "https://store.example");
}

TEST_F(CredentialChain, ErrorsNameWhatIsMissingNeverASecret) {
  auto half = resolve_s3_settings(S3Config{}, {{"HOME", dir_.string()}, {"AWS_SECRET_ACCESS_KEY", "topsecret"}});
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos);
  EXPECT_EQ(half.status().message().find("topsecret"), std::string::npos);
  auto missing = resolve_s3_settings(S3Config{}, {{"HOME", dir_.string()}, {"AWS_PROFILE", "nope"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("[nope]"), std::string::npos);
  S3Settings s = *resolve_s3_settings(S3Config{}, {{"HOME", dir_.string()}});
  EXPECT_EQ(s.describe().find("defaultsecret"), std::string::npos);
  EXPECT_NE(s.describe().find("DEFAULTID"), std::string::npos);
}

TEST(MergeRanges, NearbyRangesOfOneObjectShareAGetWithinTheLimits) {
  // Object 0: a run with a 100-byte gap, then a 1,000-byte gap; object 1 right after.
  const std::vector<ObjectRange> ranges{{0, 600, 700}, {0, 0, 500}, {1, 0, 10}, {0, 1700, 1800}, {1, 10, 20}};
  using Groups = std::vector<std::vector<std::size_t>>;
  EXPECT_EQ(merge_nearby_ranges(ranges, 100, 1 << 20), (Groups{{1, 0}, {3}, {2, 4}}));
  EXPECT_EQ(merge_nearby_ranges(ranges, 1000, 1 << 20), (Groups{{1, 0, 3}, {2, 4}}));
  EXPECT_EQ(merge_nearby_ranges(ranges, 1000, 700), (Groups{{1, 0}, {3}, {2, 4}}));  // 0..1800 is too long
  EXPECT_EQ(merge_nearby_ranges(ranges, 1000, 0), (Groups{{1}, {0}, {3}, {2}, {4}}));  // merging off
  // Overlapping ranges (the same sample twice) never share a GET: each byte goes one place.
  const std::vector<ObjectRange> twice{{0, 0, 100}, {0, 0, 100}, {0, 50, 150}};
  EXPECT_EQ(merge_nearby_ranges(twice, 1000, 1 << 20), (Groups{{0}, {1}, {2}}));
}

TEST(ListPage, ObjectsPrefixesAndTheNextToken) {
  std::vector<S3Object> objects;
  std::vector<std::string> prefixes;
  auto token = parse_list_page(
      "<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>t&amp;2</NextContinuationToken>"
      "<Contents><Key>p/a &amp; b.bin</Key><Size>12</Size><ETag>&quot;abc&quot;</ETag></Contents>"
      "<Contents><Key>p/c.bin</Key><Size>0</Size></Contents>"
      "<CommonPrefixes><Prefix>p/dir/</Prefix></CommonPrefixes></ListBucketResult>",
      objects, prefixes);
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(*token, "t&2");
  ASSERT_EQ(objects.size(), 2u);
  EXPECT_EQ(objects[0].key, "p/a & b.bin");
  EXPECT_EQ(objects[0].size, 12u);
  EXPECT_EQ(objects[0].etag, "abc");
  EXPECT_EQ(prefixes, std::vector<std::string>{"p/dir/"});
  auto last = parse_list_page("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>", objects, prefixes);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(*last, "");
  EXPECT_FALSE(parse_list_page("<Error><Code>AccessDenied</Code></Error>", objects, prefixes).ok());
}

// A transport that answers each request from a script keyed by URL (front first; the last
// answer repeats), synchronously on the next poll.
class ScriptedTransport final : public HttpTransport {
 public:
  struct Answer {
    long status = 200;
    int transport_error = 0;
    std::string body;
    std::map<std::string, std::string> headers;
  };
  std::map<std::string, std::deque<Answer>> script;
  std::map<std::string, int> attempts;
  std::size_t max_running = 0;

  void start(HttpExchange* x) override {
    std::lock_guard lock(m_);
    running_.push_back(x);
    max_running = std::max(max_running, running_.size());
  }
  std::vector<HttpExchange*> poll(std::chrono::milliseconds max_wait) override {
    std::unique_lock lock(m_);
    cv_.wait_for(lock, max_wait, [&] { return !running_.empty() || woken_; });
    woken_ = false;
    std::vector<HttpExchange*> done(running_.begin(), running_.end());
    running_.clear();
    for (HttpExchange* x : done) answer(*x);
    return done;
  }
  void wakeup() override {
    std::lock_guard lock(m_);
    woken_ = true;
    cv_.notify_all();
  }

 private:
  void answer(HttpExchange& x) {
    ++attempts[x.url];
    auto& queue = script[x.url];
    const Answer a = queue.empty() ? Answer{404, 0, "<Error><Code>NoSuchKey</Code></Error>", {}} : queue.front();
    if (queue.size() > 1) queue.pop_front();
    x.outcome = {a.transport_error != 0 ? 0 : a.status, a.transport_error, a.transport_error != 0 ? "reset" : ""};
    x.status_line = x.outcome.http_status;
    x.response_headers = a.headers;
    x.body_bytes = a.body.size();
    if (x.body_into.empty() || a.status >= 300) {
      x.body = a.body;
      return;
    }
    std::size_t at = 0;
    for (auto span : x.body_into) {
      const std::size_t n = std::min(span.size(), a.body.size() - std::min(at, a.body.size()));
      std::copy_n(a.body.data() + at, n, span.data());
      at += n;
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<HttpExchange*> running_;
  bool woken_ = false;
};

S3Settings test_settings() {
  S3Settings s;
  s.endpoint = "http://store:9000";
  s.access_key_id = "TESTKEYID";
  s.secret_access_key = "very-secret-value";
  s.concurrency = 2;
  s.max_attempts = 4;
  s.backoff_base = std::chrono::milliseconds(1);
  s.backoff_max = std::chrono::milliseconds(2);
  return s;
}

TEST(S3ClientEngine, RetriesThrottlingAndResetsThenDeliversTheBytesOnce) {
  auto transport = std::make_unique<ScriptedTransport>();
  ScriptedTransport& t = *transport;
  const std::string url = "http://store:9000/b/k/x.bin";
  t.script[url] = {{503, 0, "<Error><Code>SlowDown</Code></Error>", {}},
                   {0, 56, "", {}},
                   {206, 0, "cdef", {{"content-length", "4"}, {"content-range", "bytes 2-5/10"}}}};
  S3Client client(test_settings(), std::move(transport));
  std::vector<std::uint8_t> head(1), out(3);
  std::vector<S3Read> reads{{"k/x.bin", 2, 4, 0, {std::span(head), std::span(out)}}};
  auto statuses = client.read_all("b", reads);
  ASSERT_TRUE(statuses[0].ok()) << statuses[0].message();
  EXPECT_EQ(head[0], 'c');
  EXPECT_EQ(std::string(out.begin(), out.end()), "def");
  EXPECT_EQ(t.attempts[url], 3);
  EXPECT_EQ(client.stats().retries, 2u);
  EXPECT_EQ(client.stats().failed, 0u);
}

TEST(S3ClientEngine, WholeObjectsAreCheckedAgainstLengthAndEtag) {
  auto transport = std::make_unique<ScriptedTransport>();
  ScriptedTransport& t = *transport;
  // md5("hello") = 5d41402abc4b2a76b9719d911017c592
  t.script["http://store:9000/b/good"] = {{200, 0, "hello", {{"etag", "\"5d41402abc4b2a76b9719d911017c592\""}}}};
  t.script["http://store:9000/b/garbled"] = {{200, 0, "hellO", {{"etag", "\"5d41402abc4b2a76b9719d911017c592\""}}}};
  t.script["http://store:9000/b/short"] = {{200, 0, "hell", {}}};
  S3Client client(test_settings(), std::move(transport));
  std::vector<std::uint8_t> a(5), b(5), c(5);
  auto statuses = client.read_all("b", {{"good", 0, std::nullopt, 5, {std::span(a)}},
                                        {"garbled", 0, std::nullopt, 5, {std::span(b)}},
                                        {"short", 0, std::nullopt, 5, {std::span(c)}}});
  EXPECT_TRUE(statuses[0].ok()) << statuses[0].message();
  ASSERT_EQ(statuses[1].code(), StatusCode::kCorrupt);
  EXPECT_NE(statuses[1].message().find("s3://b/garbled"), std::string::npos);
  EXPECT_NE(statuses[1].message().find("ETag"), std::string::npos);
  ASSERT_EQ(statuses[2].code(), StatusCode::kCorrupt);
  EXPECT_NE(statuses[2].message().find("expected 5 bytes"), std::string::npos);
  EXPECT_EQ(t.attempts["http://store:9000/b/garbled"], 4) << "integrity failures are retried up to max_attempts";
  EXPECT_LE(t.max_running, 2u) << "never more than storage.s3.concurrency in flight";
}

TEST(S3ClientEngine, FinalErrorsNameTheKeyEndpointAndKeyIdButNotTheSecret) {
  auto transport = std::make_unique<ScriptedTransport>();
  ScriptedTransport& t = *transport;
  t.script["http://store:9000/b/gone"] = {{404, 0, "<Error><Code>NoSuchKey</Code><Message>no</Message></Error>", {}}};
  t.script["http://store:9000/b/denied"] = {
      {403, 0, "<Error><Code>InvalidAccessKeyId</Code><Message>unknown key</Message></Error>", {}}};
  S3Client client(test_settings(), std::move(transport));
  std::vector<std::uint8_t> a(1), b(1);
  auto statuses = client.read_all("b", {{"gone", 0, std::nullopt, 1, {std::span(a)}},
                                        {"denied", 0, std::nullopt, 1, {std::span(b)}}});
  EXPECT_EQ(statuses[0].code(), StatusCode::kNotFound);
  EXPECT_EQ(t.attempts["http://store:9000/b/gone"], 1) << "a 404 is final";
  EXPECT_NE(statuses[0].message().find("s3://b/gone"), std::string::npos);
  EXPECT_EQ(statuses[1].code(), StatusCode::kPermissionDenied);
  const std::string& m = statuses[1].message();
  EXPECT_NE(m.find("InvalidAccessKeyId"), std::string::npos);
  EXPECT_NE(m.find("http://store:9000"), std::string::npos);
  EXPECT_NE(m.find("TESTKEYID"), std::string::npos);
  EXPECT_EQ(m.find("very-secret-value"), std::string::npos);
}

TEST(S3ClientEngine, ListingFollowsContinuationTokens) {
  auto transport = std::make_unique<ScriptedTransport>();
  ScriptedTransport& t = *transport;
  t.script["http://store:9000/b/?list-type=2&prefix=p%2F"] = {
      {200, 0,
       "<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>n 1</NextContinuationToken>"
       "<Contents><Key>p/a</Key><Size>1</Size></Contents></ListBucketResult>",
       {}}};
  t.script["http://store:9000/b/?continuation-token=n%201&list-type=2&prefix=p%2F"] = {
      {200, 0,
       "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/b</Key><Size>2</Size></Contents>"
       "</ListBucketResult>",
       {}}};
  S3Client client(test_settings(), std::move(transport));
  auto listed = client.list("b", "p/");
  ASSERT_TRUE(listed.ok()) << listed.status().message();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].key, "p/a");
  EXPECT_EQ((*listed)[1].key, "p/b");
  EXPECT_EQ((*listed)[1].size, 2u);
}

std::string list_page(const std::vector<std::pair<std::string, std::uint64_t>>& objects,
                      const std::vector<std::string>& prefixes = {}) {
  std::string xml = "<ListBucketResult><IsTruncated>false</IsTruncated>";
  for (const auto& [key, size] : objects) {
    xml += "<Contents><Key>" + key + "</Key><Size>" + std::to_string(size) + "</Size></Contents>";
  }
  for (const std::string& p : prefixes) xml += "<CommonPrefixes><Prefix>" + p + "</Prefix></CommonPrefixes>";
  return xml + "</ListBucketResult>";
}

TEST(S3Scan, FolderClassesAreSplitAmongRanksAsTheDirectoryScanSplitsThem) {
  auto transport = std::make_unique<ScriptedTransport>();
  ScriptedTransport& t = *transport;
  t.script["http://store:9000/b/?delimiter=%2F&list-type=2&prefix=ds%2F"] = {
      {200, 0, list_page({{"ds/README", 5}}, {"ds/a/", "ds/b/", "ds/c/", "ds/.hidden/"}), {}}};
  t.script["http://store:9000/b/?list-type=2&prefix=ds%2Fa%2F"] = {
      {200, 0, list_page({{"ds/a/2.jpg", 20}, {"ds/a/1.jpg", 10}, {"ds/a/deep/.x", 1}}), {}}};
  t.script["http://store:9000/b/?list-type=2&prefix=ds%2Fb%2F"] = {{200, 0, list_page({{"ds/b/1.jpg", 30}}), {}}};
  t.script["http://store:9000/b/?list-type=2&prefix=ds%2Fc%2F"] = {{200, 0, list_page({{"ds/c/x/y.jpg", 40}}), {}}};
  S3Client client(test_settings(), std::move(transport));
  DatasetConfig d;
  d.path = "s3://b/ds";
  auto r0 = scan_s3_partition(client, d, 0, 2);
  auto r1 = scan_s3_partition(client, d, 1, 2);
  ASSERT_TRUE(r0.ok()) << r0.status().message();
  ASSERT_TRUE(r1.ok()) << r1.status().message();
  EXPECT_EQ(r0->class_names, (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_EQ(r0->entries.size(), 3u);  // classes 0 (a) and 2 (c), each sorted by path
  EXPECT_EQ(r0->entries[0].path, "a/1.jpg");
  EXPECT_EQ(r0->entries[0].size, 10u);
  EXPECT_EQ(r0->entries[1].path, "a/2.jpg");
  EXPECT_EQ(r0->entries[2].path, "c/x/y.jpg");
  EXPECT_EQ(r0->entries[2].label, 2);
  EXPECT_EQ(r0->skipped_root_files, 1u) << "only rank 0 counts what lies directly under the prefix";
  EXPECT_EQ(r0->skipped_hidden, 2u);
  ASSERT_EQ(r1->entries.size(), 1u);
  EXPECT_EQ(r1->entries[0].path, "b/1.jpg");
  EXPECT_EQ(r1->entries[0].label, 1);
  EXPECT_EQ(r1->skipped_root_files, 0u);
  EXPECT_EQ(t.attempts.count("http://store:9000/b/?list-type=2&prefix=ds%2Fb%2F"), 1u)
      << "rank 1 listed its class once, rank 0 never";
  EXPECT_EQ(t.attempts["http://store:9000/b/?list-type=2&prefix=ds%2Fb%2F"], 1);
}

TEST(S3Scan, AShardThatCannotBeReadFollowsStrict) {
  std::vector<std::uint8_t> tar;
  const std::string data = "sample bytes";
  append_tar_member(tar, "k1.bin", std::span(reinterpret_cast<const std::uint8_t*>(data.data()), data.size()));
  append_tar_member(tar, "k1.cls", std::span(reinterpret_cast<const std::uint8_t*>("3"), 1));
  append_tar_end(tar);
  auto run = [&](bool strict) {
    auto transport = std::make_unique<ScriptedTransport>();
    transport->script["http://store:9000/b/?delimiter=%2F&list-type=2&prefix=ds%2F"] = {
        {200, 0, list_page({{"ds/s0.tar", tar.size()}, {"ds/s1.tar", 2048}}), {}}};
    transport->script["http://store:9000/b/ds/s0.tar"] = {{200, 0, std::string(tar.begin(), tar.end()), {}}};
    // ds/s1.tar is not scripted: 404 NoSuchKey, as for an object deleted after the listing.
    S3Client client(test_settings(), std::move(transport));
    DatasetConfig d;
    d.path = "s3://b/ds";
    d.format = DatasetFormat::kWebDataset;
    d.sample_ext = "bin";
    d.strict = strict;
    return scan_s3_partition(client, d, 0, 1);
  };
  auto lenient = run(false);
  ASSERT_TRUE(lenient.ok()) << lenient.status().message();
  ASSERT_EQ(lenient->entries.size(), 1u);
  EXPECT_EQ(lenient->entries[0].size, data.size());
  EXPECT_EQ(lenient->entries[0].label, 3);
  EXPECT_EQ(lenient->shards, std::vector<std::string>{"s0.tar"});
  EXPECT_EQ(lenient->invalid_shards, 1u);
  ASSERT_EQ(lenient->problems.size(), 1u);
  EXPECT_NE(lenient->problems[0].find("s3://b/ds/s1.tar"), std::string::npos);
  auto strict = run(true);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("s3://b/ds/s1.tar"), std::string::npos);
  EXPECT_NE(strict.status().message().find("dataset.strict"), std::string::npos);
}

}  // namespace s3_client_test
}  // namespace shardmix
