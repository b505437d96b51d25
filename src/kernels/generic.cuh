// The generic GPU path: correct for every format, mode, activation, bias and shape; the fast
// decode and prefill backends replace it where speed needs it.
//
//   route_kernel (common/routing.cuh)   ids → rows grouped by local expert, m-tile schedule
//   gather_quantize_kernel              x[t] → A1[row] = Q1(x[t]) with the row's expert's scale
//   gemm_kernel<kFc1>                   A1 · W13ᵀ → alpha, bias, activation, bf16, Q2 → A2[row]
//   gemm_kernel<kFc2>                   A2 · W2ᵀ  → alpha, bias, · router weight → Y[row] (fp32)
//   combine_kernel                      out[t] = Σ_j Y[route_row[t, j]], slot order (deterministic)
//
// Quantised operands are stored as their exactly dequantised bf16 values (code × block scale); the
// NVFP4 global scales are folded into alpha. Weights are read in mma-fragment order (the one device
// copy, device_weights.h), dequantised to bf16 in shared memory through a 256-entry byte → bf16x2
// table and multiplied on bf16 tensor cores (mma.sync m16n8k16, fp32 accumulators).
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "fp4moe/activation.h"
#include "kernels/common/dequant.cuh"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/frag_dequant.cuh"
#include "kernels/common/moe_gemm.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/quantize.cuh"

