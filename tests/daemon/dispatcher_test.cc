#include "daemon/dispatcher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "tests/support/fake_clock.h"
#include "tests/support/test_util.h"

namespace kvtier {
namespace {

struct CapturedReply {
  std::vector<uint8_t> frame;
  size_t fds = 0;
  const fb::Response* response() const {
    auto r = VerifyResponseFrame(frame);
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : nullptr;
  }
};

class CaptureSink : public ReplySink {
 public:
  void Send(std::span<const uint8_t> frame, std::span<const int> fds) override {
    replies.push_back(CapturedReply{{frame.begin(), frame.end()}, fds.size()});
  }
  std::vector<CapturedReply> replies;
};

class DispatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CacheManager::Options o;
    TierOptions& h = o.tiers[TierIndex(TierKind::kHost)];
    h.enabled = true;
    h.page_bytes = 1 << 20;
    h.segment_bytes = 4 << 20;
    h.capacity_bytes = 8 << 20;
    h.huge_pages = HugePages::kOff;
    cache_ = std::move(CacheManager::Open(o)).value();
    info_.version = "test";
    dispatcher_ = std::make_unique<Dispatcher>(
        cache_.get(), &info_, &clock_, &metrics_, [](const auto&) {}, &tenants_);
  }

  template <class BuildOp>
  const fb::Response* Call(SessionContext& ctx, BuildOp build) {
    flatbuffers::FlatBufferBuilder b;
    auto [type, op] = build(b);
    b.FinishSizePrefixed(fb::CreateRequest(b, ++id_, type, op));
    dispatcher_->HandleFrame(ctx, {b.GetBufferPointer(), b.GetSize()}, sink_);
    return sink_.replies.back().response();
  }

  const fb::Response* Hello(SessionContext& ctx, fb::Role role, uint16_t major = kProtocolMajor) {
    return Call(ctx, [&](flatbuffers::FlatBufferBuilder& b) {
      auto layout = LayoutToWire(b, testing::TestLayout());
      auto name = b.CreateString("test-engine");
      auto h = fb::CreateHello(b, major, 0, role, name, role == fb::Role::Engine ? layout : 0, 16);
      return std::make_pair(fb::Op::Hello, h.Union());
    });
  }

  const fb::Response* Allocate(SessionContext& ctx, uint32_t n) {
    return Call(ctx, [&](flatbuffers::FlatBufferBuilder& b) {
      return std::make_pair(fb::Op::Allocate, fb::CreateAllocate(b, fb::Tier::Host, n).Union());
    });
  }

  FakeClock clock_;
  MetricsRegistry metrics_;
  DaemonInfo info_;
  TenantResolver tenants_{SecurityConfig{}, ::geteuid()};
  std::unique_ptr<CacheManager> cache_;
  std::unique_ptr<Dispatcher> dispatcher_;
  CaptureSink sink_;
  uint64_t id_ = 0;
};

