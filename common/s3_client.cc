#include "common/s3_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <tuple>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

#include "common/log.h"

namespace shardmix {

// ---------------------------------------------------------------- locations

Result<S3Location> parse_s3_url(std::string_view url, std::string_view what) {
  if (!is_s3_path(url)) {
    return make_error(StatusCode::kInvalidArgument, "{} '{}' is not an s3://BUCKET/PREFIX URL", what, url);
  }
  std::string_view rest = url.substr(kS3Scheme.size());
  const std::size_t slash = rest.find('/');
  S3Location out;
  out.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) out.key = std::string(rest.substr(slash + 1));
  while (!out.key.empty() && out.key.back() == '/') out.key.pop_back();
  if (out.bucket.empty()) return make_error(StatusCode::kInvalidArgument, "{} '{}' names no bucket", what, url);
  return out;
}

std::string s3_join(std::string_view url, std::string_view relative) {
  std::string out(url);
  while (!out.empty() && out.back() == '/') out.pop_back();
  if (!relative.empty()) out += "/" + std::string(relative);
  return out;
}

// ---------------------------------------------------------------- settings

std::string S3Settings::describe() const {
  return fmt::format("endpoint {}, region {}, access key id {}", endpoint, region,
                     access_key_id.empty() ? "(none)" : access_key_id);
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string env_or(const std::map<std::string, std::string>& env, const std::string& name, std::string fallback = "") {
  auto it = env.find(name);
  return it != env.end() && !it->second.empty() ? it->second : fallback;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The host part of "scheme://host[:port][/...]".
std::string_view url_host(std::string_view url) {
  const std::size_t scheme = url.find("://");
  std::string_view rest = scheme == std::string_view::npos ? url : url.substr(scheme + 3);
  rest = rest.substr(0, rest.find('/'));
  if (rest.starts_with('[')) return rest.substr(0, rest.find(']') + 1);  // IPv6 literal
  return rest.substr(0, rest.find(':'));
}

bool host_is_ip_or_local(std::string_view host) {
  if (host == "localhost" || host.starts_with('[')) return true;
  return !host.empty() && std::all_of(host.begin(), host.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '.'; });
}

}  // namespace

Result<std::map<std::string, std::string>> parse_aws_credentials(std::string_view text, std::string_view profile,
                                                                 std::string_view name) {
  std::map<std::string, std::string> out;
  bool in_profile = false, found = false;
  std::size_t line_no = 0;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    const std::string_view line = trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[') {
      if (line.back() != ']') {
        return make_error(StatusCode::kInvalidArgument, "{}:{}: a section header must end with ']'", name, line_no);
      }
      std::string_view section = trim(line.substr(1, line.size() - 2));
      if (section.starts_with("profile ")) section = trim(section.substr(8));  // the config file's spelling
      in_profile = section == profile;
      found = found || in_profile;
      continue;
    }
    if (!in_profile) continue;
    const std::size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      // Never echo the line: it may hold a secret.
      return make_error(StatusCode::kInvalidArgument, "{}:{}: expected 'key = value' in profile [{}]", name, line_no,
                        profile);
    }
    out[lower(trim(line.substr(0, eq)))] = std::string(trim(line.substr(eq + 1)));
  }
  if (!found) return make_error(StatusCode::kNotFound, "{} has no profile [{}]", name, profile);
  return out;
}

