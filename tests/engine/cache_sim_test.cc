// The trace simulator (engine/cache_sim.h) over the daemon's policy classes: prefix-hit
// accounting, Belady as a bound, the default policy against LRU, two tiers.
#include "engine/tools/cache_sim.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "storage/policy/eviction_policy.h"

namespace kvtier {
namespace {

Trace Requests(std::vector<std::vector<uint64_t>> ids) {
  std::vector<TraceRequest> rs;
  for (auto& v : ids) {
    TraceRequest r;
    r.hash_ids = std::move(v);
    rs.push_back(std::move(r));
  }
  return MakeTrace("handmade", std::move(rs));
}

SimResult Sim(const Trace& t, std::string_view policy, uint64_t capacity, uint64_t nvme = 0,
              bool admit_reused_only = false) {
  SimConfig c;
  c.host_policy = std::string(policy);
  c.host_capacity = capacity;
  c.nvme_capacity = nvme;
  c.nvme_admit_reused_only = admit_reused_only;
  c.per_request = true;
  auto r = Simulate(t, c);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : SimResult{};
}

TEST(CacheSim, ABlockCountsOnlyIfItsWholePrefixIsCached) {
  // [1 2] then [3 4] in three blocks of LRU: 1 is evicted, 2 stays. [1 2] again: 2 is
  // cached but its prefix is not, so it is no hit.
  const Trace t = Requests({{1, 2}, {3, 4}, {1, 2}});
  SimResult r = Sim(t, "lru", 3);
  EXPECT_EQ(r.blocks, 6u);
  EXPECT_EQ(r.request_hits, (std::vector<uint32_t>{0, 0, 0}));
  // With room for all four, the third request hits both.
  r = Sim(t, "lru", 4);
  EXPECT_EQ(r.request_hits, (std::vector<uint32_t>{0, 0, 2}));
  EXPECT_EQ(r.hits, 2u);
  EXPECT_DOUBLE_EQ(r.hit_ratio(), 2.0 / 6.0);
}

TEST(CacheSim, PrefixAwareEvictionKeepsTheSharedHead) {
  // A shared head [1] with many tails: LRU ends up evicting the head (it is touched first
  // in each request, so it is older than its tail); prefix-LRU keeps it.
  std::vector<std::vector<uint64_t>> ids;
  for (uint64_t i = 0; i < 50; ++i) ids.push_back({1, 100 + 4 * i, 101 + 4 * i, 102 + 4 * i, 103 + 4 * i});
  const Trace t = Requests(ids);
  const SimResult lru = Sim(t, "lru", 4), prefix = Sim(t, "prefix-lru", 4);
  EXPECT_EQ(lru.hits, 0u);
  EXPECT_EQ(prefix.hits, 49u);
}

TEST(CacheSim, RefusesAnEmptyTierOrAnUnknownPolicy) {
  const Trace t = Requests({{1}});
  SimConfig c;
  EXPECT_EQ(Simulate(t, c).status().code(), StatusCode::kInvalidArgument);
  c.host_capacity = 1;
  c.host_policy = "mru";
  EXPECT_FALSE(Simulate(t, c).ok());
}

TEST(CacheSim, BeladyBoundsEveryPolicyOnEveryShape) {
  // MIN is optimal for blocks found cached, and a policy's prefix hits are some of its
  // cached blocks: no policy gets more prefix hits than MIN's block hits. (Not more than
  // MIN's prefix hits does not hold: prefix-lirs keeps chains whole and gets 34.8% on this
  // recency trace at 5%, MIN 33.3%.)
  for (std::string_view shape : TraceShapes()) {
    auto t = GenerateTrace(shape, 2000, 3);
    ASSERT_TRUE(t.ok());
    for (double f : {0.01, 0.05, 0.2}) {
      const uint64_t cap = std::max<uint64_t>(1, static_cast<uint64_t>(f * t->unique_blocks));
      const SimResult min = SimulateBelady(*t, cap);
      EXPECT_GE(min.block_hits, min.hits) << shape << " at " << f;
      for (std::string_view p : EvictionPolicyNames()) {
        EXPECT_LE(Sim(*t, p, cap).hits, min.block_hits) << shape << " " << p << " at " << f;
      }
    }
  }
}

// The acceptance rule of the default policy (docs/benchmarks.md): never worse than LRU by
// more than 0.002 at any capacity, on every trace shape.
void ExpectDefaultAtLeastLru(const Trace& t) {
  for (double f : {0.01, 0.05, 0.2}) {
    const uint64_t cap = std::max<uint64_t>(1, static_cast<uint64_t>(f * t.unique_blocks));
    const double lru = Sim(t, "lru", cap).hit_ratio();
    const double def = Sim(t, kDefaultEvictionPolicy, cap).hit_ratio();
    EXPECT_GE(def, lru - 0.002) << t.name << " at " << f;
  }
}

TEST(CacheSim, DefaultPolicyIsNeverWorseThanLruOnGeneratedShapes) {
  for (std::string_view shape : TraceShapes()) {
    for (uint64_t seed : {1, 2}) {
      auto t = GenerateTrace(shape, 4000, seed);
      ASSERT_TRUE(t.ok());
      ExpectDefaultAtLeastLru(*t);
    }
  }
}

TEST(CacheSim, DefaultPolicyKeepsChainsThatComeBackFartherThanTheTier) {
  // The recency shape at 5%: 30 chains round robin through a tier that holds a fifth of
  // them. LRU evicts each before it comes back (0 hits); adaptive's duel hands the victims
  // to LIRS, which keeps a fixed set of chains whole (65% measured, Belady 72%).
  auto t = GenerateTrace("recency", 4000, 1);
  ASSERT_TRUE(t.ok());
  const uint64_t cap = static_cast<uint64_t>(0.05 * t->unique_blocks);
  EXPECT_EQ(Sim(*t, "lru", cap).hits, 0u);
  EXPECT_GE(Sim(*t, kDefaultEvictionPolicy, cap).hit_ratio(), 0.5);
}

// The project's shared traces: $KVTIER_SHARED_TRACES, else ../shared/traces beside the
// checkout (where CI and sessions have them); empty when neither exists.
std::vector<std::filesystem::path> SharedTraces() {
  std::vector<std::filesystem::path> out;
  const char* const dirs[] = {std::getenv("KVTIER_SHARED_TRACES"), KVTIER_SHARED_TRACES};
  for (const char* dir : dirs) {
    if (dir == nullptr || !std::filesystem::is_directory(dir)) continue;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().extension() == ".jsonl") out.push_back(e.path());
    }
    if (!out.empty()) break;
  }
  return out;
}

