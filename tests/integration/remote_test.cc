// The remote tier end to end: kvtierd "nodes" (real daemon processes with their own
// sockets and data dirs) sharing a real Redis Cluster that the test starts on loopback
// ports — a replay on one node served from the cluster on another, a value overwritten in
// the cluster (a miss, never served), a master killed mid-replay (misses only, then hits
// again once its replica took over), write_back, and a cluster that is not there at all.
#include <gtest/gtest.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <deque>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "engine/tools/block_pattern.h"
#include "engine/tools/trace.h"
#include "storage/remote/remote_tier.h"
#include "tests/integration/engine_process.h"
#include "tests/support/fake_redis_node.h"
#include "tests/support/redis_cluster_process.h"

namespace kvtier::testing {
namespace {

#define REQUIRE_REDIS() \
  if (!RedisClusterProcess::Available()) GTEST_SKIP() << "redis-server / redis-cli not installed (scripts/deps.sh)"

// A node as the scale-out check runs them: 4 MiB of host, 8 MiB of NVMe, 16 KiB blocks.
DaemonProcess::Options Node(const RedisClusterProcess& rc, const std::string& remote_yaml = "") {
  DaemonProcess::Options o;
  o.host_capacity = "4MiB";
  o.page_bytes = "16KiB";
  o.segment_bytes = "1MiB";
  o.nvme_capacity = "8MiB";
  o.nvme_yaml = "    durability: relaxed\n";
  o.remote_nodes = rc.Seeds();
  o.remote_yaml = remote_yaml;
  o.log_level = "notice";
  return o;
}

nlohmann::json Replay(const DaemonProcess& d, const std::string& trace, const TempDir& dir, int* code) {
  CmdResult r = Sh("(" + BinaryPath("kvtier-replay") + " --trace " + trace + " -s " + d.socket_path() +
                   " --block-bytes 16KiB --sessions 2 --json 2>" + dir.File("replay.err") + ")");
  *code = r.code;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j;
}

// The remote namespace of this test process's blocks: an unknown tenant, uid=U@host.
std::string UnknownTenantNamespace(const ModelLayout& layout) {
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof(host) - 1);
  return EncodeNamespace("uid=" + std::to_string(::getuid()) + "@" + host, layout.Fingerprint());
}

// A file only its owner may read.
std::string SecretFile(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.File(name);
  std::ofstream(path) << text << "\n";
  ::chmod(path.c_str(), 0600);
  return path;
}

uint64_t Hits(const nlohmann::json& j, const char* tier) { return j["hits"][tier].get<uint64_t>(); }

// One engine storing `chain` with the replay's block pattern.
Status Store(Client& c, const std::vector<BlockHash>& chain, size_t bytes) {
  KVTIER_ASSIGN_OR_RETURN(auto pages, c.Allocate(TierKind::kHost, static_cast<uint32_t>(chain.size())));
  std::vector<CommitEntry> e;
  for (size_t i = 0; i < chain.size(); ++i) {
    auto* p = static_cast<uint8_t*>(c.PageAddress(TierKind::kHost, pages[i]));
    FillBlockPattern(chain[i], {p, bytes});
    e.push_back({pages[i], chain[i], i ? chain[i - 1] : BlockHash()});
  }
  KVTIER_ASSIGN_OR_RETURN(auto r, c.Commit(TierKind::kHost, e));
  for (const auto& x : r) KVTIER_RETURN_IF_ERROR(x.status);
  return Status::Ok();
}

// An engine of `layout` on node `d` stores `chain`; then the node has put `puts` blocks
// into the cluster in all (write-through drains in the background).
::testing::AssertionResult StoreThrough(const DaemonProcess& d, const ModelLayout& layout,
                                        const std::vector<BlockHash>& chain, uint64_t puts) {
  ClientOptions o = EngineOptions(d.socket_path());
  o.layout = layout;
  auto c = Client::Connect(o);
  if (!c.ok()) return ::testing::AssertionFailure() << c.status().ToString();
  if (Status st = Store(**c, chain, layout.block_bytes); !st.ok())
    return ::testing::AssertionFailure() << st.ToString();
  const bool drained = WaitUntil([&] {
    auto s = StatsOf(d.socket_path());
    return s.ok() && s->remote && s->remote->puts == puts;
  });
  return drained ? ::testing::AssertionSuccess() : ::testing::AssertionFailure() << "puts never reached " << puts;
}

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_REDIS();
    trace_ = GenerateTrace("conversation", 300, 21);
    ASSERT_TRUE(trace_.ok());
    ASSERT_TRUE(WriteTrace(*trace_, dir_.File("t.jsonl")).ok());
  }
  std::string trace() const { return dir_.File("t.jsonl"); }
  TempDir dir_;
  Result<Trace> trace_ = Internal("unset");
};