Result<S3Settings> resolve_s3_settings(const S3Config& config, const std::map<std::string, std::string>& env) {
  S3Settings s;
  s.region = !config.region.empty() ? config.region : env_or(env, "AWS_REGION", env_or(env, "AWS_DEFAULT_REGION", "us-east-1"));
  s.endpoint = !config.endpoint.empty() ? config.endpoint
                                        : env_or(env, "AWS_ENDPOINT_URL_S3", env_or(env, "AWS_ENDPOINT_URL"));
  if (s.endpoint.empty()) s.endpoint = fmt::format("https://s3.{}.amazonaws.com", s.region);
  while (s.endpoint.ends_with('/')) s.endpoint.pop_back();
  if (!s.endpoint.starts_with("http://") && !s.endpoint.starts_with("https://")) {
    return make_error(StatusCode::kInvalidArgument,
                      "S3 endpoint '{}' (storage.s3.endpoint or AWS_ENDPOINT_URL) must start with http:// or https://",
                      s.endpoint);
  }
  if (config.addressing == "path") {
    s.path_style = true;
  } else if (config.addressing == "virtual") {
    s.path_style = false;
  } else {
    s.path_style = host_is_ip_or_local(url_host(s.endpoint));
  }
  s.concurrency = std::max<std::uint32_t>(1, config.concurrency);
  s.connect_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(config.connect_timeout);
  s.request_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(config.request_timeout);
  s.max_attempts = std::max<std::uint32_t>(1, config.max_attempts);

  auto from_profile = [&](const std::string& profile, std::string_view chosen_by) -> Status {
    std::string file = config.credentials_file;
    if (file.empty()) file = env_or(env, "AWS_SHARED_CREDENTIALS_FILE");
    if (file.empty()) {
      const std::string home = env_or(env, "HOME");
      if (home.empty()) {
        return make_error(StatusCode::kNotFound,
                          "no S3 credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are not set, and HOME is not "
                          "set to find ~/.aws/credentials for profile [{}] ({})",
                          profile, chosen_by);
      }
      file = home + "/.aws/credentials";
    }
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      return make_error(StatusCode::kNotFound,
                        "no S3 credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are not set and the credentials "
                        "file '{}' cannot be read for profile [{}] ({})",
                        file, profile, chosen_by);
    }
    std::ostringstream text;
    text << in.rdbuf();
    SHARDMIX_ASSIGN_OR_RETURN(auto keys, parse_aws_credentials(text.str(), profile, file));
    s.access_key_id = keys["aws_access_key_id"];
    s.secret_access_key = keys["aws_secret_access_key"];
    s.session_token = keys["aws_session_token"];
    if (s.access_key_id.empty() || s.secret_access_key.empty()) {
      return make_error(StatusCode::kInvalidArgument,
                        "{}: profile [{}] ({}) needs aws_access_key_id and aws_secret_access_key", file, profile,
                        chosen_by);
    }
    return Status::ok_status();
  };
  if (!config.profile.empty()) {
    SHARDMIX_RETURN_IF_ERROR(from_profile(config.profile, "storage.s3.profile"));
  } else if (!env_or(env, "AWS_ACCESS_KEY_ID").empty() || !env_or(env, "AWS_SECRET_ACCESS_KEY").empty()) {
    s.access_key_id = env_or(env, "AWS_ACCESS_KEY_ID");
    s.secret_access_key = env_or(env, "AWS_SECRET_ACCESS_KEY");
    s.session_token = env_or(env, "AWS_SESSION_TOKEN");
    if (s.access_key_id.empty() || s.secret_access_key.empty()) {
      return make_error(StatusCode::kInvalidArgument, "S3 credentials: {} is set but {} is not",
                        s.access_key_id.empty() ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID",
                        s.access_key_id.empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY");
    }
  } else if (const std::string profile = env_or(env, "AWS_PROFILE"); !profile.empty()) {
    SHARDMIX_RETURN_IF_ERROR(from_profile(profile, "AWS_PROFILE"));
  } else {
    SHARDMIX_RETURN_IF_ERROR(from_profile("default", "no AWS_PROFILE set"));
  }
  return s;
}

// ---------------------------------------------------------------- retry policy

bool RetryPolicy::retryable(const HttpOutcome& outcome) {
  if (outcome.transport_error != 0) return true;  // reset, timeout, refused, cut short
  const long h = outcome.http_status;
  return h == 408 || h == 429 || h >= 500;
}

std::chrono::microseconds RetryPolicy::backoff(std::uint32_t attempts_done, double unit) const {
  const double base_us = static_cast<double>(std::chrono::microseconds(base_).count());
  const double cap_us = static_cast<double>(std::chrono::microseconds(cap_).count());
  const double ceiling = std::min(cap_us, base_us * std::ldexp(1.0, static_cast<int>(std::min<std::uint32_t>(attempts_done, 40)) - 1));
  return std::chrono::microseconds(static_cast<std::int64_t>(std::clamp(unit, 0.0, 1.0) * ceiling));
}

// ---------------------------------------------------------------- XML

