// Activation quantisers on the device: the block scales by the fmt:: code the CPU reference runs (so
// they agree byte for byte), the elements through fmt::e2m1_round / e4m3_round (equal to the
// reference's encode-then-decode bit for bit), producing what the bf16 GEMMs read: the exactly
// dequantised value code × block scale, *without* the NVFP4 global scale (that goes into alpha).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
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

// The dequantised element of a block: e2m1_decode(nvfp4_code(v, b)) (resp. mxfp4_code) through
// fmt::e2m1_round, e4m3_decode(mxfp8_code(v, b)) through fmt::e4m3_round: a few instructions instead
// of the code's comparisons and its decode; equal bit for bit (tests/cpu/test_formats.cpp, every float
// near the grid). A block without codes (NaN, zero scale) gives +0, as code 0 does. Branch-free: the
// rounding runs for every element and the block's flag selects its result (written as the flag's
// branch around the rounding, ptxas kept a branch an element, BSSY / BRA / BSYNC: session 40's SASS);
// where the flag is off, the product is whatever it is and is not used.
__device__ __forceinline__ float nvfp4_elem(float v, const fmt::Nvfp4Block& b) {
  const float r = fmt::e2m1_round(fmt::mul_rn(v, b.inv));
  return b.encode ? r : 0.0f;
}
__device__ __forceinline__ float mxfp4_elem(float v, const fmt::MxBlock& b) {
  const float r = fmt::e2m1_round(fmt::mul_rn(v, b.mul));
  return b.encode ? r : 0.0f;
}
__device__ __forceinline__ float mxfp8_elem(float v, const fmt::MxBlock& b) {
  const float r = fmt::e4m3_round(fmt::mul_rn(v, b.mul));
  return b.encode ? r : 0.0f;
}

// Quantise-dequantise one block of kBlock = quant_block(q) values, writing bf16.
// g: NVFP4 decode global scale (ignored otherwise). amax and the NaN flag from the elements' bit
// patterns (fmt::block_amax_bits: an LOP3 and a VIMNMX an element instead of ~4 instructions).
template <int kBlock>
__device__ __forceinline__ void quant_dequant_block(QuantKind q, const float (&v)[kBlock], float g,
                                                    __nv_bfloat16 (&out)[kBlock]) {
  if constexpr (kBlock == fmt::kNvfp4Block) {  // kNone or kNvfp4
    if (q == QuantKind::kNone) {
#pragma unroll
      for (int i = 0; i < kBlock; ++i) out[i] = __float2bfloat16_rn(v[i]);
      return;
    }
    bool nan;
    const float amax = fmt::block_amax_bits(v, kBlock, &nan);  // sets nan: its own statement
    const fmt::Nvfp4Block b = fmt::nvfp4_block(amax, nan, g);
    const float s = fmt::e4m3_decode(b.scale);
#pragma unroll
    for (int i = 0; i < kBlock; ++i) out[i] = __float2bfloat16_rn(nvfp4_elem(v[i], b) * s);
  } else {  // kMxfp4 or kMxfp8
    static_assert(kBlock == fmt::kMxBlock);
    bool nan;
    const float amax = fmt::block_amax_bits(v, kBlock, &nan);  // sets nan: its own statement
    if (q == QuantKind::kMxfp4) {
      const fmt::MxBlock b = fmt::mx_block(amax, nan, fmt::kE2M1Max);
      const float s = fmt::ue8m0_decode(b.scale);
#pragma unroll
      for (int i = 0; i < kBlock; ++i) out[i] = __float2bfloat16_rn(mxfp4_elem(v[i], b) * s);
    } else {
      const fmt::MxBlock b = fmt::mx_block(amax, nan, fmt::kE4M3Max);
      const float s = fmt::ue8m0_decode(b.scale);
#pragma unroll
      for (int i = 0; i < kBlock; ++i) out[i] = __float2bfloat16_rn(mxfp8_elem(v[i], b) * s);
    }
  }
}

