// shardmix-gen: writes a deterministic ImageNet-like dataset for tests and benchmarks.
//
//   shardmix-gen --out DIR --samples N --classes C --median-kib K --seed S [--sigma 0.5]
//                [--format folder|webdataset|tfrecord] [--samples-per-shard 256]
//
// Layout (folder): DIR/class_00000/sample_00000000.bin ...; sample i belongs to class i % C.
// webdataset: DIR/shard_000000.tar ..., sample i in shard i / samples_per_shard as members
//   sample_00000000.bin (the same bytes as the folder layout's file) and sample_00000000.cls
//   (the class, ASCII); the folder and webdataset layouts of the same arguments hold the
//   same (bytes, label) samples.
// tfrecord: DIR/shard_000000.tfrecord ..., one record per sample: a tf.train.Example with
//   int64_list feature "label" (the class) and bytes_list feature "image" (the folder
//   layout's bytes); use dataset.label_feature = "label".
// Sample sizes are log-normal: round(median * exp(sigma * Z)), Z ~ N(0, 1) by Box-Muller,
// clamped to [--min-bytes, --max-bytes]. Contents are xoshiro256** bytes. Every sample
// draws from its own stream Rng::for_stream(seed, {kGenStream, i}), so the tree does not
// depend on the thread count: the same arguments give byte-identical trees.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/command_line.h"
#include "common/rng.h"
#include "common/shard_formats.h"
#include "common/s3_client.h"
#include "common/status.h"

