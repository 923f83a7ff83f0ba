#include "storage/pool/tier_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

namespace kvtier {
namespace {

// `segments` memfds of `segment_bytes`, 4 KiB pages.
std::unique_ptr<HostSegmentMemory> MakeMemory(uint32_t segments, uint64_t segment_bytes = 1 << 20) {
  HostSegmentMemory::Options o;
  o.segments = segments;
  o.segment_bytes = segment_bytes;
  o.huge_pages = HugePages::kOff;
  auto mem = HostSegmentMemory::Open(o);
  EXPECT_TRUE(mem.ok()) << mem.status().ToString();
  return mem.ok() ? std::move(mem).value() : nullptr;
}

std::unique_ptr<TierPool> MakePool(uint32_t segments, uint64_t segment_bytes = 1 << 20,
                                   uint64_t page_bytes = 256 << 10) {
  auto mem = MakeMemory(segments, segment_bytes);
  auto pool = TierPool::Open(std::move(mem), page_bytes);
  EXPECT_TRUE(pool.ok());
  return std::move(pool).value();
}

TEST(HostSegmentMemory, SegmentsAreSealedAgainstResizing) {
  auto mem = MakeMemory(2);
  ASSERT_TRUE(mem);
  const int fd = mem->ShareFd(0);
  // A client cannot shrink the segment under the daemon (which would SIGBUS it) nor grow it.
  EXPECT_NE(::ftruncate(fd, 4096), 0);
  EXPECT_NE(::ftruncate(fd, 4 << 20), 0);
  const int seals = ::fcntl(fd, F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_GROW);
  EXPECT_TRUE(seals & F_SEAL_SEAL);
  // Another mapping of the fd sees the daemon's writes.
  mem->HostAddress(0)[123] = 0x77;
  void* p = ::mmap(nullptr, 1 << 20, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(static_cast<uint8_t*>(p)[123], 0x77);
  ::munmap(p, 1 << 20);
}

// Item 3 of the fifth hardening round: a client that keeps mapping a segment after it
// changed tenant kept its old memory alive and charged to kvtierd (2x the pool with two
// tenants churning, more with every renewal a sleeping client missed).
TEST(HostSegmentMemory, RenewReleasesTheOldPagesFromEveryMapping) {
  auto mem = MakeMemory(1);
  ASSERT_TRUE(mem);
  const int old_fd = ::dup(mem->ShareFd(0));  // what a client keeps: its mapping holds the file
  ASSERT_GE(old_fd, 0);
  auto* client = static_cast<uint8_t*>(::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, old_fd, 0));
  ASSERT_NE(client, MAP_FAILED);
  std::memset(client, 0x5a, 1 << 20);
  struct stat st {};
  ASSERT_EQ(::fstat(old_fd, &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, uint64_t{1} << 20) << "the segment is allocated up front";

  ASSERT_TRUE(mem->Renew(0).ok());
  ASSERT_EQ(::fstat(old_fd, &st), 0);
  EXPECT_EQ(st.st_blocks, 0) << "the old segment's pages outlive the renewal in the client's mapping";
  for (int i = 0; i < (1 << 20); i += 4096) ASSERT_EQ(client[i], 0) << "old page " << i / 4096 << " still there";
  EXPECT_NE(mem->HostAddress(0)[0], 0x5a);
  ::munmap(client, 1 << 20);
  ::close(old_fd);
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

// Renews inline, or fails every renewal while `fail` is set.
class FlakyRenewal final : public SegmentMemory {
 public:
  explicit FlakyRenewal(std::unique_ptr<SegmentMemory> m) : m_(std::move(m)) {}
  uint32_t segment_count() const override { return m_->segment_count(); }
  uint64_t segment_bytes() const override { return m_->segment_bytes(); }
  int ShareFd(uint32_t s) const override { return m_->ShareFd(s); }
  uint8_t* HostAddress(uint32_t s) const override { return m_->HostAddress(s); }
  Status Renew(uint32_t s) override { return fail ? ResourceExhausted("no memory (test)") : m_->Renew(s); }
  bool renews_off_thread() const override { return m_->renews_off_thread(); }
  std::string Describe() const override { return m_->Describe(); }
  Status CopyToHost(uint32_t s, uint64_t o, void* d, uint64_t b) override { return m_->CopyToHost(s, o, d, b); }
  std::string_view backend() const override { return m_->backend(); }
  std::atomic<bool> fail{false};

 private:
  std::unique_ptr<SegmentMemory> m_;
};

// A runner that keeps what it is given until the test runs it: the work on a thread of its
// own, the completion on the test's.
struct HeldRenewal {
  std::function<Status()> work;
  std::function<void(Status)> done;
  void Finish() {
    Status st;
    std::thread([&] { st = work(); }).join();
    auto d = std::move(done);
    work = nullptr;
    d(st);
  }
};

TEST(TierPool, WithARunnerASegmentIsRenewedOffTheOwnersThread) {
  auto flaky = std::make_unique<FlakyRenewal>(MakeMemory(1));
  FlakyRenewal* mem = flaky.get();
  auto opened = TierPool::Open(std::move(flaky), 256 << 10);
  ASSERT_TRUE(opened.ok());
  TierPool& pool = **opened;
  HeldRenewal held;
  int renewed_calls = 0;
  pool.SetRenewalRunner(
      [&](std::function<Status()> work, std::function<void(Status)> done) {
        ASSERT_FALSE(held.work) << "two renewals at once";
        held = HeldRenewal{std::move(work), std::move(done)};
      },
      [&] { ++renewed_calls; });

  const PageId a = **pool.Allocate(0);
  pool.PageAddress(a)[0] = 0xab;
  pool.Free(a);
  const uint32_t gen = pool.Generation(0);
  // Another owner's claim starts the renewal and gets no page yet; nor does anyone else.
  EXPECT_FALSE(pool.Allocate(1)->has_value());
  ASSERT_TRUE(held.work);
  EXPECT_TRUE(pool.renewing());
  EXPECT_EQ(pool.AvailableTo(1), pool.pages_per_segment()) << "a segment on its way is room to come";
  EXPECT_FALSE(pool.Allocate(0)->has_value()) << "its last owner took it back during the renewal";
  EXPECT_FALSE(pool.Allocate(2)->has_value());
  EXPECT_EQ(renewed_calls, 0);

  held.Finish();
  EXPECT_FALSE(pool.renewing());
  EXPECT_EQ(renewed_calls, 1);
  EXPECT_EQ(pool.renewals(), 1u);
  EXPECT_EQ(pool.Generation(0), gen + 1);
  const PageId b = **pool.Allocate(1);
  EXPECT_EQ(pool.Owner(0), 1u);
  EXPECT_EQ(pool.PageAddress(b)[0], 0) << "the old owner's byte in the new owner's page";
  pool.PageAddress(b)[0] = 0xcd;
  pool.Free(b);

  // A renewal that fails leaves the segment as it was: its last owner may take it back,
  // and the next claim by another renews inline, reporting the error.
  mem->fail = true;
  EXPECT_FALSE(pool.Allocate(0)->has_value());
  held.Finish();
  EXPECT_EQ(pool.renewal_failures(), 1u);
  EXPECT_EQ(renewed_calls, 2);
  auto inline_claim = pool.Allocate(2);
  EXPECT_FALSE(inline_claim.ok());
  EXPECT_FALSE(held.work) << "after a failure the claim does not queue another renewal";
  EXPECT_EQ(pool.renewal_failures(), 2u);
  const PageId c = **pool.Allocate(1);
  EXPECT_EQ(pool.PageAddress(c)[0], 0xcd) << "its last owner gets its own memory back";
  EXPECT_EQ(pool.Generation(0), gen + 1);
}

TEST(TierPool, PageSizeMustDivideTheSegment) { EXPECT_FALSE(TierPool::Open(MakeMemory(1), 3 << 10).ok()); }

}  // namespace
}  // namespace kvtier
