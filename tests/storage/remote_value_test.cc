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

class RemoteValue : public ::testing::Test {
 protected:
  void SetUp() override {
    payload_.resize(4096);
    for (size_t i = 0; i < payload_.size(); ++i) payload_[i] = static_cast<uint8_t>(i * 31 + 7);
    key_ = EncodeBlockKey(EncodeNamespace("tenant-a", "fp-16-bytes-long"), BlockHash(std::vector<uint8_t>(16, 3)));
    meta_.length = static_cast<uint32_t>(payload_.size());
    meta_.fingerprint = "fp-16-bytes-long";
    meta_.parent = std::string(16, '\x02');
    const std::string head = EncodeRemoteHeader(key_, meta_, payload_);
    value_.assign(head.begin(), head.end());
    value_.insert(value_.end(), payload_.begin(), payload_.end());
  }
  Result<RemoteBlockMeta> Decode(const std::vector<uint8_t>& value, std::string_view key = {},
                                 std::string_view fp = "fp-16-bytes-long", uint32_t length = 4096) {
    dst_.assign(4096, 0xee);
    return DecodeRemoteValue(key.empty() ? key_ : key, value, fp, length, dst_);
  }
  std::vector<uint8_t> payload_, value_, dst_;
  std::string key_;
  RemoteBlockMeta meta_;
};

TEST_F(RemoteValue, RoundTripsWithItsMeta) {
  auto m = Decode(value_);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->length, 4096u);
  EXPECT_EQ(m->fingerprint, meta_.fingerprint);
  EXPECT_EQ(m->parent, meta_.parent);
  EXPECT_EQ(dst_, payload_);
}

TEST_F(RemoteValue, EveryFlippedByteIsDataLossAndLeavesTheDestination) {
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

TEST_F(RemoteValue, AnotherKeyLayoutOrLengthIsDataLoss) {
  const std::string other =
      EncodeBlockKey(EncodeNamespace("tenant-b", "fp-16-bytes-long"), BlockHash(std::vector<uint8_t>(16, 3)));
  EXPECT_EQ(Decode(value_, other).status().code(), StatusCode::kDataLoss);  // another tenant's key
  EXPECT_EQ(Decode(value_, {}, "fp-of-other-model").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(Decode(value_, {}, "fp-16-bytes-long", 2048).status().code(), StatusCode::kDataLoss);
}

TEST_F(RemoteValue, ShortForeignAndEmptyValuesAreDataLoss) {
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

TEST(RemoteValueKey, IsPrefixPlusHexOfTheBlockKey) {
  EXPECT_EQ(RemoteKey("kvtier:", std::string("\x01\xab", 2)), "kvtier:01ab");
  // Hex keys contain no '{', so Redis slots them by the whole key.
  const std::string k = RemoteKey("kvtier:", std::string(40, '{'));
  EXPECT_EQ(k.find('{'), std::string::npos);
}

}  // namespace
}  // namespace kvtier
