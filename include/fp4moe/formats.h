// fp4moe/formats.h — the number formats, one implementation for host and device.
//
// Everything here is plain integer and IEEE fp32 arithmetic with explicit round-to-nearest
// operations, so the CPU reference and the GPU kernels compute byte-identical codes and scales.
// (Device code must not flush subnormals: build without --use_fast_math / -ftz=true.)
//
// Formats (OCP Microscaling v1.0 names):
//   E2M1  4-bit float, values {0, .5, 1, 1.5, 2, 3, 4, 6} and their negatives; no Inf/NaN.
//   E4M3  8-bit float "fn": bias 7, max 448, subnormals down to 2^-9, 0x7F/0xFF = NaN, no Inf.
//   UE8M0 8-bit power of two 2^(e-127), e in [0, 254]; 0xFF = NaN.
//   bf16  the upper 16 bits of an fp32, round-to-nearest-even.
//
// Block quantisers (design.md §1, reference §2.1 exact path, §2.8, §2.10):
//   NVFP4  16 values, E4M3 block scale, fp32 *decode* global scale g:  v ≈ code · sf · g
//   MXFP4  32 values, UE8M0 block scale 2^ceil(log2(amax/6)):            v ≈ code · 2^(e-127)
//   MXFP8  32 values of E4M3, UE8M0 block scale 2^ceil(log2(amax/448)):  v ≈ e4m3 · 2^(e-127)
//
// Special values (defined here, tested in tests/test_formats.cpp):
//   * NaN anywhere in a block: the block scale is the format's NaN (E4M3 0x7F, UE8M0 0xFF) and every
//     code is 0, so the whole block decodes to NaN and the NaN propagates through the GEMM.
//   * ±Inf saturates ("satfinite"): the block scale is the largest the rule allows and the element
//     becomes the largest code of its sign.
//   * NVFP4 with g == 0 (or g·sf underflowing to 0): the block quantises to zero (scale 0, codes 0).
//   * A block of zeros: scale 0 for NVFP4, 2^-127 (byte 0) for MX formats; codes 0. (A -0 element
//     of an MX block keeps its sign, code 0x8 / E4M3 0x80, by the next rule; NVFP4's zero scale
//     zeroes every code.)
//   * The sign of zero is kept in E2M1 codes (-0.1 → 0x8), as hardware conversions do.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FP4MOE_HD __host__ __device__ __forceinline__
#else
#define FP4MOE_HD inline
#endif

namespace fp4moe::fmt {

// ---------------------------------------------------------------------------------------------
// Bit casts and fp32 operations that are never fused or approximated.
// ---------------------------------------------------------------------------------------------
FP4MOE_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

FP4MOE_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

FP4MOE_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  volatile float r = a * b;  // volatile: no contraction into an FMA with a neighbour
  return r;
#endif
}

FP4MOE_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  volatile float r = a / b;
  return r;
#endif
}

FP4MOE_HD bool is_nan(float f) { return (f32_bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }
FP4MOE_HD float abs_f(float f) { return bits_f32(f32_bits(f) & 0x7FFFFFFFu); }

// 2^k as an fp32, exact for k in [-149, 127] (subnormal below -126).
FP4MOE_HD float pow2f(int k) {
  if (k >= -126) return bits_f32(static_cast<uint32_t>(k + 127) << 23);
  return bits_f32(1u << (k + 149));
}

// ceil(log2(x)) for finite x > 0, exactly (no lg2.approx).
FP4MOE_HD int ceil_log2(float x) {
  uint32_t b = f32_bits(x) & 0x7FFFFFFFu;
  int e = static_cast<int>(b >> 23);
  uint32_t m = b & 0x7FFFFFu;
  if (e == 0) {  // subnormal: x = m · 2^-149, m > 0
    int msb = 31;
    while (!((m >> msb) & 1u)) --msb;
    int fl = msb - 149;  // floor(log2 x)
    return (m & ((1u << msb) - 1u)) ? fl + 1 : fl;
  }
  return m ? e - 127 + 1 : e - 127;
}

// ---------------------------------------------------------------------------------------------
// bf16
// ---------------------------------------------------------------------------------------------
FP4MOE_HD uint16_t bf16_from_f32(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even; carries into the exponent correctly
  return static_cast<uint16_t>(u >> 16);
}

FP4MOE_HD float f32_from_bf16(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// f rounded to bf16 (nearest even) and back. On the device by the conversion instruction (cvt.rn.bf16x2:
// one F2FP and a shift, against ~8 integer instructions for bf16_from_f32's add); a NaN comes out as
// the canonical NaN there and keeps its payload here, both NaN, and nothing downstream reads a NaN's
// bits (a quantisation block with a NaN gets the NaN scale and zero codes; bf16 outputs convert it
// with the same instruction). round_bf16x2: two values by one conversion.
FP4MOE_HD float round_bf16(float f) {
#if defined(__CUDA_ARCH__)
  uint32_t p;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(0.0f), "f"(f));
  return bits_f32(p << 16);
#else
  return f32_from_bf16(bf16_from_f32(f));
#endif
}
FP4MOE_HD void round_bf16x2(float& a, float& b) {
#if defined(__CUDA_ARCH__)
  uint32_t p;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(b), "f"(a));  // b to the upper half, a to the lower
  a = bits_f32(p << 16);
  b = bits_f32(p & 0xFFFF0000u);
#else
  a = round_bf16(a);
  b = round_bf16(b);
#endif
}