namespace shardmix {
namespace {

namespace fs = std::filesystem;

constexpr std::uint64_t kGenStream = 0x67656e;  // "gen"

struct Options {
  std::string out;
  std::uint64_t samples = 1024;
  std::uint32_t classes = 10;
  double median_kib = 112;
  double sigma = 0.5;
  std::uint64_t seed = 0;
  std::uint64_t min_bytes = 0;
  std::uint64_t max_bytes = 0;  // 0 = no cap
  unsigned threads = 0;         // 0 = hardware concurrency
  bool force = false;
  bool list = false;
  bool quiet = false;
  std::string format = "folder";
  std::uint64_t samples_per_shard = 256;
};

std::uint64_t sample_size(const Options& o, Rng& rng) {
  const double u1 = 1.0 - rng.uniform();  // (0, 1]
  const double u2 = rng.uniform();
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  const double bytes = std::round(o.median_kib * 1024.0 * std::exp(o.sigma * z));
  auto size = bytes <= 0 ? std::uint64_t{0} : static_cast<std::uint64_t>(bytes);
  size = std::max(size, o.min_bytes);
  if (o.max_bytes != 0) size = std::min(size, o.max_bytes);
  return size;
}

std::string class_dir(std::uint32_t c) { return fmt::format("class_{:05d}", c); }

std::string sample_rel_path(const Options& o, std::uint64_t i) {
  return fmt::format("{}/sample_{:08d}.bin", class_dir(static_cast<std::uint32_t>(i % o.classes)), i);
}

Status write_file(const std::string& path, const std::uint8_t* data, std::size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_error(StatusCode::kIoError, "cannot create '{}': {}", path, std::strerror(errno));
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return make_error(StatusCode::kIoError, "cannot write '{}' at offset {}: {}", path, done, std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) return make_error(StatusCode::kIoError, "cannot close '{}': {}", path, std::strerror(errno));
  return Status::ok_status();
}

Status check_output_dir(const Options& o) {
  std::error_code ec;
  if (fs::exists(o.out, ec)) {
    if (!fs::is_directory(o.out, ec)) {
      return make_error(StatusCode::kInvalidArgument, "--out '{}' exists and is not a directory", o.out);
    }
    if (!fs::is_empty(o.out, ec) && !o.force) {
      return make_error(StatusCode::kInvalidArgument,
                        "--out '{}' is not empty; refusing to write into it (pass --force to overwrite files of the "
                        "same names; other files are left alone)",
                        o.out);
    }
  }
  fs::create_directories(o.out, ec);
  if (ec) return make_error(StatusCode::kIoError, "cannot create --out '{}': {}", o.out, ec.message());
  if (o.format != "folder") return Status::ok_status();
  for (std::uint32_t c = 0; c < o.classes && c < o.samples; ++c) {
    fs::create_directories(fs::path(o.out) / class_dir(c), ec);
    if (ec) return make_error(StatusCode::kIoError, "cannot create '{}/{}': {}", o.out, class_dir(c), ec.message());
  }
  return Status::ok_status();
}

int run(const Options& o) {
  if (Status s = check_output_dir(o); !s.ok()) {
    fmt::print(stderr, "shardmix-gen: {}\n", s.to_string());
    return 1;
  }
  const unsigned threads =
      o.threads != 0 ? o.threads : std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::uint64_t> sizes(o.samples);
  std::atomic<std::uint64_t> next_sample{0};
  std::atomic<std::uint64_t> samples_done{0};
  std::atomic<std::uint64_t> bytes_done{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;  // guards first_error
  Status first_error;

  const auto start = std::chrono::steady_clock::now();
  const bool sharded = o.format != "folder";
  const std::uint64_t per_shard = std::max<std::uint64_t>(1, o.samples_per_shard);
  // Folder: a unit is a chunk of 16 samples; shard formats: a unit is one shard.
  const std::uint64_t unit_samples = sharded ? per_shard : 16;
  const auto fail = [&](const Status& s) {
    std::lock_guard lock(error_mutex);
    if (first_error.ok()) first_error = s;
    failed = true;
  };
  const auto worker = [&] {
    std::vector<std::uint8_t> buffer;
    std::vector<std::uint8_t> shard;
    while (!failed.load(std::memory_order_relaxed)) {
      const std::uint64_t first = next_sample.fetch_add(unit_samples);
      if (first >= o.samples) break;
      const std::uint64_t last = std::min<std::uint64_t>(first + unit_samples, o.samples);
      shard.clear();
      for (std::uint64_t i = first; i < last; ++i) {
        Rng rng = Rng::for_stream(o.seed, {kGenStream, i});
        const std::uint64_t size = sample_size(o, rng);
        sizes[i] = size;
        if (buffer.size() < size) buffer.resize(size);
        rng.fill_bytes(std::span<std::uint8_t>(buffer.data(), size));
        const std::span<const std::uint8_t> bytes(buffer.data(), size);
        const auto label = static_cast<std::int64_t>(i % o.classes);
        if (o.format == "webdataset") {
          const std::string key = fmt::format("sample_{:08d}", i);
          append_tar_member(shard, key + ".bin", bytes);
          const std::string cls = std::to_string(label);
          append_tar_member(shard, key + ".cls",
                            std::span(reinterpret_cast<const std::uint8_t*>(cls.data()), cls.size()));
        } else if (o.format == "tfrecord") {
          append_tfrecord(shard, make_example("label", label, "image", bytes));
        } else {
          const std::string path = (fs::path(o.out) / sample_rel_path(o, i)).string();
          if (Status s = write_file(path, buffer.data(), size); !s.ok()) return fail(s);
        }
        bytes_done.fetch_add(size, std::memory_order_relaxed);
        samples_done.fetch_add(1, std::memory_order_relaxed);
      }
      if (sharded) {
        if (o.format == "webdataset") append_tar_end(shard);
        const std::string path =
            (fs::path(o.out) / fmt::format("shard_{:06d}.{}", first / per_shard, o.format == "webdataset" ? "tar" : "tfrecord"))
                .string();
        if (Status s = write_file(path, shard.data(), shard.size()); !s.ok()) return fail(s);
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(worker);

  const auto seconds_since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double last_print = 0;
  while (samples_done.load() < o.samples && !failed.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const double now = seconds_since_start();
    if (!o.quiet && now - last_print >= 1.0) {
      last_print = now;
      const std::uint64_t n = samples_done.load();
      fmt::print(stderr, "shardmix-gen: {}/{} samples ({:.0f}%), {:.1f} MiB, {:.0f} MB/s\n", n, o.samples,
                 100.0 * static_cast<double>(n) / static_cast<double>(o.samples),
                 static_cast<double>(bytes_done.load()) / (1 << 20), static_cast<double>(bytes_done.load()) / now / 1e6);
    }
  }
  for (auto& t : pool) t.join();
  if (!first_error.ok()) {
    fmt::print(stderr, "shardmix-gen: {}\n", first_error.to_string());
    return 1;
  }
  const double elapsed = seconds_since_start();

  if (o.list) {
    std::string text;
    for (std::uint64_t i = 0; i < o.samples; ++i) text += fmt::format("{} {}\n", sample_rel_path(o, i), i % o.classes);
    const std::string path = (fs::path(o.out) / "filelist.txt").string();
    if (Status s = write_file(path, reinterpret_cast<const std::uint8_t*>(text.data()), text.size()); !s.ok()) {
      fmt::print(stderr, "shardmix-gen: {}\n", s.to_string());
      return 1;
    }
  }

  std::uint64_t total = 0;
  for (std::uint64_t s : sizes) total += s;
  std::vector<std::uint64_t> sorted = sizes;
  std::sort(sorted.begin(), sorted.end());
  const auto pct = [&](double p) {
    return sorted.empty() ? 0 : sorted[std::min<std::size_t>(sorted.size() - 1, static_cast<std::size_t>(p * sorted.size()))];
  };
  fmt::print(
      "shardmix-gen: wrote {} samples in {} classes to {}: {} bytes ({:.2f} GiB) in {:.2f} s ({:.0f} MB/s, {} "
      "threads)\n"
      "shardmix-gen: sample bytes min {} p5 {} median {} p95 {} max {}; seed {}{}\n",
      o.samples, std::min<std::uint64_t>(o.classes, o.samples), o.out, total,
      static_cast<double>(total) / (1ull << 30), elapsed, static_cast<double>(total) / elapsed / 1e6, threads,
      sorted.empty() ? 0 : sorted.front(), pct(0.05), pct(0.5), pct(0.95), sorted.empty() ? 0 : sorted.back(), o.seed,
      o.list ? fmt::format("; list {}/filelist.txt", o.out) : "");
  return 0;
}

// --out s3://BUCKET/PREFIX: the dataset is written to --local-copy DIR as usual, then every
// file under it is uploaded to PREFIX/<its path in DIR>, storage.s3.concurrency PUTs at a time
// ([storage.s3] settings from the AWS environment). The local copy stays: it is what the
// e2e trace checker compares the served bytes with.
int upload(const Options& o, const std::string& url, const std::string& local) {
  auto where = parse_s3_url(url, "--out");
  auto client = where.ok() ? shared_s3_client(S3Config{}) : Result<std::shared_ptr<S3Client>>(where.status());
  if (!client.ok()) {
    fmt::print(stderr, "shardmix-gen: {}\n", client.status().message());
    return 1;
  }
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(local)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::uint64_t bytes = 0;
  for (const fs::path& f : files) bytes += fs::file_size(f);
  const auto start = std::chrono::steady_clock::now();
  // Uploads are blocking calls; one thread each keeps that many PUTs in flight.
  auto worker = [&] {
    for (std::size_t i = next++; i < files.size() && !failed; i = next++) {
      std::ifstream in(files[i], std::ios::binary);
      const std::vector<std::uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const std::string rel = fs::relative(files[i], local).generic_string();
      const std::string key = where->key.empty() ? rel : where->key + "/" + rel;
      if (Status s = (*client)->put(where->bucket, key, data); !s.ok()) {
        fmt::print(stderr, "shardmix-gen: upload failed: {}\n", s.message());
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < std::max(1u, std::min<unsigned>(32, (*client)->settings().concurrency)); ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (failed) return 1;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!o.quiet) fmt::print("shardmix-gen: uploaded {} objects ({} bytes) to {} in {:.2f} s\n", files.size(), bytes, url, secs);
  return 0;
}

}  // namespace
}  // namespace shardmix

int main(int argc, char** argv) {
  shardmix::Options o;
  CLI::App app{"Writes a deterministic ImageNet-like dataset: class folders (DIR/class_00000/sample_00000000.bin), "
               "tar shards or TFRecord files."};
  app.add_option("--out", o.out, "Output directory (must be empty or absent unless --force)")->required();
  app.add_option("--samples", o.samples, "Number of samples")->check(CLI::PositiveNumber);
  app.add_option("--classes", o.classes, "Number of class folders; sample i goes to class i % C")
      ->check(CLI::PositiveNumber);
  app.add_option("--median-kib", o.median_kib, "Median sample size in KiB")->check(CLI::NonNegativeNumber);
  app.add_option("--sigma", o.sigma, "Log-normal shape: sizes are median * exp(sigma * N(0,1))")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, "Seed for sizes and contents");
  app.add_option("--min-bytes", o.min_bytes, "Smallest sample size (0 = zero-byte samples allowed)");
  app.add_option("--max-bytes", o.max_bytes, "Largest sample size (0 = no cap)");
  app.add_option("--threads", o.threads, "Writer threads (0 = number of cores, at most 8)");
  app.add_flag("--force", o.force, "Write into a non-empty directory, overwriting files of the same names");
  app.add_flag("--list", o.list, "Also write DIR/filelist.txt ('path label' lines) for dataset.format = filelist");
  app.add_flag("-q,--quiet", o.quiet, "No progress lines");
  app.add_option("--format", o.format,
                 "folder (class folders), webdataset (tar shards: .bin + .cls members), tfrecord (tf.train.Example "
                 "records: int64 'label', bytes 'image')")
      ->check(CLI::IsMember({"folder", "webdataset", "tfrecord"}));
  app.add_option("--samples-per-shard", o.samples_per_shard, "Samples per shard (webdataset, tfrecord)")
      ->check(CLI::PositiveNumber);
  std::string local_copy;
  app.add_option("--local-copy", local_copy,
                 "With --out s3://BUCKET/PREFIX: where the dataset is written before it is uploaded (kept)");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;
  if (shardmix::is_s3_path(o.out)) {
    if (local_copy.empty()) {
      fmt::print(stderr, "shardmix-gen: --out {} needs --local-copy DIR (the files uploaded, kept for checking)\n", o.out);
      return 2;
    }
    const std::string url = o.out;
    o.out = local_copy;
    if (const int rc = shardmix::run(o); rc != 0) return rc;
    return shardmix::upload(o, url, local_copy);
  }
  if (o.list && o.format != "folder") {
    fmt::print(stderr, "shardmix-gen: --list is for --format folder only\n");
    return 2;
  }
  if (o.max_bytes != 0 && o.max_bytes < o.min_bytes) {
    fmt::print(stderr, "shardmix-gen: --max-bytes {} is below --min-bytes {}\n", o.max_bytes, o.min_bytes);
    return 2;
  }
  return shardmix::run(o);
}