namespace {

std::string xml_unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    const std::size_t semi = s.find(';', i);
    if (semi == std::string_view::npos) {
      out += s[i];
      continue;
    }
    const std::string_view entity = s.substr(i + 1, semi - i - 1);
    if (entity == "amp") out += '&';
    else if (entity == "lt") out += '<';
    else if (entity == "gt") out += '>';
    else if (entity == "quot") out += '"';
    else if (entity == "apos") out += '\'';
    else if (entity.starts_with("#x") || entity.starts_with('#')) {
      unsigned code = 0;
      const bool hex = entity.starts_with("#x");
      const std::string_view digits = entity.substr(hex ? 2 : 1);
      std::from_chars(digits.data(), digits.data() + digits.size(), code, hex ? 16 : 10);
      if (code < 0x80) {
        out += static_cast<char>(code);
      } else if (code < 0x800) {
        out += static_cast<char>(0xc0 | (code >> 6));
        out += static_cast<char>(0x80 | (code & 0x3f));
      } else {
        out += static_cast<char>(0xe0 | (code >> 12));
        out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (code & 0x3f));
      }
    } else {
      out += s.substr(i, semi - i + 1);
    }
    i = semi;
  }
  return out;
}

// The text of the first <tag>...</tag> in `xml` at or after `from`; nullopt if none.
std::optional<std::string_view> xml_element(std::string_view xml, std::string_view tag, std::size_t from = 0,
                                            std::size_t* end_out = nullptr) {
  const std::string open = fmt::format("<{}>", tag), close = fmt::format("</{}>", tag);
  const std::size_t a = xml.find(open, from);
  if (a == std::string_view::npos) return std::nullopt;
  const std::size_t b = xml.find(close, a + open.size());
  if (b == std::string_view::npos) return std::nullopt;
  if (end_out != nullptr) *end_out = b + close.size();
  return xml.substr(a + open.size(), b - a - open.size());
}

std::string strip_quotes(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

}  // namespace

Result<std::string> parse_list_page(std::string_view xml, std::vector<S3Object>& objects,
                                     std::vector<std::string>& prefixes) {
  if (xml.find("<ListBucketResult") == std::string_view::npos) {
    return make_error(StatusCode::kProtocol, "the listing is not a ListBucketResult document: '{}'",
                      xml.substr(0, 200));
  }
  std::size_t pos = 0, end = 0;
  while (auto contents = xml_element(xml, "Contents", pos, &end)) {
    pos = end;
    S3Object o;
    auto key = xml_element(*contents, "Key");
    auto size = xml_element(*contents, "Size");
    if (!key || !size) return make_error(StatusCode::kProtocol, "a listing entry without Key or Size: '{}'", *contents);
    o.key = xml_unescape(*key);
    auto [p, ec] = std::from_chars(size->data(), size->data() + size->size(), o.size);
    if (ec != std::errc() || p != size->data() + size->size()) {
      return make_error(StatusCode::kProtocol, "listing entry '{}' has size '{}', not an integer", o.key, *size);
    }
    if (auto etag = xml_element(*contents, "ETag")) o.etag = strip_quotes(xml_unescape(*etag));
    objects.push_back(std::move(o));
  }
  pos = 0;
  while (auto common = xml_element(xml, "CommonPrefixes", pos, &end)) {
    pos = end;
    if (auto prefix = xml_element(*common, "Prefix")) prefixes.push_back(xml_unescape(*prefix));
  }
  const auto truncated = xml_element(xml, "IsTruncated");
  if (truncated && *truncated == "true") {
    auto token = xml_element(xml, "NextContinuationToken");
    if (!token || token->empty()) {
      return make_error(StatusCode::kProtocol, "a truncated listing page without a NextContinuationToken");
    }
    return xml_unescape(*token);
  }
  return std::string();
}

std::vector<std::vector<std::size_t>> merge_nearby_ranges(std::span<const ObjectRange> ranges, std::uint64_t max_gap,
                                                          std::uint64_t max_bytes) {
  std::vector<std::size_t> order(ranges.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::tie(ranges[a].object, ranges[a].begin, a) < std::tie(ranges[b].object, ranges[b].begin, b);
  });
  std::vector<std::vector<std::size_t>> groups;
  std::uint64_t group_begin = 0, group_end = 0;
  for (const std::size_t i : order) {
    const ObjectRange& r = ranges[i];
    const bool joins = !groups.empty() && max_bytes > 0 && ranges[groups.back().front()].object == r.object &&
                       r.begin >= group_end && r.begin - group_end <= max_gap && r.end - group_begin <= max_bytes;
    if (joins) {
      groups.back().push_back(i);
    } else {
      groups.push_back({i});
      group_begin = r.begin;
    }
    group_end = r.end;  // joining ranges start at or after the group's end
  }
  return groups;
}

