#pragma once
// What the KvEvents tests share (kv_events_test.cc, kv_events_bounds_test.cc): a loopback
// publisher, SUB sockets that have joined it, its messages and replays decoded with
// msgpack-cxx as a router decodes them, and packed extra keys.

#define MSGPACK_NO_BOOST 1
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <msgpack.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "daemon/events/kv_events.h"
#include "tests/support/test_util.h"

namespace kvtier::testing {

// AddNamespace, expected to succeed; its link.
inline uint64_t Attach(KvEvents& events, std::string_view ns, std::string_view tenant, std::string_view model,
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
inline std::vector<uint64_t> Hashes(const msgpack::object& list, bool* negative) {
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

inline Message Decode(std::vector<zmq::message_t>& parts) {
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
inline std::vector<Message> Receive(zmq::socket_t& sub, size_t n,
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

inline KvEventsOptions LoopbackOptions() {
  KvEventsOptions o;
  o.publish = "tcp://127.0.0.1:*";
  o.replay = "tcp://127.0.0.1:*";
  o.hostname = "node1";
  o.flush_interval_ns = 5'000'000;
  return o;
}

// A SUB socket that has joined: ZMQ drops what is published before a subscription lands,
// so wait until a block of a probe namespace arrives.
inline void Join(KvEvents& events, zmq::socket_t& sub) {
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

inline std::unique_ptr<Subscribed> Subscribe(const KvEventsOptions& options = LoopbackOptions()) {
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

// One msgpack array of `entries` (already packed objects).
inline std::vector<uint8_t> PackedArray(
    std::initializer_list<std::function<void(msgpack::packer<msgpack::sbuffer>&)>> entries) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(static_cast<uint32_t>(entries.size()));
  for (const auto& e : entries) e(pk);
  return std::vector<uint8_t>(buf.data(), buf.data() + buf.size());
}

// The sequences the replay socket resends from `start` (through its end mark).
inline std::vector<uint64_t> ReplayFrom(const std::string& endpoint, uint64_t start) {
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

}  // namespace kvtier::testing
