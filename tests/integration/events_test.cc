// KV events from a real kvtierd, read by a Python subscriber that decodes them as llm-d's
// indexer decodes vLLM's (tests/integration/kv_event_subscriber.py, /usr/bin/python3 with
// Debian's python3-zmq and python3-msgpack).
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "engine/tools/block_pattern.h"
#include "tests/integration/engine_process.h"

namespace kvtier::testing {
namespace {

uint64_t EventHashOf(const BlockHash& h) {
  auto b = h.bytes();
  uint64_t v = 0;
  for (size_t i = b.size() - 8; i < b.size(); ++i) v = (v << 8) | b[i];
  return v;
}

// The endpoint a log line "events: publishing on X, replay on Y" names (which: "publishing
// on " or "replay on ").
std::string Endpoint(const DaemonProcess& d, const std::string& which) {
  (void)WaitUntil([&] { return d.Log().find("events: publishing on") != std::string::npos; });
  const std::string log = d.Log();
  size_t at = log.rfind("events: publishing on");  // this run's
  if (at == std::string::npos || (at = log.find(which, at)) == std::string::npos) return "";
  at += which.size();
  return log.substr(at, log.find_first_of(", \n", at) - at);
}

bool HavePythonZmq() { return Sh("/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null").code == 0; }

// Waits (bounded) until the daemon's event counters say `done`: a peer is counted once its
// connection is accepted, so a test need not guess how long a subscriber takes to start.
bool WaitForEvents(const DaemonProcess& d, const std::function<bool(const DaemonStats::Events&)>& done) {
  return WaitUntil(
      [&] {
        auto s = StatsOf(d.socket_path());
        return s.ok() && s->events.has_value() && done(*s->events);
      },
      std::chrono::seconds(30), std::chrono::milliseconds(50));
}

TEST(Events, ASubscriberDecodingAsLlmDoesSeesEveryStoreAndRemovalAndReplayFillsItsGap) {
  ASSERT_TRUE(HavePythonZmq()) << "python3-zmq and python3-msgpack are in scripts/deps.sh";
  DaemonProcess::Options o;
  o.host_capacity = "4MiB";  // 64 pages of 64 KiB
  o.page_bytes = "64KiB";
  o.segment_bytes = "1MiB";
  o.nvme_capacity = "16MiB";
  o.extra_yaml =
      "events: {publish: 'tcp://127.0.0.1:*', replay: 'tcp://127.0.0.1:*', flush_interval: 10ms, batch_size: 16}\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string pub = Endpoint(d, "publishing on "), rep = Endpoint(d, "replay on ");
  ASSERT_FALSE(pub.empty() || rep.empty()) << d.Log();
  auto before = StatsOf(d.socket_path());
  ASSERT_TRUE(before.ok() && before->events) << d.Log();

  // 100 blocks of one chain through a 64-page host tier: demotions to NVMe.
  constexpr size_t kBlocks = 100;
  const auto chain = HashChain(2024, kBlocks);
  std::string result;
  std::jthread subscriber([&] {
    result = Sh("timeout 90 /usr/bin/python3 " + std::string(KVTIER_SOURCE_DIR) +
                "/tests/integration/kv_event_subscriber.py --endpoint " + pub + " --replay " + rep + " --expect " +
                std::to_string(kBlocks) + " --seconds 60 --idle 1.5 --drop 3,4 --first " +
                std::to_string(before->events->first_sequence))
                 .out;
  });
  ASSERT_TRUE(WaitForEvents(d, [](const DaemonStats::Events& e) { return e.subscribers >= 1; }))
      << "the subscriber did not connect";
  const ModelLayout layout = TestLayout("events-model", 16);
  {
    ClientOptions co = EngineOptions(d.socket_path(), "events-engine");
    co.layout = layout;
    auto c = Client::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    for (size_t i = 0; i < kBlocks; ++i) {
      auto pages = (*c)->Allocate(TierKind::kHost, 1);
      ASSERT_TRUE(pages.ok()) << pages.status().ToString() << d.Log();
      FillBlockPattern(chain[i], (*c)->PageBytes(TierKind::kHost, (*pages)[0]).first(layout.block_bytes));
      const std::vector<CommitEntry> e = {{(*pages)[0], chain[i], i ? chain[i - 1] : BlockHash()}};
      const std::vector<uint32_t> tokens(layout.tokens_per_block, static_cast<uint32_t>(7000 + i));  // a prompt
      auto r = (*c)->Commit(TierKind::kHost, e, /*retain=*/false, {.token_ids = tokens});
      ASSERT_TRUE(r.ok() && (*r)[0].status.ok()) << (r.ok() ? (*r)[0].status : r.status()).ToString() << d.Log();
      if (i % 10 == 9) std::this_thread::sleep_for(std::chrono::milliseconds(30));  // several messages
    }
  }
  subscriber.join();
  auto stats = StatsOf(d.socket_path());
  ASSERT_TRUE(stats.ok());
  uint64_t in_host = 0, on_nvme = 0;
  for (const auto& t : stats->tiers) {
    if (t.tier == TierKind::kHost) in_host = t.blocks;
    if (t.tier == TierKind::kNvme) on_nvme = t.blocks;
  }
  const double published = Metric(stats->metrics_url, "kvtier_events_published_total");
  EXPECT_EQ(d.Stop(), 0) << d.Log();

  auto j = nlohmann::json::parse(result.substr(std::min(result.find('{'), result.size())), nullptr, false);
  ASSERT_TRUE(j.is_object()) << result;
  EXPECT_TRUE(j["bad"].empty()) << j.dump();
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(j["topics"], nlohmann::json::array({"kv@" + std::string(host) + "@events-model"})) << j.dump();
  // The two dropped messages were missed and the replay socket filled them: no gap left.
  EXPECT_GE(j["live_missing"].get<int>(), 2) << j.dump();
  EXPECT_GE(j["replayed"].get<int>(), 2) << j.dump();
  EXPECT_EQ(j["gaps"], 0) << j.dump();
  EXPECT_EQ(j["block_sizes"], nlohmann::json::array({16})) << j.dump();
  // The engine's tokens are not published: events.token_ids is off by default.
  EXPECT_EQ(j["token_ids"], 0) << j.dump();

  std::set<uint64_t> want;
  for (const BlockHash& h : chain) want.insert(EventHashOf(h));
  auto hashes = [&](const char* key) {
    std::vector<uint64_t> v;
    if (j["events"].contains(key)) v = j["events"][key].get<std::vector<uint64_t>>();
    return v;
  };
  // One BlockStored per committed block, on the host tier.
  const std::vector<uint64_t> stored_host = hashes("BlockStored:cpu_tier1");
  EXPECT_EQ(stored_host.size(), kBlocks) << j.dump();
  EXPECT_EQ(std::set<uint64_t>(stored_host.begin(), stored_host.end()), want);
  // One BlockRemoved per block that left the host tier; one BlockStored per block spilled.
  const std::vector<uint64_t> removed_host = hashes("BlockRemoved:cpu_tier1");
  EXPECT_EQ(removed_host.size(), kBlocks - in_host) << j.dump();
  const std::vector<uint64_t> stored_nvme = hashes("BlockStored:cpu_tier2");
  EXPECT_GE(stored_nvme.size(), on_nvme) << j.dump();
  EXPECT_GT(on_nvme, 0u);
  for (uint64_t h : removed_host) EXPECT_TRUE(want.count(h));
  for (uint64_t h : stored_nvme) EXPECT_TRUE(want.count(h));
  EXPECT_EQ(j["events"].value("cleared", 0), 0) << j.dump();  // never: it would wipe the engine's own
  // The daemon's count covers what was published (the subscriber dropped two on purpose).
  EXPECT_GE(published, static_cast<double>(kBlocks + removed_host.size() + stored_nvme.size()));
}

}  // namespace
}  // namespace kvtier::testing