// ---------------------------------------------------------------------------------------------
// E2M1 (4 bits: sign, 2 exponent, 1 mantissa)
// ---------------------------------------------------------------------------------------------
constexpr float kE2M1Max = 6.0f;

FP4MOE_HD float e2m1_decode(uint8_t code) {
  // magnitude codes 0..7 → 0, .5, 1, 1.5, 2, 3, 4, 6
  const uint32_t mag = code & 7u;
  const uint32_t e = mag >> 1, m = mag & 1u;
  float v = e == 0 ? 0.5f * static_cast<float>(m) : pow2f(static_cast<int>(e) - 1) * (1.0f + 0.5f * m);
  return (code & 8u) ? -v : v;
}

// Round to nearest, ties to the even code, saturating at ±6. NaN encodes as +0 (the block scale
// carries the NaN, see the file comment).
FP4MOE_HD uint8_t e2m1_encode(float x) {
  if (is_nan(x)) return 0;
  const float a = abs_f(x);
  // Decision points are the midpoints between neighbours; a tie goes to the even code. The magnitude
  // code counts the decision points below a (strict where the tie belongs to the code below), without
  // branches: the host quantiser runs this on every weight of a checkpoint, whose values take the
  // branches at random (a chain of ifs mispredicted ~14 ns a value).
  const uint32_t mag = static_cast<uint32_t>(a > 0.25f) +   // tie 0.25 → 0 (even)
                       static_cast<uint32_t>(a >= 0.75f) +  // tie 0.75 → 2
                       static_cast<uint32_t>(a > 1.25f) +   // tie 1.25 → 2
                       static_cast<uint32_t>(a >= 1.75f) +  // tie 1.75 → 4
                       static_cast<uint32_t>(a > 2.5f) +    // tie 2.5  → 4
                       static_cast<uint32_t>(a >= 3.5f) +   // tie 3.5  → 6
                       static_cast<uint32_t>(a > 5.0f);     // tie 5    → 6; above: 7, saturating (Inf too)
  return static_cast<uint8_t>(mag | ((f32_bits(x) >> 28) & 8u));
}

// a + b and a - b rounded to nearest even, never fused or reassociated (the host's volatile keeps
// the compiler from folding (a + b) - b to a).
FP4MOE_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  volatile float r = a + b;
  return r;
#endif
}
FP4MOE_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  volatile float r = a - b;
  return r;
#endif
}

// e2m1_decode(e2m1_encode(x)) without the code, in a few instructions (the kernels requantise
// activations as quantise-then-dequantise, quantize.cuh): the nearest E2M1 value to x, ties to the
// even code, saturating at ±6, the sign kept (−0 too), and +0 for a NaN. Why it is the same: E2M1's
// grid has spacing 0.5 below 2, 1 from 2 to 4 and 2 from 4 to 6: the ulp of a 1-bit mantissa at
// a's binade, with the binades below 1 sharing 1's (the subnormal code 0.5). Adding big = 2^(E+22),
// E that binade's exponent (0 below 1), puts a in a binade whose ulp is that spacing, so the add
// rounds a to the spacing, ties to even; subtracting big again is exact. The even codes are the even
// multiples of the spacing (0, 1, 2 | 2, 4 | 4), so the tie rule picks e2m1_encode's code; at the
// binade ends 1.75 and 3.5 (ties) both round up to the next binade's first value, as the code does.
// a is saturated at 6 first (Inf too), so big is at most 2^24. Seven instructions on sm_90 plus the
// NaN test (the form with a rint by the spacing took 16 and a quarter-rate FRND).
// tests/cpu/test_formats.cpp compares it with the round trip on every float whose exponent reaches
// the grid.
FP4MOE_HD float e2m1_round(float x) {
  const float m = abs_f(x);
  const float a = m < 6.0f ? m : 6.0f;  // a NaN gives 6 here and +0 at the end
  const uint32_t e = f32_bits(a) & 0x7F800000u;
  const float big = bits_f32((e > 0x3F800000u ? e : 0x3F800000u) + (22u << 23));
  const float r = sub_rn(add_rn(a, big), big);
  return is_nan(x) ? 0.0f : bits_f32(f32_bits(r) | (f32_bits(x) & 0x80000000u));
}