// ---------------------------------------------------------------- transport

void HttpExchange::reset_response() {
  outcome = {};
  response_headers.clear();
  body.clear();
  body_bytes = 0;
  status_line = 0;
}

namespace {

// Listing pages are far smaller; an endless error body must not eat memory.
constexpr std::size_t kMaxCollectedBody = 64u << 20;

// What is kept with a running easy handle beyond the exchange itself.
struct CurlSlot {
  HttpExchange* exchange = nullptr;
  curl_slist* headers = nullptr;
};

class CurlTransport final : public HttpTransport {
 public:
  explicit CurlTransport(const S3Settings& settings) : settings_(settings) {
    static const bool initialised = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
    (void)initialised;
    multi_ = curl_multi_init();
    // One connection per request in flight, kept for the next request (no handshake per GET).
    curl_multi_setopt(multi_, CURLMOPT_MAX_HOST_CONNECTIONS, static_cast<long>(settings.concurrency));
    curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, static_cast<long>(settings.concurrency));
    sigv4_ = fmt::format("aws:amz:{}:s3", settings.region);
  }
  ~CurlTransport() override {
    for (auto& [easy, slot] : running_) {
      curl_multi_remove_handle(multi_, easy);
      curl_slist_free_all(slot.headers);
      curl_easy_cleanup(easy);
    }
    for (CURL* easy : idle_) curl_easy_cleanup(easy);
    curl_multi_cleanup(multi_);
  }

  void start(HttpExchange* x) override {
    CURL* easy = nullptr;
    if (!idle_.empty()) {
      easy = idle_.back();
      idle_.pop_back();
      curl_easy_reset(easy);
    } else {
      easy = curl_easy_init();
    }
    CurlSlot slot;
    slot.exchange = x;
    for (const std::string& h : x->headers) slot.headers = curl_slist_append(slot.headers, h.c_str());
    // No "Expect:" entry to suppress 100-continue: libcurl before 8.3 lists a header removed
    // that way in SignedHeaders although it sends none, which a verifying store refuses
    // (tests/e2e/s3_fault_proxy.py --verify-sigv4 did). Large PUTs may wait for 100 Continue.
    curl_easy_setopt(easy, CURLOPT_URL, x->url.c_str());
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, slot.headers);
    curl_easy_setopt(easy, CURLOPT_AWS_SIGV4, sigv4_.c_str());
    curl_easy_setopt(easy, CURLOPT_USERNAME, settings_.access_key_id.c_str());
    curl_easy_setopt(easy, CURLOPT_PASSWORD, settings_.secret_access_key.c_str());
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(settings_.connect_timeout.count()));
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(settings_.request_timeout.count()));
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &CurlTransport::on_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, &CurlTransport::on_header);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, x);
    if (x->method == "PUT") {
      // POSTFIELDS, not a read callback: curl then hashes the real body for the signature.
      // Never null: curl would read the body from stdin (an empty sample is a valid object).
      static const char kNoBytes[1] = {};
      curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(x->upload_bytes));
      curl_easy_setopt(easy, CURLOPT_POSTFIELDS,
                       x->upload != nullptr ? static_cast<const void*>(x->upload) : static_cast<const void*>(kNoBytes));
      curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, "PUT");
    } else if (x->method != "GET") {
      curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, x->method.c_str());
    }
    running_[easy] = slot;
    curl_multi_add_handle(multi_, easy);
  }

  std::vector<HttpExchange*> poll(std::chrono::milliseconds max_wait) override {
    int running = 0;
    curl_multi_perform(multi_, &running);
    std::vector<HttpExchange*> done = collect();
    if (!done.empty()) return done;
    curl_multi_poll(multi_, nullptr, 0, static_cast<int>(std::max<std::int64_t>(0, max_wait.count())), nullptr);
    curl_multi_perform(multi_, &running);
    return collect();
  }

  void wakeup() override { curl_multi_wakeup(multi_); }

 private:
  std::vector<HttpExchange*> collect() {
    std::vector<HttpExchange*> done;
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi_, &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURL* easy = msg->easy_handle;
      auto it = running_.find(easy);
      HttpExchange* x = it->second.exchange;
      x->outcome.transport_error = msg->data.result;
      if (msg->data.result != CURLE_OK) x->outcome.transport_text = curl_easy_strerror(msg->data.result);
      long code = 0;
      curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &code);
      x->outcome.http_status = msg->data.result == CURLE_OK ? code : 0;
      curl_multi_remove_handle(multi_, easy);
      curl_slist_free_all(it->second.headers);
      running_.erase(it);
      idle_.push_back(easy);
      done.push_back(x);
    }
    return done;
  }

  static std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
    auto* x = static_cast<HttpExchange*>(user);
    const std::size_t bytes = size * n;
    std::uint64_t at = x->body_bytes;
    x->body_bytes += bytes;
    if (!x->body_into.empty() && x->status_line >= 200 && x->status_line < 300) {
      // Scatter into the caller's spans; beyond them is counted (and failed by the check).
      std::size_t taken = 0;
      for (std::span<std::uint8_t> span : x->body_into) {
        if (taken == bytes) break;
        if (at >= span.size()) {
          at -= span.size();
          continue;
        }
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(span.size() - at, bytes - taken));
        std::memcpy(span.data() + at, data + taken, n);
        taken += n;
        at = 0;
      }
    } else if (x->body.size() < kMaxCollectedBody) {
      x->body.append(data, bytes);  // a listing page or an error document
    }
    return bytes;
  }

  static std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
    auto* x = static_cast<HttpExchange*>(user);
    const std::string_view line(data, size * n);
    if (line.starts_with("HTTP/")) {
      x->response_headers.clear();  // a new response (after a 100 Continue or a redirect)
      const std::size_t space = line.find(' ');
      if (space != std::string_view::npos) {
        std::from_chars(line.data() + space + 1, line.data() + line.size(), x->status_line);
      }
    } else if (const std::size_t colon = line.find(':'); colon != std::string_view::npos) {
      x->response_headers[lower(trim(line.substr(0, colon)))] = std::string(trim(line.substr(colon + 1)));
    }
    return size * n;
  }

  const S3Settings settings_;  // a copy: the client takes the original
  std::string sigv4_;
  CURLM* multi_ = nullptr;
  std::unordered_map<CURL*, CurlSlot> running_;
  std::vector<CURL*> idle_;
};

}  // namespace

