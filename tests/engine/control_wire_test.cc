// What ControlClient makes of a Stats reply (engine/control_wire.h), given replies no daemon
// of this version sends: a tier number this client does not know stays unknown, with the
// name the daemon gave it, and is never counted as another tier (an older kvctl against a
// newer daemon showed such a tier's pages as the host tier's).
#include "engine/control_wire.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

// A Stats reply with pool tiers `tiers` and lower tiers `lower`, as (wire number, name).
std::vector<uint8_t> Reply(std::vector<std::pair<uint8_t, std::string>> tiers,
                           std::vector<std::pair<uint8_t, std::string>> lower) {
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<fb::TierStats>> t;
  for (const auto& [n, name] : tiers) {
    auto nm = b.CreateString(name);
    fb::TierStatsBuilder x(b);
    x.add_tier(static_cast<fb::Tier>(n));
    x.add_name(nm);
    x.add_page_bytes(4096 * (n + 1));
    t.push_back(x.Finish());
  }
  std::vector<flatbuffers::Offset<fb::LowerTierStats>> l;
  for (const auto& [n, name] : lower) {
    auto nm = b.CreateString(name);
    fb::LowerTierStatsBuilder x(b);
    x.add_tier(static_cast<fb::Tier>(n));
    x.add_name(nm);
    x.add_hits(n);
    l.push_back(x.Finish());
  }
  auto tv = b.CreateVector(t);
  auto lv = b.CreateVector(l);
  fb::StatsReplyBuilder s(b);
  s.add_tiers(tv);
  s.add_lower(lv);
  b.Finish(s.Finish());
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

TEST(ControlWire, ATierThisClientDoesNotKnowStaysUnknownAndKeepsItsName) {
  const auto bytes = Reply({{1, "host"}, {77, "cxl"}}, {{3, "remote"}, {78, "s3"}});
  const DaemonStats s = StatsFromWire(*flatbuffers::GetRoot<fb::StatsReply>(bytes.data()));
  ASSERT_EQ(s.tiers.size(), 2u);
  EXPECT_EQ(s.tiers[0].tier, TierKind::kHost);
  EXPECT_EQ(s.tiers[0].page_bytes, 4096u * 2);
  EXPECT_FALSE(s.tiers[1].tier.has_value()) << "an unknown tier taken for " << TierKindName(*s.tiers[1].tier);
  EXPECT_EQ(s.tiers[1].name, "cxl");
  EXPECT_EQ(s.tiers[1].page_bytes, 4096u * 78);
  ASSERT_EQ(s.lower.size(), 2u);
  EXPECT_EQ(s.lower[0].tier, TierKind::kRemote);
  EXPECT_FALSE(s.lower[1].tier.has_value()) << "an unknown tier taken for " << TierKindName(*s.lower[1].tier);
  EXPECT_EQ(s.lower[1].name, "s3");
  EXPECT_EQ(s.lower[1].hits, 78u);
}

}  // namespace
}  // namespace kvtier
