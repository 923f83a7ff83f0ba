// KvEvents' bounds over real ZMQ sockets: peers per socket and per local user, the queue,
// endpoints in use, topics and buffer shares per tenant, the replay ring's and a message's
// bytes. Its streams and owners: kv_events_test.cc.
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "daemon/events/kv_events.h"
#include "tests/daemon/kv_events_harness.h"
#include "tests/support/test_util.h"

namespace kvtier {
namespace {

using testing::Attach;
using testing::BigEndian;
using testing::HashChain;
using testing::Join;
using testing::LoopbackOptions;
using testing::Message;
using testing::PackedArray;
using testing::Receive;
using testing::ReplayFrom;
using testing::Subscribe;
using testing::TempDir;

// Peers past the caps are shut down; the ones within keep their stream.
TEST(KvEvents, SubscribersPastTheCapAreShutDown) {
  KvEventsOptions o = LoopbackOptions();
  o.max_subscribers = 3;
  auto e = KvEvents::Open(o);
  ASSERT_TRUE(e.ok());
  zmq::context_t ctx;
  std::vector<zmq::socket_t> first;
  for (int i = 0; i < 3; ++i) {
    first.emplace_back(ctx, zmq::socket_type::sub);
    first.back().set(zmq::sockopt::subscribe, "");
    first.back().connect((*e)->publish_endpoint());
  }
  ASSERT_TRUE(testing::WaitUntil([&] { return (*e)->counters().subscribers == 3; }));
  std::vector<zmq::socket_t> more;
  for (int i = 0; i < 5; ++i) {
    more.emplace_back(ctx, zmq::socket_type::sub);
    more.back().set(zmq::sockopt::subscribe, "");
    more.back().connect((*e)->publish_endpoint());
  }
  ASSERT_TRUE(testing::WaitUntil([&] { return (*e)->counters().refused >= 5; }));
  for (auto& s : first) Join(**e, s);  // each of the first three still reads the stream
  more.clear();
  first.clear();
  EXPECT_TRUE(testing::WaitUntil([&] { return (*e)->counters().subscribers == 0; }));
}

// A local user (a member of the socket's group) holds at most its share of the slots;
// admins (root here) are not capped per user, and the slots it cannot take stay free.
TEST(KvEvents, ALocalUserHoldsAtMostItsShareOfTheSubscriberSlots) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another user";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0711), 0);  // the other user reaches the sockets
  KvEventsOptions o = LoopbackOptions();
  o.publish = "ipc://" + dir.File("events.sock");
  o.replay = "ipc://" + dir.File("replay.sock");
  o.ipc_gid = 65534;  // nogroup: the other user's group
  o.max_subscribers = 8;
  o.max_peer_share_per_user = 0.25;  // 2 of 8
  auto e = KvEvents::Open(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const std::string endpoint = (*e)->publish_endpoint();
  // The other user's 5 subscribers, held for 20 s, in a process of its own: exec'd, since
  // a forked copy of this multi-threaded test may not start threads (ZMQ's) itself.
  const std::string script =
      "import zmq, time\nc = zmq.Context()\nsubs = [c.socket(zmq.SUB) for _ in range(5)]\nfor s in subs:\n"
      "    s.setsockopt(zmq.SUBSCRIBE, b'')\n    s.connect('" +
      endpoint + "')\ntime.sleep(20)\n";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    ::execl("/usr/bin/python3", "python3", "-c", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_TRUE(testing::WaitUntil([&] { return (*e)->counters().refused == 3; }, std::chrono::seconds(10)))
      << (*e)->counters().refused << " refused";
  // Root's subscribers take the other six slots, and each reads the stream.
  zmq::context_t ctx;
  std::vector<zmq::socket_t> admins;
  for (int i = 0; i < 6; ++i) {
    admins.emplace_back(ctx, zmq::socket_type::sub);
    admins.back().set(zmq::sockopt::subscribe, "");
    admins.back().connect(endpoint);
  }
  ASSERT_TRUE(testing::WaitUntil([&] { return (*e)->counters().subscribers == 8; })) << (*e)->counters().subscribers;
  EXPECT_EQ((*e)->counters().refused, 3u);
  for (auto& s : admins) Join(**e, s);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status)) << "the other user's process ended early: status " << status;
  EXPECT_TRUE(testing::WaitUntil([&] { return (*e)->counters().subscribers == 6; }));
}

TEST(KvEvents, ABoundedQueueDropsAndCountsInsteadOfGrowing) {
  KvEventsOptions o = LoopbackOptions();
  o.queue_events = 10;
  o.flush_interval_ns = 10'000'000'000;  // nothing leaves while the test fills the queue
  auto events = KvEvents::Open(o);
  ASSERT_TRUE(events.ok());
  Attach(**events, "ns", "t", "m", 16);
  const auto hashes = HashChain(9, 100);
  for (const BlockHash& h : hashes) (*events)->Removed("ns", TierKind::kNvme, h);
  EXPECT_EQ((*events)->counters().dropped, 90u);
}

TEST(KvEvents, AnEndpointInUseIsAnErrorNamingTheKey) {
  auto first = KvEvents::Open(LoopbackOptions());
  ASSERT_TRUE(first.ok());
  KvEventsOptions o;
  o.publish = (*first)->publish_endpoint();
  auto second = KvEvents::Open(o);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("events.publish"), std::string::npos) << second.status().ToString();
}

