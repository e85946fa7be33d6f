// A saved checkpoint's bytes in a sealed memfd (common/checkpoint_memfd.h): what the
// trainer writes is what the daemon maps, the trainer cannot change it afterwards, and an
// unsealed or foreign descriptor is refused naming the checkpoint.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "common/checkpoint_memfd.h"

namespace shardmix {
namespace checkpoint_memfd_test {

TEST(CheckpointMemfdTest, WhatTheTrainerWroteIsWhatTheDaemonMapsAfterTheTrainerLetGo) {
  Result<CheckpointMemfd> memfd = CheckpointMemfd::create("model", 10000);
  ASSERT_TRUE(memfd.ok()) << memfd.status().to_string();
  for (std::size_t i = 0; i < memfd->size(); ++i) memfd->data()[i] = static_cast<std::uint8_t>(i * 31);
  ASSERT_TRUE(memfd->seal().ok());
  EXPECT_TRUE(memfd->data().empty());
  Result<CheckpointBytesPtr> mapped = map_sealed_checkpoint(memfd->fd(), "model@1");
  ASSERT_TRUE(mapped.ok()) << mapped.status().to_string();
  { CheckpointMemfd gone = std::move(*memfd); }  // the trainer exits: its descriptor closes
  const auto bytes = (*mapped)->bytes();
  ASSERT_EQ(bytes.size(), 10000u);
  for (std::size_t i = 0; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], static_cast<std::uint8_t>(i * 31)) << i;
}

TEST(CheckpointMemfdTest, ASealedCheckpointCannotBeWrittenOrResizedByTheTrainer) {
  Result<CheckpointMemfd> memfd = CheckpointMemfd::create("model", 4096);
  ASSERT_TRUE(memfd.ok());
  ASSERT_TRUE(memfd->seal().ok());
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, memfd->fd(), 0), MAP_FAILED);
  EXPECT_NE(ftruncate(memfd->fd(), 0), 0);
  const std::uint8_t byte = 1;
  EXPECT_LT(pwrite(memfd->fd(), &byte, 1, 0), 0);
}

TEST(CheckpointMemfdTest, AnUnsealedMemfdOrAPlainFileIsRefusedNamingTheCheckpoint) {
  Result<CheckpointMemfd> memfd = CheckpointMemfd::create("model", 100);
  ASSERT_TRUE(memfd.ok());
  const Result<CheckpointBytesPtr> unsealed = map_sealed_checkpoint(memfd->fd(), "model@2");
  ASSERT_FALSE(unsealed.ok());
  EXPECT_EQ(unsealed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unsealed.status().message().find("model@2"), std::string::npos) << unsealed.status().message();
  EXPECT_NE(unsealed.status().message().find("writes"), std::string::npos) << unsealed.status().message();

  std::FILE* plain = std::tmpfile();
  ASSERT_NE(plain, nullptr);
  const Result<CheckpointBytesPtr> not_memfd = map_sealed_checkpoint(fileno(plain), "model@3");
  std::fclose(plain);
  ASSERT_FALSE(not_memfd.ok());
  EXPECT_NE(not_memfd.status().message().find("model@3"), std::string::npos) << not_memfd.status().message();
}

TEST(CheckpointMemfdTest, AnEmptyCheckpointMapsToNoBytes) {
  Result<CheckpointMemfd> memfd = CheckpointMemfd::create("empty", 0);
  ASSERT_TRUE(memfd.ok());
  ASSERT_TRUE(memfd->seal().ok());
  const Result<CheckpointBytesPtr> mapped = map_sealed_checkpoint(memfd->fd(), "empty@1");
  ASSERT_TRUE(mapped.ok()) << mapped.status().to_string();
  EXPECT_TRUE((*mapped)->bytes().empty());
}

}  // namespace checkpoint_memfd_test
}  // namespace shardmix
