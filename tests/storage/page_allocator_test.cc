#include "storage/pool/page_allocator.h"

#include <gtest/gtest.h>

#include <set>

namespace kvtier {
namespace {

TEST(PageAllocator, HandsOutEveryPageOnceThenRunsOut) {
  PageAllocator a(100);
  std::set<PageId> seen;
  for (int i = 0; i < 100; ++i) {
    auto p = a.Allocate();
    ASSERT_TRUE(p.has_value());
    EXPECT_TRUE(seen.insert(*p).second) << "page handed out twice";
    EXPECT_LT(*p, 100u);
  }
  EXPECT_FALSE(a.Allocate().has_value());
  EXPECT_EQ(a.free_count(), 0u);
  EXPECT_EQ(a.used_count(), 100u);
}

TEST(PageAllocator, FreedPagesAreReusedLastInFirstOut) {
  PageAllocator a(10);
  for (int i = 0; i < 10; ++i) (void)a.Allocate();
  ASSERT_TRUE(a.Free(3).ok());
  ASSERT_TRUE(a.Free(7).ok());
  EXPECT_EQ(*a.Allocate(), 7u);
  EXPECT_EQ(*a.Allocate(), 3u);
}

TEST(PageAllocator, DoubleFreeAndOutOfRangeAreErrors) {
  PageAllocator a(4);
  auto p = a.Allocate();
  ASSERT_TRUE(a.Free(*p).ok());
  EXPECT_EQ(a.Free(*p).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.Free(4).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.free_count(), 4u);
}

}  // namespace
}  // namespace kvtier
