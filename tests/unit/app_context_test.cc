#include "control/app_context.h"

#include <gtest/gtest.h>

namespace shardmix {
namespace app_context_test {

TEST(AppContextTest, EachContextGetsItsOwnRanks) {
  const auto daemons = app_context_range("2 4", 0);
  ASSERT_TRUE(daemons.has_value());
  EXPECT_EQ(daemons->first, 0);
  EXPECT_EQ(daemons->count, 2);
  const auto trainers = app_context_range("2 4", 1);
  ASSERT_TRUE(trainers.has_value());
  EXPECT_EQ(trainers->first, 2);
  EXPECT_EQ(trainers->count, 4);
  const auto third = app_context_range("1 3 5", 2);
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->first, 4);
  EXPECT_EQ(third->count, 5);
}

TEST(AppContextTest, OneContextIsTheWholeList) {
  const auto only = app_context_range("8", 0);
  ASSERT_TRUE(only.has_value());
  EXPECT_EQ(only->first, 0);
  EXPECT_EQ(only->count, 8);
}

TEST(AppContextTest, MissingListOrUnknownContextIsNothing) {
  EXPECT_FALSE(app_context_range(nullptr, 0).has_value());
  EXPECT_FALSE(app_context_range("", 0).has_value());
  EXPECT_FALSE(app_context_range("2 4", 2).has_value());
  EXPECT_FALSE(app_context_range("2 4", -1).has_value());
  EXPECT_FALSE(app_context_range("x", 0).has_value());
}

}  // namespace app_context_test
}  // namespace shardmix
