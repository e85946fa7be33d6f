// The S3 source (dataset.path = "s3://BUCKET/PREFIX"): settings, the credential chain, the
// retry policy and a client that keeps a bounded number of requests in flight
// (storage.s3.concurrency) from one thread, over libcurl's multi interface with SigV4
// signing by libcurl (CURLOPT_AWS_SIGV4; docs/decisions/0051-s3-client-and-test-server.md).
//
// Layers, so that the logic is tested without a server (tests/unit/s3_client_test.cc):
//  - pure functions: s3:// URL parsing, settings and credential resolution, the retry
//    policy, ListObjectsV2 XML parsing, the checks of a response against what was asked;
//  - HttpTransport: starts requests and reports finished ones (CurlTransport in
//    production, a scripted fake in the tests);
//  - S3Client: the engine thread that feeds the transport, retries with jittered
//    exponential backoff and checks every response (status, Content-Length,
//    Content-Range, the ETag as MD5 of a whole object).
//
// Secrets: the secret key and the session token live only in S3Settings and in the curl
// handles; S3Settings::describe() and every message name the endpoint, the bucket and the
// access key id, never them.
//
// Thread-safety: S3Client's public members may be called from any thread; completions run
// on the engine thread (a callback must not block). The pure functions have no state.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace shardmix {

// ---------------------------------------------------------------- locations

inline constexpr std::string_view kS3Scheme = "s3://";
inline bool is_s3_path(std::string_view path) { return path.starts_with(kS3Scheme); }

struct S3Location {
  std::string bucket;
  std::string key;  // no leading '/'; a prefix ends without '/' ("" = the whole bucket)
};
// "s3://bucket/some/prefix" -> {bucket, "some/prefix"}. Error names `what` (a config key).
Result<S3Location> parse_s3_url(std::string_view url, std::string_view what);
// "s3://bucket/prefix" + "rel/key" -> "s3://bucket/prefix/rel/key".
std::string s3_join(std::string_view url, std::string_view relative);

// ---------------------------------------------------------------- settings

struct S3Settings {
  std::string endpoint;           // "https://s3.us-east-1.amazonaws.com" or "http://127.0.0.1:9000"
  std::string region;
  std::string access_key_id;
  std::string secret_access_key;  // never printed
  std::string session_token;      // never printed; "" = none
  bool path_style = true;         // http://endpoint/bucket/key; false = http://bucket.endpoint/key
  std::uint32_t concurrency = 64;
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds request_timeout{60000};
  std::uint32_t max_attempts = 6;
  std::chrono::milliseconds backoff_base{50};
  std::chrono::milliseconds backoff_max{5000};

  // "endpoint http://..., region r, access key id AKIA...": for messages and the log.
  std::string describe() const;
};

// The settings the AWS tools would use, overridden by [storage.s3]. `env`: the process
// environment (AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE, HOME).
// Credentials, first found wins: storage.s3.profile (from the credentials file), the
// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY pair, AWS_PROFILE (or "default") from the
// credentials file (storage.s3.credentials_file, else AWS_SHARED_CREDENTIALS_FILE, else
// ~/.aws/credentials). No secret is ever a config key, so none can reach --print-config.
// Errors name the variable, file or key that is missing or wrong.
Result<S3Settings> resolve_s3_settings(const S3Config& config, const std::map<std::string, std::string>& env);

// Parses an AWS credentials file (INI: [profile] then key = value lines) for `profile`.
// Returns aws_access_key_id, aws_secret_access_key, aws_session_token when present;
// kNotFound when the profile is absent. `name` appears in messages.
Result<std::map<std::string, std::string>> parse_aws_credentials(std::string_view text, std::string_view profile,
                                                                 std::string_view name);

// ---------------------------------------------------------------- retry policy

// What one attempt of a request ended with.
struct HttpOutcome {
  long http_status = 0;   // 0 = no response (transport error)
  int transport_error = 0;  // CURLcode; 0 = a response arrived
  std::string transport_text;
};

class RetryPolicy {
 public:
  RetryPolicy(std::uint32_t max_attempts, std::chrono::milliseconds base, std::chrono::milliseconds cap)
      : max_attempts_(max_attempts), base_(base), cap_(cap) {}
  // Throttling (503 SlowDown, 429), other 5xx, a 408 and transport errors (reset, timeout,
  // refused) are worth another attempt; other 4xx are final.
  static bool retryable(const HttpOutcome& outcome);
  // Another attempt after `attempts_done` (>= 1) that ended with `outcome`?
  bool should_retry(const HttpOutcome& outcome, std::uint32_t attempts_done) const {
    return retryable(outcome) && attempts_done < max_attempts_;
  }
  // "Full jitter": uniform in [0, min(cap, base * 2^(attempts_done - 1))], with `unit` in
  // [0, 1) the caller's random draw, so that many clients throttled together spread out.
  std::chrono::microseconds backoff(std::uint32_t attempts_done, double unit) const;
  std::uint32_t max_attempts() const { return max_attempts_; }

 private:
  std::uint32_t max_attempts_;
  std::chrono::milliseconds base_, cap_;
};

// ---------------------------------------------------------------- transport

