#pragma once
// Launchers of the CUDA KV kernels (kv_kernels.cu). Internal to kernels/: the
// CudaDeviceBackend calls them with device-accessible argument arrays. `stream` is a
// cudaStream_t. Each returns the launch's cudaError_t as an int (0 = success).

#include <cstdint>

#include "kernels/kv_layout.h"

namespace kvtier::cuda {

// `blocks` and `pages` point to device-accessible copies of the transfer's arrays.
int LaunchGather(const KvTransfer& t, const uint32_t* blocks, uint8_t* const* pages, void* stream);
int LaunchScatter(const KvTransfer& t, const uint32_t* blocks, uint8_t* const* pages, void* stream);
int LaunchQuantize(const KvQuantize& q, void* stream);
int LaunchDequantize(const KvQuantize& q, uint8_t* dst, void* stream);

}  // namespace kvtier::cuda