TEST_F(RemoteTierTest, ASecondNodeIsServedFromTheClusterWhatTheFirstStored) {
  RedisClusterProcess rc({.masters = 3, .replicas_per_master = 0});
  ASSERT_TRUE(rc.Start().ok());
  DaemonProcess a(Node(rc)), b(Node(rc));
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  ASSERT_TRUE(b.Start().ok()) << b.Log();
  int code = -1;
  auto ja = Replay(a, trace(), dir_, &code);
  ASSERT_EQ(code, 0) << Sh("cat " + dir_.File("replay.err")).out;
  // Write-through drains in the background: every block a committed is in the cluster.
  ASSERT_TRUE(WaitUntil([&] {
    auto s = StatsOf(a.socket_path());
    return s.ok() && s->remote && s->remote->puts_in_flight == 0 && s->remote->puts_queued == 0;
  }));
  auto jb = Replay(b, trace(), dir_, &code);
  ASSERT_EQ(code, 0) << Sh("cat " + dir_.File("replay.err")).out;
  EXPECT_EQ(jb["corrupt"], 0);
  EXPECT_EQ(jb["errors"], 0);
  EXPECT_GE(jb["hit_ratio"].get<double>(), 0.9) << jb.dump();
  EXPECT_GT(jb["hit_ratio"].get<double>(), ja["hit_ratio"].get<double>());
  // b never saw these prompts: whatever its own tiers did not hold yet came from the
  // cluster (the generated conversations reuse their own prefixes, so b's tiers serve
  // some of the rest).
  const uint64_t total = Hits(jb, "gpu") + Hits(jb, "host") + Hits(jb, "nvme") + Hits(jb, "remote");
  EXPECT_GT(3 * Hits(jb, "remote"), total) << jb.dump();
  // What operators see: kvctl and the metrics say the same.
  auto s = StatsOf(b.socket_path());
  ASSERT_TRUE(s.ok() && s->remote.has_value());
  EXPECT_EQ(s->remote->nodes.size(), 3u);
  // Each remote block is read once, however many lookups saw it on its way up.
  EXPECT_GT(s->remote->fetch_hits, 0u);
  EXPECT_LE(s->remote->fetch_hits, Hits(jb, "remote"));
  EXPECT_EQ(s->remote->checksum_failures, 0u);
  EXPECT_EQ(s->remote->errors, 0u);
  const CmdResult tiers = Sh(BinaryPath("kvctl") + " -s " + b.socket_path() + " tiers");
  EXPECT_NE(tiers.out.find("remote: redis cluster, 3 masters, 3 up"), std::string::npos) << tiers.out;
  const std::string url = MetricsUrl(b);
  // Lookups found at least what the replay then acquired (an Acquire may still miss).
  EXPECT_GE(Metric(url, "kvtier_block_hits_total{tier=\"remote\"}"), static_cast<double>(Hits(jb, "remote")));
  EXPECT_EQ(Metric(url, "kvtier_remote_nodes{state=\"up\"}"), 3);
  EXPECT_GT(Metric(url, "kvtier_bytes_moved_total{path=\"remote_to_host\"}"), 0);
  EXPECT_EQ(Metric(url, "kvtier_remote_checksum_failures_total"), 0);
  EXPECT_EQ(a.Stop(), 0) << a.Log();
  EXPECT_EQ(b.Stop(), 0) << b.Log();
}

// Unknown tenants are "uid=U@node" in the cluster. Under a configured node name (the
// DaemonSet passes the node's, from the downward API, as --node-name) the next pod on the
// node finds them, whatever its host name; another node's name does not.
TEST_F(RemoteTierTest, UnknownTenantsKeepTheirRemoteKeysUnderTheConfiguredNodeName) {
  RedisClusterProcess rc({.masters = 3, .replicas_per_master = 0});
  ASSERT_TRUE(rc.Start().ok());
  const ModelLayout layout = TestLayout("node-name-model");
  const auto chain = HashChain(77, 6);
  DaemonProcess::Options named = Node(rc);
  named.extra_yaml = "node_name: gpu-node-7\n";
  {
    DaemonProcess a(named);
    ASSERT_TRUE(a.Start().ok()) << a.Log();
    ASSERT_TRUE(StoreThrough(a, layout, chain, chain.size()));
    EXPECT_EQ(a.Stop(), 0) << a.Log();
  }
  const std::string ns = EncodeNamespace("uid=" + std::to_string(::getuid()) + "@gpu-node-7", layout.Fingerprint());
  EXPECT_NE(rc.Cli(0, "-c exists " + RemoteCodec().Key("kvtier:", EncodeBlockKey(ns, chain[0]))).find('1'),
            std::string::npos)
      << "no key under uid=U@gpu-node-7";
  auto matched = [&](const std::vector<std::string>& args) -> size_t {
    DaemonProcess::Options o = Node(rc);  // a fresh pod: no NVMe index of the last one
    o.args = args;
    DaemonProcess d(o);
    if (!d.Start().ok()) return 999;
    ClientOptions co = EngineOptions(d.socket_path());
    co.layout = layout;
    auto c = Client::Connect(co);
    auto l = c.ok() ? (*c)->Lookup(chain) : Result<LookupResult>(c.status());
    (void)d.Stop();
    return l.ok() ? l->matched : 998;
  };
  EXPECT_EQ(matched({"--node-name", "gpu-node-7"}), chain.size());
  EXPECT_EQ(matched({"--node-name", "gpu-node-8"}), 0u);
  // A name that could not be a node's is refused before anything starts.
  CmdResult bad = Sh(BinaryPath("kvtierd") + " --check-config --node-name 'a@b' 2>&1");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--node-name"), std::string::npos) << bad.out;
}