TEST_F(DispatcherTest, MalformedFrameIsAnsweredAndMarksTheSessionForClosing) {
  SessionContext ctx(1);
  std::vector<uint8_t> junk = {8, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
  dispatcher_->HandleFrame(ctx, junk, sink_);
  ASSERT_EQ(sink_.replies.size(), 1u);
  const fb::Response* r = sink_.replies[0].response();
  EXPECT_EQ(r->id(), 0u);
  EXPECT_EQ(r->status(), fb::Status::InvalidArgument);
  EXPECT_NE(r->message()->str().find("verification"), std::string::npos);
  EXPECT_TRUE(ctx.close_after_reply);
}

TEST_F(DispatcherTest, NothingButPingBeforeHello) {
  SessionContext ctx(1);
  const fb::Response* r = Allocate(ctx, 1);
  EXPECT_EQ(r->status(), fb::Status::FailedPrecondition);
  EXPECT_EQ(r->id(), id_);
  EXPECT_FALSE(ctx.close_after_reply);
  r = Call(ctx, [](flatbuffers::FlatBufferBuilder& b) {
    return std::make_pair(fb::Op::Ping, fb::CreatePing(b, b.CreateVector(std::vector<uint8_t>{1, 2, 3})).Union());
  });
  EXPECT_EQ(r->status(), fb::Status::Ok);
  EXPECT_EQ(r->reply_as_Pong()->payload()->size(), 3u);
}

TEST_F(DispatcherTest, AKeepalivePingIsAnsweredWithNothingAndWelcomeSaysTheTtl) {
  info_.heartbeat_ttl_ms = 1500;
  SessionContext ctx(2);
  const fb::Response* w = Hello(ctx, fb::Role::Engine);
  ASSERT_EQ(w->status(), fb::Status::Ok);
  EXPECT_EQ(w->reply_as_Welcome()->heartbeat_ttl_ms(), 1500u);
  const size_t before = sink_.replies.size();
  flatbuffers::FlatBufferBuilder b;
  fb::PingBuilder ping(b);
  ping.add_no_reply(true);
  const auto op = ping.Finish().Union();
  b.FinishSizePrefixed(fb::CreateRequest(b, 99, fb::Op::Ping, op));
  dispatcher_->HandleFrame(ctx, {b.GetBufferPointer(), b.GetSize()}, sink_);
  EXPECT_EQ(sink_.replies.size(), before);  // no Pong to read
  EXPECT_FALSE(ctx.close_after_reply);
  // A Ping that asks for its Pong gets it.
  const fb::Response* r = Call(
      ctx, [](flatbuffers::FlatBufferBuilder& b) { return std::make_pair(fb::Op::Ping, fb::CreatePing(b).Union()); });
  EXPECT_EQ(sink_.replies.size(), before + 1);
  EXPECT_EQ(r->status(), fb::Status::Ok);
}

TEST_F(DispatcherTest, EngineHelloGetsWelcomeWithTiersAndOneFdPerSegment) {
  SessionContext ctx(7);
  const fb::Response* r = Hello(ctx, fb::Role::Engine);
  ASSERT_EQ(r->status(), fb::Status::Ok) << r->message()->str();
  const fb::Welcome* w = r->reply_as_Welcome();
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->session_id(), 7u);
  ASSERT_EQ(w->tiers()->size(), 1u);
  EXPECT_EQ(w->tiers()->Get(0)->page_bytes(), 1u << 20);
  EXPECT_EQ(w->segments()->size(), sink_.replies.back().fds);
  // The first allocation claims a segment and grants it with its fd.
  r = Allocate(ctx, 2);
  ASSERT_EQ(r->status(), fb::Status::Ok);
  EXPECT_EQ(r->reply_as_AllocateReply()->pages()->size(), 2u);
  EXPECT_EQ(r->reply_as_AllocateReply()->segments()->size(), 1u);
  EXPECT_EQ(sink_.replies.back().fds, 1u);
  // Not again for the same segment.
  r = Allocate(ctx, 1);
  EXPECT_EQ(r->reply_as_AllocateReply()->segments()->size(), 0u);
  EXPECT_EQ(sink_.replies.back().fds, 0u);
  // A second Hello is refused.
  EXPECT_EQ(Hello(ctx, fb::Role::Engine)->status(), fb::Status::FailedPrecondition);
}

TEST_F(DispatcherTest, ControlSessionsCannotLeasePages) {
  SessionContext ctx(1);
  ASSERT_EQ(Hello(ctx, fb::Role::Control)->status(), fb::Status::Ok);
  const fb::Response* r = Allocate(ctx, 1);
  EXPECT_EQ(r->status(), fb::Status::PermissionDenied);
  r = Call(ctx, [](flatbuffers::FlatBufferBuilder& b) {
    return std::make_pair(fb::Op::Stats, fb::CreateStats(b, true).Union());
  });
  ASSERT_EQ(r->status(), fb::Status::Ok);
  EXPECT_EQ(r->reply_as_StatsReply()->tiers()->Get(0)->capacity_pages(), 8u);
}

TEST_F(DispatcherTest, WrongMajorVersionIsRefusedAndCloses) {
  SessionContext ctx(1);
  const fb::Response* r = Hello(ctx, fb::Role::Engine, kProtocolMajor + 1);
  EXPECT_EQ(r->status(), fb::Status::FailedPrecondition);
  EXPECT_TRUE(ctx.close_after_reply);
}

