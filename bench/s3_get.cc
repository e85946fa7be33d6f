// shardmix-bench-s3-get: the S3 store's raw GET rate, the bound bench/s3.sh compares
// ShardMix's initial load and cold reads with. Lists s3://BUCKET/PREFIX, then GETs every
// object once, whole, with --concurrency requests in flight through the same client the
// daemons use (common/s3_client.h) but nothing else: no catalog, no placement, no arena.
// Endpoint and credentials as the daemons take them (AWS_* variables, --endpoint).
//
//   shardmix-bench-s3-get --url s3://BUCKET/PREFIX --concurrency C [--endpoint URL]
//
// Prints one line: JSON {"objects":N,"bytes":B,"seconds":T,"objects_per_s":R,"concurrency":C}
// (listing time excluded). Exit 1 if a GET fails.
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/command_line.h"
#include "common/s3_client.h"

int main(int argc, char** argv) {
  std::string url, endpoint;
  std::uint32_t concurrency = 16;
  CLI::App app{"Raw GET rate of an S3 prefix (bench/s3.sh's bound)"};
  app.add_option("--url", url, "s3://BUCKET/PREFIX")->required();
  app.add_option("--concurrency", concurrency, "Requests in flight")->check(CLI::PositiveNumber);
  app.add_option("--endpoint", endpoint, "S3 endpoint (default: AWS_ENDPOINT_URL)");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;
  auto where = shardmix::parse_s3_url(url, "--url");
  shardmix::S3Config config;
  config.endpoint = endpoint;
  config.concurrency = concurrency;
  auto client = where.ok() ? shardmix::shared_s3_client(config)
                           : shardmix::Result<std::shared_ptr<shardmix::S3Client>>(where.status());
  if (!client.ok()) {
    fmt::print(stderr, "shardmix-bench-s3-get: {}\n", client.status().message());
    return 1;
  }
  auto objects = (*client)->list(where->bucket, where->key.empty() ? "" : where->key + "/");
  if (!objects.ok()) {
    fmt::print(stderr, "shardmix-bench-s3-get: {}\n", objects.status().message());
    return 1;
  }
  std::uint64_t bytes = 0;
  for (const auto& o : *objects) bytes += o.size;
  std::vector<std::uint8_t> buffer(bytes);
  std::vector<shardmix::S3Read> reads;
  std::uint64_t at = 0;
  for (const auto& o : *objects) {
    reads.push_back({o.key, 0, std::nullopt, o.size, {std::span(buffer.data() + at, o.size)}});
    at += o.size;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto statuses = (*client)->read_all(where->bucket, std::move(reads));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto& s : statuses) {
    if (!s.ok()) {
      fmt::print(stderr, "shardmix-bench-s3-get: {}\n", s.message());
      return 1;
    }
  }
  fmt::print("JSON {{\"objects\":{},\"bytes\":{},\"seconds\":{:.4f},\"objects_per_s\":{:.1f},\"concurrency\":{}}}\n",
             objects->size(), bytes, seconds, objects->size() / seconds, concurrency);
  return 0;
}
