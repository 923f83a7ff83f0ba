// KvEvents: the publisher over real ZMQ sockets, its messages decoded with msgpack-cxx (with
// Python as llm-d decodes them in tests/integration/events_test.cc); its bounds and owners.
// The encoding alone: kv_event_wire_test.cc.
#include "daemon/events/kv_events.h"

#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MSGPACK_NO_BOOST 1
#include <array>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <msgpack.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>
#include <zmq.hpp>

#include "tests/support/test_util.h"

namespace kvtier {
namespace {

using testing::BigEndian;
using testing::HashChain;
using testing::TempDir;

// AddNamespace, expected to succeed; its link.
uint64_t Attach(KvEvents& events, std::string_view ns, std::string_view tenant, std::string_view model,
                uint32_t tokens_per_block, const EventSource& source = {}) {
  auto link = events.AddNamespace(ns, tenant, model, tokens_per_block, source);
  EXPECT_TRUE(link.ok()) << link.status().ToString();
  return link.ok() ? *link : 0;
}

struct Message {
  std::string topic;
  uint64_t seq = 0;
  std::vector<std::pair<std::string, std::vector<uint64_t>>> events;  // tag, hashes
  std::vector<std::vector<uint32_t>> tokens;                          // per event
  std::vector<int> groups;                                            // per event: group_idx, -1 when absent
  std::vector<std::string> extra;   // per event: extra_keys as msgpack-c prints it, "" when absent
  std::vector<std::string> lora;    // per event: "lora_name/lora_id" as msgpack-c prints them
  std::optional<uint32_t> dp_rank;  // the batch's
  bool negative_hashes = false;     // some hash was sent as a negative integer
  size_t payload_bytes = 0;
};

// Hashes as their 64-bit patterns, whether sent unsigned or (SGLang's form) signed.
std::vector<uint64_t> Hashes(const msgpack::object& list, bool* negative) {
  std::vector<uint64_t> out;
  for (uint32_t i = 0; i < list.via.array.size; ++i) {
    const msgpack::object& o = list.via.array.ptr[i];
    if (o.type == msgpack::type::NEGATIVE_INTEGER) {
      *negative = true;
      out.push_back(static_cast<uint64_t>(o.via.i64));
    } else {
      out.push_back(o.as<uint64_t>());
    }
  }
  return out;
}

Message Decode(std::vector<zmq::message_t>& parts) {
  Message m;
  m.topic = parts[0].to_string();
  m.seq = BigEndian(static_cast<const uint8_t*>(parts[1].data()));
  m.payload_bytes = parts[2].size();
  msgpack::object_handle oh = msgpack::unpack(static_cast<const char*>(parts[2].data()), parts[2].size());
  const msgpack::object& list = oh.get().via.array.ptr[1];
  if (!oh.get().via.array.ptr[2].is_nil()) m.dp_rank = oh.get().via.array.ptr[2].as<uint32_t>();
  for (uint32_t i = 0; i < list.via.array.size; ++i) {  // tagged: maps
    std::map<std::string, msgpack::object> e;
    list.via.array.ptr[i].convert(e);
    m.events.emplace_back(e["type"].as<std::string>(), Hashes(e["block_hashes"], &m.negative_hashes));
    m.tokens.push_back(e.count("token_ids") ? e["token_ids"].as<std::vector<uint32_t>>() : std::vector<uint32_t>());
    m.groups.push_back(e.count("group_idx") ? e["group_idx"].as<int>() : -1);
    std::ostringstream extra, lora;
    if (e.count("extra_keys")) extra << e["extra_keys"];
    if (e.count("lora_name")) lora << e["lora_name"] << "/" << e["lora_id"];
    m.extra.push_back(extra.str());
    m.lora.push_back(lora.str());
  }
  return m;
}

// Messages received until `n` hashes or `wait`; the probes
// of Join are skipped.
std::vector<Message> Receive(zmq::socket_t& sub, size_t n,
                             std::chrono::milliseconds wait = std::chrono::milliseconds(5000),
                             bool* saw_probe = nullptr) {
  std::vector<Message> out;
  size_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (got < n && std::chrono::steady_clock::now() < deadline) {
    std::vector<zmq::message_t> parts;
    zmq::message_t m;
    if (!sub.recv(m, zmq::recv_flags::dontwait)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    parts.push_back(std::move(m));
    while (parts.back().more()) {
      zmq::message_t more;
      (void)sub.recv(more);
      parts.push_back(std::move(more));
    }
    EXPECT_EQ(parts.size(), 3u);
    EXPECT_EQ(parts[1].size(), 8u);
    out.push_back(Decode(parts));
    if (out.back().topic.find("@probe") != std::string::npos) {
      out.pop_back();
      if (saw_probe) *saw_probe = true;
      if (saw_probe) break;
      continue;
    }
    for (const auto& [tag, hashes] : out.back().events) got += hashes.size();
  }
  return out;
}

KvEventsOptions LoopbackOptions() {
  KvEventsOptions o;
  o.publish = "tcp://127.0.0.1:*";
  o.replay = "tcp://127.0.0.1:*";
  o.hostname = "node1";
  o.flush_interval_ns = 5'000'000;
  return o;
}

// A SUB socket that has joined: ZMQ drops what is published before a subscription lands,
// so wait until a block of a probe namespace arrives.
void Join(KvEvents& events, zmq::socket_t& sub) {
  const BlockHash probe = HashChain(77, 1)[0];
  for (int i = 0; i < 200; ++i) {
    const std::string ns = "probe" + std::to_string(i);
    Attach(events, ns, "probe-tenant", "probe", 16);  // one topic, however many tries
    events.Stored(ns, TierKind::kHost, probe, BlockHash());
    bool joined = false;
    (void)Receive(sub, 1, std::chrono::milliseconds(50), &joined);
    if (joined) return;
  }
  FAIL() << "the subscriber never joined";
}

// A loopback publisher and a SUB socket to every topic that has joined it.
struct Subscribed {
  std::unique_ptr<KvEvents> events;
  zmq::context_t ctx;
  zmq::socket_t sub{ctx, zmq::socket_type::sub};
};

std::unique_ptr<Subscribed> Subscribe(const KvEventsOptions& options = LoopbackOptions()) {
  auto events = KvEvents::Open(options);
  EXPECT_TRUE(events.ok()) << events.status().ToString();
  if (!events.ok()) return nullptr;
  auto s = std::make_unique<Subscribed>();
  s->events = std::move(*events);
  s->sub.set(zmq::sockopt::subscribe, "");
  s->sub.connect(s->events->publish_endpoint());
  Join(*s->events, s->sub);
  return s;
}

TEST(KvEvents, AChainIsOneBlockStoredAndSequencesAreConsecutive) {
  auto s = Subscribe();
  ASSERT_NE(s, nullptr);
  KvEvents* events = s->events.get();
  zmq::socket_t& sub = s->sub;
  const auto chain = HashChain(3, 4);
  Attach(*events, "ns", "t", "llama3-8b", 16);
  events->Stored("ns", TierKind::kHost, chain[0], BlockHash());
  for (size_t i = 1; i < chain.size(); ++i) events->Stored("ns", TierKind::kHost, chain[i], chain[i - 1]);
  events->Removed("ns", TierKind::kHost, chain[3]);
  events->Removed("ns", TierKind::kHost, chain[2]);
  events->Stored("unknown-ns", TierKind::kHost, chain[0], BlockHash());  // never published
  std::vector<Message> got = Receive(sub, 4 + 2);
  ASSERT_FALSE(got.empty());
  std::vector<std::pair<std::string, std::vector<uint64_t>>> all;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].topic, "kv@node1@llama3-8b");
    if (i > 0) {
      EXPECT_EQ(got[i].seq, got[i - 1].seq + 1);
    }
    all.insert(all.end(), got[i].events.begin(), got[i].events.end());
  }
  // No AllBlocksCleared for the new topic: it would wipe what the engine published there.
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].first, "BlockStored");
  std::vector<uint64_t> want;
  for (const BlockHash& h : chain) want.push_back(EventHash(h));
  EXPECT_EQ(all[0].second, want);
  EXPECT_EQ(all[1].first, "BlockRemoved");
  EXPECT_EQ(all[1].second, (std::vector<uint64_t>{want[3], want[2]}));
  for (const Message& m : Receive(sub, 1, std::chrono::milliseconds(200))) {
    EXPECT_TRUE(m.events.empty()) << "an event of an unknown namespace was published: " << m.topic;
  }
}