// Hello's engine identity for KV events: checked before the session attaches.
TEST_F(DispatcherTest, AnEnginesEventIdentityIsChecked) {
  auto hello = [&](SessionContext& ctx, const std::string& routable, int rank, uint8_t hashes) {
    return Call(ctx, [&](flatbuffers::FlatBufferBuilder& b) {
      auto layout = LayoutToWire(b, testing::TestLayout());
      auto name = b.CreateString("test-engine");
      auto id = b.CreateString(routable);
      auto h = fb::CreateHello(b, kProtocolMajor, kProtocolMinor, fb::Role::Engine, name, layout, 16, id, rank,
                               static_cast<fb::EventHashes>(hashes));
      return std::make_pair(fb::Op::Hello, h.Union());
    });
  };
  struct Case {
    std::string routable;
    int rank;
    uint8_t hashes;
    fb::Status want;
  };
  for (const Case& c :
       {Case{"10.0.0.5:8000", 0, 1, fb::Status::Ok}, Case{"10.0.0.5:8000", -1, 2, fb::Status::Ok},
        Case{"a@b", -1, 0, fb::Status::InvalidArgument}, Case{"10.0.0.5:8000", -2, 0, fb::Status::InvalidArgument},
        Case{"10.0.0.5:8000", 0, 3, fb::Status::InvalidArgument}}) {
    SessionContext ctx(1);
    const fb::Response* r = hello(ctx, c.routable, c.rank, c.hashes);
    EXPECT_EQ(r->status(), c.want) << c.routable << " rank " << c.rank << " hashes " << int(c.hashes);
  }
}

TEST_F(DispatcherTest, HashVectorsOfTheWrongSizeAreInvalid) {
  SessionContext ctx(1);
  ASSERT_EQ(Hello(ctx, fb::Role::Engine)->status(), fb::Status::Ok);
  const fb::Response* r = Call(ctx, [](flatbuffers::FlatBufferBuilder& b) {
    auto v = b.CreateVector(std::vector<uint8_t>(17, 1));
    return std::make_pair(fb::Op::Lookup, fb::CreateLookup(b, v).Union());
  });
  EXPECT_EQ(r->status(), fb::Status::InvalidArgument);
  EXPECT_FALSE(ctx.close_after_reply) << "a bad request is not a bad frame";
}

TEST_F(DispatcherTest, CommitCountMismatchIsInvalid) {
  SessionContext ctx(1);
  ASSERT_EQ(Hello(ctx, fb::Role::Engine)->status(), fb::Status::Ok);
  const fb::Response* r = Call(ctx, [](flatbuffers::FlatBufferBuilder& b) {
    auto pages = b.CreateVector(std::vector<uint32_t>{0, 1});
    auto hashes = b.CreateVector(std::vector<uint8_t>(16, 1));
    return std::make_pair(fb::Op::Commit, fb::CreateCommit(b, fb::Tier::Host, pages, hashes).Union());
  });
  EXPECT_EQ(r->status(), fb::Status::InvalidArgument);
  (void)dispatcher_->SessionClosed(ctx, /*quarantine_leases=*/false);
  EXPECT_TRUE(cache_->CheckInvariants().ok());
}

// Tokens, extra keys and the LoRA name a Commit carries for KV events: whole blocks of
// tokens, an entry of extra keys per page, a bounded name; else kInvalidArgument naming the
// field, and the page stays leased.
TEST_F(DispatcherTest, CommitKeysThatDoNotFitItsPagesAreInvalidAndLeaveThePageLeased) {
  SessionContext ctx(1);
  ASSERT_EQ(Hello(ctx, fb::Role::Engine)->status(), fb::Status::Ok);
  ASSERT_EQ(Allocate(ctx, 1)->status(), fb::Status::Ok);
  const std::vector<uint8_t> one_salt = {0x91, 0x91, 0xa1, 's'};  // [["s"]]
  const std::vector<uint8_t> two_nils = {0x92, 0xc0, 0xc0};       // [nil, nil]
  auto commit = [&](size_t tokens, const std::vector<uint8_t>& extra, const std::string& lora) {
    return Call(ctx, [&](flatbuffers::FlatBufferBuilder& b) {
      auto pages = b.CreateVector(std::vector<uint32_t>{0});
      auto hashes = b.CreateVector(std::vector<uint8_t>(16, 3));
      auto ids = b.CreateVector(std::vector<uint32_t>(tokens, 5));
      auto ev = b.CreateVector(extra);
      auto name = b.CreateString(lora);
      return std::make_pair(fb::Op::Commit,
                            fb::CreateCommit(b, fb::Tier::Host, pages, hashes, 0, false, 0, ids, ev, name, 1).Union());
    });
  };
  const uint32_t block = ctx.layout.tokens_per_block;
  for (const auto& [bad, field] : std::vector<std::pair<const fb::Response*, std::string>>{
           {commit(block + 1, {}, ""), "token_ids"},
           {commit(block, two_nils, ""), "extra_keys"},
           {commit(block, one_salt, std::string(StoredKeys::kMaxLoraName + 1, 'a')), "lora_name"}}) {
    EXPECT_EQ(bad->status(), fb::Status::InvalidArgument) << field;
    ASSERT_NE(bad->message(), nullptr);
    EXPECT_NE(bad->message()->str().find(field), std::string::npos) << bad->message()->str();
  }
  EXPECT_EQ(commit(block, one_salt, "adapter")->status(), fb::Status::Ok);  // still leased, so it commits
  (void)dispatcher_->SessionClosed(ctx, false);
  EXPECT_TRUE(cache_->CheckInvariants().ok());
}

