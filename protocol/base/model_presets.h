#pragma once
// Popular model geometries, for kvctl plan and kvtier-replay. Figures are the published
// configs (config.json of each model). Immutable; thread-safe.

#include <span>
#include <string_view>

#include "protocol/base/layout.h"

namespace kvtier {

struct ModelPreset {
  std::string_view name;     // "llama3.1-8b"
  std::string_view aliases;  // space-separated alternative names
  uint32_t num_layers;
  uint32_t kv_heads;  // GQA/MQA: fewer than attention heads
  uint32_t head_dim;
  uint32_t attention_heads;
  uint32_t hidden_size;
  double params_billion;         // total parameters (weights)
  double active_params_billion;  // parameters used per token (MoE: less than total)

  // A layout of this model in `dtype` with `tokens_per_block` tokens per block and the
  // natural block size.
  ModelLayout Layout(DType dtype, uint32_t tokens_per_block) const;
};

std::span<const ModelPreset> ModelPresets();
// By name or alias, case-insensitive; nullptr when unknown.
const ModelPreset* FindModelPreset(std::string_view name);

}  // namespace kvtier
