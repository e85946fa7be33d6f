// A directory of its own for a test, shared by tests/unit, tests/sim and tests/fuzz.
//
// TempDir: <gtest temp dir>/shardmix_<prefix>_<test name>_<pid> (outside a gtest test,
// <system temp dir>/shardmix_<prefix>_<pid>). Emptied first, in case a crashed run left
// it behind; removed at the end, after giving the owner back every permission a test
// took away (some tests make entries unreadable on purpose).
// TempDirTest: a gtest fixture base holding one, as `dir_`, with write() for its files.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

namespace shardmix::test_support {

class TempDir {
 public:
  explicit TempDir(std::string_view prefix) : path_(unique_path(prefix)) {
    remove();
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { remove(); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::filesystem::path& rel) const { return path_ / rel; }

  // Writes `bytes` to path()/rel, creating its parent directories, and returns the
  // absolute path. An existing file is overwritten in place (same inode), as an editor or
  // `dd conv=notrunc` would.
  std::string write(const std::filesystem::path& rel, std::string_view bytes) const {
    const std::filesystem::path p = path_ / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p.string();
  }
  std::string write(const std::filesystem::path& rel, std::span<const std::uint8_t> bytes) const {
    return write(rel, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  }

 private:
  static std::filesystem::path unique_path(std::string_view prefix) {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    if (test == nullptr) {
      return std::filesystem::temp_directory_path() /
             ("shardmix_" + std::string(prefix) + "_" + std::to_string(::getpid()));
    }
    return std::filesystem::path(::testing::TempDir()) /
           ("shardmix_" + std::string(prefix) + "_" + test->name() + "_" + std::to_string(::getpid()));
  }
  void remove() const {
    std::error_code ec;
    if (!std::filesystem::exists(path_, ec)) return;
    for (auto it = std::filesystem::recursive_directory_iterator(
             path_, std::filesystem::directory_options::skip_permission_denied, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory(ec) && !it->is_symlink(ec)) {
        std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all,
                                     std::filesystem::perm_options::add, ec);
      }
    }
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }

  std::filesystem::path path_;
};

class TempDirTest : public ::testing::Test {
 protected:
  explicit TempDirTest(std::string_view prefix) : temp_(prefix) {}

  template <typename Bytes>
  std::string write(const std::filesystem::path& rel, const Bytes& bytes) const {
    return temp_.write(rel, bytes);
  }

  TempDir temp_;
  const std::filesystem::path& dir_ = temp_.path();
};

}  // namespace shardmix::test_support
