// RedisCluster and RemoteTier against real Redis Clusters (Debian's redis-server on
// loopback ports the test picks): routing across masters, MOVED after a reshard, a
// master killed (fail fast, then its replica takes over), a stalled master (timeouts, the
// circuit breaker), a standalone server, and values that do not verify.
#include "storage/remote/remote_tier.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "protocol/base/block_key.h"
#include "storage/remote/redis_cluster.h"
#include "tests/support/fake_redis_node.h"
#include "tests/support/posted_loop.h"
#include "tests/support/redis_cluster_process.h"
#include "tests/support/test_util.h"

namespace kvtier {
namespace {

using testing::FakeRedisNode;
using testing::RedisClusterProcess;
using testing::SeededBytes;

using Loop = testing::PostedLoop;

#define REQUIRE_REDIS() \
  if (!RedisClusterProcess::Available()) GTEST_SKIP() << "redis-server / redis-cli not installed (scripts/deps.sh)"

RedisClusterOptions ClientOptions(const RedisClusterProcess& rc) {
  RedisClusterOptions o;
  o.seeds = rc.Seeds();
  o.timeout_ns = 500'000'000;
  o.breaker_open_ns = 300'000'000;
  return o;
}

// Sets n keys "k:<i>" to SeededBytes(size, i) and returns how many succeeded.
int SetAll(RedisCluster& c, Loop& loop, int n, size_t size, const std::string& prefix = "k:") {
  std::vector<std::vector<uint8_t>> values;
  for (int i = 0; i < n; ++i) values.push_back(SeededBytes(size, static_cast<uint32_t>(i)));
  int ok = 0, done = 0;
  for (int i = 0; i < n; ++i) {
    RedisCluster::Value v;
    v.body = values[i];
    c.Set(prefix + std::to_string(i), std::move(v), [&](const RedisReply& r) {
      ok += r.status.ok();
      ++done;
    });
  }
  EXPECT_TRUE(loop.Pump([&] { return done == n; }));
  return ok;
}

// GETs n keys and counts (ok with the right bytes, not found, failed).
struct GetCounts {
  int ok = 0, wrong = 0, missing = 0, failed = 0;
};
GetCounts GetAll(RedisCluster& c, Loop& loop, int n, size_t size, const std::string& prefix = "k:") {
  GetCounts g;
  int done = 0;
  for (int i = 0; i < n; ++i) {
    auto good = std::make_shared<bool>(false);
    c.Get(
        prefix + std::to_string(i),
        [good, size, i](std::span<const uint8_t> v) {
          const auto want = SeededBytes(size, static_cast<uint32_t>(i));
          *good = v.size() == want.size() && std::equal(v.begin(), v.end(), want.begin());
          return Status::Ok();
        },
        [&, good](const RedisReply& r) {
          ++done;
          if (r.status.ok()) {
            ++(*good ? g.ok : g.wrong);
          } else if (r.status.code() == StatusCode::kNotFound) {
            ++g.missing;
          } else {
            ++g.failed;
          }
        });
  }
  EXPECT_TRUE(loop.Pump([&] { return done == n; }));
  return g;
}

TEST(RedisCluster, SpreadsKeysOverMastersAndReadsThemBack) {
  REQUIRE_REDIS();
  RedisClusterProcess rc({.masters = 3, .replicas_per_master = 0});
  ASSERT_TRUE(rc.Start().ok());
  Loop loop;
  auto c = RedisCluster::Open(ClientOptions(rc), loop.Poster());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->Masters().size(), 3u);
  ASSERT_EQ(SetAll(**c, loop, 300, 20000), 300);
  // Every master holds some: requests went where their slots live (no MOVED needed).
  for (size_t i = 0; i < 3; ++i) EXPECT_GT(std::stoi(rc.Cli(i, "dbsize")), 30) << "master " << i;
  EXPECT_EQ((*c)->counters().redirects.load(), 0u);
  const GetCounts g = GetAll(**c, loop, 300, 20000);
  EXPECT_EQ(g.ok, 300);
  EXPECT_EQ(g.wrong + g.missing + g.failed, 0);
  // The slot each key went to is the one Redis computes.
  for (const char* k : {"k:1", "k:77", "kvtier:00ff"}) {
    EXPECT_EQ(std::stoi(rc.Cli(0, std::string("cluster keyslot ") + k)), RedisCluster::KeySlot(k)) << k;
  }
  int exists = 0, done = 0;
  for (const char* k : {"k:5", "k:299", "absent"}) {
    (*c)->Exists(k, [&](const RedisReply& r) {
      exists += r.status.ok() ? static_cast<int>(r.integer) : 0;
      ++done;
    });
  }
  (*c)->Del("k:5", [&](const RedisReply& r) { done += r.status.ok() && r.integer == 1; });
  ASSERT_TRUE(loop.Pump([&] { return done == 4; }));
  EXPECT_EQ(exists, 2);
  const GetCounts after = GetAll(**c, loop, 6, 20000);
  EXPECT_EQ(after.missing, 1);  // k:5
}

TEST(RedisCluster, FollowsMovedAfterAReshard) {
  REQUIRE_REDIS();
  RedisClusterProcess rc({.masters = 3, .replicas_per_master = 0});
  ASSERT_TRUE(rc.Start().ok());
  Loop loop;
  auto opts = ClientOptions(rc);
  opts.refresh_interval_ns = 3600'000'000'000;  // only MOVED can tell it
  auto c = RedisCluster::Open(opts, loop.Poster());
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(SetAll(**c, loop, 200, 1000), 200);
  // Move 2000 slots (and their keys) from the first master to the second behind the
  // client's back.
  const std::string from = rc.Cli(0, "cluster myid"), to = rc.Cli(1, "cluster myid");
  const std::string cmd = "--cluster reshard " + rc.Addresses()[0] + " --cluster-from " + from.substr(0, 40) +
                          " --cluster-to " + to.substr(0, 40) + " --cluster-slots 2000 --cluster-yes";
  rc.Cli(0, cmd);
  ASSERT_TRUE(rc.WaitHealthy(0));
  const GetCounts g = GetAll(**c, loop, 200, 1000);
  EXPECT_EQ(g.ok, 200) << "missing " << g.missing << " failed " << g.failed;
  EXPECT_GT((*c)->counters().redirects.load(), 0u);
}

TEST(RedisCluster, DeadMasterFailsFastThenItsReplicaServes) {
  REQUIRE_REDIS();
  RedisClusterProcess rc({.masters = 3, .replicas_per_master = 1});
  ASSERT_TRUE(rc.Start().ok());
  Loop loop;
  auto opts = ClientOptions(rc);
  opts.breaker_open_ns = 5'000'000'000;  // open for the whole test, however slow the machine
  auto c = RedisCluster::Open(opts, loop.Poster());
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(SetAll(**c, loop, 200, 4000), 200);
  // Replication is asynchronous: wait until every replica has what its master has.
  for (size_t m = 0; m < 3; ++m) ASSERT_TRUE(rc.WaitReplicated(m)) << "master " << m;
  rc.Kill(0);
  // Every request ends (misses, never a hang: GetAll's wait is bounded); once the breaker
  // opens they fail without being sent.
  GetCounts during;
  for (int round = 0; round < 20 && (*c)->counters().breaker_rejections.load() == 0; ++round) {
    during = GetAll(**c, loop, 200, 4000);
    EXPECT_EQ(during.wrong, 0);
    EXPECT_GT(during.failed, 0);  // the dead master's slots
  }
  EXPECT_GT((*c)->counters().breaker_rejections.load(), 0u) << "the dead master's breaker never opened";
  // The replica takes over (cluster-node-timeout 1 s); the refreshed map finds it.
  ASSERT_TRUE(rc.WaitHealthy(1));
  GetCounts after;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        after = GetAll(**c, loop, 200, 4000);
        return after.ok == 200;
      },
      std::chrono::seconds(20), std::chrono::milliseconds(200)))
      << "ok " << after.ok << " failed " << after.failed << " missing " << after.missing;
  EXPECT_EQ(after.wrong, 0);
}

