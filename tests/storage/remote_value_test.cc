// The remote tier's pure parts: key slots as Redis computes them, addresses, the value
// format and its verification. The cluster itself is tested in remote_tier_test.cc.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "protocol/base/block_key.h"
#include "storage/redis_cluster.h"
#include "storage/remote_tier.h"

namespace kvtier {
namespace {

TEST(RedisCluster, KeySlotMatchesRedisCluster) {
  // CRC16-XMODEM("123456789") = 0x31C3, the reference vector of the Redis Cluster spec.
  EXPECT_EQ(RedisCluster::KeySlot("123456789"), 0x31C3);
  EXPECT_EQ(RedisCluster::KeySlot("foo"), 12182);  // CLUSTER KEYSLOT foo
  EXPECT_EQ(RedisCluster::KeySlot("bar"), 5061);
  // Hash tags: only the first non-empty {...} counts.
  EXPECT_EQ(RedisCluster::KeySlot("{user1000}.following"), RedisCluster::KeySlot("{user1000}.followers"));
  EXPECT_EQ(RedisCluster::KeySlot("foo{bar}{zap}"), RedisCluster::KeySlot("bar"));
  EXPECT_EQ(RedisCluster::KeySlot("foo{{bar}}zap"), RedisCluster::KeySlot("{bar"));
  EXPECT_NE(RedisCluster::KeySlot("foo{}{bar}"), RedisCluster::KeySlot("bar"));  // an empty tag: the whole key
  EXPECT_EQ(RedisCluster::KeySlot("foo{}{bar}"), RedisCluster::KeySlot(std::string("foo{}{bar}")));
}

TEST(RedisCluster, ParsesAddresses) {
  std::string host;
  int port = 0;
  ASSERT_TRUE(RedisCluster::ParseAddress("127.0.0.1:7000", &host, &port));
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 7000);
  ASSERT_TRUE(RedisCluster::ParseAddress("[::1]:6379", &host, &port));
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 6379);
  ASSERT_TRUE(RedisCluster::ParseAddress("redis-0.cache:6379", &host, &port));
  EXPECT_EQ(host, "redis-0.cache");
  for (const char* bad : {"", "127.0.0.1", ":7000", "host:", "host:0", "host:65536", "host:70x", "[::1]6379"}) {
    EXPECT_FALSE(RedisCluster::ParseAddress(bad, &host, &port)) << bad;
  }
}

TEST(RedisCluster, OpenRefusesBadSeeds) {
  RedisClusterOptions o;
  auto post = [](std::function<void()>) {};
  EXPECT_EQ(RedisCluster::Open(o, post).status().code(), StatusCode::kInvalidArgument);  // none
  o.seeds = {"127.0.0.1"};
  EXPECT_EQ(RedisCluster::Open(o, post).status().code(), StatusCode::kInvalidArgument);
}

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef-fleet-secret";

// Every test runs unkeyed and keyed by a fleet secret.
class RemoteValue : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      auto c = RemoteCodec::Keyed(kSecret);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      codec_ = *c;
    }
    payload_.resize(4096);
    for (size_t i = 0; i < payload_.size(); ++i) payload_[i] = static_cast<uint8_t>(i * 31 + 7);
    key_ = codec_.Key("kvtier:", EncodeBlockKey(EncodeNamespace("tenant-a", "fp-16-bytes-long"),
                                                BlockHash(std::vector<uint8_t>(16, 3))));
    meta_.length = static_cast<uint32_t>(payload_.size());
    meta_.fingerprint = "fp-16-bytes-long";
    meta_.parent = std::string(16, '\x02');
    value_ = Seal(codec_, key_, payload_);
  }
  std::vector<uint8_t> Seal(const RemoteCodec& codec, const std::string& key, const std::vector<uint8_t>& payload) {
    const std::string head = codec.EncodeHeader(key, meta_, payload);
    std::vector<uint8_t> v(head.begin(), head.end());
    v.insert(v.end(), payload.begin(), payload.end());
    return v;
  }
  Result<RemoteBlockMeta> Decode(const std::vector<uint8_t>& value, std::string_view key = {},
                                 std::string_view fp = "fp-16-bytes-long", uint32_t length = 4096) {
    dst_.assign(4096, 0xee);
    return codec_.Decode(key.empty() ? key_ : key, value, fp, length, dst_);
  }
  RemoteCodec codec_;
  std::vector<uint8_t> payload_, value_, dst_;
  std::string key_;
  RemoteBlockMeta meta_;
};
INSTANTIATE_TEST_SUITE_P(Codec, RemoteValue, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Keyed" : "Unkeyed"; });

TEST_P(RemoteValue, RoundTripsWithItsMeta) {
  auto m = Decode(value_);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->length, 4096u);
  EXPECT_EQ(m->fingerprint, meta_.fingerprint);
  EXPECT_EQ(m->parent, meta_.parent);
  EXPECT_EQ(dst_, payload_);
}

