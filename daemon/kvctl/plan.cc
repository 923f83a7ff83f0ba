#include "daemon/kvctl/plan.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "protocol/base/model_presets.h"
#include "protocol/base/units.h"

namespace kvtier {
namespace {

constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kMiB = 1ull << 20;

uint64_t RoundUp(uint64_t v, uint64_t to) { return to ? (v + to - 1) / to * to : v; }

// Exactly, in the largest unit that divides it: "608GiB", "2176KiB" (config syntax).
std::string ConfigBytes(uint64_t v) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && v != 0 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + kUnits[u];
}

}  // namespace

double WeightBytes(const std::string& p) {
  if (p == "bf16" || p == "fp16") return 2;
  if (p == "fp8" || p == "int8") return 1;
  if (p == "int4") return 0.5;
  return 0;
}

Result<Plan> MakePlan(const PlanInput& in) {
  Plan p;
  const ModelPreset* preset = nullptr;
  if (!in.model.empty()) {
    preset = FindModelPreset(in.model);
    if (!preset) {
      std::string names;
      for (const ModelPreset& m : ModelPresets()) names += (names.empty() ? "" : ", ") + std::string(m.name);
      return InvalidArgument("unknown model '" + in.model + "' (presets: " + names +
                             "; or give --layers, --kv-heads, --head-dim and --params)");
    }
    p.layout = preset->Layout(in.kv_dtype, in.tokens_per_block);
    p.params_billion = preset->params_billion;
  } else {
    p.layout.model_id = "custom";
    p.layout.dtype = in.kv_dtype;
    p.layout.tokens_per_block = in.tokens_per_block;
  }
  if (in.num_layers) p.layout.num_layers = in.num_layers;
  if (in.kv_heads) p.layout.kv_heads = in.kv_heads;
  if (in.head_dim) p.layout.head_dim = in.head_dim;
  if (in.params_billion > 0) p.params_billion = in.params_billion;
  if (!p.layout.num_layers || !p.layout.kv_heads || !p.layout.head_dim) {
    return InvalidArgument("no model geometry: give --model, or --layers, --kv-heads and --head-dim");
  }
  if (p.params_billion <= 0) return InvalidArgument("no weight size: give --model or --params (billions)");
  if (in.context_tokens == 0) return InvalidArgument("--context must be at least 1 token");
  if (in.concurrency == 0) return InvalidArgument("--concurrency must be at least 1");
  if (in.gpu_mem_bytes == 0) return InvalidArgument("--gpu-mem is required (memory of one GPU, e.g. 80GiB)");
  if (in.gpus == 0) return InvalidArgument("--gpus must be at least 1");
  if (!(in.gpu_utilization > 0 && in.gpu_utilization <= 1)) {
    return InvalidArgument("--gpu-utilization must be in (0, 1]");
  }
  if (in.tokens_per_block == 0) return InvalidArgument("--tokens-per-block must be at least 1");
  const double wb = WeightBytes(in.weights);
  if (wb == 0) return InvalidArgument("--weights must be bf16, fp16, fp8, int8 or int4, not '" + in.weights + "'");
  if (DTypeBytes(in.kv_dtype) == 0) return InvalidArgument("unknown KV dtype");

  p.kv_bytes_per_token = p.layout.KvBytesPerToken();
  p.block_bytes = p.layout.NaturalBlockBytes();
  p.layout.block_bytes = p.block_bytes;
  p.kv_bytes_per_sequence = in.context_tokens * p.kv_bytes_per_token;
  p.kv_bytes_total = p.kv_bytes_per_sequence * in.concurrency;
  p.weights_bytes = static_cast<uint64_t>(std::llround(p.params_billion * 1e9 * wb));
  p.gpu_usable_bytes = static_cast<uint64_t>(static_cast<double>(in.gpu_mem_bytes) * in.gpus * in.gpu_utilization);
  p.activation_bytes =
      in.activation_bytes
          ? in.activation_bytes
          : std::max<uint64_t>(kGiB, static_cast<uint64_t>(0.05 * static_cast<double>(p.gpu_usable_bytes)));
  const uint64_t fixed = p.weights_bytes + p.activation_bytes;
  p.weights_fit = fixed < p.gpu_usable_bytes;
  p.gpu_kv_budget_bytes = p.weights_fit ? p.gpu_usable_bytes - fixed : 0;
  // What fits where is counted in whole blocks, as the engine's block table holds them.
  p.gpu_kv_budget_bytes = p.gpu_kv_budget_bytes / p.block_bytes * p.block_bytes;
  p.offload_bytes = p.kv_bytes_total > p.gpu_kv_budget_bytes ? p.kv_bytes_total - p.gpu_kv_budget_bytes : 0;
  p.gpu_fraction = std::min(1.0, static_cast<double>(p.gpu_kv_budget_bytes) / static_cast<double>(p.kv_bytes_total));
  // The host tier takes the offload up to the host RAM given; NVMe the rest.
  p.host_tier_bytes = in.host_mem_bytes ? std::min(p.offload_bytes, in.host_mem_bytes) : p.offload_bytes;
  p.nvme_tier_bytes = p.offload_bytes - p.host_tier_bytes;
  if (in.nvme_bytes) p.nvme_tier_bytes = std::min(p.nvme_tier_bytes, in.nvme_bytes);
  p.sequences_gpu = p.gpu_kv_budget_bytes / p.kv_bytes_per_sequence;
  const uint64_t host_cap = in.host_mem_bytes ? in.host_mem_bytes : p.host_tier_bytes;
  p.sequences_gpu_host = (p.gpu_kv_budget_bytes + host_cap) / p.kv_bytes_per_sequence;
  const uint64_t nvme_cap = in.nvme_bytes ? in.nvme_bytes : p.nvme_tier_bytes;
  p.sequences_gpu_host_nvme = (p.gpu_kv_budget_bytes + host_cap + nvme_cap) / p.kv_bytes_per_sequence;

  // kvtierd tiers: pages of one block; the host tier sized to its share of the offload
  // (with room above the high watermark, 0.85, so it holds its share before demoting);
  // NVMe the rest (its high watermark is 0.95). Segments of 256 MiB or one page.
  const uint64_t page = RoundUp(p.block_bytes, 4096);
  const uint64_t segment = std::max<uint64_t>(RoundUp(256 * kMiB, page), page);
  const uint64_t host =
      std::max(RoundUp(static_cast<uint64_t>(static_cast<double>(p.host_tier_bytes) / 0.85), segment), segment);
  const uint64_t nvme = RoundUp(static_cast<uint64_t>(static_cast<double>(p.nvme_tier_bytes) / 0.95), kGiB);
  std::ostringstream c;
  c << "# kvtierd tiers for " << p.layout.ToString() << ", " << in.concurrency << " x " << in.context_tokens
    << " tokens\n"
    << "tiers:\n"
    << "  host:\n"
    << "    capacity: " << ConfigBytes(host) << "\n"
    << "    page_bytes: " << ConfigBytes(page) << "\n"
    << "    segment_bytes: " << ConfigBytes(segment) << "\n";
  if (nvme > 0) {
    c << "  nvme:\n"
      << "    files:\n"
      << "      - path: /var/lib/kvtier/slots0\n"
      << "        capacity: " << ConfigBytes(nvme) << "\n";
  }
  p.kvtierd_config = c.str();
  return p;
}

}  // namespace kvtier