// ---------------------------------------------------------------------------------------------
// E4M3 "fn" (bias 7, max 448, NaN = 0x7F / 0xFF)
// ---------------------------------------------------------------------------------------------
constexpr float kE4M3Max = 448.0f;
constexpr uint8_t kE4M3NaN = 0x7F;

// e4m3_decode_soft / e4m3_encode_soft: the formats' definition in integer and float steps, what the
// host runs. e4m3_decode / e4m3_encode: the same on the device by the conversion instructions
// (cvt.rn.f16x2.e4m3x2 then to f32, exact; cvt.rn.satfinite.e4m3x2.f32, nearest even, ±448 past the
// range), ~2 instructions against ~15 with branches, which the quantisers ran once or twice a block
// (the scale byte and its value); a NaN input keeps the soft form's byte (the conversion's NaN sign
// is not specified). GpuFormats.DeviceFormsEqualTheSoftForms compares them on the device.
FP4MOE_HD float e4m3_decode_soft(uint8_t b) {
  const uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
  float v;
  if (e == 15 && m == 7) v = bits_f32(0x7FC00000u);
  else if (e == 0) v = static_cast<float>(m) * pow2f(-9);
  else v = static_cast<float>(8u + m) * pow2f(static_cast<int>(e) - 10);
  return (b & 0x80u) ? -v : v;
}

// Round to nearest even, saturating to ±448 (satfinite); NaN → 0x7F with the input's sign.
FP4MOE_HD uint8_t e4m3_encode_soft(float x) {
  const uint8_t sign = static_cast<uint8_t>((f32_bits(x) >> 24) & 0x80u);
  if (is_nan(x)) return static_cast<uint8_t>(sign | kE4M3NaN);
  const float a = abs_f(x);
  if (a >= kE4M3Max) return static_cast<uint8_t>(sign | 0x7E);
  if (a < pow2f(-6)) {
    // Subnormal range: value = m · 2^-9, m in 0..8 (m = 8 is the smallest normal, code 0x08).
    // a · 2^9 is exact; adding and subtracting 2^23 rounds it to the nearest even integer.
    const float s = mul_rn(a, 512.0f);
    const float r = sub_rn(add_rn(s, 8388608.0f), 8388608.0f);
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(r));
  }
  // Normal: round the fp32 mantissa from 23 to 3 bits, nearest even (may carry into the exponent).
  uint32_t b = f32_bits(a);
  b += 0x7FFFFu + ((b >> 20) & 1u);
  const int e = static_cast<int>(b >> 23) - 127 + 7;
  const uint32_t m = (b >> 20) & 7u;
  if (e > 15 || (e == 15 && m == 7)) return static_cast<uint8_t>(sign | 0x7E);
  return static_cast<uint8_t>(sign | (e << 3) | m);
}

#if defined(__CUDACC__)
// Two E4M3 bytes (the low, kHi = false, or high 16 bits of v) → f16x2, exact (sm_89+): the one
// conversion both e4m3_decode and the kernels' fragment dequantisation (kernels::ptx::e4m3x2_to_f16x2)
// use. The half is picked by a register split, which ptxas folds into the conversion's operand.
template <bool kHi>
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2_bits(uint32_t v) {
  uint32_t r;
  if constexpr (kHi)
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(r) : "r"(v));
  else
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(r) : "r"(v));
  return r;
}
#endif

FP4MOE_HD float e4m3_decode(uint8_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const uint32_t h2 = e4m3x2_to_f16x2_bits<false>(b);
  float f;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.f32.f16 %0, lo;\n}" : "=f"(f) : "r"(h2));
  return f;
#else
  return e4m3_decode_soft(b);
#endif
}

