// The remote tier's pure parts: key slots as Redis computes them, addresses, the value
// format and its verification. The cluster itself is tested in remote_tier_test.cc.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <cstring>
#include <vector>

#include "protocol/base/block_key.h"
#include "storage/remote/redis_cluster.h"
#include "storage/remote/remote_tier.h"

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

// CLUSTER SLOTS as a node could send it: parsed with hiredis' reader, as RefreshOnce does.
Result<std::vector<RedisCluster::SlotRange>> Slots(const std::string& wire) {
  redisReader* r = redisReaderCreate();
  void* obj = nullptr;
  EXPECT_EQ(redisReaderFeed(r, wire.data(), wire.size()), REDIS_OK);
  EXPECT_EQ(redisReaderGetReply(r, &obj), REDIS_OK);
  EXPECT_NE(obj, nullptr);
  auto out = obj ? RedisCluster::ParseSlots(*static_cast<redisReply*>(obj), "10.0.0.9:7000")
                 : Result<std::vector<RedisCluster::SlotRange>>(Internal("no reply"));
  if (obj) freeReplyObject(obj);
  redisReaderFree(r);
  return out;
}

std::string Entry(int lo, int hi, const std::string& ip, int port) {
  return "*3\r\n:" + std::to_string(lo) + "\r\n:" + std::to_string(hi) + "\r\n*2\r\n$" + std::to_string(ip.size()) +
         "\r\n" + ip + "\r\n:" + std::to_string(port) + "\r\n";
}

TEST(RedisCluster, ParsesSlotMapsAndRefusesWhatNamesNoNode) {
  auto ok =
      Slots("*3\r\n" + Entry(0, 100, "10.0.0.5", 7000) + Entry(101, 200, "", 7001) + Entry(201, 16383, "::1", 7002));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  ASSERT_EQ(ok->size(), 3u);
  EXPECT_EQ((*ok)[0].master, "10.0.0.5:7000");
  EXPECT_EQ((*ok)[1].master, "10.0.0.9:7001");  // "": the node asked
  EXPECT_EQ((*ok)[2].master, "[::1]:7002");
  EXPECT_EQ((*ok)[2].last, 16383u);
  // Found by the fuzzer: a host with a bracket and a carriage return was taken as a node.
  for (const std::string& bad : {Entry(0, 10, "[27.1\r.0.0", 700), Entry(0, 10, "a b", 7000), Entry(0, 16384, "h", 1),
                                 Entry(5, 4, "h", 1), Entry(0, 1, "h", 0), Entry(0, 1, "h", 65536)}) {
    EXPECT_EQ(Slots("*1\r\n" + bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(Slots("*0\r\n").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Slots(":1\r\n").status().code(), StatusCode::kInvalidArgument);
  auto standalone = Slots("-ERR This instance has cluster support disabled\r\n");
  ASSERT_TRUE(standalone.ok());
  EXPECT_EQ((*standalone)[0].master, "10.0.0.9:7000");
}

TEST(RedisCluster, ParsesRedirects) {
  bool ask = true;
  uint16_t slot = 0;
  std::string address;
  ASSERT_TRUE(RedisCluster::ParseRedirect("MOVED 3999 127.0.0.1:6381", &ask, &slot, &address));
  EXPECT_FALSE(ask);
  EXPECT_EQ(slot, 3999);
  EXPECT_EQ(address, "127.0.0.1:6381");
  ASSERT_TRUE(RedisCluster::ParseRedirect("ASK 1 h:1", &ask, &slot, &address));
  EXPECT_TRUE(ask);
  for (const char* bad : {"MOVED", "MOVED 16384 h:1", "MOVED x h:1", "MOVED 1 ", "ERR x", "ASK  h:1"}) {
    EXPECT_FALSE(RedisCluster::ParseRedirect(bad, &ask, &slot, &address)) << bad;
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
  Result<LowerBlockMeta> Decode(const std::vector<uint8_t>& value, std::string_view key = {},
                                std::string_view fp = "fp-16-bytes-long", uint32_t length = 4096) {
    dst_.assign(4096, 0xee);
    return codec_.Decode(key.empty() ? key_ : key, value, fp, length, dst_);
  }
  RemoteCodec codec_;
  std::vector<uint8_t> payload_, value_, dst_;
  std::string key_;
  LowerBlockMeta meta_;
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
  const LowerBlockMeta meta{1000, "fp", ""};
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

// Every keyed value has a nonce of its own, so its Poly1305 key tags that value alone: two
// seals of one payload under one key differ in nonce and tag, and each verifies.
TEST(RemoteValueKeyed, EachValueIsSealedUnderItsOwnNonce) {
  auto keyed = RemoteCodec::Keyed(kSecret);
  ASSERT_TRUE(keyed.ok());
  const std::string key = keyed->Key("kvtier:", EncodeBlockKey(EncodeNamespace("t", "fp"), BlockHash()));
  const std::vector<uint8_t> payload(3000, 0x17);
  const LowerBlockMeta meta{3000, "fp", ""};
  const std::string a = keyed->EncodeHeader(key, meta, payload);
  const std::string b = keyed->EncodeHeader(key, meta, payload);
  ASSERT_EQ(a.size(), b.size());
  const auto nonce = [](const std::string& h) { return h.substr(32, RemoteCodec::kNonceBytes); };
  const auto tag = [](const std::string& h) { return h.substr(16, 16); };
  EXPECT_NE(nonce(a), nonce(b));
  EXPECT_NE(tag(a), tag(b));
  EXPECT_NE(nonce(a), std::string(RemoteCodec::kNonceBytes, '\0'));
  std::vector<uint8_t> dst(3000);
  for (const std::string& head : {a, b}) {
    std::vector<uint8_t> v(head.begin(), head.end());
    v.insert(v.end(), payload.begin(), payload.end());
    EXPECT_TRUE(keyed->Decode(key, v, "fp", 3000, dst).ok());
  }
  // One value's tag with the other's nonce: refused.
  std::string mixed = a;
  mixed.replace(32, RemoteCodec::kNonceBytes, nonce(b));
  std::vector<uint8_t> v(mixed.begin(), mixed.end());
  v.insert(v.end(), payload.begin(), payload.end());
  EXPECT_EQ(keyed->Decode(key, v, "fp", 3000, dst).status().code(), StatusCode::kDataLoss);
}

TEST(RemoteValueKeyed, ShortSecretIsRefused) {
  EXPECT_EQ(RemoteCodec::Keyed("short").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