// Other bytes under a block's key, or a key of another Redis type there (a list): a miss,
// counted, and the key deleted — never served, and not a failure for ever after.
TEST_F(RemoteTierTest, AValueOverwrittenInTheClusterIsAMissNeverServed) {
  RedisClusterProcess rc({.masters = 3, .replicas_per_master = 0});
  ASSERT_TRUE(rc.Start().ok());
  DaemonProcess a(Node(rc)), b(Node(rc));
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  ASSERT_TRUE(b.Start().ok()) << b.Log();
  const ModelLayout layout = TestLayout("remote-model");
  const std::string ns = UnknownTenantNamespace(layout);
  const std::vector<std::string> plants = {"set %s " + std::string(layout.block_bytes + 80, 'z'), "del %s",
                                           "rpush %s not-a-block"};
  for (uint64_t round = 0; round < 2; ++round) {
    const auto chain = HashChain(31 + round, 6);
    ASSERT_TRUE(StoreThrough(a, layout, chain, (round + 1) * chain.size()));
    // Someone plants something else under the key of the chain's fourth block.
    const std::string key = RemoteCodec().Key("kvtier:", EncodeBlockKey(ns, chain[3]));
    ASSERT_NE(rc.Cli(0, "-c exists " + key).find('1'), std::string::npos) << "no such key: " << key;
    auto plant = [&](std::string cmd) { rc.Cli(0, "-c " + cmd.replace(cmd.find("%s"), 2, key)); };
    if (round == 0) {
      plant(plants[0]);
    } else {
      plant(plants[1]);
      plant(plants[2]);
      ASSERT_NE(rc.Cli(0, "-c type " + key).find("list"), std::string::npos);
    }
    ClientOptions o = EngineOptions(b.socket_path());
    o.layout = layout;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok());
    auto l = (*c)->Lookup(chain);
    ASSERT_TRUE(l.ok());
    ASSERT_EQ(l->matched, chain.size());  // the key exists: Lookup cannot tell
    for (TierKind t : l->tiers) EXPECT_EQ(t, TierKind::kRemote);
    auto acq = (*c)->Acquire(chain);
    ASSERT_TRUE(acq.ok());
    std::vector<BlockHash> held;
    for (size_t i = 0; i < chain.size(); ++i) {
      const BlockResult& r = (*acq)[i];
      if (i == 3) {
        EXPECT_EQ(r.status.code(), StatusCode::kDataLoss) << "a planted value was served: " << r.status.ToString();
        continue;
      }
      ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.ToString();
      held.push_back(chain[i]);
      auto bytes = (*c)->PageBytes(r.tier, r.page);
      EXPECT_TRUE(CheckBlockPattern(chain[i], bytes.first(layout.block_bytes))) << i;
    }
    ASSERT_TRUE((*c)->Release(TierKind::kHost, {}, held).ok());
    auto s = StatsOf(b.socket_path());
    ASSERT_TRUE(s.ok() && s->remote);
    EXPECT_EQ(s->remote->checksum_failures, round + 1);
    EXPECT_EQ(s->checksum_failures, round + 1);
    EXPECT_EQ(Metric(MetricsUrl(b), "kvtier_remote_checksum_failures_total"), static_cast<double>(round + 1));
    // The bad value is gone from the cluster: the next lookup ends the prefix before it.
    ASSERT_TRUE(WaitUntil([&] { return rc.Cli(0, "-c exists " + key).find('0') != std::string::npos; }));
    auto again = (*c)->Lookup(chain);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->matched, 3u);
  }
}