TEST_P(RemoteValue, EveryFlippedByteIsDataLossAndLeavesTheDestination) {
  // Header and payload alike: any single changed byte never verifies.
  for (size_t i = 0; i < value_.size(); i += (i < 128 ? 1 : 97)) {
    auto bad = value_;
    bad[i] ^= 0x40;
    auto m = Decode(bad);
    ASSERT_FALSE(m.ok()) << "byte " << i;
    EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << "byte " << i;
    EXPECT_EQ(dst_, std::vector<uint8_t>(4096, 0xee)) << "byte " << i;
  }
}

TEST_P(RemoteValue, AnotherKeyLayoutOrLengthIsDataLoss) {
  // The same value moved to another tenant's key of the same hash.
  const std::string other = codec_.Key("kvtier:", EncodeBlockKey(EncodeNamespace("tenant-b", "fp-16-bytes-long"),
                                                                 BlockHash(std::vector<uint8_t>(16, 3))));
  ASSERT_NE(other, key_);
  EXPECT_EQ(Decode(value_, other).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(Decode(value_, {}, "fp-of-other-model").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(Decode(value_, {}, "fp-16-bytes-long", 2048).status().code(), StatusCode::kDataLoss);
}

TEST_P(RemoteValue, ShortForeignAndEmptyValuesAreDataLoss) {
  for (size_t cut : {size_t{0}, size_t{3}, size_t{24}, size_t{60}, value_.size() - 1}) {
    std::vector<uint8_t> v(value_.begin(), value_.begin() + static_cast<long>(cut));
    EXPECT_EQ(Decode(v).status().code(), StatusCode::kDataLoss) << cut;
  }
  const std::string foreign = "hello from another program";
  EXPECT_EQ(Decode(std::vector<uint8_t>(foreign.begin(), foreign.end())).status().code(), StatusCode::kDataLoss);
  auto longer = value_;
  longer.push_back(0);
  EXPECT_EQ(Decode(longer).status().code(), StatusCode::kDataLoss);
}

TEST_P(RemoteValue, KeyNamesHideTheTenantAndCarryNoHashTag) {
  const std::string block_key = EncodeBlockKey(EncodeNamespace("tenant-a", "fp"), BlockHash(std::vector<uint8_t>(16)));
  const std::string k = codec_.Key("kvtier:", block_key);
  EXPECT_EQ(k.size(), 7u + 32u);
  EXPECT_EQ(k.find("tenant"), std::string::npos);
  EXPECT_EQ(k.find_first_of("{}", 7), std::string::npos);  // Redis slots it by the whole key
  EXPECT_EQ(k, codec_.Key("kvtier:", block_key)) << "the name of a block key must not change";
}

// A peer on the cluster without the secret: whatever it writes, a keyed kvtierd never
// serves it.
TEST(RemoteValueKeyed, ForgeriesWithoutTheSecretNeverVerify) {
  auto keyed = RemoteCodec::Keyed(kSecret);
  ASSERT_TRUE(keyed.ok());
  auto other = RemoteCodec::Keyed(std::string(kSecret) + "-other-fleet");
  ASSERT_TRUE(other.ok());
  const RemoteCodec unkeyed;
  const std::string block_key = EncodeBlockKey(EncodeNamespace("t", "fp"), BlockHash(std::vector<uint8_t>(16, 9)));
  const std::string key = keyed->Key("kvtier:", block_key);
  EXPECT_NE(key, unkeyed.Key("kvtier:", block_key)) << "names must depend on the secret";
  EXPECT_NE(key, other->Key("kvtier:", block_key));
  const std::vector<uint8_t> payload(1000, 0x5a);
  const RemoteBlockMeta meta{1000, "fp", ""};
  auto seal = [&](const RemoteCodec& c) {
    const std::string head = c.EncodeHeader(key, meta, payload);
    std::vector<uint8_t> v(head.begin(), head.end());
    v.insert(v.end(), payload.begin(), payload.end());
    return v;
  };
  std::vector<uint8_t> dst(1000);
  EXPECT_TRUE(keyed->Decode(key, seal(*keyed), "fp", 1000, dst).ok());
  // Sealed by anyone else (no secret, another secret), or unkeyed with the keyed flag set.
  EXPECT_EQ(keyed->Decode(key, seal(unkeyed), "fp", 1000, dst).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(keyed->Decode(key, seal(*other), "fp", 1000, dst).status().code(), StatusCode::kDataLoss);
  auto flagged = seal(unkeyed);
  flagged[12] |= 1;
  EXPECT_EQ(keyed->Decode(key, flagged, "fp", 1000, dst).status().code(), StatusCode::kDataLoss);
  // And a keyed kvtierd's values are not served by an unkeyed one.
  EXPECT_EQ(unkeyed.Decode(key, seal(*keyed), "fp", 1000, dst).status().code(), StatusCode::kDataLoss);
}

TEST(RemoteValueKeyed, ShortSecretIsRefused) {
  EXPECT_EQ(RemoteCodec::Keyed("short").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