TEST(RedisCluster, StalledMasterTimesOutAndRecovers) {
  REQUIRE_REDIS();
  RedisClusterProcess rc({.masters = 3, .replicas_per_master = 0, .node_timeout_ms = 60000});
  ASSERT_TRUE(rc.Start().ok());
  Loop loop;
  auto opts = ClientOptions(rc);
  opts.timeout_ns = 200'000'000;
  opts.breaker_open_ns = 3'000'000'000;  // still open for the second round, however slow the machine
  auto c = RedisCluster::Open(opts, loop.Poster());
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(SetAll(**c, loop, 90, 1000), 90);
  rc.Pause(0);  // SIGSTOP: connected, never answers
  // Requests to a stalled node end at their timeout (GetAll's wait is bounded).
  const GetCounts during = GetAll(**c, loop, 90, 1000);
  EXPECT_GT(during.failed, 0);
  EXPECT_EQ(during.failed + during.ok, 90);
  EXPECT_GT((*c)->counters().timeouts.load(), 0u);
  // After breaker_failures failed batches its breaker opens: then those requests fail
  // without being sent.
  for (int round = 0; round < 10 && (*c)->counters().breaker_rejections.load() == 0; ++round) {
    const GetCounts again = GetAll(**c, loop, 90, 1000);
    EXPECT_EQ(again.failed, during.failed);
  }
  EXPECT_GT((*c)->counters().breaker_rejections.load(), 0u) << "the stalled node's breaker never opened";
  rc.Resume(0);
  GetCounts after;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        after = GetAll(**c, loop, 90, 1000);
        return after.ok == 90;
      },
      std::chrono::seconds(40), std::chrono::milliseconds(100)));
}