// Sequence numbers start at the start time in microseconds, so they keep increasing
// across restarts.
TEST(KvEvents, SequencesStartAtTheStartTimeSoTheyIncreaseAcrossRestarts) {
  auto now_us = [] {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
  };
  const uint64_t before = now_us();
  auto s = Subscribe();
  ASSERT_NE(s, nullptr);
  const uint64_t first = s->events->counters().first_sequence;
  EXPECT_GE(first, before);
  EXPECT_LE(first, now_us());
  Attach(*s->events, "ns", "t", "m", 16);
  s->events->Stored("ns", TierKind::kHost, HashChain(1, 1)[0], BlockHash());
  auto got = Receive(s->sub, 1);
  ASSERT_FALSE(got.empty());
  EXPECT_GT(got[0].seq, first);  // after the probes of Join
  s.reset();
  auto again = KvEvents::Open(LoopbackOptions());
  ASSERT_TRUE(again.ok());
  EXPECT_GT((*again)->counters().first_sequence, got[0].seq);
}

// What a run announced is removed by the next one (its host tier did not survive), except
// what the new run announced again by then.
TEST(KvEvents, TheNextRunRemovesWhatTheLastAnnounced) {
  testing::TempDir dir;
  KvEventsOptions o = LoopbackOptions();
  o.state_path = dir.File("announced.json");
  const auto chain = HashChain(5, 4);
  {
    auto e = KvEvents::Open(o);
    ASSERT_TRUE(e.ok());
    Attach(**e, "ns", "t", "llama", 16, EventSource{"10.0.0.1:8000", 2});
    (*e)->Stored("ns", TierKind::kHost, chain[0], BlockHash());
    for (size_t i = 1; i < chain.size(); ++i) (*e)->Stored("ns", TierKind::kHost, chain[i], chain[i - 1]);
    (*e)->Stored("ns", TierKind::kNvme, chain[0], BlockHash());
    (*e)->Removed("ns", TierKind::kHost, chain[3]);
  }  // the state is written when the publisher stops
  ASSERT_TRUE(std::filesystem::exists(o.state_path));
  auto e = KvEvents::Open(o);
  ASSERT_TRUE(e.ok());
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv@10.0.0.1:8000@llama");
  sub.connect((*e)->publish_endpoint());
  // The new run announces chain[1] in host again before the retraction is due.
  Attach(**e, "ns", "t", "llama", 16, EventSource{"10.0.0.1:8000", 2});
  (*e)->Stored("ns", TierKind::kHost, chain[1], chain[0]);
  std::map<std::pair<std::string, std::string>, std::vector<uint64_t>> seen;  // (type, medium)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*e)->counters().retracted == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ((*e)->counters().retracted, 3u);  // chain[0], chain[2] in host; chain[0] on NVMe
  for (const Message& m : Receive(sub, 4, std::chrono::milliseconds(2000))) {
    EXPECT_EQ(m.dp_rank, std::optional<uint32_t>(2));
    for (const auto& [tag, hashes] : m.events) {
      auto& v = seen[{tag, ""}];
      v.insert(v.end(), hashes.begin(), hashes.end());
    }
  }
  std::vector<uint64_t> removed = seen[{"BlockRemoved", ""}];
  std::sort(removed.begin(), removed.end());
  std::vector<uint64_t> want = {EventHash(chain[0]), EventHash(chain[0]), EventHash(chain[2])};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(removed, want);
}

