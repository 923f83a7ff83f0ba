// KV events' wire form (daemon/events/kv_event_wire.cc): hashes as vLLM and SGLang send
// them, topics, and batches in vLLM's tagged and positional encodings, decoded with
// msgpack-cxx. The publisher: kv_events_test.cc.
#include <gtest/gtest.h>

#define MSGPACK_NO_BOOST 1
#include <map>
#include <memory>
#include <msgpack.hpp>
#include <string>
#include <vector>

#include "daemon/events/kv_events.h"
#include "tests/support/test_util.h"

namespace kvtier {
namespace {

using testing::BigEndian;
using testing::HashChain;

TEST(KvEvents, AHashIsItsLastEightBytesBigEndian) {
  for (size_t size : {16u, 32u}) {
    const BlockHash h = HashChain(7, 1, size)[0];
    EXPECT_EQ(EventHash(h), BigEndian(h.bytes().data() + size - 8));
    EXPECT_EQ(EventHash(h, EventHashForm::kVllm), EventHash(h));
  }
}

// SGLang's hash_str_to_int64: the first 16 hex digits of the page's SHA-256 hex string.
TEST(KvEvents, InSglangsFormAHashIsItsFirstEightBytesBigEndian) {
  const BlockHash h = HashChain(8, 1, 32)[0];
  EXPECT_EQ(EventHash(h, EventHashForm::kSglang), BigEndian(h.bytes().data()));
  EXPECT_NE(EventHash(h, EventHashForm::kSglang), EventHash(h));
}

TEST(KvEvents, TopicsNameEngineHostModelAndTenant) {
  EXPECT_EQ(ExpandTopic("kv@{engine}@{model}", "10.0.0.5:8000", "node1", "llama3-8b", "t"),
            "kv@10.0.0.5:8000@llama3-8b");
  EXPECT_EQ(ExpandTopic("kv@{host}@{model}", "e", "node1", "llama3-8b", "t"), "kv@node1@llama3-8b");
  EXPECT_EQ(ExpandTopic("{tenant}/{model}/{x}", "e", "h", "m", "acme"), "acme/m/{x}");
}
std::vector<KvEvent> TwoEvents() {
  std::vector<KvEvent> events(2);
  events[0].kind = KvEvent::Kind::kStored;
  events[0].hashes = {1, 0xfedcba9876543210ull};
  events[0].parent = 42;
  events[0].block_size = 16;
  events[0].tier = TierKind::kNvme;
  events[1].kind = KvEvent::Kind::kRemoved;
  events[1].hashes = {5};
  events[1].tier = TierKind::kGpu;
  return events;
}

// The batch [ts, events, nil]: positional in both encodings.
const msgpack::object& EventList(const msgpack::object& batch) {
  EXPECT_EQ(batch.type, msgpack::type::ARRAY);
  EXPECT_EQ(batch.via.array.size, 3u);
  EXPECT_EQ(batch.via.array.ptr[0].as<double>(), 1700000000.25);
  EXPECT_TRUE(batch.via.array.ptr[2].is_nil());
  return batch.via.array.ptr[1];
}

// A tagged batch's events as maps by field name (payload and handle keep their memory).
struct TaggedEvents {
  std::string payload;
  msgpack::object_handle oh;
  std::vector<std::map<std::string, msgpack::object>> maps;
};
std::unique_ptr<TaggedEvents> DecodeTagged(const std::vector<KvEvent>& events) {
  auto t = std::make_unique<TaggedEvents>();
  t->payload = EncodeEventBatch(1700000000.25, events, KvEventEncoding::kTagged);
  t->oh = msgpack::unpack(t->payload.data(), t->payload.size());
  const msgpack::object& list = EventList(t->oh.get());
  for (uint32_t i = 0; i < list.via.array.size; ++i) list.via.array.ptr[i].convert(t->maps.emplace_back());
  return t;
}

TEST(KvEvents, TaggedEventsAreMapsNamedByFieldAsCurrentVllmWritesThem) {
  auto t = DecodeTagged(TwoEvents());
  ASSERT_EQ(t->maps.size(), 2u);
  auto& stored = t->maps[0];
  auto& removed = t->maps[1];
  EXPECT_EQ(stored.size(), 8u);
  EXPECT_EQ(stored["type"].as<std::string>(), "BlockStored");
  EXPECT_EQ(stored["block_hashes"].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{1, 0xfedcba9876543210ull}));
  EXPECT_EQ(stored["parent_block_hash"].as<uint64_t>(), 42u);
  EXPECT_EQ(stored["token_ids"].via.array.size, 0u);
  EXPECT_EQ(stored["block_size"].as<uint32_t>(), 16u);
  EXPECT_TRUE(stored["lora_id"].is_nil());
  EXPECT_EQ(stored["medium"].as<std::string>(), "CPU_TIER2");
  EXPECT_TRUE(stored["lora_name"].is_nil());
  EXPECT_EQ(removed.size(), 3u);
  EXPECT_EQ(removed["type"].as<std::string>(), "BlockRemoved");
  EXPECT_EQ(removed["block_hashes"].as<std::vector<uint64_t>>(), std::vector<uint64_t>{5});
  EXPECT_EQ(removed["medium"].as<std::string>(), "GPU");
}

TEST(KvEvents, PositionalEventsAreArraysAsOlderVllmWritesThem) {
  const std::string payload = EncodeEventBatch(1700000000.25, TwoEvents(), KvEventEncoding::kPositional);
  msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& list = EventList(oh.get());
  ASSERT_EQ(list.via.array.size, 2u);
  ASSERT_EQ(list.via.array.ptr[0].via.array.size, 8u);
  const msgpack::object* stored = list.via.array.ptr[0].via.array.ptr;
  EXPECT_EQ(stored[0].as<std::string>(), "BlockStored");
  EXPECT_EQ(stored[1].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{1, 0xfedcba9876543210ull}));
  EXPECT_EQ(stored[2].as<uint64_t>(), 42u);
  EXPECT_EQ(stored[3].via.array.size, 0u);
  EXPECT_EQ(stored[4].as<uint32_t>(), 16u);
  EXPECT_TRUE(stored[5].is_nil());
  EXPECT_EQ(stored[6].as<std::string>(), "CPU_TIER2");
  EXPECT_TRUE(stored[7].is_nil());
  ASSERT_EQ(list.via.array.ptr[1].via.array.size, 3u);
  const msgpack::object* removed = list.via.array.ptr[1].via.array.ptr;
  EXPECT_EQ(removed[0].as<std::string>(), "BlockRemoved");
  EXPECT_EQ(removed[1].as<std::vector<uint64_t>>(), std::vector<uint64_t>{5});
  EXPECT_EQ(removed[2].as<std::string>(), "GPU");
}