FP4MOE_HD uint8_t e4m3_encode(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (is_nan(x)) return static_cast<uint8_t>(((f32_bits(x) >> 24) & 0x80u) | kE4M3NaN);
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));  // x to the low byte
  return static_cast<uint8_t>(r & 0xFFu);
#else
  return e4m3_encode_soft(x);
#endif
}

// e4m3_decode(e4m3_encode(x)) without the code, for the kernels' MXFP8 requantisation (quantize.cuh):
// the nearest E4M3 value, ties to even, ±448 for |x| ≥ 448, the sign kept (−0 too), and a NaN of x's
// sign for a NaN. The same add as e2m1_round: E4M3's spacing at a's binade 2^E is 2^(E−3), and
// 2^−9 below 2^−6 (the subnormals share the smallest normal binade's), so big = 2^(max(E, −6) + 20)
// has that spacing as its ulp and a + big rounds a to it, ties to even (the even codes are the even
// multiples, as e4m3_encode's integer add of the mantissa makes them); a is saturated at 448 first
// (448 = 14 · 2^5 is on the grid of its binade, so nothing rounds past it). tests/cpu/test_formats.cpp
// compares it with the round trip on every float whose exponent reaches the grid.
FP4MOE_HD float e4m3_round(float x) {
  const uint32_t sign = f32_bits(x) & 0x80000000u;
  const float m = abs_f(x);
  const float a = m < kE4M3Max ? m : kE4M3Max;  // a NaN gives 448 here and a NaN at the end
  const uint32_t e = f32_bits(a) & 0x7F800000u;
  const float big = bits_f32((e > (121u << 23) ? e : (121u << 23)) + (20u << 23));
  const float r = sub_rn(add_rn(a, big), big);
  return bits_f32((is_nan(x) ? 0x7FC00000u : f32_bits(r)) | sign);
}

// ---------------------------------------------------------------------------------------------
// UE8M0 (power-of-two scale)
// ---------------------------------------------------------------------------------------------
constexpr uint8_t kUE8M0NaN = 0xFF;

FP4MOE_HD float ue8m0_decode(uint8_t e) {
  return e == kUE8M0NaN ? bits_f32(0x7FC00000u) : pow2f(static_cast<int>(e) - 127);
}

// The MX scale byte for a block whose largest magnitude is amax and whose element format's largest
// value is elem_max: 2^ceil(log2(amax / elem_max)), clamped to [2^-127, 2^127]. Zero → byte 0.
FP4MOE_HD uint8_t mx_scale_byte(float amax, float elem_max) {
  if (is_nan(amax)) return kUE8M0NaN;
  if (!(amax > 0.0f)) return 0;
  const float t = div_rn(amax, elem_max);
  if (!(t > 0.0f)) return 0;    // amax / elem_max underflowed fp32 (tiny subnormal amax)
  if (t > 3.0e38f) return 254;  // Inf (or past 2^127)
  int e = ceil_log2(t) + 127;
  return static_cast<uint8_t>(e < 0 ? 0 : (e > 254 ? 254 : e));
}

// ---------------------------------------------------------------------------------------------
// Packing: two E2M1 codes per byte, element 2j in the low nibble of byte j.
// ---------------------------------------------------------------------------------------------
FP4MOE_HD uint8_t pack_e2m1x2(uint8_t lo, uint8_t hi) {
  return static_cast<uint8_t>((lo & 0xFu) | ((hi & 0xFu) << 4));
}
FP4MOE_HD uint8_t unpack_e2m1(const uint8_t* packed, int64_t i) {
  return static_cast<uint8_t>((packed[i >> 1] >> ((i & 1) * 4)) & 0xFu);
}

// ---------------------------------------------------------------------------------------------
// Block quantisers. Input: n fp32 values. Output: the scale byte; codes written one per byte
// (caller packs) — keeps the routine usable for any destination layout.
// ---------------------------------------------------------------------------------------------
constexpr int kNvfp4Block = 16;
constexpr int kMxBlock = 32;

FP4MOE_HD float block_amax(const float* v, int n, bool* has_nan) {
  float amax = 0.0f;
  bool nan = false;
  for (int i = 0; i < n; ++i) {
    nan |= is_nan(v[i]);
    const float a = abs_f(v[i]);
    amax = a > amax ? a : amax;
  }
  *has_nan = nan;
  return amax;
}

