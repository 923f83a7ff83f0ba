#include "protocol/framing.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace kvtier {
namespace {

std::vector<uint8_t> MakeFrame(uint32_t payload_len, uint8_t fill) {
  std::vector<uint8_t> f(4 + payload_len, fill);
  std::memcpy(f.data(), &payload_len, 4);
  return f;
}

void Feed(FrameAssembler& a, std::span<const uint8_t> bytes) {
  auto space = a.WritableSpace(bytes.size());
  ASSERT_GE(space.size(), bytes.size());
  std::memcpy(space.data(), bytes.data(), bytes.size());
  a.Produced(bytes.size());
}

TEST(FrameAssembler, SplitsAStreamIntoFramesWhateverTheChunking) {
  std::vector<uint8_t> stream;
  for (uint32_t i = 0; i < 50; ++i) {
    auto f = MakeFrame(i * 7 + 1, static_cast<uint8_t>(i));
    stream.insert(stream.end(), f.begin(), f.end());
  }
  for (size_t chunk : {1u, 3u, 17u, 4096u}) {
    FrameAssembler a(1 << 20);
    uint32_t seen = 0;
    for (size_t off = 0; off < stream.size(); off += chunk) {
      Feed(a, std::span<const uint8_t>(stream).subspan(off, std::min(chunk, stream.size() - off)));
      for (;;) {
        auto f = a.Next();
        ASSERT_TRUE(f.ok());
        if (!f->has_value()) break;
        const auto& fr = (*f)->frame;
        EXPECT_EQ(fr.size(), 4 + seen * 7 + 1);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(fr.data()) % 8, 0u) << "frame not 8-byte aligned";
        EXPECT_EQ(fr.back(), static_cast<uint8_t>(seen));
        ++seen;
      }
    }
    EXPECT_EQ(seen, 50u) << "chunk " << chunk;
    EXPECT_EQ(a.PendingBytes(), 0u);
  }
}

TEST(FrameAssembler, OversizedFrameIsAnErrorAndPoisons) {
  FrameAssembler a(1024);
  auto big = MakeFrame(1025, 0);
  Feed(a, std::span<const uint8_t>(big).first(8));
  auto f = a.Next();
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("max_frame_bytes"), std::string::npos);
  EXPECT_FALSE(a.Next().ok());
}

TEST(FrameAssembler, PartialFrameIsPendingAndGrowsTheBuffer) {
  FrameAssembler a(1 << 20, 4096);
  auto f = MakeFrame(100000, 9);
  Feed(a, std::span<const uint8_t>(f).first(5000));
  auto n = a.Next();
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->has_value());
  EXPECT_EQ(a.PendingBytes(), 5000u);
  Feed(a, std::span<const uint8_t>(f).subspan(5000));
  n = a.Next();
  ASSERT_TRUE(n.ok() && n->has_value());
  EXPECT_EQ((*n)->frame.size(), f.size());
  // Idle again: the buffer shrinks back.
  a.WritableSpace();
  EXPECT_LE(a.capacity(), 4u * 4096);
}

TEST(Framing, DescriptorsTravelWithTheirFrame) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  int memfd = ::memfd_create("framing-test", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(::write(memfd, "kvtier", 6), 6);
  auto f1 = MakeFrame(10, 1), f2 = MakeFrame(20, 2);
  ASSERT_TRUE(SendFrame(sv[0], f1, {}).ok());
  int fds[1] = {memfd};
  ASSERT_TRUE(SendFrame(sv[0], f2, fds).ok());
  ::close(memfd);

  std::deque<int> got;
  std::vector<uint8_t> buf(4096);
  size_t total = 0;
  while (total < f1.size() + f2.size()) {
    auto n = RecvSome(sv[1], std::span<uint8_t>(buf).subspan(total), &got);
    ASSERT_TRUE(n.ok());
    ASSERT_GT(*n, 0u);
    total += *n;
  }
  ASSERT_EQ(got.size(), 1u);
  char text[7] = {0};
  EXPECT_EQ(::pread(got[0], text, 6, 0), 6);
  EXPECT_STREQ(text, "kvtier");
  EXPECT_TRUE(::fcntl(got[0], F_GETFD) & FD_CLOEXEC);
  ::close(got[0]);
  ::close(sv[0]);
  // EOF after the peer closes.
  auto n = RecvSome(sv[1], buf, &got);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  ::close(sv[1]);
}

TEST(Framing, SendToAClosedPeerIsUnavailableNotSigpipe) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ::close(sv[1]);
  auto f = MakeFrame(10, 1);
  Status s = SendFrame(sv[0], f, {});
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  ::close(sv[0]);
}

}  // namespace
}  // namespace kvtier