// A hybrid model's groups are namespaces of one engine topic: the removals of what they
// announced — by the next run, and when the topic ends — name the group each block was
// stored in, as vLLM's own BlockRemoved does, so a router drops the right group's entry.
TEST(KvEvents, RetractionsNameTheGroupTheirBlocksWereStoredIn) {
  testing::TempDir dir;
  KvEventsOptions o = LoopbackOptions();
  o.state_path = dir.File("announced.json");
  o.topic_linger_ns = 200'000'000;
  const auto full = HashChain(31, 3), window = HashChain(32, 2);
  auto source = [](int32_t group) {
    EventSource s{.routable_id = "10.0.0.9:8000"};
    s.group = EventGroup{.index = group,
                         .kind = group == 0 ? "full_attention" : "sliding_window",
                         .sliding_window = group == 0 ? 0u : 128u};
    return s;
  };
  auto store = [](KvEvents& e, const std::string& ns, const std::vector<BlockHash>& chain) {
    e.Stored(ns, TierKind::kHost, chain[0], BlockHash());
    for (size_t i = 1; i < chain.size(); ++i) e.Stored(ns, TierKind::kHost, chain[i], chain[i - 1]);
  };
  // Group index -> the hashes removed under it.
  auto removals = [](const std::vector<Message>& messages) {
    std::map<int, std::vector<uint64_t>> by_group;
    for (const Message& m : messages) {
      for (size_t i = 0; i < m.events.size(); ++i) {
        EXPECT_EQ(m.events[i].first, "BlockRemoved");
        auto& v = by_group[m.groups[i]];
        v.insert(v.end(), m.events[i].second.begin(), m.events[i].second.end());
      }
    }
    for (auto& [g, v] : by_group) std::sort(v.begin(), v.end());
    return by_group;
  };
  auto hashes = [](const std::vector<BlockHash>& chain) {
    std::vector<uint64_t> v;
    for (const BlockHash& h : chain) v.push_back(EventHash(h));
    std::sort(v.begin(), v.end());
    return v;
  };
  const std::map<int, std::vector<uint64_t>> want = {{0, hashes(full)}, {1, hashes(window)}};
  {
    auto e = KvEvents::Open(o);
    ASSERT_TRUE(e.ok());
    Attach(**e, "ns-full", "t", "gemma", 16, source(0));
    Attach(**e, "ns-window", "t", "gemma", 16, source(1));
    store(**e, "ns-full", full);
    store(**e, "ns-window", window);
  }  // the state is written when the publisher stops
  {
    // The next run retracts what the last one announced, each hash under its group.
    auto s = Subscribe(o);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(testing::WaitUntil([&] { return s->events->counters().retracted == 5; }, std::chrono::seconds(10)));
    EXPECT_EQ(removals(Receive(s->sub, full.size() + window.size())), want);
    // Within a run: a topic that ends retracts under each group too.
    const uint64_t a = Attach(*s->events, "ns-full", "t", "gemma", 16, source(0));
    const uint64_t b = Attach(*s->events, "ns-window", "t", "gemma", 16, source(1));
    store(*s->events, "ns-full", full);
    store(*s->events, "ns-window", window);
    (void)Receive(s->sub, full.size() + window.size());  // their BlockStored
    const uint64_t ended = s->events->counters().topics_removed;
    s->events->RemoveNamespace(a);
    s->events->RemoveNamespace(b);
    ASSERT_TRUE(testing::WaitUntil([&] { return s->events->counters().topics_removed == ended + 1; }));
    EXPECT_EQ(removals(Receive(s->sub, full.size() + window.size())), want);
  }
}

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

