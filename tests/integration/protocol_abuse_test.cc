// Malformed, truncated, oversized and flooding clients get errors and lose their
// connection; the daemon keeps serving everyone else.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <chrono>
#include <cstring>

#include "protocol/codec.h"
#include "protocol/framing.h"
#include "tests/integration/engine_process.h"

namespace kvtier::testing {
namespace {

void WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    ASSERT_GT(w, 0) << std::strerror(errno);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Reads until EOF (or 5 s) and returns the frames received.
std::vector<std::vector<uint8_t>> ReadUntilEof(int fd) {
  FrameAssembler in(1 << 20);
  std::vector<std::vector<uint8_t>> frames;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    auto space = in.WritableSpace();
    ssize_t n = ::recv(fd, space.data(), space.size(), 0);
    if (n <= 0) break;
    in.Produced(static_cast<size_t>(n));
    while (true) {
      auto f = in.Next();
      if (!f.ok() || !f->has_value()) break;
      frames.emplace_back((*f)->frame.begin(), (*f)->frame.end());
    }
  }
  return frames;
}

void ExpectOneErrorThenClose(int fd, const std::string& words) {
  auto frames = ReadUntilEof(fd);
  ASSERT_EQ(frames.size(), 1u) << "expected exactly one error reply before the close";
  auto r = VerifyResponseFrame(frames[0]);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->id(), 0u);
  EXPECT_EQ((*r)->status(), fb::Status::InvalidArgument);
  ASSERT_NE((*r)->message(), nullptr);
  EXPECT_NE((*r)->message()->str().find(words), std::string::npos) << (*r)->message()->str();
}

class ProtocolAbuse : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonProcess::Options o;
    o.extra_yaml = "protocol:\n  max_frame_bytes: 64KiB\n  max_pending_output: 256KiB\n";
    daemon_ = std::make_unique<DaemonProcess>(o);
    ASSERT_TRUE(daemon_->Start().ok()) << daemon_->Log();
    auto c = Client::Connect(EngineOptions(daemon_->socket_path(), "bystander"));
    ASSERT_TRUE(c.ok()) << c.status().ToString() << "\n" << daemon_->Log();
    bystander_ = std::move(c).value();
    chain_ = HashChain(1, 4);
    auto pages = bystander_->Allocate(TierKind::kHost, 4);
    ASSERT_TRUE(pages.ok());
    std::vector<CommitEntry> e;
    for (int i = 0; i < 4; ++i) e.push_back({(*pages)[i], chain_[i], {}});
    ASSERT_TRUE(bystander_->Commit(TierKind::kHost, e).ok());
  }
  void TearDown() override {
    bystander_.reset();
    if (daemon_) {
      EXPECT_EQ(daemon_->Stop(), 0) << daemon_->Log();
    }
  }
  // The other session is unaffected.
  void ExpectBystanderServed() {
    auto l = bystander_->Lookup(chain_);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l->matched, 4u);
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> bystander_;
  std::vector<BlockHash> chain_;
};

TEST_F(ProtocolAbuse, GarbageFrameGetsAnErrorAndTheConnectionCloses) {
  int fd = RawConnect(daemon_->socket_path());
  ASSERT_GE(fd, 0);
  uint8_t junk[64];
  for (size_t i = 0; i < sizeof(junk); ++i) junk[i] = static_cast<uint8_t>(i * 37 + 11);
  uint32_t len = sizeof(junk) - 4;
  std::memcpy(junk, &len, 4);
  WriteAll(fd, junk, sizeof(junk));
  ExpectOneErrorThenClose(fd, "verification");
  ::close(fd);
  ExpectBystanderServed();
}

TEST_F(ProtocolAbuse, OversizedFrameGetsAnErrorBeforeItsBodyIsRead) {
  int fd = RawConnect(daemon_->socket_path());
  ASSERT_GE(fd, 0);
  uint32_t len = 64 * 1024 + 1;  // one over max_frame_bytes
  WriteAll(fd, &len, 4);
  ExpectOneErrorThenClose(fd, "max_frame_bytes");
  ::close(fd);
  ExpectBystanderServed();
}

