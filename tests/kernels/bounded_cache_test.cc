// BoundedCache (kernels/bounded_cache.h): at most `capacity` values, the least recently used
// dropped to make room (the cuDNN attention, seeing full(), first waits for its stream, so that no
// dropped graph's work is still queued).
#include "zerort/kernels/bounded_cache.h"

#include <memory>
#include <string>
#include <tuple>

#include "gtest/gtest.h"

namespace zerort {
namespace {

TEST(BoundedCacheTest, KeepsTheMostRecentlyUsed) {
  BoundedCache<int, std::string> cache(3);
  for (int k : {1, 2, 3}) {
    EXPECT_FALSE(cache.full());
    cache.Insert(k, std::to_string(k));
  }
  EXPECT_TRUE(cache.full());
  EXPECT_EQ(cache.size(), 3u);
  ASSERT_NE(cache.Find(1), nullptr);  // 1 is now the most recently used; 2 the least
  EXPECT_EQ(*cache.Insert(4, "4"), "4");
  EXPECT_EQ(cache.Find(2), nullptr);
  for (int k : {1, 3, 4}) {
    ASSERT_NE(cache.Find(k), nullptr) << k;
    EXPECT_EQ(*cache.Find(k), std::to_string(k));
  }
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.dropped(), 1u);
  cache.Clear();
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.Find(1), nullptr);
  EXPECT_FALSE(cache.full());
}

// Generation's pattern: a new key every call (a sequence one token longer). The cache stays at
// its capacity, and a key used between the new ones (training's shape) is never dropped.
TEST(BoundedCacheTest, ManyNewKeysStayBoundedAndSpareTheOneInUse) {
  using Key = std::tuple<bool, int, int>;
  BoundedCache<Key, std::unique_ptr<int>> cache(8);
  const Key training{false, 8, 1024};
  cache.Insert(training, std::make_unique<int>(-1));
  for (int len = 1; len <= 1000; ++len) {
    if (cache.Find({false, 1, len}) == nullptr)
      cache.Insert({false, 1, len}, std::make_unique<int>(len));
    ASSERT_NE(cache.Find(training), nullptr) << len;
    ASSERT_LE(cache.size(), 8u);
  }
  EXPECT_EQ(**cache.Find(training), -1);
  EXPECT_EQ(**cache.Find({false, 1, 1000}), 1000);
  EXPECT_EQ(cache.Find({false, 1, 990}), nullptr);  // seven of the newest kept beside training
  EXPECT_NE(cache.Find({false, 1, 994}), nullptr);
  EXPECT_EQ(cache.dropped(), 1000u - 7u);
}

TEST(BoundedCacheTest, ACapacityBelowOneHoldsOne) {
  BoundedCache<int, int> cache(0);
  EXPECT_EQ(cache.capacity(), 1u);
  cache.Insert(1, 10);
  cache.Insert(2, 20);
  EXPECT_EQ(cache.Find(1), nullptr);
  EXPECT_EQ(*cache.Find(2), 20);
}

}  // namespace
}  // namespace zerort