TEST_F(RemoteTierTest, AMasterKilledMidReplayCostsMissesOnlyAndHitsComeBack) {
  // 3 s: a shorter node timeout made masters fail over on their own under TSan's load.
  RedisClusterProcess rc({.masters = 3, .replicas_per_master = 1, .node_timeout_ms = 3000});
  ASSERT_TRUE(rc.Start().ok());
  DaemonProcess a(Node(rc)), b(Node(rc)), c(Node(rc));
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  ASSERT_TRUE(b.Start().ok()) << b.Log();
  ASSERT_TRUE(c.Start().ok()) << c.Log();
  int code = -1;
  Replay(a, trace(), dir_, &code);
  ASSERT_EQ(code, 0);
  ASSERT_TRUE(WaitUntil([&] {
    auto s = StatsOf(a.socket_path());
    return s.ok() && s->remote && s->remote->puts_in_flight == 0 && s->remote->puts_queued == 0;
  }));
  for (size_t m = 0; m < 3; ++m) ASSERT_TRUE(rc.WaitReplicated(m)) << "master " << m;
  nlohmann::json jb;
  std::thread replay([&] { jb = Replay(b, trace(), dir_, &code); });
  EXPECT_TRUE(WaitForLookups(b, 20)) << b.Log();  // the master dies under the replay
  rc.Kill(1);
  replay.join();
  ASSERT_EQ(code, 0) << Sh("cat " + dir_.File("replay.err")).out;
  EXPECT_EQ(jb["corrupt"], 0);
  EXPECT_EQ(jb["errors"], 0) << "a dead master must cost misses, never errors";
  auto sb = StatsOf(b.socket_path());
  ASSERT_TRUE(sb.ok() && sb->remote);
  // Once the replica has taken over, a third node is served from the whole cluster again.
  // (Failover takes a few seconds; on a loaded 2-vCPU machine, up to tens.)
  ASSERT_TRUE(rc.WaitHealthy(0, 90000)) << rc.Cli(0, "cluster nodes");
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto s = StatsOf(c.socket_path());
        if (!s.ok() || !s->remote) return false;
        for (const auto& n : s->remote->nodes) {
          if (n.address == rc.Addresses()[1]) return false;  // the dead one is still in its map
        }
        return s->remote->nodes.size() == 3;
      },
      std::chrono::seconds(60)));
  auto jc = Replay(c, trace(), dir_, &code);
  ASSERT_EQ(code, 0);
  EXPECT_EQ(jc["corrupt"], 0);
  EXPECT_EQ(jc["errors"], 0);
  EXPECT_GE(jc["hit_ratio"].get<double>(), 0.9) << jc.dump();
}

TEST_F(RemoteTierTest, WriteBackPutsWhatLeavesHostMemory) {
  RedisClusterProcess rc({.masters = 3, .replicas_per_master = 0});
  ASSERT_TRUE(rc.Start().ok());
  // No NVMe tier: host is the last local tier, and write_back puts what it evicts.
  DaemonProcess::Options o = Node(rc, "    write_policy: write_back\n");
  o.nvme_capacity.clear();
  DaemonProcess a(o), b(Node(rc));
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  ASSERT_TRUE(b.Start().ok()) << b.Log();
  int code = -1;
  auto ja = Replay(a, trace(), dir_, &code);
  ASSERT_EQ(code, 0) << Sh("cat " + dir_.File("replay.err")).out;
  EXPECT_EQ(ja["errors"], 0);
  auto sa = StatsOf(a.socket_path());
  ASSERT_TRUE(sa.ok() && sa->remote);
  EXPECT_EQ(sa->remote->write_policy, "write_back");
  // Only what was evicted was put: every stored block but those host still holds (at
  // most its 256 pages).
  const double stored = Metric(MetricsUrl(a), "kvtier_commits_total{outcome=\"stored\"}");
  const double blocks_in_host = static_cast<double>(sa->tiers[0].blocks);
  ASSERT_EQ(sa->tiers[0].name, "host");
  EXPECT_GT(sa->remote->puts, 0u);
  EXPECT_LE(static_cast<double>(sa->remote->puts), stored);
  EXPECT_GE(static_cast<double>(sa->remote->puts) + blocks_in_host, stored) << "a block left host without a put";
  auto jb = Replay(b, trace(), dir_, &code);
  ASSERT_EQ(code, 0);
  EXPECT_EQ(jb["corrupt"], 0);
  EXPECT_GT(Hits(jb, "remote"), 0u);
}