TEST(RedisCluster, StandaloneServerServesEverySlot) {
  REQUIRE_REDIS();
  RedisClusterProcess rc({.masters = 1, .replicas_per_master = 0, .cluster = false});
  ASSERT_TRUE(rc.Start().ok());
  Loop loop;
  RedisClusterOptions o;
  o.seeds = rc.Seeds(1);
  auto c = RedisCluster::Open(o, loop.Poster());
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(SetAll(**c, loop, 50, 100), 50);
  EXPECT_EQ(GetAll(**c, loop, 50, 100).ok, 50);
}

TEST(RedisCluster, UnreachableClusterMissesAtOnce) {
  Loop loop;
  RedisClusterOptions o;
  o.seeds = {"127.0.0.1:1"};  // nothing listens on port 1
  auto c = RedisCluster::Open(o, loop.Poster());
  ASSERT_TRUE(c.ok()) << "an unreachable cluster is not a start failure";
  EXPECT_FALSE((*c)->Available());
  const GetCounts g = GetAll(**c, loop, 10, 10);
  EXPECT_EQ(g.failed, 10);
}

// ---- replies from nodes that cannot be trusted -------------------------------------------

// A client of one fake node that says it serves every slot.
std::unique_ptr<RedisCluster> OpenOnFake(const FakeRedisNode& node, Loop& loop, RedisClusterOptions o = {}) {
  o.seeds = {node.address()};
  auto c = RedisCluster::Open(o, loop.Poster());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

RedisReply GetOne(RedisCluster& c, Loop& loop, const std::string& key) {
  std::optional<RedisReply> rep;
  c.Get(
      key, [](std::span<const uint8_t>) { return Status::Ok(); }, [&](const RedisReply& r) { rep = r; });
  EXPECT_TRUE(loop.Pump([&] { return rep.has_value(); }));
  return rep.value_or(RedisReply{Internal("no reply"), 0, 0});
}

TEST(RedisClusterHostile, HugeBulkIsRefusedFromItsLengthLine) {
  std::atomic<int> gets{0};
  // 300 MB announced and the first 64 MiB of it sent: a reader that took it in would wait
  // for the rest until the timeout, not refuse it at once.
  const std::string huge_reply = "$300000000\r\n" + std::string(64 << 20, 'x');
  FakeRedisNode node([&](const std::vector<std::string>& a) -> std::string {
    if (a[0] == "CLUSTER") return FakeRedisNode::SlotsForOne(node.port());
    if (a[0] == "GET" && a[1] == "huge") {
      ++gets;
      return huge_reply;
    }
    if (a[0] == "GET" && a[1] == "error") return "-" + std::string(3 << 20, 'e');  // no end of line
    if (a[0] == "GET") return FakeRedisNode::Bulk(std::string(1000, 'v'));
    return "-ERR unknown\r\n";
  });
  ASSERT_TRUE(node.Start().ok());
  Loop loop;
  RedisClusterOptions o;
  o.max_value_bytes = 256 << 10;
  o.timeout_ns = 20'000'000'000;  // a refusal is not a timeout
  auto c = OpenOnFake(node, loop, o);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Available());
  // The value is refused, as a value that does not verify is (the caller's miss and delete),
  // from its length line.
  const RedisReply huge = GetOne(*c, loop, "huge");
  EXPECT_EQ(huge.status.code(), StatusCode::kDataLoss) << huge.status.ToString();
  EXPECT_EQ(c->counters().oversized.load(), 1u);
  EXPECT_EQ(c->counters().timeouts.load(), 0u);
  // An endless error line is refused once it is longer than any value could be.
  EXPECT_EQ(GetOne(*c, loop, "error").status.code(), StatusCode::kDataLoss);
  EXPECT_EQ(c->counters().oversized.load(), 2u);
  // The node is not blamed for it, and the next request is served on a new connection.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(GetOne(*c, loop, "small").status.ok());
  EXPECT_TRUE(c->Available());
  EXPECT_EQ(gets.load(), 1);
}

