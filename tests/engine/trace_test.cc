// Trace loading, writing and generation (engine/trace.h).
#include "engine/tools/trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "tests/support/test_util.h"

namespace kvtier {
namespace {

using testing::TempDir;

TEST(Trace, EqualIdsAfterDifferentPrefixesAreDifferentBlocks) {
  TempDir dir;
  std::ofstream(dir.File("t.jsonl"))
      << R"({"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [5, 6]})"
      << "\n\n"
      << R"({"timestamp": 7, "input_length": 1024, "output_length": 1, "hash_ids": [7, 6]})"
      << "\n"
      << R"({"timestamp": 9, "input_length": 1536, "output_length": 1, "hash_ids": [5, 6, 8]})"
      << "\n";
  auto t = LoadTrace(dir.File("t.jsonl"));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->requests.size(), 3u);
  EXPECT_EQ(t->name, "t.jsonl");
  EXPECT_EQ(t->total_blocks, 7u);
  EXPECT_EQ(t->unique_blocks, 5u);  // 5, 5>6, 7, 7>6, 5>6>8
  EXPECT_NE(t->requests[0].blocks[1], t->requests[1].blocks[1]);
  EXPECT_EQ(t->requests[0].blocks[0], t->requests[2].blocks[0]);
  EXPECT_EQ(t->requests[0].blocks[1], t->requests[2].blocks[1]);
  EXPECT_EQ(t->requests[1].timestamp_ms, 7);
  EXPECT_EQ(t->requests[2].input_length, 1536u);
}

TEST(Trace, ABadLineIsNamed) {
  TempDir dir;
  std::ofstream(dir.File("bad.jsonl")) << R"({"timestamp": 0, "hash_ids": [1]})"
                                       << "\n"
                                       << R"({"timestamp": 1, "hash_ids": "x"})"
                                       << "\n";
  auto t = LoadTrace(dir.File("bad.jsonl"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("bad.jsonl:2"), std::string::npos) << t.status().ToString();
  std::ofstream(dir.File("empty.jsonl")) << "\n";
  EXPECT_FALSE(LoadTrace(dir.File("empty.jsonl")).ok());
  EXPECT_EQ(LoadTrace(dir.File("missing.jsonl")).status().code(), StatusCode::kNotFound);
}

TEST(Trace, WrittenTracesReadBackTheSame) {
  auto t = GenerateTrace("conversation", 300, 7);
  ASSERT_TRUE(t.ok());
  TempDir dir;
  ASSERT_TRUE(WriteTrace(*t, dir.File("c.jsonl")).ok());
  auto back = LoadTrace(dir.File("c.jsonl"));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->requests.size(), t->requests.size());
  EXPECT_EQ(back->unique_blocks, t->unique_blocks);
  EXPECT_EQ(back->total_blocks, t->total_blocks);
  for (size_t i = 0; i < t->requests.size(); ++i) {
    EXPECT_EQ(back->requests[i].blocks, t->requests[i].blocks) << i;
    EXPECT_EQ(back->requests[i].timestamp_ms, t->requests[i].timestamp_ms) << i;
  }
}

TEST(Trace, GeneratedShapesAreDeterministicPerSeed) {
  for (std::string_view shape : TraceShapes()) {
    if (shape == "agentic") continue;  // sized in sessions: AgenticTracesAreSessionsWithHints
    auto a = GenerateTrace(shape, 500, 1), b = GenerateTrace(shape, 500, 1), c = GenerateTrace(shape, 500, 2);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << shape;
    ASSERT_EQ(a->requests.size(), 500u) << shape;
    bool same = true, differs = false;
    for (size_t i = 0; i < 500; ++i) {
      same = same && a->requests[i].hash_ids == b->requests[i].hash_ids;
      differs = differs || a->requests[i].hash_ids != c->requests[i].hash_ids;
    }
    EXPECT_TRUE(same) << shape;
    if (shape != "scan") {
      EXPECT_TRUE(differs) << shape;  // a scan has no randomness
    }
    // Shapes with reuse reuse; a scan never does.
    EXPECT_EQ(a->unique_blocks == a->total_blocks, shape == "scan") << shape;
  }
  EXPECT_EQ(GenerateTrace("sawtooth", 10, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(GenerateTrace("zipf", 0, 1).ok());
}

TEST(Trace, AgenticTracesAreSessionsWithHintsAndReadBackWithThem) {
  AgentParams p;
  p.sessions = 20;
  p.scale = 0.1;
  auto a = GenerateAgenticTrace(p, 3), b = GenerateAgenticTrace(p, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->requests.size(), b->requests.size());
  ASSERT_TRUE(a->has_sessions);
  std::map<std::string, const TraceRequest*> last;
  size_t ends = 0, subagents = 0;
  for (size_t i = 0; i < a->requests.size(); ++i) {
    const TraceRequest& r = a->requests[i];
    EXPECT_EQ(r.hash_ids, b->requests[i].hash_ids);
    ASSERT_FALSE(r.session_id.empty());
    EXPECT_GT(r.cache_ttl_s, 0);
    if (i > 0) {
      EXPECT_GE(r.timestamp_ms, a->requests[i - 1].timestamp_ms);
    }
    // A turn extends its session's context: the last turn's whole chain is its prefix.
    if (auto it = last.find(r.session_id); it != last.end()) {
      const auto& before = it->second->blocks;
      ASSERT_GT(r.blocks.size(), before.size());
      EXPECT_TRUE(std::equal(before.begin(), before.end(), r.blocks.begin())) << r.session_id;
      EXPECT_FALSE(it->second->session_end);
    }
    last[r.session_id] = &r;
    ends += r.session_end;
    subagents += r.session_id.find(".sub") != std::string::npos;
  }
  EXPECT_GT(ends, 0u);
  EXPECT_LT(ends, last.size());  // some sessions are abandoned
  EXPECT_GT(subagents, 0u);
  TempDir dir;
  ASSERT_TRUE(WriteTrace(*a, dir.File("a.jsonl")).ok());
  auto back = LoadTrace(dir.File("a.jsonl"));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->has_sessions);
  for (size_t i = 0; i < a->requests.size(); ++i) {
    EXPECT_EQ(back->requests[i].session_id, a->requests[i].session_id);
    EXPECT_EQ(back->requests[i].session_end, a->requests[i].session_end);
    EXPECT_NEAR(back->requests[i].cache_ttl_s, a->requests[i].cache_ttl_s, 1e-9);
  }
  p.sessions = 0;
  EXPECT_EQ(GenerateAgenticTrace(p, 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