// The best ratio of the default policy's hit ratio to LRU's over a few capacities.
double BestGainOverLru(const Trace& t) {
  double best = 0;
  for (double f : {0.01, 0.05, 0.2}) {
    const uint64_t cap = static_cast<uint64_t>(f * t.unique_blocks);
    const double lru = Sim(t, "lru", cap).hit_ratio();
    if (lru > 0) best = std::max(best, Sim(t, kDefaultEvictionPolicy, cap).hit_ratio() / lru);
  }
  return best;
}

TEST(CacheSim, DefaultPolicyBeatsLruOnTheSharedTraces) {
  // Runs on every checkout: with the shared traces (1.1x LRU somewhere, as measured in
  // docs/benchmarks.md), and without them on the generated Zipf shape, where the margin
  // measured is smaller (1.07x at 1%).
  const auto files = SharedTraces();
  if (files.empty()) {
    auto t = GenerateTrace("zipf", 4000, 1);
    ASSERT_TRUE(t.ok());
    ExpectDefaultAtLeastLru(*t);
    EXPECT_GE(BestGainOverLru(*t), 1.05) << "generated zipf (no shared traces here)";
    return;
  }
  for (const auto& f : files) {
    auto t = LoadTrace(f.string());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ExpectDefaultAtLeastLru(*t);
    EXPECT_GE(BestGainOverLru(*t), 1.1) << t->name;
  }
}