TEST(KvEvents, ANamespacesBlocksGoToTheTopicOfEveryEngineAttachedToIt) {
  auto s = Subscribe();
  ASSERT_NE(s, nullptr);
  KvEvents* events = s->events.get();
  zmq::socket_t& sub = s->sub;
  const auto chain = HashChain(5, 2);
  // Two engines serving one model on this node, one that declared no identity, and
  // another model: the connectors' model ids carry layout facts after a '|'.
  Attach(*events, "ns", "t", "llama|HNC|tp0of1|pp0of1", 16, {.routable_id = "10.0.0.5:8000"});
  Attach(*events, "ns", "t", "llama|HNC|tp0of1|pp0of1", 16, {.routable_id = "10.0.0.6:8000"});
  Attach(*events, "ns", "t", "llama|HNC|tp0of1|pp0of1", 16, {.routable_id = "10.0.0.6:8000"});  // again: no change
  Attach(*events, "ns", "t", "llama|HNC|tp0of1|pp0of1", 16);
  Attach(*events, "other", "t", "qwen", 16, {.routable_id = "10.0.0.7:8000"});
  events->Stored("ns", TierKind::kHost, chain[0], BlockHash());
  events->Removed("ns", TierKind::kHost, chain[0]);
  events->Stored("other", TierKind::kHost, chain[1], BlockHash());
  std::map<std::string, std::vector<std::string>> by_topic;
  for (const Message& m : Receive(sub, 3 * 2 + 1)) {
    for (const auto& [tag, hashes] : m.events) by_topic[m.topic].push_back(tag);
  }
  const std::vector<std::string> both = {"BlockStored", "BlockRemoved"};
  EXPECT_EQ(by_topic, (std::map<std::string, std::vector<std::string>>{{"kv@10.0.0.5:8000@llama", both},
                                                                       {"kv@10.0.0.6:8000@llama", both},
                                                                       {"kv@node1@llama", both},
                                                                       {"kv@10.0.0.7:8000@qwen", {"BlockStored"}}}));
}

