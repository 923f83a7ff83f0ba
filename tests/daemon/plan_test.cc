// kvctl plan's arithmetic against hand computations.
#include "daemon/kvctl/plan.h"

#include <gtest/gtest.h>

#include "daemon/config.h"
#include "protocol/base/units.h"

namespace kvtier {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

PlanInput Llama8bOnH200() {
  PlanInput in;
  in.model = "llama3.1-8b";
  in.context_tokens = 131072;
  in.concurrency = 32;
  in.gpu_mem_bytes = 141 * kGiB;
  return in;
}

TEST(Plan, Llama8bIs128KiBPerTokenAndMostOfA32x128kLoadLivesBelowTheGpu) {
  auto p = MakePlan(Llama8bOnH200());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  // 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes (bf16).
  EXPECT_EQ(p->kv_bytes_per_token, 2u * 32 * 8 * 128 * 2);
  EXPECT_EQ(p->kv_bytes_per_token, 131072u);
  EXPECT_EQ(p->kv_bytes_per_sequence, 131072ull * 131072);  // 16 GiB
  EXPECT_EQ(p->kv_bytes_total, 131072ull * 131072 * 32);    // 512 GiB
  // 0.90 x 141 GiB usable, less 8.03e9 x 2 bytes of weights, less 5% for activations.
  const double usable = 0.90 * 141 * kGiB;
  const double budget = usable - 8.03e9 * 2 - 0.05 * usable;
  EXPECT_NEAR(static_cast<double>(p->gpu_kv_budget_bytes), budget, static_cast<double>(p->block_bytes));
  EXPECT_EQ(p->gpu_kv_budget_bytes % p->block_bytes, 0u);
  EXPECT_EQ(p->sequences_gpu, static_cast<uint64_t>(budget / (16.0 * kGiB)));
  EXPECT_EQ(p->offload_bytes, p->kv_bytes_total - p->gpu_kv_budget_bytes);
  EXPECT_EQ(p->host_tier_bytes + p->nvme_tier_bytes, p->offload_bytes);
  EXPECT_EQ(p->sequences_gpu_host, 32u) << "with a host tier as large as the offload, all 32 fit";
}

TEST(Plan, HostRamLimitSendsTheRestToNvme) {
  PlanInput in = Llama8bOnH200();
  in.host_mem_bytes = 256 * kGiB;
  auto p = MakePlan(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->host_tier_bytes, 256 * kGiB);
  EXPECT_EQ(p->nvme_tier_bytes, p->offload_bytes - 256 * kGiB);
  EXPECT_EQ(p->sequences_gpu_host, (p->gpu_kv_budget_bytes + 256 * kGiB) / (16 * kGiB));
  EXPECT_EQ(p->sequences_gpu_host_nvme, 32u);
}

TEST(Plan, GqaAndDtypeAndWeightsChangeTheFigures) {
  PlanInput in = Llama8bOnH200();
  in.model = "qwen2.5-7b";  // 28 layers, 4 KV heads (GQA 7:1)
  in.kv_dtype = DType::kFloat8E4M3;
  auto q = MakePlan(in);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->kv_bytes_per_token, 2u * 28 * 4 * 128 * 1);
  in.model = "llama3.1-70b";
  in.kv_dtype = DType::kBFloat16;
  in.gpu_mem_bytes = 80 * kGiB;
  auto big = MakePlan(in);
  ASSERT_TRUE(big.ok());
  EXPECT_FALSE(big->weights_fit) << "141 GB of bf16 weights do not fit one 80 GiB GPU";
  EXPECT_EQ(big->gpu_kv_budget_bytes, 0u);
  in.gpus = 4;
  in.weights = "fp8";
  auto tp = MakePlan(in);
  ASSERT_TRUE(tp.ok());
  EXPECT_TRUE(tp->weights_fit);
  EXPECT_EQ(tp->weights_bytes, static_cast<uint64_t>(70.6e9));
}

TEST(Plan, ExplicitGeometryAndErrors) {
  PlanInput in;
  in.num_layers = 40;
  in.kv_heads = 1;  // MQA
  in.head_dim = 64;
  in.params_billion = 1;
  in.context_tokens = 1000;
  in.gpu_mem_bytes = 24 * kGiB;
  auto p = MakePlan(in);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->kv_bytes_per_token, 2u * 40 * 1 * 64 * 2);
  PlanInput bad = in;
  bad.model = "gpt-9";
  EXPECT_NE(MakePlan(bad).status().message().find("unknown model 'gpt-9'"), std::string::npos);
  bad = in;
  bad.gpu_mem_bytes = 0;
  EXPECT_NE(MakePlan(bad).status().message().find("--gpu-mem"), std::string::npos);
  bad = in;
  bad.weights = "fp3";
  EXPECT_NE(MakePlan(bad).status().message().find("--weights"), std::string::npos);
}

TEST(Plan, TheConfigItPrintsIsAValidKvtierdConfig) {
  PlanInput in = Llama8bOnH200();
  in.host_mem_bytes = 256 * kGiB;
  auto p = MakePlan(in);
  ASSERT_TRUE(p.ok());
  auto c = ParseConfig(p->kvtierd_config);
  ASSERT_TRUE(c.ok()) << c.status().ToString() << "\n" << p->kvtierd_config;
  EXPECT_EQ(c->host.page_bytes, p->block_bytes);
  EXPECT_GE(static_cast<double>(c->host.capacity_bytes) * 0.85, static_cast<double>(p->host_tier_bytes));
  ASSERT_EQ(c->nvme.tier.files.size(), 1u);
  EXPECT_GE(static_cast<double>(c->nvme.tier.files[0].capacity_bytes) * 0.95, static_cast<double>(p->nvme_tier_bytes));
}

}  // namespace
}  // namespace kvtier