// ZMQ would replace the socket file of an ipc endpoint another daemon publishes on; a
// file nobody listens on any more (a crashed daemon's) is taken over.
TEST(KvEvents, AnIpcPathAnotherPublisherHoldsIsRefusedAndAStaleOneReused) {
  testing::TempDir dir;
  KvEventsOptions o;
  o.publish = "ipc://" + dir.File("events.sock");
  o.replay = "ipc://" + dir.File("replay.sock");
  auto first = KvEvents::Open(o);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = KvEvents::Open(o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("events.publish"), std::string::npos) << second.status().ToString();
  KvEventsOptions replay_only = o;
  replay_only.publish = "ipc://" + dir.File("other.sock");
  auto third = KvEvents::Open(replay_only);
  ASSERT_FALSE(third.ok());
  EXPECT_NE(third.status().message().find("events.replay"), std::string::npos) << third.status().ToString();
  first->reset();
  ASSERT_TRUE(std::filesystem::exists(dir.File("events.sock"))) << "ZMQ leaves the file; nobody listens on it";
  auto again = KvEvents::Open(o);
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

// One tenant's engines hold at most max_topics_per_tenant topics, lingering ones counted;
// other tenants are not affected, and an ended topic frees its place.
TEST(KvEvents, ATenantsTopicsAreCappedAndAnEndedTopicFreesItsPlace) {
  KvEventsOptions o = LoopbackOptions();
  o.max_topics_per_tenant = 3;
  o.topic_linger_ns = 0;
  auto events = KvEvents::Open(o);
  ASSERT_TRUE(events.ok());
  KvEvents& e = **events;
  std::vector<uint64_t> links;
  for (int i = 0; i < 3; ++i) {
    const std::string id = "10.0.1." + std::to_string(i) + ":8000";
    links.push_back(Attach(e, "ns", "a", "m", 16, EventSource{.routable_id = id}));
  }
  Attach(e, "ns", "a", "m", 16, EventSource{.routable_id = "10.0.1.0:8000"});  // a topic it holds: no new one
  auto over = e.AddNamespace("ns", "a", "m", 16, EventSource{.routable_id = "10.0.1.9:8000"});
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("max_topics_per_tenant"), std::string::npos);
  EXPECT_EQ(e.counters().topics_refused, 1u);
  Attach(e, "nsb", "b", "m", 16, EventSource{.routable_id = "10.0.2.0:8000"});  // another tenant
  e.RemoveNamespace(links[2]);
  ASSERT_TRUE(testing::WaitUntil([&] { return e.counters().topics_removed == 1; }));
  Attach(e, "ns", "a", "m", 16, EventSource{.routable_id = "10.0.1.9:8000"});
  EXPECT_EQ(e.counters().topics, 4u);
}