// The same quantise-dequantise with the block spread over kBlock / kPer consecutive lanes of a warp,
// kPer consecutive elements a lane (lane i of the group holds elements kPer·i..; the groups start at
// lanes that are multiples of kBlock / kPer), every lane of the warp taking part. amax and NaN are
// reduced within the lane, then across the group (max and or are order-free), so codes and scales
// equal quant_dequant_block's bit for bit.
template <int kBlock, int kPer>
__device__ __forceinline__ void quant_dequant_lanes(QuantKind q, const float (&v)[kPer], float g,
                                                    __nv_bfloat16 (&out)[kPer]) {
  static_assert(kBlock % kPer == 0 && kBlock / kPer <= 32, "a block spans whole lanes of one warp");
  if (q == QuantKind::kNone) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) out[i] = __float2bfloat16_rn(v[i]);
    return;
  }
  // The lane's part as quant_dequant_block's (block_amax_bits); where a lane holds a NaN its amax is
  // unspecified, but the reduced flag then makes the block's encoders return before reading it.
  bool lane_nan;
  float amax = fmt::block_amax_bits(v, kPer, &lane_nan);  // sets lane_nan: its own statement
  int nan = lane_nan;
#pragma unroll
  for (int o = kBlock / kPer / 2; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, amax, o);
    amax = other > amax ? other : amax;
    nan |= __shfl_xor_sync(0xffffffffu, nan, o);
  }
  if constexpr (kBlock == fmt::kNvfp4Block) {
    const fmt::Nvfp4Block b = fmt::nvfp4_block(amax, nan != 0, g);
    const float s = fmt::e4m3_decode(b.scale);
#pragma unroll
    for (int i = 0; i < kPer; ++i) out[i] = __float2bfloat16_rn(nvfp4_elem(v[i], b) * s);
  } else {
    static_assert(kBlock == fmt::kMxBlock);
    if (q == QuantKind::kMxfp4) {
      const fmt::MxBlock b = fmt::mx_block(amax, nan != 0, fmt::kE2M1Max);
      const float s = fmt::ue8m0_decode(b.scale);
#pragma unroll
      for (int i = 0; i < kPer; ++i) out[i] = __float2bfloat16_rn(mxfp4_elem(v[i], b) * s);
    } else {
      const fmt::MxBlock b = fmt::mx_block(amax, nan != 0, fmt::kE4M3Max);
      const float s = fmt::ue8m0_decode(b.scale);
#pragma unroll
      for (int i = 0; i < kPer; ++i) out[i] = __float2bfloat16_rn(mxfp8_elem(v[i], b) * s);
    }
  }
}
// One element a lane.
template <int kBlock>
__device__ __forceinline__ __nv_bfloat16 quant_dequant_lanes(QuantKind q, float v, float g) {
  const float in[1] = {v};
  __nv_bfloat16 out[1];
  quant_dequant_lanes<kBlock, 1>(q, in, g, out);
  return out[0];
}

// quant_dequant_lanes for the block size of q (quant_block: 16 lanes for NVFP4 and kNone, 32 for MX).
__device__ __forceinline__ __nv_bfloat16 quant_dequant_lanes(QuantKind q, float v, float g) {
  return quant_block(q) == 16 ? quant_dequant_lanes<16>(q, v, g) : quant_dequant_lanes<32>(q, v, g);
}

// quant_dequant_block over kBlock bf16 values read from memory, with few registers: one pass for the
// block's amax and NaN, a second that rounds and stores 8 values at a time, so no more than 8
// values are live. The same steps as quant_dequant_block, so the results are equal bit for
// bit. The values are columns col0.. of `row`, held in 16-byte chunks of 8 whose index is XORed
// with `x` (a swizzled staging row; x = 0: plain); col0 a multiple of 8, dst 16-byte aligned. For
// threads with a small register budget (the bf16 path's FC1 requantisation runs in the producer
// warpgroup, dynamic_bf16.cuh).
namespace detail {
__device__ __forceinline__ float bf16_word_half(uint32_t w, int half) {
  return fmt::f32_from_bf16(static_cast<uint16_t>(half ? w >> 16 : w & 0xFFFFu));
}
__device__ __forceinline__ uint4 staged_chunk(const uint16_t* row, int col, int x) {
  return *reinterpret_cast<const uint4*>(row + (((col >> 3) ^ x) << 3));
}
// Pass 2: dst[i] = bf16(elem(v_i) · s); elem rounds one value (nvfp4_elem, …).
template <int kBlock, class Elem>
__device__ __forceinline__ void dequant_pass(const uint16_t* row, int col0, int x, __nv_bfloat16* dst, float s,
                                             Elem elem) {
#pragma unroll 1
  for (int i = 0; i < kBlock; i += 8) {
    const uint4 raw = staged_chunk(row, col0 + i, x);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __nv_bfloat162 pr = __floats2bfloat162_rn(elem(bf16_word_half(w[j], 0)) * s, elem(bf16_word_half(w[j], 1)) * s);
      o[j] = *reinterpret_cast<const uint32_t*>(&pr);
    }
    *reinterpret_cast<uint4*>(dst + i) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}
}  // namespace detail