TEST_F(ProtocolAbuse, TruncatedFrameAtEofGetsAnError) {
  int fd = RawConnect(daemon_->socket_path());
  ASSERT_GE(fd, 0);
  flatbuffers::FlatBufferBuilder b;
  b.FinishSizePrefixed(fb::CreateRequest(b, 5, fb::Op::Ping, fb::CreatePing(b).Union()));
  WriteAll(fd, b.GetBufferPointer(), b.GetSize() - 3);
  ::shutdown(fd, SHUT_WR);
  ExpectOneErrorThenClose(fd, "truncated");
  ::close(fd);
  ExpectBystanderServed();
}

TEST_F(ProtocolAbuse, ValidFramesAfterAGoodSessionStillWork) {
  // A well-formed Ping on a raw socket is answered with its id: the raw helpers are right.
  int fd = RawConnect(daemon_->socket_path());
  ASSERT_GE(fd, 0);
  flatbuffers::FlatBufferBuilder b;
  b.FinishSizePrefixed(fb::CreateRequest(b, 77, fb::Op::Ping, fb::CreatePing(b).Union()));
  WriteAll(fd, b.GetBufferPointer(), b.GetSize());
  ::shutdown(fd, SHUT_WR);
  auto frames = ReadUntilEof(fd);
  ASSERT_EQ(frames.size(), 1u);
  auto r = VerifyResponseFrame(frames[0]);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->id(), 77u);
  EXPECT_EQ((*r)->status(), fb::Status::Ok);
  ::close(fd);
}

TEST_F(ProtocolAbuse, AClientThatNeverReadsCannotStallOthers) {
  int fd = RawConnect(daemon_->socket_path());
  ASSERT_GE(fd, 0);
  ::fcntl(fd, F_SETFL, O_NONBLOCK);
  // Pings with 32 KiB payloads, never reading the 32 KiB answers: the daemon's buffer for
  // this client fills, it stops reading from it, and everyone else is served meanwhile.
  flatbuffers::FlatBufferBuilder b;
  std::vector<uint8_t> payload(32 * 1024, 1);
  b.FinishSizePrefixed(fb::CreateRequest(b, 1, fb::Op::Ping, fb::CreatePing(b, b.CreateVector(payload)).Union()));
  // Send until the socket stays full for 300 ms: the daemon has stopped reading us.
  size_t sent = 0, off = 0;
  auto last_progress = std::chrono::steady_clock::now();
  const auto deadline = last_progress + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline &&
         std::chrono::steady_clock::now() - last_progress < std::chrono::milliseconds(300)) {
    ssize_t w = ::send(fd, b.GetBufferPointer() + off, b.GetSize() - off, MSG_NOSIGNAL);
    if (w > 0) {
      sent += static_cast<size_t>(w);
      off = (off + static_cast<size_t>(w)) % b.GetSize();
      last_progress = std::chrono::steady_clock::now();
    } else {
      ASSERT_EQ(errno, EAGAIN) << std::strerror(errno);
      ::usleep(1000);
    }
  }
  // It read more than its output limit's worth, then pushed back instead of buffering on.
  EXPECT_GT(sent, 256u * 1024);
  EXPECT_LT(sent, 64u << 20) << "the daemon kept reading a client that never reads";
  for (int i = 0; i < 20; ++i) ExpectBystanderServed();
  ::close(fd);
  ExpectBystanderServed();
}

TEST_F(ProtocolAbuse, ManyBadClientsInARowLeaveTheDaemonHealthy) {
  for (int i = 0; i < 50; ++i) {
    int fd = RawConnect(daemon_->socket_path());
    ASSERT_GE(fd, 0);
    uint8_t buf[32] = {};
    uint32_t len = 28;
    std::memcpy(buf, &len, 4);
    buf[4 + (i % 28)] = static_cast<uint8_t>(i);
    WriteAll(fd, buf, 4 + (i % 28) + 1);
    ::close(fd);  // mid-frame, no reading
  }
  ExpectBystanderServed();
  auto stats = StatsOf(daemon_->socket_path());
  ASSERT_TRUE(stats.ok());
}

}  // namespace
}  // namespace kvtier::testing