TEST_F(RemoteTierTest, ATenantsRemoteQuotaDeletesItsOldestPuts) {
  RedisClusterProcess rc({.masters = 3, .replicas_per_master = 0});
  ASSERT_TRUE(rc.Start().ok());
  const ModelLayout layout = TestLayout("quota-model");
  DaemonProcess::Options o = Node(rc);
  o.page_bytes = "64KiB";
  o.nvme_capacity = "16MiB";
  // This test's own uid is the tenant: at most 10 blocks of it in the cluster from this node.
  o.extra_yaml = "security:\n  tenants: [{name: capped, uids: [" + std::to_string(::getuid()) +
                 "], quota: {remote: " + std::to_string(10 * layout.block_bytes) + "}}]\n";
  DaemonProcess a(o);
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  ClientOptions co = EngineOptions(a.socket_path());
  co.layout = layout;
  auto c = Client::Connect(co);
  ASSERT_TRUE(c.ok());
  const auto chain = HashChain(51, 30);
  for (size_t from = 0; from < chain.size(); from += 10) {
    std::vector<BlockHash> part(chain.begin() + static_cast<long>(from), chain.begin() + static_cast<long>(from) + 10);
    ASSERT_TRUE(Store(**c, part, layout.block_bytes).ok());
  }
  ASSERT_TRUE(WaitUntil([&] {
    auto s = StatsOf(a.socket_path());
    return s.ok() && s->remote && s->remote->puts == chain.size();
  }));
  EXPECT_EQ(Metric(MetricsUrl(a), "kvtier_remote_quota_deletes_total"), 20);
  // In the cluster: 10 of them (the oldest puts to complete went; puts run in parallel on
  // several connections, so "oldest" is by completion).
  const std::string ns = EncodeNamespace("capped", layout.Fingerprint());
  auto exists = [&](const BlockHash& h) {
    return rc.Cli(0, "-c exists " + RemoteCodec().Key("kvtier:", EncodeBlockKey(ns, h))).find('1') != std::string::npos;
  };
  auto held = [&] {
    size_t n = 0;
    for (const BlockHash& h : chain) n += exists(h);
    return n;
  };
  ASSERT_TRUE(WaitUntil([&] { return held() == 10; })) << held();
}

// The cluster is shared with whoever can reach it. An ACL keeps out who has no password;
// under a fleet secret key names say nothing of tenant or model, and a value moved from
// one key to another or planted by someone without the secret (the cluster's admin
// included) is a miss, counted, never served.
TEST_F(RemoteTierTest, AnAclAndAFleetSecretKeepOthersOut) {
  RedisClusterProcess rc({.masters = 3, .replicas_per_master = 0, .password = "admin-pass-7"});
  ASSERT_TRUE(rc.Start().ok());
  for (size_t i = 0; i < rc.size(); ++i) {
    // The ACL docs/operations.md gives (Securing the remote tier).
    ASSERT_NE(rc.Cli(i,
                     "acl setuser kvtierd on '>kvtierd-pass-3' '~kvtier:*' +@read +@write +@keyspace -@dangerous "
                     "'+cluster|slots' +ping +asking")
                  .find("OK"),
              std::string::npos);
  }
  const std::string secret = "fleet-secret-0123456789-abcdefghijklmnop";
  const std::string yaml = "    username: kvtierd\n    password_file: " + SecretFile(dir_, "pw", "kvtierd-pass-3") +
                           "\n    secret_file: " + SecretFile(dir_, "secret", secret) + "\n";
  DaemonProcess a(Node(rc, yaml)), b(Node(rc, yaml));
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  ASSERT_TRUE(b.Start().ok()) << b.Log();
  const ModelLayout layout = TestLayout("remote-model");
  const auto chain = HashChain(77, 8);
  ASSERT_TRUE(StoreThrough(a, layout, chain, chain.size()));
  // Key names: the prefix and a keyed hash, nothing of tenant or model.
  std::string keys;
  for (size_t i = 0; i < rc.size(); ++i) keys += rc.Cli(i, "--scan");
  EXPECT_EQ(std::count(keys.begin(), keys.end(), '\n'), static_cast<long>(chain.size())) << keys;
  for (const std::string& clear : {std::string("uid="), std::string("remote-model"), layout.Fingerprint()}) {
    EXPECT_EQ(keys.find(HexEncode(clear)), std::string::npos) << clear;
    EXPECT_EQ(keys.find(clear), std::string::npos) << clear;
  }
  // Without the password nobody gets in.
  const CmdResult anon = Sh("timeout 10 redis-cli -p " + std::to_string(rc.port(0)) + " --scan 2>&1");
  EXPECT_NE(anon.out.find("NOAUTH"), std::string::npos) << anon.out;
  // The cluster's admin (who has no fleet secret) moves block 2's value onto block 5's key
  // and plants a value sealed without the secret at block 6's key.
  auto codec = RemoteCodec::Keyed(secret);
  ASSERT_TRUE(codec.ok());
  const std::string ns = UnknownTenantNamespace(layout);
  auto key = [&](size_t i) { return codec->Key("kvtier:", EncodeBlockKey(ns, chain[i])); };
  // Callbacks are posted from the client's connection threads; this thread runs them.
  std::mutex mu;
  std::deque<std::function<void()>> posted;
  RedisClusterOptions admin;
  admin.seeds = rc.Seeds();
  admin.password = "admin-pass-7";
  auto cluster = RedisCluster::Open(admin, [&](std::function<void()> fn) {
    std::lock_guard<std::mutex> l(mu);
    posted.push_back(std::move(fn));
  });
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto run = [&](auto issue) {
    std::optional<RedisReply> rep;
    issue([&](const RedisReply& r) { rep = r; });
    EXPECT_TRUE(WaitUntil([&] {
      std::deque<std::function<void()>> ready;
      {
        std::lock_guard<std::mutex> l(mu);
        ready.swap(posted);
      }
      for (auto& fn : ready) fn();
      return rep.has_value();
    }));
    return rep.value_or(RedisReply{Internal("no reply"), 0, 0});
  };
  std::vector<uint8_t> moved;
  ASSERT_TRUE(run([&](auto done) {
                (*cluster)->Get(
                    key(2),
                    [&](std::span<const uint8_t> v) {
                      moved.assign(v.begin(), v.end());
                      return Status::Ok();
                    },
                    done);
              }).status.ok());
  ASSERT_FALSE(moved.empty());
  std::vector<uint8_t> forged(layout.block_bytes);
  FillBlockPattern(chain[1], forged);  // someone else's KV
  const std::string head = RemoteCodec().EncodeHeader(
      key(6),
      LowerBlockMeta{static_cast<uint32_t>(forged.size()), layout.Fingerprint(),
                     std::string(reinterpret_cast<const char*>(chain[5].bytes().data()), chain[5].bytes().size())},
      forged);
  RedisCluster::Value mv, fv;
  mv.body = moved;
  fv.head = head;
  fv.body = forged;
  ASSERT_TRUE(run([&](auto done) { (*cluster)->Set(key(5), std::move(mv), done); }).status.ok());
  ASSERT_TRUE(run([&](auto done) { (*cluster)->Set(key(6), std::move(fv), done); }).status.ok());
  // b: every other block is served, with its own bytes; 5 and 6 are misses, counted.
  ClientOptions o = EngineOptions(b.socket_path());
  o.layout = layout;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  auto acq = (*c)->Acquire(chain);
  ASSERT_TRUE(acq.ok());
  std::vector<BlockHash> held;
  for (size_t i = 0; i < chain.size(); ++i) {
    const BlockResult& r = (*acq)[i];
    if (i == 5 || i == 6) {
      EXPECT_EQ(r.status.code(), StatusCode::kDataLoss) << i << ": a moved or planted value was served";
      continue;
    }
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.ToString();
    held.push_back(chain[i]);
    EXPECT_TRUE(CheckBlockPattern(chain[i], (*c)->PageBytes(r.tier, r.page).first(layout.block_bytes))) << i;
  }
  ASSERT_TRUE((*c)->Release(TierKind::kHost, {}, held).ok());
  auto st = StatsOf(b.socket_path());
  ASSERT_TRUE(st.ok() && st->remote);
  EXPECT_EQ(st->remote->checksum_failures, 2u);
  EXPECT_EQ(Metric(MetricsUrl(b), "kvtier_remote_authenticated"), 1);
  EXPECT_EQ(a.Stop(), 0) << a.Log();
  EXPECT_EQ(b.Stop(), 0) << b.Log();
}