std::unique_ptr<HttpTransport> make_curl_transport(const S3Settings& settings) {
  return std::make_unique<CurlTransport>(settings);
}

// ---------------------------------------------------------------- client

namespace {

// RFC 3986 unreserved characters stay, '/' separates key segments; the rest is %XX, as
// SigV4's canonical URI expects.
std::string uri_encode(std::string_view s, bool keep_slash) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += c;
    } else {
      out += fmt::format("%{:02X}", u);
    }
  }
  return out;
}

std::string md5_hex(const std::vector<std::span<std::uint8_t>>& spans) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_md5(), nullptr);
  for (std::span<std::uint8_t> span : spans) EVP_DigestUpdate(ctx, span.data(), span.size());
  EVP_DigestFinal_ex(ctx, digest, &length);
  EVP_MD_CTX_free(ctx);
  std::string out;
  for (unsigned int i = 0; i < length; ++i) out += fmt::format("{:02x}", digest[i]);
  return out;
}

std::string sha256_hex(const std::uint8_t* data, std::uint64_t size) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data, static_cast<std::size_t>(size), digest, &length, EVP_sha256(), nullptr);
  std::string out;
  for (unsigned int i = 0; i < length; ++i) out += fmt::format("{:02x}", digest[i]);
  return out;
}

