// Activation quantisers on the device: the fmt:: block quantisers (the same code the CPU reference
// runs, so codes and scales agree byte for byte), producing what the bf16 GEMMs read: the exactly
// dequantised value code × block scale, *without* the NVFP4 global scale (that goes into alpha).
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "fp4moe/config.h"
#include "fp4moe/formats.h"

namespace fp4moe::kernels {

// How a GEMM input is quantised, resolved once on the host from (format, mode).
enum class QuantKind : int { kNone, kNvfp4, kMxfp4, kMxfp8 };

__host__ __device__ inline QuantKind quant_kind(WeightFormat f, ActMode m) {
  if (m == ActMode::kA16) return QuantKind::kNone;
  if (m == ActMode::kA8) return QuantKind::kMxfp8;
  return f == WeightFormat::kNVFP4 ? QuantKind::kNvfp4 : QuantKind::kMxfp4;
}

__host__ __device__ inline int quant_block(QuantKind q) {
  // kNone has no blocks; 16 is the granularity its copy loops use.
  return q == QuantKind::kNvfp4 || q == QuantKind::kNone ? fmt::kNvfp4Block : fmt::kMxBlock;
}

// Quantise-dequantise one block of kBlock = quant_block(q) values, writing bf16.
// g: NVFP4 decode global scale (ignored otherwise).
template <int kBlock>
__device__ __forceinline__ void quant_dequant_block(QuantKind q, const float (&v)[kBlock], float g,
                                                    __nv_bfloat16 (&out)[kBlock]) {
  uint8_t codes[kBlock];
  if constexpr (kBlock == fmt::kNvfp4Block) {  // kNone or kNvfp4
    if (q == QuantKind::kNone) {
#pragma unroll
      for (int i = 0; i < kBlock; ++i) out[i] = __float2bfloat16_rn(v[i]);
      return;
    }
    const float s = fmt::e4m3_decode(fmt::nvfp4_quantize_block(v, g, codes));
#pragma unroll
    for (int i = 0; i < kBlock; ++i) out[i] = __float2bfloat16_rn(fmt::e2m1_decode(codes[i]) * s);
  } else {  // kMxfp4 or kMxfp8
    static_assert(kBlock == fmt::kMxBlock);
    if (q == QuantKind::kMxfp4) {
      const float s = fmt::ue8m0_decode(fmt::mxfp4_quantize_block(v, codes));
#pragma unroll
      for (int i = 0; i < kBlock; ++i) out[i] = __float2bfloat16_rn(fmt::e2m1_decode(codes[i]) * s);
    } else {
      const float s = fmt::ue8m0_decode(fmt::mxfp8_quantize_block(v, codes));
#pragma unroll
      for (int i = 0; i < kBlock; ++i) out[i] = __float2bfloat16_rn(fmt::e4m3_decode(codes[i]) * s);
    }
  }
}

}  // namespace fp4moe::kernels
