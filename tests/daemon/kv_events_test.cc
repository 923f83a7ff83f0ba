// KvEvents: the publisher over real ZMQ sockets, its messages decoded with msgpack-cxx (with
// Python as llm-d decodes them in tests/integration/events_test.cc); its streams and owners.
// Its bounds: kv_events_bounds_test.cc; the encoding alone: kv_event_wire_test.cc.
#include "daemon/events/kv_events.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>
#include <zmq.hpp>

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

}  // namespace
}  // namespace kvtier