template <int kBlock>
__device__ __forceinline__ void quant_dequant_bf16_run(QuantKind q, const uint16_t* row, int col0, int x, float g,
                                                       __nv_bfloat16* dst) {
  static_assert(kBlock % 8 == 0, "16-byte chunks");
  if (q == QuantKind::kNone) {  // bf16 in, bf16 out
#pragma unroll
    for (int i = 0; i < kBlock; i += 8) *reinterpret_cast<uint4*>(dst + i) = detail::staged_chunk(row, col0 + i, x);
    return;
  }
  float amax = 0.0f;  // fmt::block_amax: a NaN never raises amax, and marks the block
  bool nan = false;
#pragma unroll
  for (int i = 0; i < kBlock; i += 8) {
    const uint4 raw = detail::staged_chunk(row, col0 + i, x);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float v = detail::bf16_word_half(w[j / 2], j & 1);
      nan |= fmt::is_nan(v);
      const float a = fmt::abs_f(v);
      amax = a > amax ? a : amax;
    }
  }
  if constexpr (kBlock == fmt::kNvfp4Block) {
    const fmt::Nvfp4Block b = fmt::nvfp4_block(amax, nan, g);
    detail::dequant_pass<kBlock>(row, col0, x, dst, fmt::e4m3_decode(b.scale),
                                 [&](float v) { return nvfp4_elem(v, b); });
  } else {
    static_assert(kBlock == fmt::kMxBlock);
    if (q == QuantKind::kMxfp4) {
      const fmt::MxBlock b = fmt::mx_block(amax, nan, fmt::kE2M1Max);
      detail::dequant_pass<kBlock>(row, col0, x, dst, fmt::ue8m0_decode(b.scale),
                                   [&](float v) { return mxfp4_elem(v, b); });
    } else {
      const fmt::MxBlock b = fmt::mx_block(amax, nan, fmt::kE4M3Max);
      detail::dequant_pass<kBlock>(row, col0, x, dst, fmt::ue8m0_decode(b.scale),
                                   [&](float v) { return mxfp8_elem(v, b); });
    }
  }
}
// A quantised NVFP4-a4 activation value in f16, for the f16 tensor-core paths (the register path's
// NVFP4-a4 variant, direct_micro's f16 variant), which read both operands as f16. Exact: every
// NVFP4-a4 value is an E2M1 code times an E4M3 scale, at most 6 · 448 and at least 2^-10 in
// magnitude, with at most 5 significant bits; NaN stays NaN. One value, and two at once.
__device__ __forceinline__ __half act_f16(__nv_bfloat16 v) { return __float2half_rn(__bfloat162float(v)); }
__device__ __forceinline__ __half2 act_f16x2(__nv_bfloat162 v) { return __float22half2_rn(__bfloat1622float2(v)); }

// N = 4 or 8 quantised activation values (8- or 16-byte aligned) to a GEMM input buffer: as bf16,
// or as f16 (act_f16x2) for the register path's NVFP4-a4 variant (f16 = true). One store.
template <int N>
__device__ __forceinline__ void store_act(__nv_bfloat16* dst, const __nv_bfloat16* q, bool f16) {
  static_assert(N == 4 || N == 8, "one 8- or 16-byte store");
  uint32_t w[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    w[i] = *reinterpret_cast<const uint32_t*>(q + 2 * i);
    if (f16) {
      const __half2 h = act_f16x2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
      w[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
  }
  if constexpr (N == 8) *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  else *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
}

}  // namespace fp4moe::kernels
