// One conformance suite, run against every IoEngine (as liburing's tests, the io_uring run
// skips where a ring cannot be set up; the threads fallback runs the same suite).
#include "storage/io/io_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "tests/support/fault_injection_io_engine.h"
#include "tests/support/test_util.h"

namespace kvtier {
namespace {

using Factory = Result<std::unique_ptr<IoEngine>> (*)(const IoEngineOptions&);

struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : size(n) {
    void* p = nullptr;
    EXPECT_EQ(::posix_memalign(&p, 4096, n), 0);
    data = static_cast<uint8_t*>(p);
  }
  ~AlignedBuffer() { ::free(data); }
  uint8_t* data;
  size_t size;
};

class IoEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    IoEngineOptions o;
    o.backend = GetParam();
    o.queue_depth = 8;
    o.max_buffers = 4;
    auto e = OpenIoEngine(o);
    if (!e.ok() && GetParam() == "io_uring") GTEST_SKIP() << "no io_uring here: " << e.status().ToString();
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    fd_ = ::open(dir_.File("data").c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
    ASSERT_GE(fd_, 0);
    ASSERT_EQ(::fallocate(fd_, 0, 0, 1 << 20), 0);
  }
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
  }

  // Waits on notify_fd and reaps until `n` completions arrived.
  std::vector<IoCompletion> WaitFor(size_t n) {
    std::vector<IoCompletion> all;
    for (int i = 0; i < 500 && all.size() < n; ++i) {
      pollfd p{engine_->notify_fd(), POLLIN, 0};
      ::poll(&p, 1, 20);
      auto got = engine_->Reap();
      all.insert(all.end(), got.begin(), got.end());
    }
    return all;
  }

  testing::TempDir dir_;
  std::unique_ptr<IoEngine> engine_;
  int fd_ = -1;
};

TEST_P(IoEngineTest, WritesAndReadsBackODirectWithRegisteredBuffers) {
  AlignedBuffer buf(64 * 1024), back(64 * 1024);
  for (size_t i = 0; i < buf.size; ++i) buf.data[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_TRUE(engine_->RegisterBuffer(0, buf.data, buf.size).ok());
  ASSERT_TRUE(engine_->Enqueue({IoOp::kWrite, fd_, 8192, buf.data, 64 * 1024, 0, 11}).ok());
  ASSERT_TRUE(engine_->Submit().ok());
  auto c = WaitFor(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].tag, 11u);
  EXPECT_EQ(c[0].result, 64 * 1024);
  ASSERT_TRUE(engine_->Enqueue({IoOp::kFdatasync, fd_, 0, nullptr, 0, -1, 12}).ok());
  ASSERT_TRUE(engine_->Enqueue({IoOp::kRead, fd_, 8192, back.data, 64 * 1024, -1, 13}).ok());
  ASSERT_TRUE(engine_->Submit().ok());
  c = WaitFor(2);
  ASSERT_EQ(c.size(), 2u);
  for (const auto& x : c) EXPECT_GE(x.result, 0) << "tag " << x.tag;
  EXPECT_EQ(std::memcmp(buf.data, back.data, buf.size), 0);
  EXPECT_EQ(engine_->in_flight(), 0u);
}

TEST_P(IoEngineTest, ReadPastTheEndIsNoDataNotAShortSuccess) {
  AlignedBuffer buf(8192);
  ASSERT_TRUE(engine_->Enqueue({IoOp::kRead, fd_, (1 << 20) - 4096, buf.data, 8192, -1, 1}).ok());
  ASSERT_TRUE(engine_->Submit().ok());
  auto c = WaitFor(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].result, -ENODATA);
}

TEST_P(IoEngineTest, ErrorsComeBackAsNegativeErrno) {
  AlignedBuffer buf(4096);
  // A write through a read-only descriptor: the kernel refuses with EBADF.
  const int ro = ::open(dir_.File("data").c_str(), O_RDONLY);
  ASSERT_GE(ro, 0);
  ASSERT_TRUE(engine_->Enqueue({IoOp::kWrite, ro, 0, buf.data, 4096, -1, 5}).ok());
  ASSERT_TRUE(engine_->Submit().ok());
  auto c = WaitFor(1);
  ::close(ro);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].tag, 5u);
  EXPECT_EQ(c[0].result, -EBADF);
}

TEST_P(IoEngineTest, QueueIsBoundedAndDrains) {
  AlignedBuffer buf(4096 * 8);
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(engine_->Enqueue({IoOp::kWrite, fd_, i * 4096, buf.data + i * 4096, 4096, -1, i}).ok());
  }
  EXPECT_EQ(engine_->Enqueue({IoOp::kWrite, fd_, 0, buf.data, 4096, -1, 99}).code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(engine_->Submit().ok());
  auto c = WaitFor(8);
  EXPECT_EQ(c.size(), 8u);
  EXPECT_EQ(engine_->in_flight(), 0u);
  std::vector<bool> seen(8, false);
  for (const auto& x : c) {
    ASSERT_LT(x.tag, 8u);
    seen[x.tag] = true;
    EXPECT_EQ(x.result, 4096);
  }
  for (bool s : seen) EXPECT_TRUE(s);
}

TEST_P(IoEngineTest, FaultInjectionFailsExactlyTheNthRequest) {
  auto faults = ParseIoFaults("write:2:enospc,read:1:short");
  ASSERT_TRUE(faults.ok());
  FaultInjectionIoEngine f(std::move(engine_), *faults);
  AlignedBuffer buf(4096 * 4), into(4096 * 4);  // the read must not land in what is being written
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(f.Enqueue({IoOp::kWrite, fd_, i * 4096, buf.data, 4096, -1, i}).ok());
  }
  ASSERT_TRUE(f.Enqueue({IoOp::kRead, fd_, 0, into.data, 8192, -1, 10}).ok());
  ASSERT_TRUE(f.Submit().ok());
  std::vector<IoCompletion> c;
  for (int i = 0; i < 500 && c.size() < 4; ++i) {
    pollfd p{f.notify_fd(), POLLIN, 0};
    ::poll(&p, 1, 20);
    auto got = f.Reap();
    c.insert(c.end(), got.begin(), got.end());
  }
  ASSERT_EQ(c.size(), 4u);
  for (const auto& x : c) {
    if (x.tag == 1)
      EXPECT_EQ(x.result, -ENOSPC);
    else if (x.tag == 10)
      EXPECT_EQ(x.result, 4096) << "short read reports half";
    else
      EXPECT_EQ(x.result, 4096);
  }
  EXPECT_EQ(f.injected(), 2u);
  EXPECT_FALSE(ParseIoFaults("write:0:eio").ok());
  EXPECT_FALSE(ParseIoFaults("scribble:1:eio").ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, IoEngineTest, ::testing::Values("io_uring", "threads"),
                         [](const auto& info) { return info.param; });

TEST(IoEngine, UnknownBackendIsRefused) {
  IoEngineOptions o;
  o.backend = "carrier-pigeon";
  EXPECT_EQ(OpenIoEngine(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
