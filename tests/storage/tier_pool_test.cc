#include "storage/pool/tier_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace kvtier {
namespace {

std::unique_ptr<TierPool> MakePool(uint32_t segments, uint64_t segment_bytes = 1 << 20,
                                   uint64_t page_bytes = 256 << 10) {
  HostSegmentMemory::Options o;
  o.segments = segments;
  o.segment_bytes = segment_bytes;
  o.huge_pages = HugePages::kOff;
  auto mem = HostSegmentMemory::Open(o);
  EXPECT_TRUE(mem.ok()) << mem.status().ToString();
  auto pool = TierPool::Open(std::move(mem).value(), page_bytes);
  EXPECT_TRUE(pool.ok());
  return std::move(pool).value();
}

TEST(HostSegmentMemory, SegmentsAreSealedAgainstResizing) {
  HostSegmentMemory::Options o;
  o.segments = 2;
  o.segment_bytes = 1 << 20;
  o.huge_pages = HugePages::kOff;
  auto mem = HostSegmentMemory::Open(o);
  ASSERT_TRUE(mem.ok());
  const int fd = (*mem)->ShareFd(0);
  // A client cannot shrink the segment under the daemon (which would SIGBUS it) nor grow it.
  EXPECT_NE(::ftruncate(fd, 4096), 0);
  EXPECT_NE(::ftruncate(fd, 4 << 20), 0);
  const int seals = ::fcntl(fd, F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_GROW);
  EXPECT_TRUE(seals & F_SEAL_SEAL);
  // Another mapping of the fd sees the daemon's writes.
  (*mem)->HostAddress(0)[123] = 0x77;
  void* p = ::mmap(nullptr, 1 << 20, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(static_cast<uint8_t*>(p)[123], 0x77);
  ::munmap(p, 1 << 20);
}

TEST(HostSegmentMemory, HugePagesOnFailsClearlyWithoutThem) {
  if (FreeHugePageBytes() >= (64ull << 20)) GTEST_SKIP() << "this host has huge pages";
  HostSegmentMemory::Options o;
  o.segments = 32;
  o.segment_bytes = 2 << 20;
  o.huge_pages = HugePages::kOn;
  auto mem = HostSegmentMemory::Open(o);
  ASSERT_FALSE(mem.ok());
  EXPECT_EQ(mem.status().code(), StatusCode::kFailedPrecondition);
  o.huge_pages = HugePages::kAuto;  // falls back
  EXPECT_TRUE(HostSegmentMemory::Open(o).ok());
}

TEST(TierPool, OwnersNeverShareASegment) {
  auto pool = MakePool(4);  // 4 pages per segment
  std::vector<PageId> a, b;
  for (int i = 0; i < 6; ++i) a.push_back(**pool->Allocate(/*owner=*/0));
  for (int i = 0; i < 5; ++i) b.push_back(**pool->Allocate(/*owner=*/1));
  for (PageId pa : a) {
    for (PageId pb : b) EXPECT_NE(pool->SegmentOf(pa), pool->SegmentOf(pb));
  }
  EXPECT_EQ(pool->SegmentsOf(0).size(), 2u);
  EXPECT_EQ(pool->SegmentsOf(1).size(), 2u);
  EXPECT_EQ(pool->free_count(), 16u - 11u);
  // Owner 0 has 2 free pages in its segments and no unowned segment is left.
  EXPECT_EQ(pool->AvailableTo(0), 2u);
  EXPECT_EQ(pool->AvailableTo(2), 0u);
  EXPECT_FALSE(pool->Allocate(2)->has_value());
  // What each owner holds follows allocations and frees.
  EXPECT_EQ(pool->UsedBy(0), 6u);
  EXPECT_EQ(pool->UsedBy(1), 5u);
  EXPECT_EQ(pool->UsedBy(2), 0u);
  pool->Free(a[0]);
  pool->Free(b[4]);
  EXPECT_EQ(pool->UsedBy(0), 5u);
  EXPECT_EQ(pool->UsedBy(1), 4u);
}

TEST(TierPool, ASegmentChangesOwnerOnlyWithFreshMemory) {
  auto pool = MakePool(1);
  std::vector<PageId> pages;
  for (int i = 0; i < 4; ++i) pages.push_back(**pool->Allocate(0));
  for (PageId p : pages) std::memset(pool->PageAddress(p), 0xab, 4096);
  const uint32_t gen = pool->Generation(0);
  int renewed = -1;
  pool->SetRenewListener([&](uint32_t s) { renewed = static_cast<int>(s); });
  for (PageId p : pages) pool->Free(p);
  EXPECT_EQ(pool->Owner(0), kNoOwner);
  // The same owner takes its segment back as it was.
  PageId again = **pool->Allocate(0);
  EXPECT_EQ(pool->Generation(0), gen);
  EXPECT_EQ(pool->PageAddress(again)[0], 0xab) << "same owner: memory kept";
  pool->Free(again);
  // Another owner gets it renewed: zeroed memory, a new generation, the listener told.
  PageId other = **pool->Allocate(1);
  EXPECT_EQ(pool->Owner(0), 1u);
  EXPECT_EQ(pool->Generation(0), gen + 1);
  EXPECT_EQ(renewed, 0);
  for (PageId page : pages) {
    uint8_t* p = pool->PageAddress(page);
    for (int i = 0; i < 4096; ++i) ASSERT_EQ(p[i], 0) << "old owner's bytes visible at " << i;
  }
  (void)other;
}

TEST(TierPool, PageSizeMustDivideTheSegment) {
  HostSegmentMemory::Options o;
  o.segments = 1;
  o.segment_bytes = 1 << 20;
  o.huge_pages = HugePages::kOff;
  auto mem = HostSegmentMemory::Open(o);
  ASSERT_TRUE(mem.ok());
  EXPECT_FALSE(TierPool::Open(std::move(mem).value(), 3 << 10).ok());
}

}  // namespace
}  // namespace kvtier
