// The generic path's gather-quantise (x → A1) and top-k sum (Y → out), as device functions: the
// generic path's kernels (generic.cuh) run them one unit per warp or thread, the fused routing +
// gather (route.cuh) its warps' units, and the static backend (static_moe.cuh) its top-k sum.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "fp4moe/config.h"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/quantize.cuh"

namespace fp4moe::kernels::generic {

// x[t] → A1[row] for every routed row of token t. One warp per (token, 32 quantisation blocks of its
// hidden), one block per lane: the lane reads its block of x once, then for each of the token's K
// routes (slot order; unrouted slots, -1, skipped) quantises it with the route's expert's scale and
// stores it. The quantisation is redone only when that scale differs from the previous route's (bit
// for bit): MX formats and a16 have no per-expert scale, and an NVFP4 checkpoint's experts often
// share one. Why: one warp per routed row read each token K times and quantised it K times; at
// qwen3-30b-a3b T = 16384 (K = 8) it took 0.68 ms for ~0.6 GB of traffic (NOTES session 7).
struct GatherParams {
  const __nv_bfloat16* x;  // [T, H]
  int tokens, hidden, h_pad, top_k;
  QuantKind q1;
  const float* q1_scale;   // [E_local]
  const int* route_row;    // [T·K]: the slot's routed row, or -1
  const int* row_expert;   // [rows]: the row's local expert
  __nv_bfloat16* a1;       // [rows][h_pad]
  bool a1_f16;             // A1 in f16 (dynamic's NVFP4-a4 register path; store_act)
};

inline constexpr int kGatherWarps = 8;
static_assert(kMaxTopK <= 32, "gather_block holds one routing slot per lane");
// Warps per token: 32 blocks each.
__host__ __device__ inline int gather_chunks(int h_pad, QuantKind q) { return (h_pad / quant_block(q) + 31) / 32; }

// A lane's block of x[t] as it is read: kBlock bf16 values, zeros past the hidden size (padding
// columns, which quantise to zeros in every format) and for inactive lanes.
template <int kBlock>
struct XBlock {
  uint4 raw[kBlock / 8];
};
template <int kBlock>
__device__ __forceinline__ XBlock<kBlock> load_x_block(const GatherParams& p, int t, int b, bool active) {
  XBlock<kBlock> x;
  const bool in = active && b * kBlock < p.hidden;
  const __nv_bfloat16* xb = p.x + static_cast<int64_t>(in ? t : 0) * p.hidden + (in ? b : 0) * kBlock;
#pragma unroll
  for (int i = 0; i < kBlock / 8; ++i) x.raw[i] = in ? *reinterpret_cast<const uint4*>(xb + 8 * i) : make_uint4(0, 0, 0, 0);
  return x;
}

// The lane's block quantised for each of the token's K routes (slot order; unrouted slots, row −1,
// skipped) with the route's expert's scale and stored to A1[row]; lane j holds slot j's row and
// scale (slot_row, slot_g), broadcast by shuffles. The quantisation is redone only when the scale
// differs from the previous route's (bit for bit). Every lane of the warp calls it (shuffles).
template <int kBlock>
__device__ __forceinline__ void quantize_routes(const GatherParams& p, const XBlock<kBlock>& x, int b, bool active,
                                                int slot_row, float slot_g) {
  float v[kBlock];
#pragma unroll
  for (int i = 0; i < kBlock / 8; ++i) {
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&x.raw[i]);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[8 * i + j] = __bfloat162float(h[j]);
  }
  __nv_bfloat16 q[kBlock];
  uint32_t done_scale = 0;
  bool done = false;
  for (int j = 0; j < p.top_k; ++j) {
    const int row = __shfl_sync(0xffffffffu, slot_row, j);
    const float g = __shfl_sync(0xffffffffu, slot_g, j);
    if (row < 0 || !active) continue;
    if (!done || __float_as_uint(g) != done_scale) {
      quant_dequant_block(p.q1, v, g, q);
      done_scale = __float_as_uint(g);
      done = true;
    }
    __nv_bfloat16* dst = p.a1 + static_cast<int64_t>(row) * p.h_pad + b * kBlock;
#pragma unroll
    for (int i = 0; i < kBlock; i += 8) store_act<8>(dst + i, q + i, p.a1_f16);
  }
}