// An engine's routable id is its tenant's while a topic it named lives: another tenant
// cannot announce blocks as that engine.
TEST(KvEvents, ARoutableIdBelongsToTheTenantThatDeclaredIt) {
  KvEventsOptions o = LoopbackOptions();
  o.topic_linger_ns = 0;
  auto events = KvEvents::Open(o);
  ASSERT_TRUE(events.ok());
  KvEvents& e = **events;
  const EventSource engine{.routable_id = "10.0.3.1:8000"};
  const uint64_t a = Attach(e, "ns-a", "a", "m", 16, engine);
  Attach(e, "ns-a2", "a", "other-model", 16, engine);  // its own tenant may, for any model
  auto b = e.AddNamespace("ns-b", "b", "x", 16, engine);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(b.status().message().find("10.0.3.1:8000"), std::string::npos);
  Attach(e, "ns-b", "b", "x", 16);  // no routable id: the host's topic
  e.RemoveNamespace(a);
  EXPECT_FALSE(e.AddNamespace("ns-b", "b", "x", 16, engine).ok());  // the other-model topic still holds it
}

// Of the buffer, a tenant's events take at most an equal share among the tenants with
// namespaces: one tenant's flood drops its own events, not another's.
TEST(KvEvents, ATenantsEventsTakeAtMostItsShareOfTheBuffer) {
  KvEventsOptions o = LoopbackOptions();
  o.queue_events = 100;
  o.flush_interval_ns = 60'000'000'000;  // nothing is sent during the test
  auto events = KvEvents::Open(o);
  ASSERT_TRUE(events.ok());
  KvEvents& e = **events;
  Attach(e, "ns-a", "a", "m", 16);
  Attach(e, "ns-b", "b", "m", 16);
  const auto flood = HashChain(14, 200);
  for (const BlockHash& h : flood) e.Removed("ns-a", TierKind::kHost, h);
  EXPECT_EQ(e.counters().dropped, 150u);  // a's share: 100 / 2 tenants
  for (const BlockHash& h : HashChain(15, 40)) e.Removed("ns-b", TierKind::kHost, h);
  EXPECT_EQ(e.counters().dropped, 150u);
}

// One block's extra keys of 8,007 bytes packed: two keys of 4,000 (within the limit of 8 KiB).
std::vector<uint8_t> KeyedEntry() {
  return PackedArray({[](msgpack::packer<msgpack::sbuffer>& pk) {
    pk.pack_array(2);
    for (int i = 0; i < 2; ++i) pk.pack(std::string(4000, 'k'));
  }});
}

// A block's extra keys are up to 8 KiB: the buffer is bounded in bytes too, each tenant's
// share of them as of its events (a flood of keyed blocks once grew kvtierd by 1 GB in 3 s).
TEST(KvEvents, ATenantsKeyedBlocksTakeAtMostItsShareOfTheBuffersBytes) {
  KvEventsOptions o = LoopbackOptions();
  o.token_ids = true;
  o.queue_bytes = 256 * 1024;
  o.message_bytes = 1 << 20;             // one BlockStored of them all
  o.flush_interval_ns = 60'000'000'000;  // nothing is sent during the test
  auto events = KvEvents::Open(o);
  ASSERT_TRUE(events.ok());
  KvEvents& e = **events;
  Attach(e, "ns-a", "a", "m", 16);
  Attach(e, "ns-b", "b", "m", 16);
  auto split = SplitExtraKeys(KeyedEntry(), 1);
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  const StoredKeys keys{.extra = *split};
  const auto flood = HashChain(16, 100);
  for (size_t i = 0; i < flood.size(); ++i)
    e.Stored("ns-a", TierKind::kHost, flood[i], i ? flood[i - 1] : BlockHash(), keys);
  // One event (a chain joins its BlockStored) of as many blocks as a's half holds.
  const uint64_t per_block = sizeof(uint64_t) + (*split)[0].size();
  const uint64_t held = (o.queue_bytes / 2 - sizeof(KvEvent)) / per_block;
  ASSERT_LT(held, 20u);
  EXPECT_EQ(e.counters().dropped, flood.size() - held);
  const auto other = HashChain(17, 10);
  for (size_t i = 0; i < other.size(); ++i)
    e.Stored("ns-b", TierKind::kHost, other[i], i ? other[i - 1] : BlockHash(), keys);
  EXPECT_EQ(e.counters().dropped, flood.size() - held) << "b's blocks were dropped for a's";
}

