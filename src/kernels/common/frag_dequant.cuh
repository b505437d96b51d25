// Dequantisation of mma-fragment-order weights (device_weights.h: tiles of 16 rows × 64 k, one 16-byte
// vector per lane) into the A operand of a 16 × 16 k-step, the register layout that mma.sync
// m16n8k16 and wgmma m64nNk16 (A from registers, one warp per 16 rows) both read:
//   a[0]: row g,   k 2c, 2c+1      a[1]: row g+8, k 2c, 2c+1
//   a[2]: row g,   k 2c+8, 2c+9    a[3]: row g+8, k 2c+8, 2c+9        (g = lane / 4, c = lane % 4)
// Word t of the lane's vector holds k16 step t: byte 0 = a[0]'s two codes, byte 1 = a[1]'s, ...
// slo / shi: the block scale bytes of rows g and g+8 for the tile's 64 k (4 E4M3 bytes for NVFP4, 2
// UE8M0 bytes for MX), little-endian.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

#include "fp4moe/formats.h"
#include "kernels/common/dequant.cuh"
#include "kernels/common/fragment_layout.h"
#include "kernels/common/ptx.cuh"

namespace fp4moe::kernels {

// Lookup tables of the bf16 path, one copy per lane (or row group) so a warp's 32 lookups hit 32
// banks.
struct FragTables {
  uint32_t e2m1x2[256][32];  // E2M1 byte → bf16x2, entry b of lane l at [b][l]
  uint32_t scale2[256][8];   // scale byte → bf16x2 (both halves), entry of row group g at [b][g]
};

// Fills the tables; `warp` / `warps`: this thread's warp among the `warps` that share the work. One
// table row per warp step: the lanes write consecutive words (no bank conflicts).
__device__ __forceinline__ void fill_frag_tables(FragTables& t, bool nvfp4, int warp, int warps) {
  const int lane = threadIdx.x & 31;
  for (int b = warp; b < 256; b += warps) {
    t.e2m1x2[b][lane] = static_cast<uint32_t>(e2m1_to_bf16_bits(b & 0xF)) |
                        (static_cast<uint32_t>(e2m1_to_bf16_bits(b >> 4)) << 16);
    if (lane < 8) {
      const uint16_t h = fmt::bf16_from_f32(nvfp4 ? fmt::e4m3_decode(b) : fmt::ue8m0_decode(b));
      t.scale2[b][lane] = static_cast<uint32_t>(h) | (static_cast<uint32_t>(h) << 16);
    }
  }
}

__device__ __forceinline__ uint32_t hmul2_f16_bits(uint32_t a, uint32_t b) {
  __half2 r = __hmul2(*reinterpret_cast<__half2*>(&a), *reinterpret_cast<__half2*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t hmul2_bf16_bits(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// k16 step t, f16 (NVFP4 weights only): each value is code × block scale × 2^-6 (the caller multiplies
// its fp32 result by 2^6). E2M1 nibble (s e1 e0 m) → E4M3 byte (s 0 0 e1 e0 m 0 0), whose value is the
// code × 2^-6, then one exact E4M3x2 → f16x2 conversion per register.
__device__ __forceinline__ void frag_a_f16(uint32_t word, uint32_t slo, uint32_t shi, int t, uint32_t (&a)[4]) {
  const uint32_t lo = e2m1_lo_as_e4m3(word), hi = e2m1_hi_as_e4m3(word);  // k, k + 1 of each byte
  const uint32_t x01 = ptx::prmt(lo, hi, 0x5140), x23 = ptx::prmt(lo, hi, 0x7362);
  const uint32_t s_lo = ptx::e4m3x2_to_f16x2<false>(ptx::prmt(slo, 0, t * 0x11));  // (s, s)
  const uint32_t s_hi = ptx::e4m3x2_to_f16x2<false>(ptx::prmt(shi, 0, t * 0x11));
  a[0] = hmul2_f16_bits(ptx::e4m3x2_to_f16x2<false>(x01), s_lo);  // row g,   k 2c
  a[1] = hmul2_f16_bits(ptx::e4m3x2_to_f16x2<true>(x01), s_hi);   // row g+8, k 2c
  a[2] = hmul2_f16_bits(ptx::e4m3x2_to_f16x2<false>(x23), s_lo);  // row g,   k 2c+8
  a[3] = hmul2_f16_bits(ptx::e4m3x2_to_f16x2<true>(x23), s_hi);   // row g+8, k 2c+8
}

// k16 step t, bf16 through the tables: exact code × block scale. sb: scale bytes per row per tile
// (4 NVFP4, 2 MX).
__device__ __forceinline__ void frag_a_bf16(const FragTables& tb, uint32_t word, uint32_t slo, uint32_t shi, int t,
                                            int sb, uint32_t (&a)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2;
  const int j = sb == 4 ? t : t >> 1;
  const uint32_t s_lo = tb.scale2[(slo >> (8 * j)) & 0xFF][g];
  const uint32_t s_hi = tb.scale2[(shi >> (8 * j)) & 0xFF][g];
  a[0] = hmul2_bf16_bits(tb.e2m1x2[word & 0xFF][lane], s_lo);          // row g,   k 2c
  a[1] = hmul2_bf16_bits(tb.e2m1x2[(word >> 8) & 0xFF][lane], s_hi);   // row g+8, k 2c
  a[2] = hmul2_bf16_bits(tb.e2m1x2[(word >> 16) & 0xFF][lane], s_lo);  // row g,   k 2c+8
  a[3] = hmul2_bf16_bits(tb.e2m1x2[word >> 24][lane], s_hi);           // row g+8, k 2c+8
}

// The scale words of one tile for this lane: rows g and g+8 (s: the tile's scale bytes).
__device__ __forceinline__ void frag_scales(const uint8_t* s, int sb, uint32_t& slo, uint32_t& shi) {
  const int g = (threadIdx.x & 31) >> 2;
  if (sb == 4) {
    slo = *reinterpret_cast<const uint32_t*>(s + g * 4);
    shi = *reinterpret_cast<const uint32_t*>(s + (g + 8) * 4);
  } else {
    slo = *reinterpret_cast<const uint16_t*>(s + g * 2);
    shi = *reinterpret_cast<const uint16_t*>(s + (g + 8) * 2);
  }
}

}  // namespace fp4moe::kernels
