// Table-free exact dequantisation of NVFP4 weights to bf16, for the dynamic (wgmma) backend's
// producer. Plain functions, callable on host and device, so tests/cpu/test_dequant_bits.cpp checks
// every code × every scale byte against fmt:: decoding.
//
// The trick: an E2M1 nibble (s e1 e0 m) placed as the bf16 bit pattern  s<<15 | (e1 e0 m)<<6  puts
// e1 e0 in the two lowest exponent bits and m in the top mantissa bit, so the bf16 value is exactly
// code × 2^-126 (normal codes: 2^(e-127)·(1 + m/2) = 2^(e-1)·(1 + m/2) · 2^-126; the subnormal 0.5
// lands on the bf16 subnormal 2^-127). One bf16 multiply by the block scale pre-multiplied by
// 2^kE4m3PreScaleLog2 then gives code × scale × 2^-kNvfp4UnscaleLog2, exactly:
//   * scale × 2^119 is a normal bf16 for every finite E4M3 byte (2^-9 · 2^119 .. 448 · 2^119 < 2^128;
//     E4M3 has ≤ 4 significant bits), NaN stays NaN;
//   * the product has ≤ 6 significant bits and lies in [2^-17, 21], normal in bf16: the multiply
//     rounds nothing (bf16 arithmetic keeps subnormal inputs: PTX mul/fma .bf16x2 have no .ftz).
// The GEMM epilogue multiplies alpha by 2^kNvfp4UnscaleLog2 (exact in fp32), so the result is the
// same sum of the same products as with the table (every product just carries a factor 2^-7, which
// fp32 accumulation reproduces exactly away from fp32's subnormal range).
// UE8M0 scales span 2^-127 .. 2^127, too wide for any single pre-scale: MXFP4 keeps the table path.
//
// Word order: a fragment-order word (device_weights.h, fragment_layout.h) holds four bytes
//   byte 0: row g,   k, k+1     byte 2: row g,   k+8, k+9
//   byte 1: row g+8, k, k+1     byte 3: row g+8, k+8, k+9
// (low nibble = the lower k). Nibbles i and i + 4 of a word are always the same row and the same
// 16-wide k group, so they share a scale and one packed multiply serves both.
#pragma once

#include <cstdint>

#include "fp4moe/formats.h"

namespace fp4moe::kernels {

inline constexpr int kE4m3PreScaleLog2 = 119;
inline constexpr int kNvfp4UnscaleLog2 = 126 - kE4m3PreScaleLog2;  // alpha × 2^7 undoes the trick

// Nibbles i and i + 4 of w (i = 0..3) as bf16x2 bit patterns of code × 2^-126: nibble i in the low
// half, nibble i + 4 in the high half. After x = w >> 4i the two nibbles sit at bits 0–3 and 16–19;
// magnitude bits 0–2 move to 6–8 (and 16–18 to 22–24), sign bit 3 to 15 (and 19 to 31).
FP4MOE_HD uint32_t e2m1_nibbles_as_bf16x2(uint32_t w, int i) {
  const uint32_t x = w >> (4 * i);
  return ((x << 6) & 0x01C001C0u) | ((x << 12) & 0x80008000u);
}

// Broadcast bf16x2 of one E4M3 block scale × 2^119 (the NVFP4 multiplier of the trick above).
FP4MOE_HD uint32_t e4m3_prescaled_bf16x2(uint8_t s) {
  const uint32_t h = fmt::bf16_from_f32(fmt::e4m3_decode(s) * fmt::pow2f(kE4m3PreScaleLog2));  // exact in fp32
  return h | (h << 16);
}

// Broadcast bf16x2 of one UE8M0 block scale (exact: a power of two, 2^-127 a bf16 subnormal).
FP4MOE_HD uint32_t ue8m0_bf16x2(uint8_t e) {
  const uint32_t h = fmt::bf16_from_f32(fmt::ue8m0_decode(e));
  return h | (h << 16);
}

// The two E2M1 codes of one byte (low nibble = lower k) as bf16x2 of their plain values: the table
// entry of the MXFP4 path.
FP4MOE_HD uint32_t e2m1x2_bf16x2(uint8_t b) {
  return static_cast<uint32_t>(fmt::bf16_from_f32(fmt::e2m1_decode(b & 0xF))) |
         (static_cast<uint32_t>(fmt::bf16_from_f32(fmt::e2m1_decode(b >> 4))) << 16);
}

// Packed bf16x2 multiply, round to nearest (the product of two bf16 is exact in fp32, so the host
// version rounds once, like the hardware).
FP4MOE_HD uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  uint32_t d = 0;
  for (int h = 0; h < 2; ++h) {
    const float x = fmt::f32_from_bf16(static_cast<uint16_t>(a >> (16 * h)));
    const float y = fmt::f32_from_bf16(static_cast<uint16_t>(b >> (16 * h)));
    d |= static_cast<uint32_t>(fmt::bf16_from_f32(fmt::mul_rn(x, y))) << (16 * h);
  }
  return d;
#endif
}

// {low half of a, low half of b} (kHigh = false) or {high half of a, high half of b}.
template <bool kHigh>
FP4MOE_HD uint32_t pair_halves(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, kHigh ? 0x7632 : 0x5410);
#else
  return kHigh ? (a >> 16) | (b & 0xFFFF0000u) : (a & 0xFFFFu) | (b << 16);
#endif
}

// One fragment-order word of NVFP4 codes → four bf16x2 (out[b] = byte b's codes k, k+1) times the
// pre-scaled scale of row g (s_g) or row g + 8 (s_g8), each code × scale × 2^-7 exactly.
FP4MOE_HD void dequant_word_nvfp4(uint32_t w, uint32_t s_g, uint32_t s_g8, uint32_t (&out)[4]) {
  const uint32_t lo_g = bf16x2_mul(e2m1_nibbles_as_bf16x2(w, 0), s_g);    // (g, k)    (g, k+8)
  const uint32_t hi_g = bf16x2_mul(e2m1_nibbles_as_bf16x2(w, 1), s_g);    // (g, k+1)  (g, k+9)
  const uint32_t lo_g8 = bf16x2_mul(e2m1_nibbles_as_bf16x2(w, 2), s_g8);  // (g+8, k)  (g+8, k+8)
  const uint32_t hi_g8 = bf16x2_mul(e2m1_nibbles_as_bf16x2(w, 3), s_g8);  // (g+8, k+1) (g+8, k+9)
  out[0] = pair_halves<false>(lo_g, hi_g);
  out[1] = pair_halves<false>(lo_g8, hi_g8);
  out[2] = pair_halves<true>(lo_g, hi_g);
  out[3] = pair_halves<true>(lo_g8, hi_g8);
}

}  // namespace fp4moe::kernels