TEST(KvEvents, AnEnginesDataParallelRankRidesOnItsTopicsBatches) {
  auto s = Subscribe();
  ASSERT_NE(s, nullptr);
  const auto chain = HashChain(6, 2);
  // Two DP ranks behind one API server: one topic name, a batch per rank.
  Attach(*s->events, "rank0", "t", "m", 16, {.routable_id = "10.0.0.8:8000", .dp_rank = 0});
  Attach(*s->events, "rank1", "t", "m", 16, {.routable_id = "10.0.0.8:8000", .dp_rank = 1});
  s->events->Stored("rank0", TierKind::kHost, chain[0], BlockHash());
  s->events->Stored("rank1", TierKind::kHost, chain[1], BlockHash());
  std::map<uint32_t, std::pair<std::string, uint64_t>> by_rank;  // rank -> topic, hash
  for (const Message& m : Receive(s->sub, 2)) {
    ASSERT_TRUE(m.dp_rank.has_value()) << m.topic;
    by_rank[*m.dp_rank] = {m.topic, m.events.at(0).second.at(0)};
  }
  EXPECT_EQ(by_rank,
            (std::map<uint32_t, std::pair<std::string, uint64_t>>{{0, {"kv@10.0.0.8:8000@m", EventHash(chain[0])}},
                                                                  {1, {"kv@10.0.0.8:8000@m", EventHash(chain[1])}}}));
}

// An SGLang engine's namespace is announced with SGLang's ids (signed, from the first 8
// bytes), its sidecar pools' namespaces (form kNone) not at all.
TEST(KvEvents, ANamespacesHashFormIsTheFirstAttachersAndNoneAnnouncesNothing) {
  auto s = Subscribe();
  ASSERT_NE(s, nullptr);
  std::array<uint8_t, 32> top{};
  top.fill(0xf1);  // the top bit set: a negative int64 in SGLang's form
  const BlockHash page(top), next = HashChain(9, 1, 32)[0];
  Attach(*s->events, "kv", "t", "sglang:qwen", 16, {.routable_id = "10.0.0.9:30000", .hashes = EventHashForm::kSglang});
  Attach(*s->events, "kv", "t", "sglang:qwen", 16, {.routable_id = "10.0.0.10:30000"});  // form stays SGLang's
  Attach(*s->events, "draft", "t", "sglang:qwen", 16,
         {.routable_id = "10.0.0.9:30000", .hashes = EventHashForm::kNone});
  s->events->Stored("draft", TierKind::kHost, next, BlockHash());
  s->events->Stored("kv", TierKind::kHost, page, BlockHash());
  s->events->Stored("kv", TierKind::kHost, next, page);
  std::map<std::string, std::vector<uint64_t>> by_topic;
  bool negative = false;
  for (const Message& m : Receive(s->sub, 2 * 2)) {
    negative |= m.negative_hashes;
    for (const auto& [tag, hashes] : m.events) {
      by_topic[m.topic].insert(by_topic[m.topic].end(), hashes.begin(), hashes.end());
    }
  }
  const std::vector<uint64_t> want = {EventHash(page, EventHashForm::kSglang), EventHash(next, EventHashForm::kSglang)};
  EXPECT_EQ(by_topic, (std::map<std::string, std::vector<uint64_t>>{{"kv@10.0.0.9:30000@sglang:qwen", want},
                                                                    {"kv@10.0.0.10:30000@sglang:qwen", want}}));
  EXPECT_TRUE(negative) << "a hash with its top bit set must go as a negative integer, as SGLang sends it";
}

