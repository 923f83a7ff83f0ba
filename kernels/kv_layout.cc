#include "kernels/kv_layout.h"

#include <cmath>

namespace kvtier {

Status KvGeometry::Validate() const {
  if (num_layers == 0 || num_layers > kMaxKvLayers) return InvalidArgument("kv geometry: num_layers must be 1..256");
  if (num_blocks == 0) return InvalidArgument("kv geometry: num_blocks must be > 0");
  if (block_tokens == 0 || kv_heads == 0 || head_dim == 0) {
    return InvalidArgument("kv geometry: block_tokens, kv_heads and head_dim must be > 0");
  }
  if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4) {
    return InvalidArgument("kv geometry: elem_bytes must be 1, 2 or 4");
  }
  if (block_stride_bytes != 0 && (kind != KvLayoutKind::kBlockFirst || block_stride_bytes < 2 * SlabBytes())) {
    return InvalidArgument("kv geometry: block_stride_bytes needs a block-first layout and at least 2 x slab bytes");
  }
  return Status::Ok();
}

double QuantErrorBound(QuantKind kind, double x, double row_max) {
  // The last terms: float32 arithmetic of the scale and the products (a few ulps of the
  // row's largest magnitude), and an absolute floor for rows of zeros.
  const double slop = row_max * 0x1p-20 + 1e-7;
  if (kind == QuantKind::kInt8) return row_max / 254.0 + slop;
  return std::fabs(x) / 16.0 + row_max / 512.0 + slop;
}

}  // namespace kvtier