bool is_md5_etag(std::string_view etag) {
  return etag.size() == 32 && std::all_of(etag.begin(), etag.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

StatusCode code_for_http(long status) {
  if (status == 404) return StatusCode::kNotFound;
  if (status == 401 || status == 403) return StatusCode::kPermissionDenied;
  return StatusCode::kIoError;
}

// The SHA-256 of an empty payload: what every GET signs.
constexpr std::string_view kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

}  // namespace

struct S3Client::Request {
  HttpExchange x;
  std::string name;            // "s3://bucket/key": every message starts with it
  std::optional<S3Read> read;  // reads: what the response is checked against
  std::uint32_t attempts = 0;
  std::chrono::steady_clock::time_point due;
  std::function<void(Request&, const Status&)> done;
};

S3Client::S3Client(S3Settings settings, std::unique_ptr<HttpTransport> transport)
    : settings_(std::move(settings)),
      policy_(settings_.max_attempts, settings_.backoff_base, settings_.backoff_max),
      transport_(std::move(transport)),
      engine_([this] { run(); }) {}

S3Client::~S3Client() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  transport_->wakeup();
  engine_.join();
}

std::string S3Client::object_url(const std::string& bucket, std::string_view key, std::string_view query) const {
  std::string url;
  if (settings_.path_style) {
    url = fmt::format("{}/{}/{}", settings_.endpoint, bucket, uri_encode(key, true));
  } else {
    const std::size_t scheme_end = settings_.endpoint.find("://") + 3;
    url = fmt::format("{}{}.{}/{}", settings_.endpoint.substr(0, scheme_end), bucket,
                      settings_.endpoint.substr(scheme_end), uri_encode(key, true));
  }
  if (!query.empty()) url += fmt::format("?{}", query);
  return url;
}

void S3Client::submit(std::unique_ptr<Request> request) {
  request->x.headers.push_back(fmt::format("x-amz-content-sha256: {}", kEmptySha256));
  if (!settings_.session_token.empty()) {
    request->x.headers.push_back(fmt::format("x-amz-security-token: {}", settings_.session_token));
  }
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      incoming_.push_back(std::move(request));
      transport_->wakeup();
      return;
    }
  }
  request->done(*request, make_error(StatusCode::kCancelled, "{}: the S3 client is stopping", request->name));
}

void S3Client::read_async(const std::string& bucket, std::vector<S3Read> reads,
                          std::function<void(std::size_t, const Status&)> done) {
  auto shared_done = std::make_shared<std::function<void(std::size_t, const Status&)>>(std::move(done));
  for (std::size_t i = 0; i < reads.size(); ++i) {
    S3Read& read = reads[i];
    if (read.length && *read.length == 0) {  // no bytes to ask for (a Range of none is invalid)
      (*shared_done)(i, Status::ok_status());
      continue;
    }
    auto r = std::make_unique<Request>();
    r->name = fmt::format("s3://{}/{}", bucket, read.key);
    r->x.url = object_url(bucket, read.key);
    if (read.length) {
      r->x.headers.push_back(fmt::format("Range: bytes={}-{}", read.offset, read.offset + *read.length - 1));
    }
    r->x.body_into = read.into;
    r->read = std::move(read);
    r->done = [shared_done, i](Request&, const Status& status) { (*shared_done)(i, status); };
    submit(std::move(r));
  }
}

std::vector<Status> S3Client::read_all(const std::string& bucket, std::vector<S3Read> reads) {
  std::vector<Status> out(reads.size());
  std::mutex m;
  std::condition_variable cv;
  std::size_t left = reads.size();
  read_async(bucket, std::move(reads), [&](std::size_t i, const Status& s) {
    std::lock_guard lock(m);
    out[i] = s;
    if (--left == 0) cv.notify_all();
  });
  std::unique_lock lock(m);
  cv.wait(lock, [&] { return left == 0; });
  return out;
}

namespace {

// One request, waited for: listing pages and uploads.
struct Waiter {
  std::mutex m;
  std::condition_variable cv;
  bool finished = false;
  Status status;
  std::string body;
};

}  // namespace