// A namespace whose engine named its KV cache group (a hybrid model's sliding-window
// group): BlockStored carries group_idx, kv_cache_spec_kind and the window, BlockRemoved
// group_idx, as vLLM 0.32's own; the positional form (older vLLM) never has them.
TEST(KvEvents, TaggedEventsOfANamedGroupCarryItAsVllmDoes) {
  std::vector<KvEvent> events = TwoEvents();
  for (KvEvent& e : events) e.group = EventGroup{.index = 2, .kind = "sliding_window", .sliding_window = 128};
  auto t = DecodeTagged(events);
  ASSERT_EQ(t->maps.size(), 2u);
  auto& stored = t->maps[0];
  auto& removed = t->maps[1];
  EXPECT_EQ(stored.size(), 11u);
  EXPECT_EQ(stored["group_idx"].as<int>(), 2);
  EXPECT_EQ(stored["kv_cache_spec_kind"].as<std::string>(), "sliding_window");
  EXPECT_EQ(stored["kv_cache_spec_sliding_window"].as<uint32_t>(), 128u);
  EXPECT_EQ(removed.size(), 4u);
  EXPECT_EQ(removed["group_idx"].as<int>(), 2);
  // A group without a window or kind: only what was said.
  events[0].group = EventGroup{.index = 0};
  auto plain = DecodeTagged(events);
  EXPECT_EQ(plain->maps[0].size(), 9u);
  EXPECT_EQ(plain->maps[0]["group_idx"].as<int>(), 0);
  const std::string positional = EncodeEventBatch(1700000000.25, events, KvEventEncoding::kPositional);
  msgpack::object_handle oh = msgpack::unpack(positional.data(), positional.size());
  EXPECT_EQ(EventList(oh.get()).via.array.ptr[0].via.array.size, 8u);
  EXPECT_EQ(EventList(oh.get()).via.array.ptr[1].via.array.size, 3u);
}

TEST(KvEvents, OnlyVllmsSpecKindsAreAccepted) {
  for (std::string_view k : kEventSpecKinds) EXPECT_EQ(EventSpecKind(std::string(k)), k);
  EXPECT_FALSE(EventSpecKind("Sliding_Window"));
  EXPECT_FALSE(EventSpecKind(""));
}

}  // namespace
}  // namespace kvtier