// Every command takes only its own kind of reply: a GET answered with a status, an
// integer or an array is a miss to delete (never a hit with nothing checked), an EXISTS
// answered with a bulk is a failure (never "found").
TEST(RedisClusterHostile, RepliesOfTheWrongKindAreNeverAnswers) {
  std::atomic<int> n{0};
  FakeRedisNode node([&](const std::vector<std::string>& a) -> std::string {
    if (a[0] == "CLUSTER") return FakeRedisNode::SlotsForOne(node.port());
    const char* wrong[] = {"+OK\r\n", ":1\r\n", "*1\r\n:1\r\n"};
    if (a[0] == "GET") return wrong[n++ % 3];
    if (a[0] == "EXISTS") return FakeRedisNode::Bulk("1");
    return "-ERR unknown\r\n";
  });
  ASSERT_TRUE(node.Start().ok());
  Loop loop;
  auto c = OpenOnFake(node, loop);
  ASSERT_NE(c, nullptr);
  for (int i = 0; i < 3; ++i) {
    bool sunk = false;
    std::optional<RedisReply> rep;
    c->Get(
        "k",
        [&](std::span<const uint8_t>) {
          sunk = true;
          return Status::Ok();
        },
        [&](const RedisReply& r) { rep = r; });
    ASSERT_TRUE(loop.Pump([&] { return rep.has_value(); }));
    EXPECT_EQ(rep->status.code(), StatusCode::kDataLoss) << i << ": " << rep->status.ToString();
    EXPECT_FALSE(sunk);
  }
  std::optional<RedisReply> ex;
  c->Exists("k", [&](const RedisReply& r) { ex = r; });
  ASSERT_TRUE(loop.Pump([&] { return ex.has_value(); }));
  EXPECT_FALSE(ex->status.ok());
  EXPECT_EQ(ex->integer, 0);
}

TEST(RedisClusterHostile, RequestsBehindARefusedValueGoAgain) {
  FakeRedisNode node([&](const std::vector<std::string>& a) -> std::string {
    if (a[0] == "CLUSTER") return FakeRedisNode::SlotsForOne(node.port());
    if (a[0] == "GET" && a[1] == "huge") return "$999999999\r\n";
    return FakeRedisNode::Bulk("ok");
  });
  ASSERT_TRUE(node.Start().ok());
  Loop loop;
  RedisClusterOptions o;
  o.max_value_bytes = 4096;
  o.connections_per_node = 1;  // one pipeline: the small gets queue behind the huge one
  auto c = OpenOnFake(node, loop, o);
  ASSERT_NE(c, nullptr);
  int ok = 0, refused = 0, other = 0;
  for (int i = 0; i < 20; ++i) {
    c->Get(
        i == 3 ? "huge" : "k" + std::to_string(i), [](std::span<const uint8_t>) { return Status::Ok(); },
        [&](const RedisReply& r) {
          ++(r.status.ok() ? ok : r.status.code() == StatusCode::kDataLoss ? refused : other);
        });
  }
  ASSERT_TRUE(loop.Pump([&] { return ok + refused + other == 20; }));
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(ok, 19);
}