namespace kvtier::testing {
namespace {

uint64_t RssKiB(pid_t pid) { return ProcStatusKb(pid, "VmRSS"); }

// A subscriber that connects and never reads: ZMQ's send high-water mark drops its
// messages (it could replay them); the daemon neither blocks nor grows.
TEST(Events, ASubscriberThatNeverReadsLeavesTheDaemonBoundedAndServing) {
  ASSERT_TRUE(HavePythonZmq());
  DaemonProcess::Options o;
  o.host_capacity = "16MiB";  // 128 pages of 128 KiB: 128 KiB blocks churn
  o.page_bytes = "128KiB";
  o.segment_bytes = "1MiB";
  o.log_level = "info";
  o.extra_yaml = "events: {publish: 'tcp://127.0.0.1:*', send_hwm: 50, batch_size: 8, flush_interval: 1ms}\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string pub = Endpoint(d, "publishing on ");
  ASSERT_FALSE(pub.empty()) << d.Log();
  // Connects, subscribes, then sleeps with a 4 KiB receive buffer: the kernel buffers fill
  // and stay full.
  std::jthread stuck([&] {
    Sh("timeout 30 /usr/bin/python3 -c \"import zmq,time; c=zmq.Context(); s=c.socket(zmq.SUB); "
       "s.setsockopt(zmq.RCVBUF, 4096); s.setsockopt(zmq.RCVHWM, 1); s.connect('" +
       pub + "'); s.setsockopt(zmq.SUBSCRIBE, b''); time.sleep(8)\"");
  });
  ASSERT_TRUE(WaitForEvents(d, [](const DaemonStats::Events& e) { return e.subscribers >= 1; }))
      << "the stuck subscriber did not connect";
  auto load = [&](double seconds) {
    CmdResult r =
        Sh("timeout 60 " + BinaryPath("kvtier-load") + " -s " + d.socket_path() +
           " --sessions 2 --prefixes 2000 --depth 8 --tokens-per-block 1 --json --seconds " + std::to_string(seconds));
    return nlohmann::json::parse(r.out.substr(std::min(r.out.find('{'), r.out.size())), nullptr, false);
  };
  nlohmann::json warm = load(1.0);
  const uint64_t rss_before = RssKiB(d.pid());
  nlohmann::json r = load(4.0);
  const uint64_t rss_after = RssKiB(d.pid());
  auto stats = StatsOf(d.socket_path());
  ASSERT_TRUE(stats.ok()) << stats.status().ToString() << d.Log();
  const double published = Metric(stats->metrics_url, "kvtier_events_published_total");
  const double dropped = Metric(stats->metrics_url, "kvtier_events_dropped_total");
  stuck.join();
  EXPECT_EQ(r.value("errors", -1), 0) << r.dump();
  EXPECT_EQ(r.value("corrupt", -1), 0) << r.dump();
  EXPECT_GT(r.value("requests", 0), 0) << r.dump();
  // Thousands of events went out while the subscriber read none, and the daemon's own
  // queue never overflowed: the publisher thread kept up whatever the subscriber did.
  EXPECT_GT(published, 5000) << "too little traffic for the test to mean anything";
  EXPECT_EQ(dropped, 0);
  // (Under a sanitizer RSS is the sanitizer's: its quarantine of freed memory grows with
  // the run, as the soak says; judged in the plain build.)
  if (!kSanitized) {
    EXPECT_LT(rss_after, rss_before + 32 * 1024) << "RSS grew from " << rss_before << " to " << rss_after << " KiB";
  }
  std::cout << "published " << published << " events in " << r.value("requests", 0) << " requests; RSS " << rss_before
            << " -> " << rss_after << " KiB\n";
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

}  // namespace
}  // namespace kvtier::testing

namespace kvtier::testing {
namespace {

// Hundreds of subscribers and replay peers that never read, from one local user: past
// events.max_subscribers / max_replay_peers they are shut down, and the daemon's memory
// stays bounded while it serves.
TEST(Events, PeersPastTheCapsAreRefusedAndTheDaemonStaysBounded) {
  ASSERT_TRUE(HavePythonZmq());
  DaemonProcess::Options o;
  o.host_capacity = "16MiB";
  o.page_bytes = "128KiB";
  o.segment_bytes = "1MiB";
  o.log_level = "info";
  o.extra_yaml =
      "events: {publish: 'tcp://127.0.0.1:*', replay: 'tcp://127.0.0.1:*', batch_size: 1, flush_interval: 1ms,\n"
      "         max_subscribers: 16, max_replay_peers: 4}\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string pub = Endpoint(d, "publishing on "), rep = Endpoint(d, "replay on ");
  ASSERT_FALSE(pub.empty() || rep.empty()) << d.Log();
  auto load = [&](double seconds) {
    CmdResult r =
        Sh("timeout 60 " + BinaryPath("kvtier-load") + " -s " + d.socket_path() +
           " --sessions 2 --prefixes 2000 --depth 8 --tokens-per-block 1 --json --seconds " + std::to_string(seconds));
    return nlohmann::json::parse(r.out.substr(std::min(r.out.find('{'), r.out.size())), nullptr, false);
  };
  (void)load(1.0);  // the ring of replay messages fills
  const uint64_t rss_before = RssKiB(d.pid());
  std::jthread flood([&] {
    Sh("timeout 30 /usr/bin/python3 -c \"import zmq,time; c=zmq.Context(); socks=[]\n"
       "for _ in range(200):\n"
       "  s=c.socket(zmq.SUB); s.setsockopt(zmq.RCVHWM,1); s.setsockopt(zmq.RCVBUF,4096); s.connect('" +
       pub +
       "'); s.setsockopt(zmq.SUBSCRIBE,b''); socks.append(s)\n"
       "for _ in range(40):\n"
       "  s=c.socket(zmq.DEALER); s.setsockopt(zmq.RCVHWM,1); s.setsockopt(zmq.RCVBUF,4096); s.connect('" +
       rep +
       "'); s.send_multipart([b'', (0).to_bytes(8,'big')]); socks.append(s)\n"
       "time.sleep(8)\"");
  });
  // Every peer past the caps is refused once it has connected.
  ASSERT_TRUE(WaitForEvents(d, [](const DaemonStats::Events& e) { return e.refused >= 200 - 16 + 40 - 4; }))
      << "the flood's peers were not all refused";
  nlohmann::json r = load(4.0);
  const uint64_t rss_after = RssKiB(d.pid());
  auto stats = StatsOf(d.socket_path());
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  const double refused = Metric(stats->metrics_url, "kvtier_events_peers_refused_total");
  const CmdResult status = Sh(BinaryPath("kvctl") + " -s " + d.socket_path() + " status");
  flood.join();
  EXPECT_EQ(r.value("errors", -1), 0) << r.dump();
  EXPECT_GT(r.value("requests", 0), 0) << r.dump();
  EXPECT_GE(refused, 200 - 16 + 40 - 4) << "peers past the caps were not refused";
  ASSERT_TRUE(stats->events.has_value());
  EXPECT_GE(stats->events->refused, 200u - 16 + 40 - 4);
  EXPECT_NE(status.out.find("events    " + pub), std::string::npos) << status.out;
  if (!kSanitized) {
    EXPECT_LT(rss_after, rss_before + 48 * 1024) << "RSS grew from " << rss_before << " to " << rss_after << " KiB";
  }
  std::cout << "refused " << refused << " peers; RSS " << rss_before << " -> " << rss_after << " KiB\n";
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// A restart: what the last run announced in host memory is gone, and routers are told.
TEST(Events, ARestartRemovesWhatTheLastRunAnnounced) {
  ASSERT_TRUE(HavePythonZmq());
  DaemonProcess::Options o;
  o.host_capacity = "4MiB";
  o.page_bytes = "64KiB";
  o.segment_bytes = "1MiB";
  o.extra_yaml = "events: {publish: 'tcp://127.0.0.1:*', replay: 'tcp://127.0.0.1:*', flush_interval: 10ms}\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const auto chain = HashChain(99, 10);
  const ModelLayout layout = TestLayout("restart-model", 16);
  {
    ClientOptions co = EngineOptions(d.socket_path(), "engine");
    co.layout = layout;
    auto c = Client::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto pages = (*c)->Allocate(TierKind::kHost, static_cast<uint32_t>(chain.size()));
    ASSERT_TRUE(pages.ok());
    std::vector<CommitEntry> e;
    for (size_t i = 0; i < chain.size(); ++i) e.push_back({(*pages)[i], chain[i], i ? chain[i - 1] : BlockHash()});
    ASSERT_TRUE((*c)->Commit(TierKind::kHost, e).ok());
  }
  auto first = StatsOf(d.socket_path());
  ASSERT_TRUE(first.ok() && first->events);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string pub = Endpoint(d, "publishing on "), rep = Endpoint(d, "replay on ");
  // A router that reconnects at once; what it misses while it connects it asks the replay
  // socket for, from this run's first sequence.
  auto again = StatsOf(d.socket_path());
  ASSERT_TRUE(again.ok() && again->events);
  const CmdResult got =
      Sh("timeout 20 /usr/bin/python3 -c \"import zmq,msgpack,json,time; c=zmq.Context(); s=c.socket(zmq.SUB)\n"
         "s.connect('" +
         pub +
         "'); s.setsockopt(zmq.SUBSCRIBE,b''); s.setsockopt(zmq.RCVTIMEO,3000); out={}\n"
         "def add(seq,p):\n"
         "  out[seq]=[[e['type'],e.get('medium'),e['block_hashes'],seq] for e in msgpack.unpackb(p)[1]]\n"
         "try:\n"
         "  while True:\n"
         "    t,seq,p=s.recv_multipart(); add(int.from_bytes(seq,'big'),p)\n"
         "except zmq.Again: pass\n"
         "r=c.socket(zmq.DEALER); r.connect('" +
         rep + "'); r.setsockopt(zmq.RCVTIMEO,3000); r.send_multipart([b'',(" +
         std::to_string(again->events->first_sequence) +
         ").to_bytes(8,'big')])\n"
         "while True:\n"
         "  _,seq,p=r.recv_multipart()\n"
         "  if seq==b'\\xff'*8: break\n"
         "  add(int.from_bytes(seq,'big'),p)\n"
         "print(json.dumps([e for k in sorted(out) for e in out[k]]))\"");
  auto j = nlohmann::json::parse(got.out, nullptr, false);
  ASSERT_TRUE(j.is_array()) << got.out;
  std::set<uint64_t> removed, want;
  for (const BlockHash& h : chain) want.insert(EventHashOf(h));
  for (const auto& e : j) {
    EXPECT_EQ(e[0], "BlockRemoved") << e.dump();
    EXPECT_EQ(e[1], "CPU_TIER1") << e.dump();
    EXPECT_GT(e[3].get<uint64_t>(), first->events->first_sequence) << "sequences must increase across restarts";
    for (uint64_t h : e[2].get<std::vector<uint64_t>>()) removed.insert(h);
  }
  EXPECT_EQ(removed, want);
  auto second = StatsOf(d.socket_path());
  ASSERT_TRUE(second.ok() && second->events);
  EXPECT_EQ(second->events->retracted, chain.size());
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

}  // namespace
}  // namespace kvtier::testing