// Tokens are a tenant's prompt: sent only when events.token_ids says so.
TEST(KvEvents, WithoutTokenIdsOnABlockStoredCarriesNoTokens) {
  auto s = Subscribe();
  ASSERT_NE(s, nullptr);
  const auto chain = HashChain(4, 2);
  Attach(*s->events, "ns", "t", "m", 4);
  s->events->Stored("ns", TierKind::kHost, chain[0], BlockHash(), {.tokens = std::vector<uint32_t>{1, 2, 3, 4}});
  s->events->Stored("ns", TierKind::kHost, chain[1], chain[0], {.tokens = std::vector<uint32_t>{5, 6, 7, 8}});
  std::vector<Message> got = Receive(s->sub, 1);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].events.size(), 1u);
  EXPECT_EQ(got[0].events[0].second.size(), 2u);
  EXPECT_TRUE(got[0].tokens[0].empty());
}

TEST(KvEvents, ABlocksTokensGoWithItsBlockStoredAndOnlyWholeBlocksOfThem) {
  KvEventsOptions o = LoopbackOptions();
  o.token_ids = true;
  auto s = Subscribe(o);
  ASSERT_NE(s, nullptr);
  KvEvents* events = s->events.get();
  zmq::socket_t& sub = s->sub;
  const auto chain = HashChain(4, 4);
  const std::vector<uint32_t> t0 = {1, 2, 3, 4}, t1 = {5, 6, 7, 8}, short_one = {9, 9};
  Attach(*events, "ns", "t", "m", 4);
  events->Stored("ns", TierKind::kHost, chain[0], BlockHash(), {.tokens = t0});
  events->Stored("ns", TierKind::kHost, chain[1], chain[0], {.tokens = t1});         // joins: both have tokens
  events->Stored("ns", TierKind::kHost, chain[2], chain[1]);                         // none: its own event
  events->Stored("ns", TierKind::kHost, chain[3], chain[2], {.tokens = short_one});  // not a block's worth: none
  std::vector<std::pair<size_t, std::vector<uint32_t>>> got;                         // hashes, tokens per BlockStored
  for (const Message& m : Receive(sub, 4)) {
    for (size_t i = 0; i < m.events.size(); ++i) got.emplace_back(m.events[i].second.size(), m.tokens[i]);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], (std::pair<size_t, std::vector<uint32_t>>{2, {1, 2, 3, 4, 5, 6, 7, 8}}));
  EXPECT_EQ(got[1], (std::pair<size_t, std::vector<uint32_t>>{2, {}}));
}

// One msgpack array of `entries` (already packed objects).
std::vector<uint8_t> PackedArray(
    std::initializer_list<std::function<void(msgpack::packer<msgpack::sbuffer>&)>> entries) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(static_cast<uint32_t>(entries.size()));
  for (const auto& e : entries) e(pk);
  return std::vector<uint8_t>(buf.data(), buf.data() + buf.size());
}

