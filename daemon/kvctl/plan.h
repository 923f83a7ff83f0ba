#pragma once
// The capacity planner behind `kvctl plan`: how much KV cache a serving set-up needs, how
// much of it fits in GPU memory next to the weights, how much must live in host RAM and
// on NVMe, and the kvtierd tier sizes for it. Pure arithmetic; no daemon involved.
//
//   KV bytes per token = 2 (K and V) x layers x KV heads x head dim x KV dtype bytes
//   (GQA/MQA models have fewer KV heads than attention heads: only KV heads count).
//   KV bytes total     = context x concurrency x KV bytes per token
//   GPU KV budget      = GPU memory x GPUs x utilization - weights - activation reserve

#include <cstdint>
#include <string>

#include "protocol/base/layout.h"
#include "protocol/base/status.h"

namespace kvtier {

struct PlanInput {
  std::string model;        // preset name ("" with explicit geometry)
  uint32_t num_layers = 0;  // explicit geometry (overrides the preset's when set)
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  double params_billion = 0;  // weights; 0: the preset's
  DType kv_dtype = DType::kBFloat16;
  std::string weights = "bf16";   // bf16 | fp16 | fp8 | int8 | int4
  uint64_t gpu_mem_bytes = 0;     // per GPU
  uint32_t gpus = 1;              // tensor-parallel GPUs sharing weights and KV
  double gpu_utilization = 0.90;  // the fraction of GPU memory the engine may use
  uint64_t activation_bytes = 0;  // reserve for activations; 0: 5% of usable memory, at least 1 GiB
  uint64_t context_tokens = 0;
  uint64_t concurrency = 1;
  uint32_t tokens_per_block = 16;
  uint64_t host_mem_bytes = 0;  // host RAM for the host tier (0: as much as needed)
  uint64_t nvme_bytes = 0;      // NVMe for the NVMe tier (0: the rest)
};

struct Plan {
  ModelLayout layout;
  double params_billion = 0;
  uint64_t kv_bytes_per_token = 0;
  uint64_t kv_bytes_per_sequence = 0;
  uint64_t kv_bytes_total = 0;
  uint64_t block_bytes = 0;  // one block of tokens_per_block tokens: kvtierd's page
  uint64_t weights_bytes = 0;
  uint64_t activation_bytes = 0;
  uint64_t gpu_usable_bytes = 0;
  uint64_t gpu_kv_budget_bytes = 0;  // 0 when the weights do not fit
  bool weights_fit = true;
  uint64_t offload_bytes = 0;            // KV that must live below the GPU: total - GPU budget
  uint64_t host_tier_bytes = 0;          // of which in host RAM
  uint64_t nvme_tier_bytes = 0;          // and on NVMe
  uint64_t sequences_gpu = 0;            // full-context sequences that fit in the GPU alone
  uint64_t sequences_gpu_host = 0;       // ... with the host tier
  uint64_t sequences_gpu_host_nvme = 0;  // ... with host and NVMe tiers
  double gpu_fraction = 0;               // of the total KV, the share that fits in the GPU
  std::string kvtierd_config;            // YAML for the tiers this plan needs
};

// kInvalidArgument naming what is missing or wrong (unknown model, no GPU memory, ...).
Result<Plan> MakePlan(const PlanInput& in);

// Bytes per weight for "bf16", "fp16", "fp8", "int8", "int4"; 0 when unknown.
double WeightBytes(const std::string& precision);

}  // namespace kvtier