TEST_F(DispatcherTest, HandlesFromAnotherDaemonEpochAreRefused) {
  info_.epoch = 0x1234;
  SessionContext ctx(1);
  ASSERT_EQ(Hello(ctx, fb::Role::Engine)->status(), fb::Status::Ok);
  ASSERT_EQ(Allocate(ctx, 1)->status(), fb::Status::Ok);
  auto commit = [&](uint64_t epoch) {
    return Call(ctx, [epoch](flatbuffers::FlatBufferBuilder& b) {
      auto pages = b.CreateVector(std::vector<uint32_t>{0});
      auto hashes = b.CreateVector(std::vector<uint8_t>(16, 7));
      return std::make_pair(fb::Op::Commit,
                            fb::CreateCommit(b, fb::Tier::Host, pages, hashes, 0, false, epoch).Union());
    });
  };
  const fb::Response* stale = commit(0x9999);  // leased before a restart
  EXPECT_EQ(stale->status(), fb::Status::FailedPrecondition);
  ASSERT_NE(stale->message(), nullptr);
  EXPECT_NE(stale->message()->str().find("stale"), std::string::npos);
  auto release = Call(ctx, [](flatbuffers::FlatBufferBuilder& b) {
    auto pages = b.CreateVector(std::vector<uint32_t>{0});
    return std::make_pair(fb::Op::Release, fb::CreateRelease(b, fb::Tier::Host, pages, 0, 0x9999).Union());
  });
  EXPECT_EQ(release->status(), fb::Status::FailedPrecondition);
  EXPECT_EQ(commit(0x1234)->status(), fb::Status::Ok);
  (void)dispatcher_->SessionClosed(ctx, false);
  EXPECT_TRUE(cache_->CheckInvariants().ok());
}

TEST_F(DispatcherTest, VerifyIsForAdminsAndStatsHidesOtherTenants) {
  // This process is root or the daemon's uid here, so build a resolver that makes the
  // peers non-admins: a daemon uid nobody has and no root peers.
  SecurityConfig sec;
  TenantResolver strict(sec, 54321);
  Dispatcher d(
      cache_.get(), &info_, &clock_, &metrics_,
      [](const std::function<void(const SessionContext&)>& fn) {
        SessionContext a(10), b(11);
        a.tenant = "uid=1000";
        b.tenant = "uid=2000";
        fn(a);
        fn(b);
      },
      &strict);
  SessionContext ctx(1);
  ctx.uid = 1000;
  auto call = [&](auto build) {
    flatbuffers::FlatBufferBuilder b;
    auto [type, op] = build(b);
    b.FinishSizePrefixed(fb::CreateRequest(b, ++id_, type, op));
    d.HandleFrame(ctx, {b.GetBufferPointer(), b.GetSize()}, sink_);
    return sink_.replies.back().response();
  };
  auto hello = call([](flatbuffers::FlatBufferBuilder& b) {
    return std::make_pair(fb::Op::Hello,
                          fb::CreateHello(b, kProtocolMajor, 0, fb::Role::Control, b.CreateString("kvctl")).Union());
  });
  ASSERT_EQ(hello->status(), fb::Status::Ok);
  EXPECT_FALSE(ctx.admin);
  auto verify = call([](flatbuffers::FlatBufferBuilder& b) {
    return std::make_pair(fb::Op::VerifyTier, fb::CreateVerifyTier(b).Union());
  });
  EXPECT_EQ(verify->status(), fb::Status::PermissionDenied);
  auto stats = call([](flatbuffers::FlatBufferBuilder& b) {
    return std::make_pair(fb::Op::Stats, fb::CreateStats(b, true).Union());
  });
  ASSERT_EQ(stats->status(), fb::Status::Ok);
  const auto* sr = stats->reply_as_StatsReply();
  ASSERT_NE(sr->sessions(), nullptr);
  ASSERT_EQ(sr->sessions()->size(), 1u);  // its own tenant's session only
  EXPECT_EQ(sr->sessions()->Get(0)->tenant()->str(), "uid=1000");
}

}  // namespace
}  // namespace kvtier