// A cluster-level refusal (CLUSTERDOWN, as during a failover with no replica) fails its
// requests without blaming the node that said it, and is logged in Redis' words once, not
// once a request (973,291 such errors once gave no line at all).
TEST(RedisClusterHostile, ClusterRefusalsAreLoggedOnceInRedisWordsWithoutBlamingTheNode) {
  FakeRedisNode node([&](const std::vector<std::string>& a) -> std::string {
    if (a[0] == "CLUSTER") return FakeRedisNode::SlotsForOne(node.port());
    return "-CLUSTERDOWN The cluster is down\r\n";
  });
  ASSERT_TRUE(node.Start().ok());
  Loop loop;
  RedisClusterOptions o;
  o.breaker_failures = 1;  // one failure blamed on the node would open its breaker
  auto c = OpenOnFake(node, loop, o);
  ASSERT_NE(c, nullptr);
  ::testing::internal::CaptureStderr();
  int unavailable = 0;
  for (int i = 0; i < 50; ++i)
    unavailable += GetOne(*c, loop, "k" + std::to_string(i)).status.code() == StatusCode::kUnavailable;
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(unavailable, 50);
  EXPECT_TRUE(c->Available()) << "the node answered: its breaker must stay closed";
  EXPECT_EQ(c->counters().breaker_rejections.load(), 0u);
  size_t lines = 0;
  for (size_t at = log.find("CLUSTERDOWN The cluster is down"); at != std::string::npos;
       at = log.find("CLUSTERDOWN The cluster is down", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u) << log;
}

TEST(RedisClusterHostile, SlotMapOfTooManyMastersIsNotUsed) {
  FakeRedisNode node([&](const std::vector<std::string>& a) -> std::string {
    return a[0] == "CLUSTER" ? FakeRedisNode::SlotsForMany(1024) : "-ERR unknown\r\n";
  });
  ASSERT_TRUE(node.Start().ok());
  Loop loop;
  auto c = OpenOnFake(node, loop);
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->Available());
  EXPECT_GE(c->counters().maps_refused.load(), 1u);
  EXPECT_EQ(c->connection_threads(), 0u);
  EXPECT_EQ(GetOne(*c, loop, "k").status.code(), StatusCode::kUnavailable);
}

TEST(RedisClusterHostile, EndlessMovedKeepsNodesAndThreadsBounded) {
  std::atomic<int> next{0};
  FakeRedisNode node([&](const std::vector<std::string>& a) -> std::string {
    if (a[0] == "CLUSTER") return FakeRedisNode::SlotsForOne(node.port());
    // Each time another port (nothing listens below 1024 here).
    return "-MOVED 0 127.0.0.1:" + std::to_string(2 + next++ % 1000) + "\r\n";
  });
  ASSERT_TRUE(node.Start().ok());
  Loop loop;
  RedisClusterOptions o;
  o.connect_timeout_ns = 50'000'000;
  auto c = OpenOnFake(node, loop, o);
  ASSERT_NE(c, nullptr);
  const size_t per_node = o.connections_per_node + 1;
  size_t most = 0;
  int answered = 0;
  for (int round = 0; round < 20; ++round) {
    int done = 0;
    for (int i = 0; i < 25; ++i) {
      c->Get(
          "k" + std::to_string(i), [](std::span<const uint8_t>) { return Status::Ok(); },
          [&](const RedisReply& r) {
            ++done;
            answered += !r.status.ok();
          });
    }
    ASSERT_TRUE(loop.Pump([&] {
      most = std::max(most, c->connection_threads());
      return done == 25;
    }));
  }
  EXPECT_EQ(answered, 500) << "a request to a node that only redirects succeeded";
  EXPECT_GE(c->counters().redirects.load(), 500u);
  EXPECT_LE(most, (1 + RedisCluster::kMaxStrangers) * per_node);
  // Once the map is read again the strangers are gone with their threads.
  ASSERT_TRUE(testing::WaitUntil([&] { return c->connection_threads() == per_node; }));
  EXPECT_GT(c->counters().nodes_dropped.load(), 0u);
}