// What else vLLM hashed a block from (a cache salt, an image's id and offset) goes with its
// BlockStored, one entry per hash, only where tokens may go; the LoRA adapter always.
TEST(KvEvents, ABlocksExtraKeysAndLoraAdapterGoWithItsBlockStoredAsVllmSendsThem) {
  auto salted = [](msgpack::packer<msgpack::sbuffer>& pk) {
    pk.pack_array(2);
    pk.pack(std::string("salt-1"));
    pk.pack_array(2);
    pk.pack(std::string("img-7"));
    pk.pack(3);
  };
  auto none = [](msgpack::packer<msgpack::sbuffer>& pk) { pk.pack_nil(); };
  auto keys = SplitExtraKeys(PackedArray({salted, none, none}), 3);
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  const auto chain = HashChain(4, 6);
  for (bool token_ids : {true, false}) {
    KvEventsOptions o = LoopbackOptions();
    o.token_ids = token_ids;
    auto s = Subscribe(o);
    ASSERT_NE(s, nullptr);
    Attach(*s->events, "ns", "t", "m", 4);
    const StoredKeys commit{.extra = *keys, .lora_name = "adapter-a", .lora_id = 3};
    for (size_t i = 0; i < 3; ++i) {
      s->events->Stored("ns", TierKind::kHost, chain[i], i ? chain[i - 1] : BlockHash(), commit.Block(i, 3));
    }
    // Another adapter's block never joins the first adapter's BlockStored.
    s->events->Stored("ns", TierKind::kHost, chain[3], chain[2], {.lora_name = "adapter-b", .lora_id = 4});
    std::vector<std::tuple<size_t, std::string, std::string>> got;  // hashes, extra keys, lora
    for (const Message& m : Receive(s->sub, 4)) {
      for (size_t i = 0; i < m.events.size(); ++i) got.emplace_back(m.events[i].second.size(), m.extra[i], m.lora[i]);
    }
    const std::string extra = token_ids ? R"([["salt-1",["img-7",3]],null,null])" : "";
    EXPECT_EQ(got, (std::vector<std::tuple<size_t, std::string, std::string>>{{3, extra, R"("adapter-a"/3)"},
                                                                              {1, "", R"("adapter-b"/4)"}}))
        << "token_ids " << token_ids;
  }
}

TEST(KvEvents, ExtraKeysThatAreNotAnEntryPerBlockAreRefusedSayingWhy) {
  auto str = [](msgpack::packer<msgpack::sbuffer>& pk) { pk.pack(std::string("s")); };
  auto arr = [](msgpack::packer<msgpack::sbuffer>& pk) {
    pk.pack_array(1);
    pk.pack(std::string("s"));
  };
  auto map = [](msgpack::packer<msgpack::sbuffer>& pk) {
    pk.pack_array(1);
    pk.pack_map(1);
    pk.pack(1);
    pk.pack(2);
  };
  auto deep = [](msgpack::packer<msgpack::sbuffer>& pk) {
    for (int i = 0; i < 8; ++i) pk.pack_array(1);
    pk.pack_nil();
  };
  auto wide = [](msgpack::packer<msgpack::sbuffer>& pk) {  // 3 keys of 4000 bytes: each within the limits
    pk.pack_array(3);
    for (int i = 0; i < 3; ++i) pk.pack(std::string(4000, 'k'));
  };
  EXPECT_TRUE(SplitExtraKeys(PackedArray({arr, arr}), 2).ok());
  std::vector<uint8_t> trailing = PackedArray({arr});
  trailing.push_back(0xc0);
  const std::vector<uint8_t> garbage = {0xdd, 0xff, 0xff, 0xff, 0xff};  // array32 of 4G entries, none there
  for (const auto& [bytes, blocks, why] : std::vector<std::tuple<std::vector<uint8_t>, size_t, std::string>>{
           {PackedArray({arr}), 2, "one entry per page (2)"},
           {PackedArray({str}), 1, "neither nil nor an array"},
           {PackedArray({map}), 1, "within the limits"},
           {PackedArray({deep}), 1, "within the limits"},
           {PackedArray({arr, wide}), 2, "entry 1 packs to 12010 bytes (at most 8192 per block)"},
           {trailing, 1, "bytes after"},
           {garbage, 1, "within the limits"},
           {{}, 1, "within the limits"}}) {
    auto r = SplitExtraKeys(bytes, blocks);
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().ToString();
  }
}

