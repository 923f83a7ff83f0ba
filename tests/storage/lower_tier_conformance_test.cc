// The LowerTier contract (storage/lower_tier.h), clause by clause, over every lower tier:
// the memory tier, the remote tier on a real Redis server (Debian's redis-server, started
// here on a loopback port), and the fake the seam's own tests use. A new tier joins by a
// row in Tiers() below ("Adding a tier", docs/architecture.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "protocol/base/block_key.h"
#include "storage/lower_tier.h"
#include "storage/memory/memory_tier.h"
#include "storage/remote/remote_tier.h"
#include "tests/support/fake_lower_tier.h"
#include "tests/support/posted_loop.h"
#include "tests/support/redis_cluster_process.h"
#include "tests/support/test_util.h"

namespace kvtier {
namespace {

using testing::PostedLoop;
using testing::RedisClusterProcess;
using testing::SeededBytes;

constexpr uint32_t kBytes = 16 * 1024;
constexpr const char* kFingerprint = "fingerprint-conformance";

// A tier under test and what only its maker knows.
struct Made {
  std::unique_ptr<LowerTier> tier;
  // Replaces the stored value of `block_key` with other bytes of the same size, as a
  // broken or hostile store would; null where nothing outside the tier can reach its values.
  std::function<void(const std::string& block_key)> corrupt;
  // The most bytes the tier accepts in one Put (a larger one is refused for space).
  uint64_t most_bytes = 0;
  std::shared_ptr<void> keep;  // what the tier needs alive (a Redis server)
};

struct TierMaker {
  std::string name;
  // An empty Made (with the reason in *skip) where the tier cannot be made here.
  std::function<Made(Post post, std::string* skip)> make;
};

void PrintTo(const TierMaker& m, std::ostream* os) { *os << m.name; }

std::vector<TierMaker> Tiers() {
  return {
      {"memory",
       [](Post post, std::string*) {
         Made m;
         auto t = MemoryTier::Open({.capacity_bytes = 1 << 20}, std::move(post));
         EXPECT_TRUE(t.ok()) << t.status().ToString();
         if (t.ok()) m.tier = std::move(t).value();
         m.most_bytes = 1 << 20;
         return m;
       }},
      {"remote",
       [](Post post, std::string* skip) {
         Made m;
         if (!RedisClusterProcess::Available()) {
           *skip = "redis-server / redis-cli not installed (scripts/deps.sh)";
           return m;
         }
         // Full at 4 MiB and refusing writes then (noeviction), as a store without room does.
         auto rc = std::make_shared<RedisClusterProcess>(RedisClusterProcess::Options{.masters = 1,
                                                                                      .replicas_per_master = 0,
                                                                                      .maxmemory = "4mb",
                                                                                      .maxmemory_policy = "noeviction",
                                                                                      .cluster = false});
         if (Status st = rc->Start(); !st.ok()) {
           ADD_FAILURE() << st.ToString();
           return m;
         }
         RemoteTierOptions o;
         o.cluster.seeds = rc->Seeds(1);
         o.cluster.timeout_ns = 2'000'000'000;
         auto t = RemoteTier::Open(o, std::move(post));
         EXPECT_TRUE(t.ok()) << t.status().ToString();
         if (t.ok()) m.tier = std::move(t).value();
         m.corrupt = [rc, prefix = o.key_prefix](const std::string& block_key) {
           const std::string key = RemoteCodec().Key(prefix, block_key);
           const std::string len = rc->Cli(0, "strlen " + key);
           rc->Cli(0, "set " + key + " " + std::string(static_cast<size_t>(std::stoul(len)), 'x'));
         };
         m.most_bytes = 4 << 20;
         m.keep = rc;
         return m;
       }},
      {"fake",
       [](Post post, std::string*) {
         Made m;
         auto store = std::make_shared<testing::FakeLowerTier::Store>();
         auto fake = std::make_unique<testing::FakeLowerTier>(store, std::move(post));
         fake->capacity = 64;  // values
         m.corrupt = [store](const std::string& block_key) { (*store)[block_key].bytes[0] ^= 1; };
         m.most_bytes = 64 * kBytes;
         m.tier = std::move(fake);
         return m;
       }},
  };
}

class LowerTierConformance : public ::testing::TestWithParam<TierMaker> {
 protected:
  void SetUp() override {
    std::string skip;
    made_ = GetParam().make(loop_.Poster(), &skip);
    if (!skip.empty()) GTEST_SKIP() << skip;
    ASSERT_TRUE(made_.tier);
  }
  LowerTier& tier() { return *made_.tier; }