TEST(RedisClusterHostile, FrozenNodeCostsEachRequestOneTimeout) {
  FakeRedisNode node([&](const std::vector<std::string>& a) -> std::string {
    if (a[0] == "CLUSTER") return FakeRedisNode::SlotsForOne(node.port());
    return "";  // never answers
  });
  ASSERT_TRUE(node.Start().ok());
  Loop loop;
  RedisClusterOptions o;
  o.timeout_ns = 1'000'000'000;
  o.breaker_failures = 100;
  auto c = OpenOnFake(node, loop, o);
  ASSERT_NE(c, nullptr);
  // Lookups arriving while the first batch waits for its replies: each ends one timeout
  // after its own call (it used to wait for the batch ahead and then a timeout of its own).
  std::vector<RedisReply> replies;
  for (int i = 0; i < 3; ++i) {
    c->Exists("k" + std::to_string(i), [&](const RedisReply& r) { replies.push_back(r); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  ASSERT_TRUE(loop.Pump([&] { return replies.size() == 3; }));
  for (const RedisReply& r : replies) {
    EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
    EXPECT_LT(r.latency_ns, 1'600'000'000) << "a request waited for longer than one timeout";
  }
}

TEST(RedisClusterHostile, OpenBreakerClosesAsSoonAsTheNodeAnswers) {
  std::atomic<bool> frozen{false};
  FakeRedisNode node([&](const std::vector<std::string>& a) -> std::string {
    if (a[0] == "CLUSTER") return FakeRedisNode::SlotsForOne(node.port());
    if (frozen) return "";
    return a[0] == "PING" ? "+PONG\r\n" : FakeRedisNode::Bulk("v");
  });
  ASSERT_TRUE(node.Start().ok());
  Loop loop;
  RedisClusterOptions o;
  o.timeout_ns = 200'000'000;
  o.breaker_failures = 1;
  o.breaker_open_ns = 600'000'000'000;  // without a probe: shut for ten minutes
  auto c = OpenOnFake(node, loop, o);
  ASSERT_NE(c, nullptr);
  frozen = true;
  EXPECT_EQ(GetOne(*c, loop, "k").status.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(c->Available()) << "one failed batch should have opened the breaker";
  frozen = false;
  EXPECT_TRUE(testing::WaitUntil([&] { return c->Available(); }, std::chrono::seconds(10)));
  EXPECT_TRUE(GetOne(*c, loop, "k").status.ok());
}

TEST(RedisClusterHostile, SlotMapIsLookedForSoonAfterAStartWithNoNode) {
  Loop loop;
  auto node = std::make_unique<FakeRedisNode>([](const std::vector<std::string>&) { return std::string(); });
  ASSERT_TRUE(node->Start().ok());
  const std::string address = node->address();
  node.reset();  // the port is free: nobody answers at start
  RedisClusterOptions o;
  o.seeds = {address};
  o.refresh_interval_ns = 3600'000'000'000;  // not the periodic refresh
  auto c = RedisCluster::Open(o, loop.Poster());
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE((*c)->Available());
  // The node comes up on that port.
  std::string host;
  int port = 0;
  ASSERT_TRUE(RedisCluster::ParseAddress(address, &host, &port));
  FakeRedisNode again([&](const std::vector<std::string>& a) -> std::string {
    if (a[0] == "CLUSTER") return FakeRedisNode::SlotsForOne(port);
    return FakeRedisNode::Bulk("v");
  });
  ASSERT_TRUE(again.Start(port).ok()) << "port " << port << " was taken meanwhile";
  EXPECT_TRUE(testing::WaitUntil([&] { return (*c)->Available(); }, std::chrono::seconds(10)));
  EXPECT_TRUE(GetOne(**c, loop, "k").status.ok());
}

// ---- RemoteTier --------------------------------------------------------------------------

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RedisClusterProcess::Available()) GTEST_SKIP() << "redis-server not installed";
    rc_ = std::make_unique<RedisClusterProcess>(RedisClusterProcess::Options{.masters = 3, .replicas_per_master = 0});
    ASSERT_TRUE(rc_->Start().ok());
    RemoteTierOptions o;
    o.cluster = ClientOptions(*rc_);
    auto t = RemoteTier::Open(o, loop_.Poster());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tier_ = std::move(t).value();
  }
  std::string Key(int i) {
    return EncodeBlockKey(EncodeNamespace("tenant", "fingerprint-0001"),
                          BlockHash(std::vector<uint8_t>(16, static_cast<uint8_t>(i))));
  }
  Status Put(int i, const std::vector<uint8_t>& data) {
    std::optional<Status> st;
    LowerBlockMeta m{static_cast<uint32_t>(data.size()), "fingerprint-0001", std::string(16, 'p')};
    tier_->Put(Key(i), m, data, [&](Status s) { st = s; });
    EXPECT_TRUE(loop_.Pump([&] { return st.has_value(); }));
    return st.value_or(Internal("no answer"));
  }
  Status Fetch(int i, std::vector<uint8_t>* out, uint32_t length, LowerBlockMeta* meta = nullptr) {
    out->assign(length, 0);
    std::optional<Status> st;
    tier_->Fetch(Key(i), "fingerprint-0001", length, *out, [&](Status s, LowerBlockMeta m) {
      st = s;
      if (meta) *meta = m;
    });
    EXPECT_TRUE(loop_.Pump([&] { return st.has_value(); }));
    return st.value_or(Internal("no answer"));
  }
  std::vector<bool> Exists(std::vector<int> ids) {
    std::vector<std::string> keys;
    for (int i : ids) keys.push_back(Key(i));
    std::optional<std::vector<bool>> found;
    tier_->Exists(keys, [&](std::vector<bool> f) { found = std::move(f); });
    EXPECT_TRUE(loop_.Pump([&] { return found.has_value(); }));
    return found.value_or(std::vector<bool>());
  }

  Loop loop_;
  std::unique_ptr<RedisClusterProcess> rc_;
  std::unique_ptr<RemoteTier> tier_;
};

TEST_F(RemoteTierTest, PutFetchAndExists) {
  const auto data = SeededBytes(65536, 9);
  ASSERT_TRUE(Put(1, data).ok());
  std::vector<uint8_t> got;
  LowerBlockMeta meta;
  ASSERT_TRUE(Fetch(1, &got, 65536, &meta).ok());
  EXPECT_EQ(got, data);
  EXPECT_EQ(meta.parent, std::string(16, 'p'));
  EXPECT_EQ(Fetch(2, &got, 65536).code(), StatusCode::kNotFound);
  EXPECT_EQ(Exists({1, 2, 1}), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(tier_->counters().fetch_hits, 1u);
  EXPECT_EQ(tier_->counters().fetch_misses, 1u);
  EXPECT_EQ(tier_->counters().put_bytes, 65536u);
}

TEST_F(RemoteTierTest, OverwrittenValueIsAMissCountedAndDeleted) {
  const auto data = SeededBytes(8192, 4);
  ASSERT_TRUE(Put(3, data).ok());
  // Someone writes other bytes of the same length under the key.
  const std::string key = RemoteCodec().Key("kvtier:", Key(3));
  std::string value = rc_->Cli(0, "-c --no-raw get " + key);
  ASSERT_FALSE(value.empty());
  rc_->Cli(0, "-c set " + key + " " + std::string(8192 + 60, 'x'));
  std::vector<uint8_t> got;
  EXPECT_EQ(Fetch(3, &got, 8192).code(), StatusCode::kDataLoss);
  EXPECT_EQ(got, std::vector<uint8_t>(8192, 0)) << "bytes of a value that did not verify reached the destination";
  EXPECT_EQ(tier_->counters().checksum_failures, 1u);
  // Deleted: the next reader misses without reading it.
  ASSERT_TRUE(testing::WaitUntil([&] { return Exists({3}) == std::vector<bool>{false}; }));
  // A value for another layout (length) is refused the same way.
  ASSERT_TRUE(Put(4, data).ok());
  EXPECT_EQ(Fetch(4, &got, 4096).code(), StatusCode::kDataLoss);
}

TEST_F(RemoteTierTest, DeadClusterCostsNothing) {
  ASSERT_TRUE(Put(5, SeededBytes(1024, 5)).ok());
  for (size_t i = 0; i < rc_->size(); ++i) rc_->Kill(i);
  std::vector<uint8_t> got;
  // The first requests find the nodes gone and open their breakers...
  for (int round = 0; round < 4; ++round) EXPECT_EQ(Fetch(5, &got, 1024).code(), StatusCode::kUnavailable);
  std::vector<int> many;
  for (int i = 0; i < 40; ++i) many.push_back(i);  // keys on every master
  for (int round = 0; round < 4; ++round) EXPECT_EQ(Exists(many), std::vector<bool>(40, false));
  // ...after which a lookup is answered without a request on the wire.
  EXPECT_FALSE(tier_->available());
  const uint64_t sent = tier_->cluster_counters().requests.load();
  for (int i = 0; i < 50; ++i) EXPECT_EQ(Exists({5, 6}), (std::vector<bool>{false, false}));
  EXPECT_EQ(tier_->cluster_counters().requests.load(), sent);
}

}  // namespace
}  // namespace kvtier
