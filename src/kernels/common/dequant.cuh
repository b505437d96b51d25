// Exact dequantisation of E2M1 weights to bf16 (design.md §1).
//
// code × scale is exactly representable in bf16 for every E2M1 code and every E4M3 scale (at most
// 6 significant bits, exponents in [2^-10, 2688]) and for UE8M0 scales whose products stay inside
// fp32's range (prepare_weights rejects the rest). So a bf16 multiply of the decoded code by the
// decoded scale loses nothing, and bf16 tensor-core products equal the Blackwell block-scaled MMA's.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "fp4moe/formats.h"

namespace fp4moe::kernels {

// The two E2M1 codes of one byte (low nibble = even element) as a bf16x2 pattern, for all 256
// bytes. Filled once per CTA into shared memory by fill_e2m1x2_table().
struct E2m1x2Table {
  uint32_t v[256];
};

__device__ __forceinline__ uint16_t e2m1_to_bf16_bits(uint32_t code) {
  return fmt::bf16_from_f32(fmt::e2m1_decode(static_cast<uint8_t>(code)));
}

// The two codes of byte b (low nibble = even element) as a bf16x2 pattern.
__device__ __forceinline__ uint32_t e2m1x2_bf16_bits(uint32_t b) {
  return static_cast<uint32_t>(e2m1_to_bf16_bits(b & 0xF)) | (static_cast<uint32_t>(e2m1_to_bf16_bits(b >> 4)) << 16);
}

__device__ __forceinline__ void fill_e2m1x2_table(E2m1x2Table& t) {
  for (int b = threadIdx.x; b < 256; b += blockDim.x) t.v[b] = e2m1x2_bf16_bits(b);
}

// The block scale as bf16 (exact: E4M3 has 4 significant bits; UE8M0 is a power of two).
__device__ __forceinline__ __nv_bfloat162 scale_bf16x2(uint8_t s, bool nvfp4) {
  const float f = nvfp4 ? fmt::e4m3_decode(s) : fmt::ue8m0_decode(s);
  return __float2bfloat162_rn(f);
}

}  // namespace fp4moe::kernels