// One HTTP exchange. The transport fills the response fields; a 2xx body goes in place into
// `body_into`'s spans one after the other (bytes beyond them are counted, not written).
struct HttpExchange {
  // request
  std::string method = "GET";
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  const std::uint8_t* upload = nullptr;  // PUT body
  std::uint64_t upload_bytes = 0;
  std::vector<std::span<std::uint8_t>> body_into;  // empty = collect into `body`
  // response
  HttpOutcome outcome;
  std::map<std::string, std::string> response_headers;  // names lower-case
  std::string body;                 // when body_into is empty, or an error document
  std::uint64_t body_bytes = 0;     // received (those beyond body_capacity included)
  long status_line = 0;             // the status as the headers arrive (body_into only takes 2xx bodies)
  void* owner = nullptr;            // the engine's bookkeeping
  void reset_response();
};

class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  // Starts `x`; it is reported by a later poll(). At most `concurrency` are started at once.
  virtual void start(HttpExchange* x) = 0;
  // Waits up to `max_wait` for progress (or a wakeup()); returns the exchanges that finished.
  virtual std::vector<HttpExchange*> poll(std::chrono::milliseconds max_wait) = 0;
  // Makes a poll() in progress return early (any thread).
  virtual void wakeup() = 0;
};

// libcurl multi: SigV4 by CURLOPT_AWS_SIGV4, one easy handle per slot (connections reused),
// the settings' timeouts. Errors in construction are fatal programming errors (curl init).
std::unique_ptr<HttpTransport> make_curl_transport(const S3Settings& settings);

// ---------------------------------------------------------------- client

struct S3Object {
  std::string key;   // full key
  std::uint64_t size = 0;
  std::string etag;  // without quotes
};

// Parses one ListObjectsV2 page. Fills `objects` (Contents) and `prefixes` (CommonPrefixes)
// and returns the NextContinuationToken ("" = last page).
Result<std::string> parse_list_page(std::string_view xml, std::vector<S3Object>& objects,
                                     std::vector<std::string>& prefixes);

// One object read. length = nullopt: the whole object, whose size must be `expected_size`
// (and whose ETag, when it is an MD5, must match the bytes); else bytes [offset, offset +
// *length) by a ranged GET.
struct S3Read {
  std::string key;
  std::uint64_t offset = 0;
  std::optional<std::uint64_t> length;
  std::uint64_t expected_size = 0;  // whole reads: the object's size from the listing
  // Where the bytes go, in order (a sample and its framing: header, data, footer); the
  // spans add up to the bytes asked for.
  std::vector<std::span<std::uint8_t>> into;
};

// Bytes [begin, end) of object `object` (an index the caller gives its objects).
struct ObjectRange {
  std::uint32_t object = 0;
  std::uint64_t begin = 0, end = 0;
};
// Which ranges to fetch together, so that reads near each other in one object cost one
// request (storage.s3.merge_gap / merge_max): groups of indices into `ranges`, each sorted
// by offset, with every range in exactly one group. A range joins the group before it when
// it is in the same object, starts at or after that group's end and at most `max_gap` bytes
// after it, and the group's span stays within `max_bytes` (0: no merging, one range a
// group). Overlapping ranges are never merged, so each byte of a GET goes to one place.
std::vector<std::vector<std::size_t>> merge_nearby_ranges(std::span<const ObjectRange> ranges, std::uint64_t max_gap,
                                                          std::uint64_t max_bytes);

struct S3ClientStats {
  std::uint64_t requests = 0;    // attempts sent
  std::uint64_t retries = 0;     // attempts after a retryable failure
  std::uint64_t bytes = 0;       // body bytes of successful reads
  std::uint64_t failed = 0;      // requests that failed for good
};

class S3Client {
 public:
  S3Client(S3Settings settings, std::unique_ptr<HttpTransport> transport);
  ~S3Client();  // cancels what is queued (its callbacks get kCancelled) and joins
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // Reads every one of `reads`; `done(i, status)` once per read (engine thread), in any order.
  void read_async(const std::string& bucket, std::vector<S3Read> reads,
                  std::function<void(std::size_t, const Status&)> done);
  // The same, blocking; one status per read.
  std::vector<Status> read_all(const std::string& bucket, std::vector<S3Read> reads);
  // Every object under `prefix` (ListObjectsV2, all pages). With a delimiter, also the
  // common prefixes ("dir/" names) instead of what is below them.
  Result<std::vector<S3Object>> list(const std::string& bucket, const std::string& prefix,
                                     std::vector<std::string>* common_prefixes = nullptr,
                                     std::string_view delimiter = "");
  // Uploads one object (shardmix-gen --out s3://...).
  Status put(const std::string& bucket, const std::string& key, std::span<const std::uint8_t> bytes);

  S3ClientStats stats() const;
  const S3Settings& settings() const { return settings_; }
  std::string object_url(const std::string& bucket, std::string_view key, std::string_view query = "") const;

 private:
  struct Request;
  void submit(std::unique_ptr<Request> request);
  void run();
  void finish_attempt(Request& r);
  // An exchange's request and everything the client needs to check its response.
  Status check_response(const Request& r) const;

  const S3Settings settings_;
  const RetryPolicy policy_;
  std::unique_ptr<HttpTransport> transport_;
  std::mutex mutex_;  // guards incoming_ and stopping_
  std::deque<std::unique_ptr<Request>> incoming_;
  bool stopping_ = false;
  std::atomic<std::uint64_t> requests_{0}, retries_{0}, bytes_{0}, failed_{0};
  std::thread engine_;  // last: started once everything above exists
};

// The process's client for `config` (created on first use, then shared; the daemon reads
// one dataset). Error: settings that cannot be resolved, naming the key or variable.
Result<std::shared_ptr<S3Client>> shared_s3_client(const S3Config& config);

}  // namespace shardmix
