// Dequantisation of mma-fragment-order weights (device_weights.h: tiles of 16 rows × 64 k, one 16-byte
// vector per lane) into the A operand of a 16 × 16 k-step, the register layout that mma.sync
// m16n8k16 and wgmma m64nNk16 (A from registers, one warp per 16 rows) both read:
//   a[0]: row g,   k 2c, 2c+1      a[1]: row g+8, k 2c, 2c+1
//   a[2]: row g,   k 2c+8, 2c+9    a[3]: row g+8, k 2c+8, 2c+9        (g = lane / 4, c = lane % 4)
// Word t of the lane's vector holds k16 step t: byte 0 = a[0]'s two codes, byte 1 = a[1]'s, ...
// slo / shi: the block scale words of rows g and g+8 for the tile's 64 k as frag_scales returns them:
// byte t is k16 step t's scale in both formats (4 E4M3 bytes for NVFP4; MX's 2 UE8M0 bytes, one per
// 32 k, spread to b0 b0 b1 b1).
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
struct alignas(16) FragTables {
  uint32_t e2m1x2[256][32];  // E2M1 byte → bf16x2, entry b of lane l at [b][l]
  uint32_t scale2[256][8];   // scale byte → bf16x2 (both halves), entry of row group g at [b][g]
};

// Fills the tables; `thread` / `threads`: this thread among the `threads` that share the work
// (then a __syncthreads). Each thread decodes whole entries, one byte value b at a time, and writes
// its copies as 16-byte stores, the chunk order rotated by b so a quarter-warp's eight rows land on
// distinct banks. Until session 21 every lane of a warp decoded the same entry for its own copy, one
// table row per warp step: 32 redundant decodes per entry, 8.4 us of direct_micro's setup at
// qwen3-30b-a3b T = 1 (10.3 against the f16 variant's 1.9 us, GpuDiagnostics.DirectMicroPhases on an
// H100), and once per launch in each of dynamic's bf16-variant GEMMs.
__device__ __forceinline__ void fill_frag_tables(FragTables& t, bool nvfp4, int thread, int threads) {
  for (int b = thread; b < 256; b += threads) {
    const uint32_t v = e2m1x2_bf16_bits(b);
    const uint16_t h = fmt::bf16_from_f32(nvfp4 ? fmt::e4m3_decode(b) : fmt::ue8m0_decode(b));
    const uint32_t s = static_cast<uint32_t>(h) | (static_cast<uint32_t>(h) << 16);
    uint4* row = reinterpret_cast<uint4*>(t.e2m1x2[b]);  // 8 chunks of 4 lanes' copies
#pragma unroll
    for (int j = 0; j < 8; ++j) row[(j + b) & 7] = make_uint4(v, v, v, v);
    uint4* srow = reinterpret_cast<uint4*>(t.scale2[b]);  // 2 chunks of 4 row groups' copies
#pragma unroll
    for (int j = 0; j < 2; ++j) srow[(j + b) & 1] = make_uint4(s, s, s, s);
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

// The f16 path's block scales of one tile (NVFP4: E4M3 bytes, slo / shi as frag_scales returns them),
// converted once per tile: s[0] = rows g, k16 steps (0, 1); s[1] = rows g, steps (2, 3); s[2], s[3]
// the same for rows g+8. Two E4M3x2 → f16x2 conversions per row, against one PRMT and one conversion
// per row and step when each step converted its own.
struct F16Scales {
  uint32_t s[4];
};
__device__ __forceinline__ F16Scales frag_scales_f16(uint32_t slo, uint32_t shi) {
  return {{ptx::e4m3x2_to_f16x2<false>(slo), ptx::e4m3x2_to_f16x2<true>(slo), ptx::e4m3x2_to_f16x2<false>(shi),
           ptx::e4m3x2_to_f16x2<true>(shi)}};
}
// Half h of the f16x2 word w in both halves; with a constant h, ptxas can fold it into the HMUL2's
// operand (.H0_H0 / .H1_H1) rather than spend a PRMT.
__device__ __forceinline__ uint32_t f16_broadcast(uint32_t w, int h) {
  const __half2 v = *reinterpret_cast<const __half2*>(&w);
  const __half2 r = h ? __high2half2(v) : __low2half2(v);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// A lane's 16 bytes of codes as standard words (byte = one register's two codes), whichever way the
// weights were stored (DeviceWeights::f16_words, bf16_words), for the kernels that read codes by byte.
__device__ __forceinline__ uint4 standard_words(uint4 v, bool f16_words, bool bf16_words) {
  if (f16_words)
    return make_uint4(standard_word_from_f16(v.x), standard_word_from_f16(v.y), standard_word_from_f16(v.z),
                      standard_word_from_f16(v.w));
  if (bf16_words)
    return make_uint4(standard_word_from_bf16(v.x), standard_word_from_bf16(v.y), standard_word_from_bf16(v.z),
                      standard_word_from_bf16(v.w));
  return v;
}

// k16 step t, f16 (NVFP4 weights only, stored as f16 words: fragment_layout.h): each value is
// code × block scale × 2^-6 (the caller multiplies its fp32 result by 2^6). The word's E2M1 codes as
// E4M3 bytes (s 0 0 e1 e0 m 0 0, worth the code × 2^-6), already paired per register, then one exact
// E4M3x2 → f16x2 conversion per register; sc from frag_scales_f16.
__device__ __forceinline__ void frag_a_f16(uint32_t word, const F16Scales& sc, int t, uint32_t (&a)[4]) {
  const uint32_t x01 = f16w_x01(word), x23 = f16w_x23(word);  // (a0, a1) and (a2, a3): k, k + 1 each
  const uint32_t s_lo = f16_broadcast(sc.s[t >> 1], t & 1);  // (s, s) of row g
  const uint32_t s_hi = f16_broadcast(sc.s[2 + (t >> 1)], t & 1);
  a[0] = hmul2_f16_bits(ptx::e4m3x2_to_f16x2<false>(x01), s_lo);  // row g,   k 2c
  a[1] = hmul2_f16_bits(ptx::e4m3x2_to_f16x2<true>(x01), s_hi);   // row g+8, k 2c
  a[2] = hmul2_f16_bits(ptx::e4m3x2_to_f16x2<false>(x23), s_lo);  // row g,   k 2c+8
  a[3] = hmul2_f16_bits(ptx::e4m3x2_to_f16x2<true>(x23), s_hi);   // row g+8, k 2c+8
}

// The bf16-word path's block scales of one tile (NVFP4, E4M3 bytes as frag_scales returns them),
// each as bf16 worth the scale × 2^118, converted once per tile like F16Scales: s[0] = rows g, k16
// steps (0, 1), s[1] = rows g, steps (2, 3), s[2], s[3] the same for rows g+8. E4M3x2 → f16x2 is
// exact, and an E4M3 value's f16 has zeros in its 7 low mantissa bits; so (h >> 3) puts each half's
// exponent and mantissa at bf16's positions (the high half's low zero bits shift into the low
// half's top) and + 230 per exponent field (127 - 15 + 118) rebiases: ≤ 253 for E4M3's largest
// 448, no carry between halves. Needs scales ≥ +0 and a zero scale only on all-zero codes, which
// the host's repack guarantees (DeviceWeights::bf16_words: negative scales fold their sign into the
// codes, a zero scale's block is zeroed); a zero scale becomes 2^103, times zero codes.
struct Bf16wScales {
  uint32_t s[4];
};
template <bool kHi>
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2_2p118(uint32_t v) {
  return (ptx::e4m3x2_to_f16x2<kHi>(v) >> 3) + 0x73007300u;
}
__device__ __forceinline__ Bf16wScales frag_scales_bf16w(uint32_t slo, uint32_t shi) {
  return {{e4m3x2_to_bf16x2_2p118<false>(slo), e4m3x2_to_bf16x2_2p118<true>(slo), e4m3x2_to_bf16x2_2p118<false>(shi),
           e4m3x2_to_bf16x2_2p118<true>(shi)}};
}
// Half h of the bf16x2 word w in both halves (a constant h folds into the HMUL2's operand).
__device__ __forceinline__ uint32_t bf16_broadcast(uint32_t w, int h) {
  const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162 r = h ? __high2bfloat162(v) : __low2bfloat162(v);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// k16 step t, bf16 from a bf16 word (fragment_layout.h, DeviceWeights::bf16_words): the four
// registers' codes as bf16 worth code × 2^-126 (three funnel-shift rotations, five LOP3), each times
// its row's scale × 2^118: code × scale × 2^-8 (the caller multiplies its fp32 result by 2^8).
// 13 instructions a step against frag_a_bf16's ~22 (8 PRMT, 6 address adds, 6 LDS, 4 HMUL2).
__device__ __forceinline__ void frag_a_bf16w(uint32_t word, const Bf16wScales& sc, int t, uint32_t (&a)[4]) {
  const uint32_t s_lo = bf16_broadcast(sc.s[t >> 1], t & 1);  // (s, s) of row g
  const uint32_t s_hi = bf16_broadcast(sc.s[2 + (t >> 1)], t & 1);
  const uint32_t r8 = __funnelshift_r(word, word, 8) & kBf16wA3Rot;
  a[0] = hmul2_bf16_bits(__funnelshift_r(word, word, 10) & kBf16wMask, s_lo);  // row g,   k 2c
  a[1] = hmul2_bf16_bits(__funnelshift_r(word, word, 4) & kBf16wMask, s_hi);   // row g+8, k 2c
  a[2] = hmul2_bf16_bits(__funnelshift_r(word, word, 14) & kBf16wMask, s_lo);  // row g,   k 2c+8
  a[3] = hmul2_bf16_bits((word & (kBf16wMask & ~kBf16wA3Rot)) | r8, s_hi);     // row g+8, k 2c+8
}

// The per-lane columns of both tables as shared-memory addresses, taken once per kernel (or loop):
// a lookup is then byte extract (PRMT) + address (LEA: base + byte · row stride) + LDS, with no
// generic-to-shared conversion or 64-bit index math per use.
struct FragLut {
  uint32_t e2m1;   // &e2m1x2[0][lane]: entry b at e2m1 + b · 128
  uint32_t scale;  // &scale2[0][g]:    entry b at scale + b · 32
};
inline constexpr int kE2m1RowShift = 7;   // log2(sizeof(e2m1x2[0])) = 32 lanes × 4 bytes
inline constexpr int kScaleRowShift = 5;  // log2(sizeof(scale2[0])) = 8 row groups × 4 bytes
static_assert(sizeof(FragTables::e2m1x2[0]) == 1u << kE2m1RowShift, "e2m1x2 row stride");
static_assert(sizeof(FragTables::scale2[0]) == 1u << kScaleRowShift, "scale2 row stride");

__device__ __forceinline__ FragLut frag_lut(const FragTables& tb) {
  const int lane = threadIdx.x & 31;
  return {ptx::smem_addr(&tb.e2m1x2[0][lane]), ptx::smem_addr(&tb.scale2[0][lane >> 2])};
}

// Byte i of v as 0..255 (PRMT: byte i to position 0, zeros from the second operand elsewhere).
__device__ __forceinline__ uint32_t byte_of(uint32_t v, int i) { return ptx::prmt(v, 0u, 0x4440u | i); }

// The table word at `base` + byte · 2^shift. Volatile: the tables are written before a barrier, and
// a non-volatile asm without memory operands could be hoisted above it.
template <int kShift>
__device__ __forceinline__ uint32_t lut_load(uint32_t base, uint32_t byte) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(base + (byte << kShift)));
  return v;
}

// k16 step t, bf16 through the tables: exact code × block scale (slo / shi from frag_scales).
__device__ __forceinline__ void frag_a_bf16(const FragLut& lut, uint32_t word, uint32_t slo, uint32_t shi, int t,
                                            uint32_t (&a)[4]) {
  const uint32_t s_lo = lut_load<kScaleRowShift>(lut.scale, byte_of(slo, t));
  const uint32_t s_hi = lut_load<kScaleRowShift>(lut.scale, byte_of(shi, t));
  a[0] = hmul2_bf16_bits(lut_load<kE2m1RowShift>(lut.e2m1, byte_of(word, 0)), s_lo);  // row g,   k 2c
  a[1] = hmul2_bf16_bits(lut_load<kE2m1RowShift>(lut.e2m1, byte_of(word, 1)), s_hi);  // row g+8, k 2c
  a[2] = hmul2_bf16_bits(lut_load<kE2m1RowShift>(lut.e2m1, byte_of(word, 2)), s_lo);  // row g,   k 2c+8
  a[3] = hmul2_bf16_bits(lut_load<kE2m1RowShift>(lut.e2m1, byte_of(word, 3)), s_hi);  // row g+8, k 2c+8
}

// The scale words of one tile for this lane: rows g and g+8 (s: the tile's scale bytes, sb per row:
// 4 NVFP4, 2 MX). MX's two bytes (k 0..31, 32..63) are spread to b0 b0 b1 b1 here, once per tile, so
// that byte t is k16 step t's scale in both formats and the per-step code needs no format test.
__device__ __forceinline__ void frag_scales(const uint8_t* s, int sb, uint32_t& slo, uint32_t& shi) {
  const int g = (threadIdx.x & 31) >> 2;
  if (sb == 4) {
    slo = *reinterpret_cast<const uint32_t*>(s + g * 4);
    shi = *reinterpret_cast<const uint32_t*>(s + (g + 8) * 4);
  } else {
    slo = ptx::prmt(*reinterpret_cast<const uint16_t*>(s + g * 2), 0u, 0x1100u);
    shi = ptx::prmt(*reinterpret_cast<const uint16_t*>(s + (g + 8) * 2), 0u, 0x1100u);
  }
}

// frag_scales from the shared-memory address of the row tile's scale bytes (its row 0).
// kLaneIn: s already holds this lane's offset, g · (sb == 4 ? 4 : 2) (dynamic's helper kernels).
template <bool kLaneIn = false>
__device__ __forceinline__ void frag_scales_smem(uint32_t s, int sb, uint32_t& slo, uint32_t& shi) {
  const int g = kLaneIn ? 0 : (threadIdx.x & 31) >> 2;
  if (sb == 4) {
    slo = ptx::ld_shared_u32(s + g * 4);
    shi = ptx::ld_shared_u32(s + (g + 8) * 4);
  } else {
    slo = ptx::prmt(ptx::ld_shared_u16(s + g * 2), 0u, 0x1100u);
    shi = ptx::prmt(ptx::ld_shared_u16(s + (g + 8) * 2), 0u, 0x1100u);
  }
}

}  // namespace fp4moe::kernels