TEST(CacheSim, AnNvmeTierBehindTheHostAddsHitsAndAdmissionSavesWrites) {
  auto t = GenerateTrace("conversation-long", 4000, 1);
  ASSERT_TRUE(t.ok());
  const uint64_t cap = t->unique_blocks / 50;
  const SimResult one = Sim(*t, "lru", cap);
  const SimResult two = Sim(*t, "lru", cap, 4 * cap);
  const SimResult admit = Sim(*t, "lru", cap, 4 * cap, /*admit_reused_only=*/true);
  EXPECT_EQ(one.nvme_hits, 0u);
  EXPECT_GT(two.nvme_hits, 0u);
  EXPECT_EQ(two.hits, two.host_hits + two.nvme_hits);
  EXPECT_GT(two.hit_ratio(), one.hit_ratio());
  EXPECT_LT(admit.nvme_writes, two.nvme_writes);
  // An NVMe tier as large as the host plus it, under Belady, bounds the pair.
  EXPECT_LE(two.hit_ratio(), SimulateBelady(*t, 5 * cap).hit_ratio());
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// Two sessions paused while one-off requests stream by: with their hints (a TTL covering the
// pause), their contexts outlive the stream; without, LRU and the default lose them.
Trace PausedSessions(bool with_sessions) {
  std::vector<TraceRequest> rs;
  auto add = [&](int64_t t, std::vector<uint64_t> ids, const char* session) {
    TraceRequest r;
    r.timestamp_ms = t;
    r.hash_ids = std::move(ids);
    if (with_sessions && session != nullptr) {
      r.session_id = session;
      r.cache_ttl_s = 100;
    }
    rs.push_back(std::move(r));
  };
  add(0, {1, 2, 3, 4}, "a");
  add(1000, {11, 12, 13, 14}, "b");
  for (uint64_t i = 0; i < 10; ++i)
    add(2000 + 1000 * static_cast<int64_t>(i), {100 + 4 * i, 101 + 4 * i, 102 + 4 * i, 103 + 4 * i}, nullptr);
  add(20'000, {1, 2, 3, 4, 5}, "a");
  add(21'000, {11, 12, 13, 14, 15}, "b");
  return MakeTrace("paused", std::move(rs));
}

TEST(CacheSim, SessionHintsKeepPausedSessionsThroughAStreamOfOneOffRequests) {
  const Trace hinted = PausedSessions(true), plain = PausedSessions(false);
  ASSERT_TRUE(hinted.has_sessions);
  ASSERT_FALSE(plain.has_sessions);
  SimConfig c;
  c.host_capacity = 12;
  c.per_request = true;
  for (std::string_view policy : {std::string_view("lru"), kDefaultEvictionPolicy}) {
    c.host_policy = std::string(policy);
    c.hints = false;
    auto without = Simulate(hinted, c);
    c.hints = true;
    auto with = Simulate(hinted, c);
    ASSERT_TRUE(without.ok() && with.ok());
    EXPECT_EQ(without->request_hits.end()[-2] + without->request_hits.back(), 0u) << policy;
    EXPECT_EQ(with->request_hits.end()[-2], 4u) << policy;
    EXPECT_EQ(with->request_hits.back(), 4u) << policy;
    // A trace without session fields: hints change nothing.
    auto a = Simulate(plain, c);
    c.hints = false;
    auto b = Simulate(plain, c);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->request_hits, b->request_hits) << policy;
  }
}

TEST(CacheSim, AnEndedSessionsBlocksGoBeforeAnyoneElses) {
  // "a" ends; "b" is a plain request with no session. With hints a's blocks go first, so
  // "b" comes back to a hit; without them LRU evicts "b" (older) instead.
  std::vector<TraceRequest> rs(4);
  rs[0].timestamp_ms = 0;
  rs[0].hash_ids = {50, 51};
  rs[1].timestamp_ms = 1;
  rs[1].hash_ids = {1, 2};
  rs[1].session_id = "a";
  rs[1].cache_ttl_s = 100;
  rs[1].session_end = true;
  rs[2].timestamp_ms = 2;
  rs[2].hash_ids = {60, 61};
  rs[3].timestamp_ms = 3;
  rs[3].hash_ids = {50, 51};
  const Trace t = MakeTrace("ended", std::move(rs));
  SimConfig c;
  c.host_policy = "lru";
  c.host_capacity = 4;
  c.per_request = true;
  auto without = Simulate(t, c);
  c.hints = true;
  auto with = Simulate(t, c);
  ASSERT_TRUE(without.ok() && with.ok());
  EXPECT_EQ(without->request_hits.back(), 0u);
  EXPECT_EQ(with->request_hits.back(), 2u);
}

}  // namespace
}  // namespace kvtier