// The token's routes are loaded once per warp, lane j holding slot j's row and its expert's scale
// (K ≤ 32), and broadcast by shuffles: loading them per slot made three dependent global loads
// (route_row, row_expert, q1_scale) per route, 24 round trips per warp at K = 8.
template <int kBlock>
__device__ __forceinline__ void gather_block(const GatherParams& p, int t, int b, bool active, int lane) {
  const int slot_row = lane < p.top_k ? p.route_row[static_cast<int64_t>(t) * p.top_k + lane] : -1;
  const float slot_g = slot_row >= 0 ? p.q1_scale[p.row_expert[slot_row]] : 0.0f;
  quantize_routes<kBlock>(p, load_x_block<kBlock>(p, t, b, active), b, active, slot_row, slot_g);
}

// Work unit `warp` of tokens · gather_chunks: token warp / chunks, its 32 blocks of chunk warp % chunks.
// Whole warps: the unit is the warp's (a unit past the tokens does nothing).
__device__ __forceinline__ void gather_unit(const GatherParams& p, int64_t warp, int lane) {
  const int chunks = gather_chunks(p.h_pad, p.q1);
  const int t = static_cast<int>(warp / chunks);
  const int b = static_cast<int>(warp % chunks) * 32 + lane;
  if (t >= p.tokens) return;
  if (quant_block(p.q1) == 16) gather_block<16>(p, t, b, b < p.h_pad / 16, lane);
  else gather_block<32>(p, t, b, b < p.h_pad / 32, lane);
}

// out[t, c..c+3] = Σ_j Y[route_row[t·K + j], c..c+3] in slot order; unrouted slots add nothing. With
// acc (the dynamic backend's scatter-add, MoeGemmParams::out_acc, for a bf16 output) the sums are
// already there: out[t, c..c+3] = acc[t, c..c+3], rounded.
struct CombineParams {
  const float* y;
  const int* route_row;
  int top_k, hidden;
  void* out;
  bool out_fp32;
  const float* acc = nullptr;
};

inline constexpr int kCombineThreads = 128;

// Columns c … c + 3 of token t's output (c < hidden, hidden % 4 == 0). The slots go in groups of
// kCombineGroup: the group's rows are loaded, then its Y values, then added in slot order (the same
// sum, bit for bit, as one slot at a time). Why: one slot at a time was two dependent loads a slot,
// 2K round trips in series (16 at K = 8) for a decode call whose combine is all latency.
inline constexpr int kCombineGroup = 8;
__device__ __forceinline__ void combine4(const CombineParams& p, int t, int c) {
  if (p.acc) {
    store_out4(p.out, p.out_fp32, static_cast<int64_t>(t) * p.hidden + c,
               *reinterpret_cast<const float4*>(p.acc + static_cast<int64_t>(t) * p.hidden + c));
    return;
  }
  float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
  const int* slots = p.route_row + static_cast<int64_t>(t) * p.top_k;
  for (int j0 = 0; j0 < p.top_k; j0 += kCombineGroup) {
    int row[kCombineGroup];
    float4 v[kCombineGroup];
#pragma unroll
    for (int i = 0; i < kCombineGroup; ++i) row[i] = j0 + i < p.top_k ? slots[j0 + i] : -1;
#pragma unroll
    for (int i = 0; i < kCombineGroup; ++i)
      if (row[i] >= 0) v[i] = *reinterpret_cast<const float4*>(p.y + static_cast<int64_t>(row[i]) * p.hidden + c);
#pragma unroll
    for (int i = 0; i < kCombineGroup; ++i)
      if (row[i] >= 0) add4(s, v[i]);  // unrouted slots add nothing
  }
  store_out4(p.out, p.out_fp32, static_cast<int64_t>(t) * p.hidden + c, s);
}

}  // namespace fp4moe::kernels::generic