// The replay ring keeps at most replay_bytes of messages: the oldest go first.
TEST(KvEvents, TheReplayRingKeepsAtMostItsBytesNewestFirst) {
  KvEventsOptions o = LoopbackOptions();
  o.token_ids = true;
  o.replay_bytes = 64 * 1024;
  auto events = KvEvents::Open(o);
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  auto split = SplitExtraKeys(KeyedEntry(), 1);
  ASSERT_TRUE(split.ok());
  const StoredKeys keys{.extra = *split};
  // 5 messages of 3 keyed blocks (about 24 KiB each): 2 fit in 64 KiB.
  for (int m = 0; m < 5; ++m) {
    const std::string ns = "ns" + std::to_string(m);
    Attach(**events, ns, "t", "m" + std::to_string(m), 16);
    const auto chain = HashChain(20 + m, 3);
    for (size_t i = 0; i < 3; ++i)
      (*events)->Stored(ns, TierKind::kHost, chain[i], i ? chain[i - 1] : BlockHash(), keys);
    const uint64_t sent = static_cast<uint64_t>(m) + 1;
    ASSERT_TRUE(testing::WaitUntil([&] { return (*events)->counters().messages == sent; }));
  }
  const uint64_t first = (*events)->counters().first_sequence;
  EXPECT_EQ(ReplayFrom((*events)->replay_endpoint(), first), (std::vector<uint64_t>{first + 3, first + 4}));
}

// A message holds at most message_bytes of hashes, tokens and keys: keyed blocks of one
// chain go out in several BlockStored, in order, none past the bound.
TEST(KvEvents, AMessageHoldsAtMostItsBytesOfKeyedBlocks) {
  KvEventsOptions o = LoopbackOptions();
  o.token_ids = true;
  o.message_bytes = 32 * 1024;  // 4 blocks of 8,015 bytes (a hash and its keys)
  o.flush_interval_ns = 200'000'000;
  auto s = Subscribe(o);
  ASSERT_NE(s, nullptr);
  Attach(*s->events, "ns", "t", "m", 16);
  auto split = SplitExtraKeys(KeyedEntry(), 1);
  ASSERT_TRUE(split.ok());
  const StoredKeys keys{.extra = *split};
  const auto chain = HashChain(30, 20);
  for (size_t i = 0; i < chain.size(); ++i) {
    s->events->Stored("ns", TierKind::kHost, chain[i], i ? chain[i - 1] : BlockHash(), keys);
  }
  std::vector<uint64_t> sent;
  size_t messages = 0;
  for (const Message& m : Receive(s->sub, chain.size())) {
    ++messages;
    EXPECT_LE(m.payload_bytes, o.message_bytes + 1024) << "the encoding adds names and headers, not blocks";
    for (const auto& [tag, hashes] : m.events) sent.insert(sent.end(), hashes.begin(), hashes.end());
  }
  std::vector<uint64_t> want;
  for (const BlockHash& h : chain) want.push_back(EventHash(h));
  EXPECT_EQ(sent, want);
  EXPECT_EQ(messages, 5u);
}

}  // namespace
}  // namespace kvtier