namespace fp4moe::kernels::generic {

// Tile of one CTA: BM routed rows × BN weight rows, BK along K per step; 4 warps in a 2 × 2 grid,
// 32 × 32 each.
inline constexpr int BM = 64, BN = 64, BK = 32, kThreads = 128;
static_assert(BN == 16 * (kThreads / 32), "each warp dequantises one 16-row fragment tile of the B tile");
static_assert(64 % BK == 0 && BK == 32, "a BK step is half of a 64-k fragment tile");
inline constexpr int kSmemStride = BK + 8;  // bf16 per shared row: 80 B, so ldmatrix rows hit distinct banks

// The problem description and the epilogues are shared with the dynamic backend (common/moe_gemm.cuh).
using GemmParams = MoeGemmParams;

struct GemmSmem {
  __nv_bfloat16 a[2][BM][kSmemStride];  // A tiles, double-buffered (cp.async)
  __nv_bfloat16 b[BN][kSmemStride];     // dequantised weight tile: rows = n, contiguous k
  alignas(16) float c[BM][BN + 4];      // epilogue staging (float4 reads)
  E2m1x2Table lut;
};

template <bool kFc1>
__global__ void __launch_bounds__(kThreads) gemm_kernel(GemmParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  GemmSmem& sm = *reinterpret_cast<GemmSmem*>(smem_raw);
  const int tile = blockIdx.x;
  if (tile >= *p.num_tiles) return;  // the grid is sized for the worst case
  const int y = blockIdx.y;
  const int e = p.tile_expert[tile];
  const int row0 = p.tile_row0[tile];
  const int valid = min(BM, p.expert_offset[e + 1] - row0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  fill_e2m1x2_table(sm.lut);

  // Weight loads from the mma-fragment order (device_weights.h): warp w takes the 16-row tile of
  // tile columns [16w, 16w + 16) (16 consecutive weight rows: weight_row keeps 16-row groups whole),
  // each lane its 16 bytes per 64-k fragment tile, of which a BK = 32 step uses words 2h, 2h + 1.
  const int sb = 64 / p.block, g = lane >> 2, cq = lane & 3;
  const int64_t ftile0 = (static_cast<int64_t>(e) * (p.w_rows / 16) + weight_row<BN>(p, kFc1, y, 16 * warp) / 16) *
                         (p.k_pad / 64);
  const unsigned char* w_codes = reinterpret_cast<const unsigned char*>(p.w_frag + ftile0 * 32 + lane);
  const uint8_t* w_scale = p.s_frag + ftile0 * 16 * sb;
  const int ktiles = p.k_pad / BK;

  auto load_a = [&](int stage, int kt) {
#pragma unroll
    for (int c = tid; c < BM * BK / 8; c += kThreads) {
      const int r = c >> 2, ch = c & 3;
      const bool ok = r < valid;
      const __nv_bfloat16* src = p.a + static_cast<int64_t>(row0 + (ok ? r : 0)) * p.k_pad + kt * BK + ch * 8;
      ptx::cp_async_16(&sm.a[stage][r][ch * 8], src, ok ? 16 : 0);  // rows past the expert: zeros
    }
    ptx::cp_async_commit();
  };
  uint2 codes;
  uint32_t slo, shi;
  auto load_b = [&](int kt) {
    codes = *reinterpret_cast<const uint2*>(w_codes + (kt >> 1) * 512 + (kt & 1) * 8);
    frag_scales(w_scale + (kt >> 1) * 16 * sb, sb, slo, shi);
  };

  float acc[2][4][4] = {};
  const int wm = warp >> 1, wn = warp & 1, q = lane >> 3, l8 = lane & 7;
  load_a(0, 0);
  load_b(0);
  __syncthreads();  // the table is filled
  for (int kt = 0; kt < ktiles; ++kt) {
    // k16 step j of this BK step is step t = 2·(kt % 2) + j of the fragment tile: its A fragment
    // (frag_dequant.cuh) goes to rows 16w + g (+8), k 16j + 2c (+8) of the B tile; byte t of the
    // scale words is its scale (frag_scales spreads MX's two bytes).
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int t = 2 * (kt & 1) + j;
      const uint32_t word = j ? codes.y : codes.x;
      const __nv_bfloat162 s_lo = scale_bf16x2(static_cast<uint8_t>(slo >> (8 * t)), p.nvfp4);
      const __nv_bfloat162 s_hi = scale_bf16x2(static_cast<uint8_t>(shi >> (8 * t)), p.nvfp4);
      const uint32_t lo = *reinterpret_cast<const uint32_t*>(&s_lo), hi = *reinterpret_cast<const uint32_t*>(&s_hi);
      const int n = 16 * warp + g, k = 16 * j + 2 * cq;
      *reinterpret_cast<uint32_t*>(&sm.b[n][k]) = hmul2_bf16_bits(sm.lut.v[word & 0xFF], lo);
      *reinterpret_cast<uint32_t*>(&sm.b[n + 8][k]) = hmul2_bf16_bits(sm.lut.v[(word >> 8) & 0xFF], hi);
      *reinterpret_cast<uint32_t*>(&sm.b[n][k + 8]) = hmul2_bf16_bits(sm.lut.v[(word >> 16) & 0xFF], lo);
      *reinterpret_cast<uint32_t*>(&sm.b[n + 8][k + 8]) = hmul2_bf16_bits(sm.lut.v[word >> 24], hi);
    }
    ptx::cp_async_wait<0>();
    __syncthreads();
    if (kt + 1 < ktiles) {  // next step's loads overlap this step's MMAs
      load_a((kt + 1) & 1, kt + 1);
      load_b(kt + 1);
    }
    const int st = kt & 1;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t a[2][4], b[4][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        ptx::ldmatrix_x4(a[mt], &sm.a[st][wm * 32 + mt * 16 + (q & 1) * 8 + l8][kk + (q >> 1) * 8]);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t t4[4];
        ptx::ldmatrix_x4(t4, &sm.b[wn * 32 + np * 16 + (q >> 1) * 8 + l8][kk + (q & 1) * 8]);
        b[2 * np][0] = t4[0], b[2 * np][1] = t4[1], b[2 * np + 1][0] = t4[2], b[2 * np + 1][1] = t4[3];
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) ptx::mma_16816<false>(acc[mt][nt], a[mt], b[nt]);
    }
    __syncthreads();
  }

