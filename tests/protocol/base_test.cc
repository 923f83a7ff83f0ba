#include <gtest/gtest.h>

#include <cerrno>

#include "protocol/base/block_key.h"
#include "protocol/base/layout.h"
#include "protocol/base/model_presets.h"
#include "protocol/base/status.h"
#include "protocol/base/text.h"
#include "protocol/base/units.h"

namespace kvtier {
namespace {

Result<int> Half(int v) {
  if (v % 2) return InvalidArgument("odd");
  return v / 2;
}

Result<int> Quarter(int v) {
  KVTIER_ASSIGN_OR_RETURN(int h, Half(v));
  KVTIER_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(Status, OkIsCheapAndPrintsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(Status, ErrorCarriesCodeAndContext) {
  Status s = NotFound("no page 7").WithContext("release");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: release: no page 7");
}

TEST(Status, AssignOrReturnPropagatesTheFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);  // 6/2 = 3 is odd
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "odd");
}

TEST(Status, AResultMadeOfAnOkStatusIsAnInternalError) {
  const Result<int> r = Status::Ok();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_FALSE(internal::AsStatus(r).ok());  // so RETURN_IF_ERROR passes it on
}

TEST(Status, ErrnoMapsToRetryMeaning) {
  EXPECT_EQ(ErrnoStatus(EAGAIN, "x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoStatus(ENOSPC, "x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(ENOENT, "x").code(), StatusCode::kNotFound);
  EXPECT_EQ(ErrnoStatus(EIO, "x").code(), StatusCode::kInternal);
}

TEST(Namespace, LengthPrefixedFieldsNeverCollide) {
  // The test vector of the hardening issue: "org_1" + "2345" != "org_12345" + "".
  EXPECT_NE(EncodeNamespace("org_1", "2345"), EncodeNamespace("org_12345", ""));
  EXPECT_NE(EncodeNamespace("", "ab"), EncodeNamespace("a", "b"));
  EXPECT_EQ(EncodeNamespace("t", "m"), EncodeNamespace("t", "m"));
  // A long tenant still encodes unambiguously (multi-byte varint length).
  std::string long_tenant(300, 'x');
  EXPECT_NE(EncodeNamespace(long_tenant, "m"), EncodeNamespace(long_tenant + "m", ""));
}

TEST(BlockHash, EqualityAndZero) {
  uint8_t a[16] = {1}, z[16] = {0};
  BlockHash ha(a), hz(z), ha2(a);
  EXPECT_EQ(ha, ha2);
  EXPECT_FALSE(ha == hz);
  EXPECT_TRUE(hz.IsZero());
  EXPECT_FALSE(ha.IsZero());
  EXPECT_EQ(ha.Hex().size(), 32u);
}

TEST(Hex, RoundTripAndRejectsJunk) {
  std::string out;
  ASSERT_TRUE(HexDecode(HexEncode(std::string("\x01\xab\xff", 3)), &out));
  EXPECT_EQ(out, std::string("\x01\xab\xff", 3));
  EXPECT_FALSE(HexDecode("abc", &out));
  EXPECT_FALSE(HexDecode("zz", &out));
}

TEST(Layout, KvBytesPerTokenMatchesTheFormula) {
  // Llama-3-8B in bf16: 2 * 32 * 8 * 128 * 2 = 128 KiB per token.
  const ModelPreset* p = FindModelPreset("llama3.1-8b");
  ASSERT_NE(p, nullptr);
  ModelLayout l = p->Layout(DType::kBFloat16, 16);
  EXPECT_EQ(l.KvBytesPerToken(), 131072u);
  EXPECT_EQ(l.NaturalBlockBytes(), 131072u * 16);
  EXPECT_TRUE(l.Validate().ok());
  EXPECT_EQ(FindModelPreset("LLAMA3-8B"), p);  // alias, any case
  EXPECT_EQ(FindModelPreset("gpt-9"), nullptr);
}

TEST(Layout, FingerprintChangesWithEveryField) {
  ModelLayout base = FindModelPreset("qwen2.5-7b")->Layout(DType::kBFloat16, 16);
  const std::string fp = base.Fingerprint();
  EXPECT_EQ(fp.size(), 16u);
  std::vector<ModelLayout> variants(7, base);
  variants[0].model_id += "x";
  variants[1].num_layers++;
  variants[2].kv_heads++;
  variants[3].head_dim++;
  variants[4].dtype = DType::kFloat16;
  variants[5].tokens_per_block++;
  variants[6].block_bytes++;
  for (const auto& v : variants) EXPECT_NE(v.Fingerprint(), fp) << v.ToString();
}

TEST(Layout, ValidateNamesTheBadField) {
  ModelLayout l = FindModelPreset("mistral-7b")->Layout(DType::kBFloat16, 16);
  l.kv_heads = 0;
  Status s = l.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kv_heads"), std::string::npos);
}

// A model id names the model in logs, kvctl and event topics, where '@' separates fields
// and a control character would forge a line or drive a terminal.
TEST(Layout, AModelIdWithAControlCharacterOrAnAtIsRefused) {
  ModelLayout l = FindModelPreset("mistral-7b")->Layout(DType::kBFloat16, 16);
  for (const std::string& bad : {std::string("a@b"), std::string("evil\x1b]52;c;Zm9v\x07"), std::string("line\nforged"),
                                 std::string("c1\xc2\x9b")}) {
    l.model_id = bad;
    Status s = l.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(s.message().find('\x1b'), std::string::npos) << "the refusal repeats the escape raw";
  }
  l.model_id = "meta-llama/Llama-3.1-8B|kv_first|tp0of2|pp0of1 mod\xc3\xa8le";  // UTF-8 is fine
  EXPECT_TRUE(l.Validate().ok());
}

TEST(Text, ControlCharactersAreEscapedAndNothingElse) {
  EXPECT_EQ(EscapeControlCharacters("plain name/1.0"), "plain name/1.0");
  EXPECT_EQ(EscapeControlCharacters("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(EscapeControlCharacters("x\ny\x7f"), "x\\x0ay\\x7f");
  EXPECT_EQ(EscapeControlCharacters("c1\xc2\x9b!"), "c1\\xc2\\x9b!");
  EXPECT_EQ(EscapeControlCharacters("back\\slash"), "back\\\\slash");
  EXPECT_EQ(EscapeControlCharacters("\xc3\xa8"), "\xc3\xa8");  // a letter, not a control
  EXPECT_FALSE(HasControlCharacters("\xc3\xa8 ok"));
  EXPECT_TRUE(HasControlCharacters("tab\there"));
}

TEST(Units, ParsesBinaryAndDecimalSuffixes) {
  EXPECT_EQ(*ParseBytes("1GiB"), 1ull << 30);
  EXPECT_EQ(*ParseBytes("256MiB"), 256ull << 20);
  EXPECT_EQ(*ParseBytes("141GiB"), 141ull << 30);
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("1.5K"), 1536u);
  EXPECT_EQ(*ParseBytes("2 GB"), 2000000000u);
  EXPECT_FALSE(ParseBytes("12 furlongs").ok());
  EXPECT_FALSE(ParseBytes("-1").ok());
  EXPECT_FALSE(ParseBytes("").ok());
  EXPECT_EQ(FormatBytes(1ull << 30), "1 GiB");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
}

}  // namespace
}  // namespace kvtier