Result<std::vector<S3Object>> S3Client::list(const std::string& bucket, const std::string& prefix,
                                             std::vector<std::string>* common_prefixes, std::string_view delimiter) {
  std::vector<S3Object> objects;
  std::vector<std::string> prefixes;
  std::string token;
  do {
    // Query parameters in SigV4's canonical (sorted) order.
    std::string query;
    if (!token.empty()) query += fmt::format("continuation-token={}&", uri_encode(token, false));
    if (!delimiter.empty()) query += fmt::format("delimiter={}&", uri_encode(delimiter, false));
    query += fmt::format("list-type=2&prefix={}", uri_encode(prefix, false));
    auto r = std::make_unique<Request>();
    r->name = fmt::format("s3://{}/{} (listing)", bucket, prefix);
    r->x.url = object_url(bucket, "", query);
    Waiter w;
    r->done = [&w](Request& req, const Status& s) {
      std::lock_guard lock(w.m);
      w.status = s;
      w.body = std::move(req.x.body);
      w.finished = true;
      w.cv.notify_all();
    };
    submit(std::move(r));
    std::unique_lock lock(w.m);
    w.cv.wait(lock, [&] { return w.finished; });
    SHARDMIX_RETURN_IF_ERROR(w.status);
    auto next = parse_list_page(w.body, objects, prefixes);
    if (!next.ok()) return next.status().with_context(fmt::format("listing s3://{}/{}", bucket, prefix));
    token = *next;
  } while (!token.empty());
  if (common_prefixes != nullptr) *common_prefixes = std::move(prefixes);
  return objects;
}

Status S3Client::put(const std::string& bucket, const std::string& key, std::span<const std::uint8_t> bytes) {
  auto r = std::make_unique<Request>();
  r->name = fmt::format("s3://{}/{}", bucket, key);
  r->x.method = "PUT";
  r->x.url = object_url(bucket, key);
  r->x.upload = bytes.data();
  r->x.upload_bytes = bytes.size();
  Waiter w;
  r->done = [&w](Request&, const Status& s) {
    std::lock_guard lock(w.m);
    w.status = s;
    w.finished = true;
    w.cv.notify_all();
  };
  // The payload's own hash (submit() adds the empty one for GETs only).
  r->x.headers.push_back(fmt::format("x-amz-content-sha256: {}", sha256_hex(bytes.data(), bytes.size())));
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return make_error(StatusCode::kCancelled, "{}: the S3 client is stopping", r->name);
    if (!settings_.session_token.empty()) {
      r->x.headers.push_back(fmt::format("x-amz-security-token: {}", settings_.session_token));
    }
    incoming_.push_back(std::move(r));
  }
  transport_->wakeup();
  std::unique_lock lock(w.m);
  w.cv.wait(lock, [&] { return w.finished; });
  return w.status;
}

S3ClientStats S3Client::stats() const { return {requests_.load(), retries_.load(), bytes_.load(), failed_.load()}; }

Status S3Client::check_response(const Request& r) const {
  const HttpExchange& x = r.x;
  const HttpOutcome& o = x.outcome;
  if (o.transport_error != 0) {
    return make_error(StatusCode::kUnavailable, "{}: {} ({})", r.name, o.transport_text, settings_.describe());
  }
  if (o.http_status < 200 || o.http_status >= 300) {
    const std::string code = std::string(xml_element(x.body, "Code").value_or(""));
    const std::string message = xml_unescape(xml_element(x.body, "Message").value_or(""));
    return make_error(code_for_http(o.http_status), "{}: HTTP {}{}{} ({})", r.name, o.http_status,
                      code.empty() ? "" : " " + code, message.empty() ? "" : ": " + message, settings_.describe());
  }
  if (!r.read) return Status::ok_status();
  const S3Read& read = *r.read;
  const std::uint64_t want = read.length ? *read.length : read.expected_size;
  const std::string where = read.length ? fmt::format(" at offset {}", read.offset) : "";
  if (x.body_bytes != want) {
    return make_error(StatusCode::kCorrupt, "{}: expected {} bytes{}, the response had {} (changed since the listing?)",
                      r.name, want, where, x.body_bytes);
  }
  if (auto it = x.response_headers.find("content-length"); it != x.response_headers.end() && it->second != std::to_string(want)) {
    return make_error(StatusCode::kCorrupt, "{}: Content-Length {} but {} bytes expected{}", r.name, it->second, want,
                      where);
  }
  if (read.length && o.http_status == 206) {
    const auto it = x.response_headers.find("content-range");
    const std::string expected = fmt::format("bytes {}-{}/", read.offset, read.offset + want - 1);
    if (it == x.response_headers.end() || !it->second.starts_with(expected)) {
      return make_error(StatusCode::kCorrupt, "{}: asked for {}..., the response holds '{}'", r.name, expected,
                        it == x.response_headers.end() ? "no Content-Range" : it->second);
    }
  } else if (read.length && read.offset != 0) {
    return make_error(StatusCode::kProtocol, "{}: the endpoint ignored the Range request (HTTP {})", r.name,
                      o.http_status);
  }
  if (!read.length) {
    const auto it = x.response_headers.find("etag");
    const std::string etag = it == x.response_headers.end() ? "" : strip_quotes(it->second);
    // A single-part upload's ETag is the MD5 of its bytes; multipart ones ("...-N") are not.
    if (is_md5_etag(etag) && md5_hex(read.into) != lower(etag)) {
      return make_error(StatusCode::kCorrupt, "{}: the bytes received do not match the object's ETag {}", r.name,
                        etag);
    }
  }
  return Status::ok_status();
}