  // Stage alpha · acc (+ bias) in shared memory. Accumulator (mt, nt, i) sits at row
  // lane/4 + 8·(i/2), column 2·(lane%4) + i%2 of its 16 × 8 tile.
  const float alpha = p.alpha[e];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = wm * 32 + mt * 16 + (lane >> 2) + (i >> 1) * 8;
        const int col = wn * 32 + nt * 8 + (lane & 3) * 2 + (i & 1);
        const float bias = p.bias ? p.bias[static_cast<int64_t>(e) * p.w_rows + weight_row<BN>(p, kFc1, y, col)] : 0.0f;
        sm.c[r][col] = alpha * acc[mt][nt][i] + bias;
      }
  __syncthreads();

  if constexpr (kFc1) fc1_store_rows<BN>(p, &sm.c[0][0], BN + 4, valid, row0, e, y, tid, kThreads);  // → A2
  else fc2_store_rows<BN>(p, &sm.c[0][0], BN + 4, valid, row0, y, tid, kThreads);                    // → Y
}

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
  bool a1_f16;             // A1 in f16 (dynamic's NVFP4-a4 register path; store_act8)
};

inline constexpr int kGatherWarps = 8;
static_assert(kMaxTopK <= 32, "gather_block holds one routing slot per lane");
// Warps per token: 32 blocks each.
__host__ __device__ inline int gather_chunks(int h_pad, QuantKind q) { return (h_pad / quant_block(q) + 31) / 32; }

// The token's routes are loaded once per warp, lane j holding slot j's row and its expert's scale
// (K ≤ 32), and broadcast by shuffles: loading them per slot made three dependent global loads
// (route_row, row_expert, q1_scale) per route, 24 round trips per warp at K = 8.
template <int kBlock>
__device__ __forceinline__ void gather_block(const GatherParams& p, int t, int b, bool active, int lane) {
  const int slot_row = lane < p.top_k ? p.route_row[static_cast<int64_t>(t) * p.top_k + lane] : -1;
  const float slot_g = slot_row >= 0 ? p.q1_scale[p.row_expert[slot_row]] : 0.0f;
  float v[kBlock];
  if (active && b * kBlock < p.hidden) {
    const __nv_bfloat16* xb = p.x + static_cast<int64_t>(t) * p.hidden + b * kBlock;
#pragma unroll
    for (int i = 0; i < kBlock; i += 8) {
      const uint4 raw = *reinterpret_cast<const uint4*>(xb + i);
      const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[i + j] = __bfloat162float(h[j]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kBlock; ++i) v[i] = 0.0f;  // padding columns: quantise to zeros in every format
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
    for (int i = 0; i < kBlock; i += 8) store_act8(dst + i, q + i, p.a1_f16);
  }
}

__global__ void __launch_bounds__(kGatherWarps * 32) gather_quantize_kernel(GatherParams p) {
  const int chunks = gather_chunks(p.h_pad, p.q1);
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kGatherWarps + (threadIdx.x >> 5);
  const int t = static_cast<int>(warp / chunks);
  const int lane = threadIdx.x & 31;
  const int b = static_cast<int>(warp % chunks) * 32 + lane;
  if (t >= p.tokens) return;  // whole warps: t is the warp's
  if (quant_block(p.q1) == 16) gather_block<16>(p, t, b, b < p.h_pad / 16, lane);
  else gather_block<32>(p, t, b, b < p.h_pad / 32, lane);
}

// out[t, c..c+3] = Σ_j Y[route_row[t·K + j], c..c+3] in slot order; unrouted slots add nothing.
struct CombineParams {
  const float* y;
  const int* route_row;
  int top_k, hidden;
  void* out;
  bool out_fp32;
};

inline constexpr int kCombineThreads = 128;

__global__ void __launch_bounds__(kCombineThreads) combine_kernel(CombineParams p) {
  const int t = blockIdx.x;
  const int c = (blockIdx.y * kCombineThreads + threadIdx.x) * 4;
  if (c >= p.hidden) return;
  float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int j = 0; j < p.top_k; ++j) {
    const int row = p.route_row[static_cast<int64_t>(t) * p.top_k + j];
    if (row < 0) continue;
    add4(s, *reinterpret_cast<const float4*>(p.y + static_cast<int64_t>(row) * p.hidden + c));
  }
  store_out4(p.out, p.out_fp32, static_cast<int64_t>(t) * p.hidden + c, s);
}

}  // namespace fp4moe::kernels::generic
