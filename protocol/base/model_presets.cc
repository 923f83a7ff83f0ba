#include "protocol/base/model_presets.h"

#include <cctype>
#include <string>

namespace kvtier {
namespace {

constexpr ModelPreset kPresets[] = {
    // name, aliases, layers, kv heads, head dim, attn heads, hidden, params, active
    {"llama3.1-8b", "llama3-8b llama-3.1-8b llama-3-8b meta-llama-3.1-8b", 32, 8, 128, 32, 4096, 8.03, 8.03},
    {"llama3.1-70b", "llama3-70b llama-3.1-70b llama-3-70b", 80, 8, 128, 64, 8192, 70.6, 70.6},
    {"qwen2.5-7b", "qwen2.5-7b-instruct", 28, 4, 128, 28, 3584, 7.62, 7.62},
    {"qwen2.5-72b", "qwen2.5-72b-instruct", 80, 8, 128, 64, 8192, 72.7, 72.7},
    {"mistral-7b", "mistral-7b-v0.1 mistral-7b-instruct", 32, 8, 128, 32, 4096, 7.24, 7.24},
    {"mixtral-8x7b", "mixtral-8x7b-instruct", 32, 8, 128, 32, 4096, 46.7, 12.9},
};

std::string Lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

}  // namespace

ModelLayout ModelPreset::Layout(DType dtype, uint32_t tokens_per_block) const {
  ModelLayout l;
  l.model_id = std::string(name);
  l.num_layers = num_layers;
  l.kv_heads = kv_heads;
  l.head_dim = head_dim;
  l.dtype = dtype;
  l.tokens_per_block = tokens_per_block;
  l.block_bytes = l.NaturalBlockBytes();
  return l;
}

std::span<const ModelPreset> ModelPresets() { return kPresets; }

const ModelPreset* FindModelPreset(std::string_view name) {
  const std::string want = Lower(name);
  for (const ModelPreset& p : kPresets) {
    if (want == p.name) return &p;
    std::string_view a = p.aliases;
    while (!a.empty()) {
      size_t sp = a.find(' ');
      std::string_view tok = a.substr(0, sp);
      if (want == tok) return &p;
      if (sp == std::string_view::npos) break;
      a.remove_prefix(sp + 1);
    }
  }
  return nullptr;
}

}  // namespace kvtier