// A wrong password: kvtierd serves from its own tiers and says why the cluster is not
// used, in Redis' own words.
TEST_F(RemoteTierTest, AWrongPasswordIsLoggedWithRedisWords) {
  RedisClusterProcess rc({.masters = 1, .replicas_per_master = 0, .cluster = false, .password = "right"});
  ASSERT_TRUE(rc.Start().ok());
  DaemonProcess::Options o = Node(rc, "    password_file: " + SecretFile(dir_, "pw", "wrong") + "\n");
  o.remote_nodes = rc.Seeds(1);
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  EXPECT_TRUE(WaitUntil([&] { return d.Log().find("WRONGPASS") != std::string::npos; })) << d.Log();
  EXPECT_NE(d.Log().find("tiers.remote.secret_file is not set"), std::string::npos) << d.Log();
  EXPECT_EQ(Metric(MetricsUrl(d), "kvtier_remote_authenticated"), 0);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// A cluster out of memory (noeviction) refuses puts: kvtierd says so in Redis' words,
// counts them failed (not stored), and backs off instead of shipping every block's bytes.
TEST_F(RemoteTierTest, AFullClusterIsLoggedAndPutsBackOff) {
  RedisClusterProcess rc(
      {.masters = 1, .replicas_per_master = 0, .maxmemory = "3mb", .maxmemory_policy = "noeviction", .cluster = false});
  ASSERT_TRUE(rc.Start().ok());
  DaemonProcess::Options o = Node(rc);
  o.remote_nodes = rc.Seeds(1);
  o.host_capacity = "8MiB";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const ModelLayout layout = TestLayout("full-model");
  ClientOptions co = EngineOptions(d.socket_path());
  co.layout = layout;
  auto c = Client::Connect(co);
  ASSERT_TRUE(c.ok());
  for (uint64_t seq = 0; seq < 40; ++seq) {
    ASSERT_TRUE(Store(**c, HashChain(500 + seq, 8), layout.block_bytes).ok());
  }
  ASSERT_TRUE(WaitUntil([&] { return d.Log().find("OOM command not allowed") != std::string::npos; })) << d.Log();
  EXPECT_NE(d.Log().find("puts back off"), std::string::npos) << d.Log();
  // Backing off: a chain committed while puts pause is skipped, none of its bytes sent. The
  // pause is 1 s doubling per refusal, so a machine too slow to store inside one pause gets
  // a longer one on its next try; a try counts only if no new pause began during it.
  const std::string url = MetricsUrl(d);
  bool skipped_during_a_pause = false;
  for (uint64_t attempt = 0; attempt < 5 && !skipped_during_a_pause; ++attempt) {
    ASSERT_TRUE(WaitUntil([&] {
      auto s = StatsOf(d.socket_path());
      return s.ok() && s->remote && s->remote->puts_in_flight == 0 && s->remote->puts_queued == 0;
    }));
    auto before = StatsOf(d.socket_path());
    const double backoffs = Metric(url, "kvtier_remote_put_backoffs_total");
    ASSERT_TRUE(Store(**c, HashChain(900 + attempt, 8), layout.block_bytes).ok());
    auto after = StatsOf(d.socket_path());
    ASSERT_TRUE(before.ok() && after.ok() && before->remote && after->remote);
    const uint64_t sent_before = before->remote->puts + before->remote->puts_failed + before->remote->puts_in_flight;
    const uint64_t sent_after = after->remote->puts + after->remote->puts_failed + after->remote->puts_in_flight;
    if (sent_after == sent_before && Metric(url, "kvtier_remote_put_backoffs_total") == backoffs) {
      EXPECT_EQ(after->remote->puts_skipped, before->remote->puts_skipped + 8);
      skipped_during_a_pause = true;
    } else {
      // The pause ended before the chain was committed: its puts went out and were refused.
      ASSERT_TRUE(WaitUntil([&] { return Metric(url, "kvtier_remote_put_backoffs_total") > backoffs; }))
          << "puts " << before->remote->puts << "->" << after->remote->puts << ", failed "
          << before->remote->puts_failed << "->" << after->remote->puts_failed
          << ": sent in a pause, or refused without a new one\n"
          << d.Log();
    }
  }
  EXPECT_TRUE(skipped_during_a_pause) << d.Log();
  auto s = StatsOf(d.socket_path());
  ASSERT_TRUE(s.ok() && s->remote);
  EXPECT_GT(s->remote->puts_failed, 0u);
  EXPECT_LT(s->remote->puts * layout.block_bytes, 3u << 20) << "more stored than the cluster holds";
  EXPECT_GE(Metric(url, "kvtier_remote_put_backoffs_total"), 1);
  EXPECT_EQ(Metric(url, "kvtier_remote_put_failures_total"), static_cast<double>(s->remote->puts_failed));
  const CmdResult tiers = Sh(BinaryPath("kvctl") + " -s " + d.socket_path() + " tiers");
  EXPECT_NE(tiers.out.find(std::to_string(s->remote->puts_failed) + " failed"), std::string::npos) << tiers.out;
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST_F(RemoteTierTest, AClusterThatIsNotThereCostsNothing) {
  // Nothing listens there: kvtierd starts, serves from its local tiers, and counts errors.
  DaemonProcess::Options o = Node(RedisClusterProcess());
  o.remote_nodes = {"127.0.0.1:1"};
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  int code = -1;
  auto j = Replay(d, trace(), dir_, &code);
  ASSERT_EQ(code, 0);
  EXPECT_EQ(j["errors"], 0);
  EXPECT_EQ(j["corrupt"], 0);
  EXPECT_EQ(Hits(j, "remote"), 0u);
  EXPECT_GT(j["hit_ratio"].get<double>(), 0.3);
  auto s = StatsOf(d.socket_path());
  ASSERT_TRUE(s.ok() && s->remote);
  EXPECT_TRUE(s->remote->nodes.empty());  // no slot map was ever read
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// A "cluster" that lies, through a real kvtierd: a node that says it holds every block and
// then answers GET with a 300 MB value (64 MiB of it sent), with a key of another Redis
// type, with MOVED to a new port every time, and a slot map of 1,024 masters. Every
// lookup it answers is at most a miss for the engine, nothing it sends is served, and the
// daemon's threads and memory stay bounded (they grew to 3,074 threads and ~900 MB).
TEST(RemoteHostile, ANodeThatLiesIsNeverServedAndCannotGrowTheDaemon) {
  enum Mode : int { kHuge, kWrongType, kMoved, kManyMasters };
  std::atomic<int> mode{kHuge};
  std::atomic<int> next_port{0};
  const auto huge = std::make_shared<const std::string>("$300000000\r\n" + std::string(64 << 20, 'x'));
  const std::string many = FakeRedisNode::SlotsForMany(1024);
  FakeRedisNode node([&](const std::vector<std::string>& a) -> FakeRedisNode::Reply {
    const std::string& cmd = a[0];
    if (cmd == "CLUSTER") return mode == kManyMasters ? many : FakeRedisNode::SlotsForOne(node.port());
    if (cmd == "PING") return "+PONG\r\n";
    if (cmd == "DEL") return ":1\r\n";
    if (mode == kMoved || mode == kManyMasters) {
      return "-MOVED 0 127.0.0.1:" + std::to_string(2 + next_port++ % 1000) + "\r\n";
    }
    if (cmd == "EXISTS") return ":1\r\n";
    if (cmd == "GET") {
      if (mode == kHuge) return huge;
      return "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";
    }
    return "-ERR unknown command\r\n";
  });
  ASSERT_TRUE(node.Start().ok());
  DaemonProcess::Options o;
  o.host_capacity = "8MiB";
  o.page_bytes = "64KiB";
  o.segment_bytes = "1MiB";
  o.log_level = "info";
  o.remote_nodes = {node.address()};
  o.remote_yaml = "    timeout: 1s\n    connect_timeout: 100ms\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ClientOptions co = EngineOptions(d.socket_path());
  auto c = Client::Connect(co);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // One lookup and acquire of a chain no local tier holds: whatever the node says, no
  // block is served from it.
  uint64_t seed = 1000;
  auto probe = [&](const char* what) {
    const auto chain = HashChain(seed++, 8);
    auto l = (*c)->Lookup(chain);
    ASSERT_TRUE(l.ok()) << what << ": " << l.status().ToString();
    auto acq = (*c)->Acquire(chain);
    ASSERT_TRUE(acq.ok()) << what << ": " << acq.status().ToString();
    std::vector<BlockHash> held;
    for (size_t i = 0; i < chain.size(); ++i) {
      if ((*acq)[i].status.ok()) held.push_back(chain[i]);
    }
    EXPECT_TRUE(held.empty()) << what << ": " << held.size() << " blocks served from a lying node";
    if (!held.empty()) (void)(*c)->Release(TierKind::kHost, {}, held);
  };
  probe("warm-up");
  const uint64_t rss_before = ProcStatusKb(d.pid(), "VmRSS");
  uint64_t most_threads = 0;
  for (int m : {kHuge, kWrongType, kMoved, kManyMasters}) {
    mode = m;
    for (int round = 0; round < 12; ++round) {
      probe(m == kHuge ? "huge value" : m == kWrongType ? "wrong type" : m == kMoved ? "MOVED" : "1,024 masters");
      most_threads = std::max(most_threads, ProcStatusKb(d.pid(), "Threads"));
    }
  }
  const uint64_t rss_after = ProcStatusKb(d.pid(), "VmRSS");
  const uint64_t rss_peak = ProcStatusKb(d.pid(), "VmHWM");  // a buffer since freed counts too
  const std::string url = MetricsUrl(d);
  EXPECT_GE(Metric(url, "kvtier_remote_oversized_replies_total"), 1) << "the huge value was never asked for";
  EXPECT_GE(Metric(url, "kvtier_remote_checksum_failures_total"), 12) << "the refused values were not counted\n"
                                                                      << d.Log();
  EXPECT_GE(Metric(url, "kvtier_remote_redirects_total"), 12);
  // The map is read again on the refresh thread, at most every 200 ms after a MOVED.
  EXPECT_TRUE(WaitUntil([&] { return Metric(url, "kvtier_remote_slot_maps_refused_total") >= 1; }))
      << "the 1,024-master map was never read";
  // A connection thread per pooled connection of the node and of at most four strangers,
  // plus the daemon's own: far below one per redirect target (3,074 before).
  EXPECT_LT(most_threads, 100u);
  if (!kSanitized) {
    EXPECT_LT(rss_peak, rss_before + 32 * 1024) << "RSS peaked at " << rss_peak << " KiB from " << rss_before;
  }
  std::cout << "threads at most " << most_threads << "; RSS " << rss_before << " -> " << rss_after << " KiB, peak "
            << rss_peak << " KiB\n";
  // The daemon still serves what its own tiers hold.
  const auto local = HashChain(7, 4);
  ASSERT_TRUE(Store(**c, local, co.layout.block_bytes).ok());
  auto acq = (*c)->Acquire(local);
  ASSERT_TRUE(acq.ok());
  for (size_t i = 0; i < local.size(); ++i) {
    ASSERT_TRUE((*acq)[i].status.ok()) << i;
    EXPECT_TRUE(
        CheckBlockPattern(local[i], (*c)->PageBytes((*acq)[i].tier, (*acq)[i].page).first(co.layout.block_bytes)));
  }
  ASSERT_TRUE((*c)->Release(TierKind::kHost, {}, local).ok());
  c->reset();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

}  // namespace
}  // namespace kvtier::testing