  static std::string Key(int i) {
    return EncodeBlockKey(EncodeNamespace("tenant", kFingerprint),
                          BlockHash(std::vector<uint8_t>(16, static_cast<uint8_t>(i))));
  }
  static LowerBlockMeta Meta(uint32_t length, int parent) {
    return {length, kFingerprint, parent < 0 ? std::string() : std::string(16, static_cast<char>(parent))};
  }
  Status Put(int i, const std::vector<uint8_t>& data, int parent = -1) {
    std::optional<Status> st;
    tier().Put(Key(i), Meta(static_cast<uint32_t>(data.size()), parent), data, [&](Status s) { st = s; });
    EXPECT_TRUE(loop_.Pump([&] { return st.has_value(); })) << "no answer to a Put";
    return st.value_or(Internal("no answer"));
  }
  struct Got {
    Status status;
    LowerBlockMeta meta;
  };
  Got Fetch(int i, std::vector<uint8_t>* dst, uint32_t length = kBytes, const std::string& fingerprint = kFingerprint) {
    std::optional<Got> got;
    tier().Fetch(Key(i), fingerprint, length, *dst, [&](Status s, LowerBlockMeta m) { got = Got{s, std::move(m)}; });
    EXPECT_TRUE(loop_.Pump([&] { return got.has_value(); })) << "no answer to a Fetch";
    return got.value_or(Got{Internal("no answer"), {}});
  }
  std::vector<bool> Exists(const std::vector<int>& ids) {
    std::vector<std::string> keys;
    for (int i : ids) keys.push_back(Key(i));
    std::optional<std::vector<bool>> found;
    tier().Exists(keys, [&](std::vector<bool> f) { found = std::move(f); });
    EXPECT_TRUE(loop_.Pump([&] { return found.has_value(); })) << "no answer to an Exists";
    return found.value_or(std::vector<bool>());
  }
  static std::vector<std::string_view> FigureKeys(const LowerTierReport& r) {
    std::vector<std::string_view> keys;
    for (const TierFigure& f : r.figures) keys.push_back(f.key);
    return keys;
  }

