// Index math of the mma-fragment layouts, shared by the host repack (device_weights.cpp), the decode
// kernel (direct_micro.cuh) and the CPU tests (tests/cpu/test_fragment_layout.cpp). Plain integer
// functions, callable on host and device.
//
// mma.m16n8k16 (bf16) operands, lane l = 4g + c (g = l / 4, c = l % 4):
//   A (16 × 16, row-major): a0 = (row g, k 2c..2c+1), a1 = (row g+8, k 2c..), a2 = (row g, k 2c+8..),
//                           a3 = (row g+8, k 2c+8..)
//   B (16 × 8, "col"):      b0 = (k 2c..2c+1, column g), b1 = (k 2c+8..2c+9, column g)
#pragma once

#include <cstdint>

#include "fp4moe/formats.h"  // FP4MOE_HD

namespace fp4moe::kernels {

// Weights, 16 rows × 64 k per tile, 512 bytes: lane l's 16 bytes at l·16; byte 4t + b of a lane is
// the A operand register b of k16 step t — two E2M1 codes, k and k + 1 (low nibble = k).
struct FragmentSource {
  int row;  // within the tile, 0..15
  int k;    // within the tile, even, 0..62
};
FP4MOE_HD FragmentSource weight_fragment_source(int lane, int t, int b) {
  const int g = lane >> 2, c = lane & 3;
  return {g + (b & 1) * 8, 16 * t + (b >> 1) * 8 + 2 * c};
}

// Activations, per 64-column chunk: logical column w → position, so that lane (g, c) finds the B
// operands of k16 steps t = 0..3 at positions c·16 + 4t + {0,1} (b0) and + {2,3} (b1): two 16-byte
// loads per lane per chunk.
FP4MOE_HD int permuted(int w) {
  const int t = w >> 4, r = w & 15, half = r >> 3, c = (r & 7) >> 1, e = r & 1;
  return c * 16 + t * 4 + half * 2 + e;
}
FP4MOE_HD long long permuted_col(int col) { return (col & ~63) + permuted(col & 63); }

// The f16 word layout (DeviceWeights::f16_words: NVFP4 weights with a4 activations, whose kernels
// multiply on f16 tensor cores). Each E2M1 code (s e1 e0 m) is read as the E4M3 byte
// (s 0 0 e1 e0 m 0 0), whose value is exactly the code × 2^-6 (E4M3 bias 7, E2M1 bias 1, and E2M1's
// subnormal 0.5 lands on E4M3's subnormal 2^-7); one E4M3x2 → f16x2 conversion then gives two values.
// The host stores each 32-bit word of the fragment order (the 8 codes of the A registers a0..a3 of
// one k16 step, nibble 2b = register b's lower k, 2b + 1 its upper k: the standard word) so that
// these E4M3 bytes come out of it with few instructions:
//   x01 = the E4M3 bytes of nibbles 0..3 (a0's pair, a1's pair) = w & 0x9C9C9C9C: nibble j sits in
//         byte j at bits s → 7, e1 → 4, e0 → 3, m → 2;
//   x23 = those of nibbles 4..7 (a2, a3): nibble 4 + j sits in byte j's other bits, m → 0, e0 → 1,
//         s → 5, e1 → 6, so (w << 2) moves m, e0, s into place and (w >> 2) moves e1.
// 5 instructions a word, against 9 for the standard word (4 + 3 bit moves, then 2 PRMT to pair the
// bytes). No single shift and mask can give x23: no shift maps the bits {0, 1, 5, 6} of a byte onto
// {2, 3, 4, 7}.
FP4MOE_HD uint32_t f16w_x01(uint32_t w) { return w & 0x9C9C9C9Cu; }
FP4MOE_HD uint32_t f16w_x23(uint32_t w) { return ((w << 2) & 0x8C8C8C8Cu) | ((w >> 2) & 0x10101010u); }
// Code n (s e1 e0 m) in a byte's E4M3 bits and in its other bits, and back.
FP4MOE_HD uint32_t e2m1_in_e4m3_bits(uint32_t n) { return ((n & 7u) << 2) | ((n & 8u) << 4); }
FP4MOE_HD uint32_t e2m1_in_other_bits(uint32_t n) { return (n & 3u) | ((n & 4u) << 4) | ((n & 8u) << 2); }
FP4MOE_HD uint32_t e2m1_from_e4m3_bits(uint32_t b) { return ((b >> 2) & 7u) | ((b >> 4) & 8u); }
FP4MOE_HD uint32_t e2m1_from_other_bits(uint32_t b) { return (b & 3u) | ((b >> 4) & 4u) | ((b >> 2) & 8u); }
// Standard word ↔ f16 word (the host repack; generic and the bf16 copy's pre-pass read f16 words
// back as standard ones).
FP4MOE_HD uint32_t f16_word_from_standard(uint32_t w) {
  uint32_t r = 0;
  for (int j = 0; j < 4; ++j)
    r |= (e2m1_in_e4m3_bits((w >> (4 * j)) & 0xFu) | e2m1_in_other_bits((w >> (4 * j + 16)) & 0xFu)) << (8 * j);
  return r;
}
FP4MOE_HD uint32_t standard_word_from_f16(uint32_t w) {
  uint32_t r = 0;
  for (int j = 0; j < 4; ++j) {
    const uint32_t b = (w >> (8 * j)) & 0xFFu;
    r |= e2m1_from_e4m3_bits(b) << (4 * j) | e2m1_from_other_bits(b) << (4 * j + 16);
  }
  return r;
}

// The bf16 word layout (NVFP4 weights with bf16 operands: a16, a8). Each E2M1 code (s e1 e0 m) is
// placed straight into a bf16 half as s → bit 15, e1 e0 m → bits 8..6 (exponent field 0..3 and the
// first mantissa bit), whose value is exactly the code × 2^-126 (E2M1's subnormal 0.5 lands on
// bf16's subnormal 2^-127); one HMUL2 by the block scale × 2^118 (frag_scales_bf16w) then gives
// code × scale × 2^-8, a normal bf16 for every code and positive scale. No table loads, no
// conversion instruction.
// Register b of a k16 step (nibbles 2b, 2b + 1 of the standard word in its low and high half) needs
// its 8 bits at kBf16wMask. No rotation of one word can put all four registers' bits there (the
// masks' translates do not tile 32 bits), so the host stores the word so that three registers are a
// rotation and a mask each and the fourth takes two groups, 9 instructions a word:
//   a0 = rotr(w, 10) & M,  a1 = rotr(w, 4) & M,  a2 = rotr(w, 14) & M,
//   a3 = (w & (M without bits 6, 22)) | (rotr(w, 8) & bits 6, 22)
// (rotr(w, d): bit t takes bit (t + d) mod 32). The storage bit of a target bit t of register b is
// (t + bf16w_rotation(b, t)) mod 32; the four registers' storage bits cover the word once each.
inline constexpr uint32_t kBf16wMask = 0x81C081C0u;  // bits 15, 8, 7, 6 of both halves
inline constexpr uint32_t kBf16wA3Rot = 0x00400040u;  // a3's bits taken from rotr(w, 8): the m bits
FP4MOE_HD uint32_t rotr32(uint32_t w, int d) { return d == 0 ? w : (w >> d) | (w << (32 - d)); }
FP4MOE_HD int bf16w_rotation(int b, int t) {
  switch (b) {
    case 0: return 10;
    case 1: return 4;
    case 2: return 14;
    default: return ((kBf16wA3Rot >> t) & 1u) ? 8 : 0;
  }
}
// Register b's bf16x2 bits (code × 2^-126 in each half) from a bf16 word; on the device
// frag_a_bf16w (frag_dequant.cuh) issues the rotations as funnel shifts.
FP4MOE_HD uint32_t bf16w_register(uint32_t w, int b) {
  if (b < 3) return rotr32(w, bf16w_rotation(b, 6)) & kBf16wMask;
  return (w & (kBf16wMask & ~kBf16wA3Rot)) | (rotr32(w, 8) & kBf16wA3Rot);
}
// Nibble n (s e1 e0 m) at bits 15, 8, 7, 6 of a half (h = 0 low, 1 high), and back.
FP4MOE_HD uint32_t e2m1_in_bf16_bits(uint32_t n, int h) {
  return (((n & 8u) << 12) | ((n & 7u) << 6)) << (16 * h);
}
FP4MOE_HD uint32_t e2m1_from_bf16_bits(uint32_t r, int h) {
  const uint32_t v = r >> (16 * h);
  return ((v >> 12) & 8u) | ((v >> 6) & 7u);
}
// Standard word ↔ bf16 word (the host repack; generic and the bf16 copy's pre-pass read bf16 words
// back as standard ones).
FP4MOE_HD uint32_t bf16_word_from_standard(uint32_t w) {
  uint32_t r = 0;
  for (int b = 0; b < 4; ++b) {
    const uint32_t reg = e2m1_in_bf16_bits((w >> (8 * b)) & 0xFu, 0) | e2m1_in_bf16_bits((w >> (8 * b + 4)) & 0xFu, 1);
    for (int t = 0; t < 32; ++t)
      if ((kBf16wMask >> t) & 1u) r |= ((reg >> t) & 1u) << ((t + bf16w_rotation(b, t)) & 31);
  }
  return r;
}
FP4MOE_HD uint32_t standard_word_from_bf16(uint32_t w) {
  uint32_t r = 0;
  for (int b = 0; b < 4; ++b) {
    const uint32_t reg = bf16w_register(w, b);
    r |= (e2m1_from_bf16_bits(reg, 0) | (e2m1_from_bf16_bits(reg, 1) << 4)) << (8 * b);
  }
  return r;
}

// How the host stores each code word (DeviceWeights::f16_words, bf16_words): as it comes (standard),
// or rearranged for the f16 or the bf16-word kernels.
enum class WordLayout : int { kStandard, kF16, kBf16 };
FP4MOE_HD uint32_t word_from_standard(uint32_t w, WordLayout layout) {
  return layout == WordLayout::kF16 ? f16_word_from_standard(w) : layout == WordLayout::kBf16 ? bf16_word_from_standard(w) : w;
}

inline constexpr int kMaxKChunks = 8;  // k_chunk_count's cap on max_chunks

// How many chunks to cut KT k-tiles into for `tiles` independent row tiles whose tiles · chunks
// units `warps` warps take round-robin: the count n ≤ max_chunks, kMaxKChunks that least loads the
// busiest warp, ceil(tiles · n / warps) units of ceil(KT / n) tiles plus one tile's worth of a
// unit's own cost (its pipeline's fill), the fewest chunks on a tie; every chunk non-empty (chunks
// of ceil(KT / n) tiles). Until session 19 the count was ceil(warps / tiles): direct_micro's FC2 at
// mixtral-8x7b with 5 touched experts cut 2 chunks, 10 units on 8 warps, so two warps streamed
// twice the weights of the rest and FC2 took 1.6× the 4-expert time per expert (NOTES session 19).
FP4MOE_HD int k_chunk_count(int tiles, int KT, int warps, int max_chunks) {
  tiles = tiles > 1 ? tiles : 1;
  warps = warps > 1 ? warps : 1;
  int top = max_chunks < KT ? max_chunks : KT;
  top = top < kMaxKChunks ? top : kMaxKChunks;
  int best = 1, best_cost = -1;
  // Unrolled, n is a constant: no division by a register (direct_micro runs this between the grid
  // barrier and FC2: session 20 measured its FC2 phase at qwen3-30b-a3b T = 1 1.6 µs longer with
  // the first version, a loop of divisions by n, at the same chunk count).
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int n = 1; n <= kMaxKChunks; ++n) {
    const int per = (KT + n - 1) / n;
    if (n > top || (n - 1) * per >= KT) continue;  // n non-empty chunks of `per` (the last ≥ 1)
    const int cost = (tiles * n + warps - 1) / warps * (per + 1);
    if (best_cost < 0 || cost < best_cost) best = n, best_cost = cost;
  }
  return best;
}

}  // namespace fp4moe::kernels
