// Checkpoint files (common/checkpoint_file.h): the drain's write (temporary file, fsync,
// rename), the checksum, a full file system, retention on disk and the name rules.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "common/checkpoint_file.h"
#include "tests/support/temp_dir.h"

namespace shardmix {
namespace checkpoint_file_test {

namespace fs = std::filesystem;

std::vector<std::uint8_t> pattern(std::size_t size, std::uint8_t seed) {
  std::vector<std::uint8_t> data(size);
  for (std::size_t i = 0; i < size; ++i) data[i] = static_cast<std::uint8_t>(seed + i * 7);
  return data;
}

std::vector<std::string> files_under(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(fs::relative(e.path(), dir).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Files may grow to `bytes` while alive: writes past it fail with EFBIG, as on a full
// file system, for this process only and without a mount.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);  // else the write kills the process
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_handler_);
  }

 private:
  rlimit saved_{};
  void (*previous_handler_)(int) = nullptr;
};

class CheckpointFileTest : public test_support::TempDirTest {
 protected:
  CheckpointFileTest() : TempDirTest("ckptfile") {}
};

TEST_F(CheckpointFileTest, WriteThenReadRoundTripsWithoutLeavingTemporaryFiles) {
  const CheckpointId id{"model.pt", 3};
  const std::vector<std::uint8_t> data = pattern(100000, 1);
  ASSERT_TRUE(write_checkpoint_file(dir_, id, data).ok());
  EXPECT_EQ(files_under(dir_), std::vector<std::string>{"model.pt/v3.smxckpt"});
  EXPECT_EQ(fs::file_size(checkpoint_file_path(dir_, id)), kCheckpointFileHeaderBytes + data.size());
  const Result<std::vector<std::uint8_t>> back = read_checkpoint_file(dir_, id);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, data);
  // An empty checkpoint is a checkpoint too.
  ASSERT_TRUE(write_checkpoint_file(dir_, CheckpointId{"empty", 1}, {}).ok());
  EXPECT_TRUE(read_checkpoint_file(dir_, CheckpointId{"empty", 1})->empty());
}

TEST_F(CheckpointFileTest, AFlippedByteOrATruncationIsCorruptNamingTheFile) {
  const CheckpointId id{"m", 1};
  ASSERT_TRUE(write_checkpoint_file(dir_, id, pattern(4096, 2)).ok());
  const fs::path path = checkpoint_file_path(dir_, id);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(kCheckpointFileHeaderBytes + 100));
    f.put('\x5a');
  }
  const Result<std::vector<std::uint8_t>> flipped = read_checkpoint_file(dir_, id);
  ASSERT_FALSE(flipped.ok());
  EXPECT_EQ(flipped.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(flipped.status().message().find(path.string()), std::string::npos) << flipped.status().message();
  EXPECT_NE(flipped.status().message().find("CRC32C"), std::string::npos);

  fs::resize_file(path, 1000);
  const Result<std::vector<std::uint8_t>> truncated = read_checkpoint_file(dir_, id);
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(read_checkpoint_file(dir_, CheckpointId{"m", 2}).status().code(), StatusCode::kNotFound);
}

TEST_F(CheckpointFileTest, AFullFileSystemFailsTheWriteNamingCheckpointAndDirectoryAndKeepsThePreviousVersion) {
  const CheckpointId old_version{"m", 1};
  const std::vector<std::uint8_t> old_bytes = pattern(1000, 3);
  ASSERT_TRUE(write_checkpoint_file(dir_, old_version, old_bytes).ok());
  Status failed;
  {
    const FileSizeLimit limit(64 * 1024);
    failed = write_checkpoint_file(dir_, CheckpointId{"m", 2}, pattern(1 << 20, 4));
  }
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.code(), StatusCode::kIoError);
  EXPECT_NE(failed.message().find("m@2"), std::string::npos) << failed.message();
  EXPECT_NE(failed.message().find(dir_.string()), std::string::npos) << failed.message();
  EXPECT_NE(failed.message().find("write"), std::string::npos) << failed.message();
  // No torn v2, no temporary file left behind, v1 intact.
  EXPECT_EQ(files_under(dir_), std::vector<std::string>{"m/v1.smxckpt"});
  EXPECT_EQ(*read_checkpoint_file(dir_, old_version), old_bytes);
}

TEST_F(CheckpointFileTest, AnUnwritableDirectoryIsAnErrorNamingIt) {
  write("blocker", std::string_view("a file where the directory should be"));
  const Status failed = write_checkpoint_file(dir_ / "blocker", CheckpointId{"m", 1}, pattern(10, 5));
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("m@1"), std::string::npos) << failed.message();
  EXPECT_NE(failed.message().find((dir_ / "blocker").string()), std::string::npos) << failed.message();
}

TEST_F(CheckpointFileTest, ListingSkipsTemporaryAndStrayFilesAndRetentionRemovesTheOldest) {
  for (std::uint64_t v = 1; v <= 4; ++v) ASSERT_TRUE(write_checkpoint_file(dir_, CheckpointId{"a", v}, pattern(10, 1)).ok());
  ASSERT_TRUE(write_checkpoint_file(dir_, CheckpointId{"b", 7}, pattern(10, 2)).ok());
  write("a/.v5.smxckpt.tmp-99", std::string_view("half written"));
  write("a/notes.txt", std::string_view("stray"));
  write(".hidden/v1.smxckpt", std::string_view("not a name"));
  const Result<std::vector<CheckpointId>> listed = list_checkpoint_files(dir_);
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  const std::vector<CheckpointId> expected = {{"a", 1}, {"a", 2}, {"a", 3}, {"a", 4}, {"b", 7}};
  EXPECT_EQ(*listed, expected);

  const Result<std::vector<CheckpointId>> removed = remove_superseded_checkpoint_files(dir_, "a", 2);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, (std::vector<CheckpointId>{{"a", 1}, {"a", 2}}));
  const std::vector<CheckpointId> left = {{"a", 3}, {"a", 4}, {"b", 7}};
  EXPECT_EQ(*list_checkpoint_files(dir_), left);
  EXPECT_TRUE(list_checkpoint_files(dir_ / "missing")->empty());
}

TEST(CheckpointNameTest, OnlyOnePlainPathComponentIsAName) {
  EXPECT_TRUE(validate_checkpoint_name("rank-3_model.pt").ok());
  for (const std::string& bad : std::vector<std::string>{"", ".", "..", ".hidden", "a/b", "../x", "sp ace", std::string(201, 'x')}) {
    const Status s = validate_checkpoint_name(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(validate_checkpoint_name("a/b").message().find("'a/b'"), std::string::npos);
}

}  // namespace checkpoint_file_test
}  // namespace shardmix