// The sequences the replay socket resends from `start` (through its end mark).
std::vector<uint64_t> ReplayFrom(const std::string& endpoint, uint64_t start) {
  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.connect(endpoint);
  uint8_t from[8];
  for (int i = 0; i < 8; ++i) from[i] = static_cast<uint8_t>(start >> (8 * (7 - i)));
  dealer.send(zmq::const_buffer(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(from, 8), zmq::send_flags::none);
  std::vector<uint64_t> seqs;
  dealer.set(zmq::sockopt::rcvtimeo, 5000);
  for (int i = 0; i < 100; ++i) {
    std::vector<zmq::message_t> parts;
    zmq::message_t m;
    if (!dealer.recv(m)) break;
    parts.push_back(std::move(m));
    while (parts.back().more()) {
      zmq::message_t more;
      (void)dealer.recv(more);
      parts.push_back(std::move(more));
    }
    EXPECT_EQ(parts.size(), 3u);  // "", sequence, payload
    if (parts.size() != 3) break;
    const uint64_t seq = BigEndian(static_cast<const uint8_t*>(parts[1].data()));
    if (seq == ~0ull) {
      EXPECT_EQ(parts[2].size(), 0u);
      break;
    }
    seqs.push_back(seq);
  }
  return seqs;
}

TEST(KvEvents, TheReplaySocketResendsFromASequenceAndEndsWithMinusOne) {
  auto events = KvEvents::Open(LoopbackOptions());
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  const auto hashes = HashChain(5, 5);
  for (int i = 0; i < 5; ++i) {
    Attach(**events, "ns" + std::to_string(i), "t", "m" + std::to_string(i), 16);
    (*events)->Stored("ns" + std::to_string(i), TierKind::kHost, hashes[i], BlockHash());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // one message each
  }
  ASSERT_TRUE(testing::WaitUntil([&] { return (*events)->counters().messages == 5; }));
  const uint64_t first = (*events)->counters().first_sequence;
  const std::vector<uint64_t> seqs = ReplayFrom((*events)->replay_endpoint(), first + 2);
  EXPECT_EQ(seqs, (std::vector<uint64_t>{first + 2, first + 3, first + 4}));
  EXPECT_EQ((*events)->counters().replays, 1u);
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

// A topic outlives its last engine by topic_linger; then what it announced is removed and
// the namespace's blocks go nowhere (no engine can load them through it).
TEST(KvEvents, ATopicEndsAfterItsLastEngineAndRetractsWhatItAnnounced) {
  KvEventsOptions o = LoopbackOptions();
  o.topic_linger_ns = 300'000'000;
  auto s = Subscribe(o);
  ASSERT_NE(s, nullptr);
  KvEvents& events = *s->events;
  const auto chain = HashChain(12, 3);
  const EventSource engine{.routable_id = "10.0.0.20:8000"};
  const uint64_t first = Attach(events, "ns", "t", "m", 16, engine);
  const uint64_t second = Attach(events, "ns", "t", "m", 16, engine);  // a second worker, same topic
  ASSERT_NE(first, second);
  events.Stored("ns", TierKind::kHost, chain[0], BlockHash());
  for (size_t i = 1; i < chain.size(); ++i) events.Stored("ns", TierKind::kHost, chain[i], chain[i - 1]);
  ASSERT_EQ(Receive(s->sub, chain.size()).size(), 1u);
  const uint32_t topics = events.counters().topics;  // the probes' and this one
  events.RemoveNamespace(first);
  events.RemoveNamespace(second);
  // Back within the linger: nothing is retracted, the topic goes on.
  const uint64_t again = Attach(events, "ns", "t", "m", 16, engine);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(events.counters().topics_removed, 0u);
  EXPECT_TRUE(Receive(s->sub, 1, std::chrono::milliseconds(100)).empty());
  events.RemoveNamespace(again);
  ASSERT_TRUE(testing::WaitUntil([&] { return events.counters().topics_removed == 1; }));
  EXPECT_EQ(events.counters().topics, topics - 1);
  std::vector<uint64_t> removed;
  for (const Message& m : Receive(s->sub, chain.size())) {
    EXPECT_EQ(m.topic, "kv@10.0.0.20:8000@m");
    for (const auto& [tag, hashes] : m.events) {
      EXPECT_EQ(tag, "BlockRemoved");
      removed.insert(removed.end(), hashes.begin(), hashes.end());
    }
  }
  std::sort(removed.begin(), removed.end());
  std::vector<uint64_t> want;
  for (const BlockHash& h : chain) want.push_back(EventHash(h));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(removed, want);
  // The namespace has no topic left: its blocks are announced to nobody.
  events.Stored("ns", TierKind::kHost, HashChain(13, 1)[0], BlockHash());
  EXPECT_TRUE(Receive(s->sub, 1, std::chrono::milliseconds(200)).empty());
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