  PostedLoop loop_;
  Made made_;
};

TEST_P(LowerTierConformance, NamesItselfAsALowerTierAndCanBeAsked) {
  EXPECT_TRUE(IsLowerTier(tier().kind()));
  EXPECT_FALSE(tier().Describe().empty());
  EXPECT_TRUE(tier().available());
}

TEST_P(LowerTierConformance, AFetchAfterAPutGetsExactlyTheBlockAndItsMeta) {
  const auto data = SeededBytes(kBytes, 1);
  ASSERT_TRUE(Put(1, data, /*parent=*/7).ok());
  std::vector<uint8_t> dst(kBytes, 0);
  const Got g = Fetch(1, &dst);
  ASSERT_TRUE(g.status.ok()) << g.status.ToString();
  EXPECT_EQ(dst, data);
  EXPECT_EQ(g.meta.length, kBytes);
  EXPECT_EQ(g.meta.fingerprint, kFingerprint);
  EXPECT_EQ(g.meta.parent, std::string(16, 7));
  // A chain's first block has no parent; a Put over a key replaces its value.
  const auto other = SeededBytes(kBytes, 2);
  ASSERT_TRUE(Put(1, other).ok());
  const Got again = Fetch(1, &dst);
  ASSERT_TRUE(again.status.ok()) << again.status.ToString();
  EXPECT_EQ(dst, other);
  EXPECT_TRUE(again.meta.parent.empty());
}

TEST_P(LowerTierConformance, AKeyNotHeldIsNotFoundAndWritesNothing) {
  std::vector<uint8_t> dst(kBytes, 0xa5);
  EXPECT_EQ(Fetch(2, &dst).status.code(), StatusCode::kNotFound);
  EXPECT_EQ(dst, std::vector<uint8_t>(kBytes, 0xa5));
}

TEST_P(LowerTierConformance, AValueOfAnotherLayoutIsNeverServed) {
  ASSERT_TRUE(Put(3, SeededBytes(kBytes, 3)).ok());
  std::vector<uint8_t> dst(kBytes, 0xa5);
  const Status shorter = Fetch(3, &dst, kBytes / 2).status;
  EXPECT_FALSE(shorter.ok()) << "served as a block of another length";
  ASSERT_TRUE(Put(3, SeededBytes(kBytes, 3)).ok());
  const Status other = Fetch(3, &dst, kBytes, "fingerprint-of-another-model").status;
  EXPECT_FALSE(other.ok()) << "served to another layout";
  EXPECT_EQ(dst, std::vector<uint8_t>(kBytes, 0xa5)) << "bytes of a value that was refused reached the destination";
}

TEST_P(LowerTierConformance, AValueThatDoesNotVerifyIsDataLossAndNeverServed) {
  if (!made_.corrupt) GTEST_SKIP() << GetParam().name << ": nothing outside the tier reaches its values";
  ASSERT_TRUE(Put(4, SeededBytes(kBytes, 4)).ok());
  made_.corrupt(Key(4));
  std::vector<uint8_t> dst(kBytes, 0xa5);
  EXPECT_EQ(Fetch(4, &dst).status.code(), StatusCode::kDataLoss);
  EXPECT_EQ(dst, std::vector<uint8_t>(kBytes, 0xa5));
  EXPECT_GE(tier().Report().checksum_failures, 1u);
}

TEST_P(LowerTierConformance, ExistsAnswersEachKeyInOrder) {
  ASSERT_TRUE(Put(5, SeededBytes(kBytes, 5)).ok());
  ASSERT_TRUE(Put(7, SeededBytes(kBytes, 7)).ok());
  EXPECT_EQ(Exists({5, 6, 7, 5}), (std::vector<bool>{true, false, true, true}));
  EXPECT_EQ(Exists({}), std::vector<bool>{});
}

TEST_P(LowerTierConformance, ADeletedBlockIsGone) {
  ASSERT_TRUE(Put(8, SeededBytes(kBytes, 8)).ok());
  tier().Delete(Key(8));
  // Fire and forget: a store may apply it a moment later, but soon.
  std::vector<uint8_t> dst(kBytes, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (Exists({8}) != std::vector<bool>{false} && std::chrono::steady_clock::now() < deadline) {
    loop_.Pump([] { return false; }, std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Exists({8}), std::vector<bool>{false});
  EXPECT_EQ(Fetch(8, &dst).status.code(), StatusCode::kNotFound);
  tier().Delete(Key(9));  // a key never held: nothing happens
  EXPECT_EQ(Exists({9}), std::vector<bool>{false});
}

TEST_P(LowerTierConformance, CallbacksAreNeverDeliveredInsideTheCall) {
  const auto data = SeededBytes(kBytes, 10);
  bool put = false, fetched = false, exists = false;
  tier().Put(Key(10), Meta(kBytes, -1), data, [&](Status) { put = true; });
  EXPECT_FALSE(put);
  ASSERT_TRUE(loop_.Pump([&] { return put; }));
  std::vector<uint8_t> dst(kBytes);
  tier().Fetch(Key(10), kFingerprint, kBytes, dst, [&](Status, LowerBlockMeta) { fetched = true; });
  EXPECT_FALSE(fetched);
  tier().Exists({Key(10)}, [&](std::vector<bool>) { exists = true; });
  EXPECT_FALSE(exists);
  EXPECT_TRUE(loop_.Pump([&] { return fetched && exists; }));
}

TEST_P(LowerTierConformance, APutRefusedForSpaceSaysResourceExhausted) {
  // Blocks until the tier says it has no room; one larger than all of it at the latest.
  Status last;
  for (int i = 0; i < 512 && last.ok(); ++i) last = Put(100 + i, SeededBytes(kBytes, 100 + i));
  if (last.ok()) last = Put(99, SeededBytes(made_.most_bytes + kBytes, 99));
  EXPECT_EQ(last.code(), StatusCode::kResourceExhausted) << last.ToString();
}

TEST_P(LowerTierConformance, ReportNamesTheSameFiguresInTheSameOrderEveryTime) {
  const auto before = FigureKeys(tier().Report());
  ASSERT_TRUE(Put(11, SeededBytes(kBytes, 11)).ok());
  std::vector<uint8_t> dst(kBytes);
  (void)Fetch(11, &dst);
  (void)Fetch(12, &dst);
  (void)Exists({11, 12});
  const auto after = FigureKeys(tier().Report());
  EXPECT_EQ(before, after);
  std::vector<std::string_view> seen;
  for (std::string_view k : after) {
    EXPECT_EQ(std::count(seen.begin(), seen.end(), k), 0) << "figure '" << k << "' named twice";
    seen.push_back(k);
  }
}

TEST_P(LowerTierConformance, ATierDestroyedFirstDeliversNothingAfter) {
  ASSERT_TRUE(Put(13, SeededBytes(kBytes, 13)).ok());
  int delivered = 0;
  auto dst = std::make_unique<std::vector<uint8_t>>(kBytes);
  const auto data = SeededBytes(kBytes, 14);
  tier().Put(Key(14), Meta(kBytes, -1), data, [&](Status) { ++delivered; });
  tier().Fetch(Key(13), kFingerprint, kBytes, *dst, [&](Status, LowerBlockMeta) { ++delivered; });
  tier().Exists({Key(13)}, [&](std::vector<bool>) { ++delivered; });
  made_.tier.reset();
  loop_.Pump([] { return false; }, std::chrono::milliseconds(300));
  EXPECT_EQ(delivered, 0) << "callbacks of a destroyed tier ran";
}

INSTANTIATE_TEST_SUITE_P(EveryLowerTier, LowerTierConformance, ::testing::ValuesIn(Tiers()),
                         [](const ::testing::TestParamInfo<TierMaker>& p) { return p.param.name; });

}  // namespace
}  // namespace kvtier