void S3Client::run() {
  std::minstd_rand rng(std::random_device{}());
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::deque<std::unique_ptr<Request>> ready;
  std::multimap<std::chrono::steady_clock::time_point, std::unique_ptr<Request>> delayed;
  std::unordered_map<HttpExchange*, std::unique_ptr<Request>> in_flight;
  auto log = log::get("s3");
  for (;;) {
    bool stopping = false;
    {
      std::lock_guard lock(mutex_);
      while (!incoming_.empty()) {
        ready.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
      stopping = stopping_;
    }
    if (stopping) {
      const Status cancelled = make_error(StatusCode::kCancelled, "the S3 client is stopping");
      for (auto& r : ready) r->done(*r, cancelled.with_context(r->name));
      for (auto& [due, r] : delayed) r->done(*r, cancelled.with_context(r->name));
      for (auto& [x, r] : in_flight) r->done(*r, cancelled.with_context(r->name));
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    while (!delayed.empty() && delayed.begin()->first <= now) {
      ready.push_back(std::move(delayed.begin()->second));
      delayed.erase(delayed.begin());
    }
    while (in_flight.size() < settings_.concurrency && !ready.empty()) {
      std::unique_ptr<Request> r = std::move(ready.front());
      ready.pop_front();
      r->x.reset_response();
      ++r->attempts;
      requests_.fetch_add(1, std::memory_order_relaxed);
      HttpExchange* x = &r->x;
      in_flight.emplace(x, std::move(r));
      transport_->start(x);
    }
    auto wait = std::chrono::milliseconds(500);
    if (!delayed.empty()) {
      wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(delayed.begin()->first - now) +
                                std::chrono::milliseconds(1));
    }
    for (HttpExchange* x : transport_->poll(wait)) {
      auto it = in_flight.find(x);
      if (it == in_flight.end()) continue;
      std::unique_ptr<Request> r = std::move(it->second);
      in_flight.erase(it);
      Status status = check_response(*r);
      // Integrity failures (a body cut short, a wrong length or hash) are retried like a
      // reset: the object may be fine and the transfer not.
      HttpOutcome judged = r->x.outcome;
      if (status.ok() == false && status.code() == StatusCode::kCorrupt && judged.transport_error == 0) {
        judged.transport_error = -1;
      }
      if (!status.ok() && policy_.should_retry(judged, r->attempts)) {
        retries_.fetch_add(1, std::memory_order_relaxed);
        log->debug("{} (attempt {} of {}; retrying)", status.message(), r->attempts, policy_.max_attempts());
        r->due = std::chrono::steady_clock::now() + policy_.backoff(r->attempts, unit(rng));
        delayed.emplace(r->due, std::move(r));
        continue;
      }
      if (!status.ok()) {
        failed_.fetch_add(1, std::memory_order_relaxed);
        if (r->attempts > 1) status = status.with_context(fmt::format("after {} attempts", r->attempts));
      } else if (r->read) {
        bytes_.fetch_add(r->x.body_bytes, std::memory_order_relaxed);
      }
      r->done(*r, status);
    }
  }
}

Result<std::shared_ptr<S3Client>> shared_s3_client(const S3Config& config) {
  static std::mutex mutex;
  static std::vector<std::pair<S3Config, std::shared_ptr<S3Client>>> clients;
  std::lock_guard lock(mutex);
  for (const auto& [c, client] : clients) {
    if (c == config) return client;
  }
  SHARDMIX_ASSIGN_OR_RETURN(S3Settings settings, resolve_s3_settings(config, environment_map()));
  auto transport = make_curl_transport(settings);
  auto client = std::make_shared<S3Client>(std::move(settings), std::move(transport));
  clients.emplace_back(config, client);
  return client;
}

}  // namespace shardmix