// block_amax from the bit patterns, for the kernels: |v|'s bits order as |v| does and NaNs are the
// only ones above +Inf's, so one integer max gives both (an LOP3 and a VIMNMX an element, where the
// float compares and NaN tests took ~4). amax equals block_amax's where no v is NaN; where one is, it
// is unspecified (nvfp4_block and mx_block return before reading it). tests/cpu/test_formats.cpp.
FP4MOE_HD float block_amax_bits(const float* v, int n, bool* has_nan) {
  uint32_t m = 0;
  for (int i = 0; i < n; ++i) {
    const uint32_t a = f32_bits(v[i]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  *has_nan = m > 0x7F800000u;
  return bits_f32(m);
}

// Each quantiser is a per-block step (the scale byte, and the multiplier its elements are encoded
// with) and a per-element step, so a block spread over threads (one element each, amax and NaN
// reduced across them) encodes exactly like the sequential loop.

// NVFP4: sf = e4m3(min(amax / (6·g), 448)); code_i = e2m1(v_i · (1 / (sf·g))).
struct Nvfp4Block {
  uint8_t scale;   // E4M3 byte
  bool encode;     // false: every code is 0 (NaN block or g, a non-positive g, or a zero decoded scale)
  float inv;       // 1 / (decoded scale · g) where encode
};
FP4MOE_HD Nvfp4Block nvfp4_block(float amax, bool nan, float g) {
  if (nan || is_nan(g)) return {kE4M3NaN, false, 0.0f};
  if (!(g > 0.0f)) return {0, false, 0.0f};
  float sf = div_rn(amax, mul_rn(6.0f, g));
  sf = sf > kE4M3Max ? kE4M3Max : sf;
  const uint8_t byte = e4m3_encode(sf);
  const float denom = mul_rn(e4m3_decode(byte), g);
  if (!(denom > 0.0f)) return {byte, false, 0.0f};
  return {byte, true, div_rn(1.0f, denom)};
}
FP4MOE_HD uint8_t nvfp4_code(float v, const Nvfp4Block& b) { return b.encode ? e2m1_encode(mul_rn(v, b.inv)) : 0; }

FP4MOE_HD uint8_t nvfp4_quantize_block(const float* v, float g, uint8_t* codes) {
  bool nan;
  const float amax = block_amax(v, kNvfp4Block, &nan);  // sets nan: its own statement, before nan is read
  const Nvfp4Block b = nvfp4_block(amax, nan, g);
  for (int i = 0; i < kNvfp4Block; ++i) codes[i] = nvfp4_code(v[i], b);
  return b.scale;
}

// MX (MXFP4: E2M1 elements, elem_max 6; MXFP8: E4M3 elements, elem_max 448):
// e = clamp(ceil(log2(amax / elem_max)) + 127, 0, 254); element i encodes v_i · 2^(127-e).
// A NaN block gets scale 0xFF and elements 0.
struct MxBlock {
  uint8_t scale;  // UE8M0 byte
  bool encode;    // false: NaN block, every element 0
  float mul;      // 2^(127 - e)
};
FP4MOE_HD MxBlock mx_block(float amax, bool nan, float elem_max) {
  if (nan) return {kUE8M0NaN, false, 0.0f};
  const uint8_t e = mx_scale_byte(amax, elem_max);
  return {e, true, pow2f(127 - static_cast<int>(e))};
}
FP4MOE_HD uint8_t mxfp4_code(float v, const MxBlock& b) { return b.encode ? e2m1_encode(mul_rn(v, b.mul)) : 0; }
FP4MOE_HD uint8_t mxfp8_code(float v, const MxBlock& b) { return b.encode ? e4m3_encode(mul_rn(v, b.mul)) : 0; }

// One MX block: kE4 selects E4M3 elements (MXFP8) over E2M1 (MXFP4).
template <bool kE4>
FP4MOE_HD uint8_t mx_quantize_block(const float* v, uint8_t* codes) {
  bool nan;
  const float amax = block_amax(v, kMxBlock, &nan);  // sets nan: its own statement, before nan is read
  const MxBlock b = mx_block(amax, nan, kE4 ? kE4M3Max : kE2M1Max);
  for (int i = 0; i < kMxBlock; ++i) codes[i] = kE4 ? mxfp8_code(v[i], b) : mxfp4_code(v[i], b);
  return b.scale;
}
FP4MOE_HD uint8_t mxfp4_quantize_block(const float* v, uint8_t* codes) { return mx_quantize_block<false>(v, codes); }
FP4MOE_HD uint8_t mxfp8_quantize_block(const float* v, uint8_t* q) { return mx_quantize_block<true>(v, q); }

}  // namespace fp4moe::fmt
