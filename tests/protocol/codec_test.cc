#include "protocol/codec.h"

#include <gtest/gtest.h>

#include <random>

namespace kvtier {
namespace {

std::vector<uint8_t> LookupFrame(uint64_t id, size_t n_hashes) {
  flatbuffers::FlatBufferBuilder b;
  std::vector<BlockHash> hs;
  for (size_t i = 0; i < n_hashes; ++i) {
    uint8_t h[16] = {static_cast<uint8_t>(i), 1};
    hs.emplace_back(h);
  }
  auto lk = fb::CreateLookup(b, HashesToWire(b, hs));
  b.FinishSizePrefixed(fb::CreateRequest(b, id, fb::Op::Lookup, lk.Union()));
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

TEST(Codec, ValidFrameVerifiesAndDecodes) {
  auto f = LookupFrame(42, 3);
  auto r = VerifyRequestFrame(f);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->id(), 42u);
  ASSERT_EQ((*r)->op_type(), fb::Op::Lookup);
  auto hl = HashList::Parse((*r)->op_as_Lookup()->hashes(), 16);
  ASSERT_TRUE(hl.ok());
  EXPECT_EQ(hl->size(), 3u);
  EXPECT_EQ((*hl)[2].bytes()[0], 2);
}

// Found by the dispatcher fuzzer: a union type without its table passes the FlatBuffers
// verifier; the codec refuses it so no handler sees a null operation.
TEST(Codec, AnOperationTypeWithoutItsBodyIsMalformed) {
  for (fb::Op op : {fb::Op::Hello, fb::Op::Ping, fb::Op::Commit, fb::Op::Stats}) {
    flatbuffers::FlatBufferBuilder b;
    fb::RequestBuilder rb(b);
    rb.add_id(7);
    rb.add_op_type(op);
    b.FinishSizePrefixed(rb.Finish());
    auto r = VerifyRequestFrame({b.GetBufferPointer(), b.GetSize()});
    ASSERT_FALSE(r.ok()) << static_cast<int>(op);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("no body"), std::string::npos);
  }
  flatbuffers::FlatBufferBuilder b;
  fb::ResponseBuilder rb(b);
  rb.add_id(7);
  rb.add_reply_type(fb::Reply::Pong);
  b.FinishSizePrefixed(rb.Finish());
  EXPECT_FALSE(VerifyResponseFrame({b.GetBufferPointer(), b.GetSize()}).ok());
}

TEST(Codec, HashVectorMustBeAMultipleOfTheHashSize) {
  auto f = LookupFrame(1, 3);  // 48 bytes
  auto r = VerifyRequestFrame(f);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(HashList::Parse((*r)->op_as_Lookup()->hashes(), 32).ok());
}

TEST(Codec, TruncatedAndCorruptFramesAreRejected) {
  auto f = LookupFrame(7, 4);
  // Every truncation, with the prefix fixed to claim the shorter length.
  for (size_t len = 0; len < f.size(); ++len) {
    std::vector<uint8_t> t(f.begin(), f.begin() + len);
    if (len >= 4) {
      uint32_t payload = static_cast<uint32_t>(len - 4);
      std::memcpy(t.data(), &payload, 4);
    }
    EXPECT_FALSE(VerifyRequestFrame(t).ok()) << "length " << len;
  }
  // A prefix that disagrees with the frame.
  auto bad = f;
  bad[0] ^= 1;
  EXPECT_FALSE(VerifyRequestFrame(bad).ok());
  // Random byte flips never crash the verifier (and most are refused).
  std::mt19937 rng(1234);
  for (int i = 0; i < 2000; ++i) {
    auto m = f;
    const size_t pos = 4 + rng() % (m.size() - 4);
    m[pos] = static_cast<uint8_t>(rng());
    auto r = VerifyRequestFrame(m);
    if (r.ok()) {
      auto hl = HashList::Parse((*r)->op_type() == fb::Op::Lookup ? (*r)->op_as_Lookup()->hashes() : nullptr, 16);
      (void)hl;
    }
  }
}

TEST(Codec, StatusCodesAreTheSameOnBothSides) {
  for (int c = 0; c <= kMaxStatusCode; ++c) {
    EXPECT_EQ(static_cast<int>(ToWire(static_cast<StatusCode>(c))), c);
    EXPECT_EQ(static_cast<int>(FromWire(static_cast<fb::Status>(c))), c);
  }
  EXPECT_EQ(FromWire(static_cast<fb::Status>(200)), StatusCode::kInternal);
}

TEST(Codec, LayoutRoundTrips) {
  ModelLayout l{"m", 32, 8, 128, DType::kBFloat16, 16, 0};
  l.block_bytes = l.NaturalBlockBytes();
  flatbuffers::FlatBufferBuilder b;
  b.Finish(LayoutToWire(b, l));
  auto* w = flatbuffers::GetRoot<fb::Layout>(b.GetBufferPointer());
  ModelLayout back = LayoutFromWire(*w);
  EXPECT_EQ(back.Fingerprint(), l.Fingerprint());
}

}  // namespace
}  // namespace kvtier
