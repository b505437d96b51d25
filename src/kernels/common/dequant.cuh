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

__device__ __forceinline__ void fill_e2m1x2_table(E2m1x2Table& t) {
  for (int b = threadIdx.x; b < 256; b += blockDim.x)
    t.v[b] = static_cast<uint32_t>(e2m1_to_bf16_bits(b & 0xF)) | (static_cast<uint32_t>(e2m1_to_bf16_bits(b >> 4)) << 16);
}

// The block scale as bf16 (exact: E4M3 has 4 significant bits; UE8M0 is a power of two).
__device__ __forceinline__ __nv_bfloat162 scale_bf16x2(uint8_t s, bool nvfp4) {
  const float f = nvfp4 ? fmt::e4m3_decode(s) : fmt::ue8m0_decode(s);
  return __float2bfloat162_rn(f);
}

// 8 packed bytes (16 codes) × scale → 16 bf16 written as two 16-byte vectors.
__device__ __forceinline__ void dequant16(const E2m1x2Table& t, uint2 packed, __nv_bfloat162 scale, uint4 (&out)[2]) {
  uint32_t w[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = t.v[(packed.x >> (8 * i)) & 0xFF], hi = t.v[(packed.y >> (8 * i)) & 0xFF];
    __nv_bfloat162 a = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&lo), scale);
    __nv_bfloat162 b = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&hi), scale);
    w[i] = *reinterpret_cast<uint32_t*>(&a);
    w[4 + i] = *reinterpret_cast<uint32_t*>(&b);
  }
  out[0] = make_uint4(w[0], w[1], w[2], w[3]);
  out[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

}  // namespace fp4moe::kernels
