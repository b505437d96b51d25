// The generic GPU path: correct for every format, mode, activation, bias and shape; the fast
// decode and prefill backends replace it where speed needs it.
//
//   route_kernel (common/routing.cuh)   ids → rows grouped by local expert, m-tile schedule
//   gather_quantize_kernel              x[t] → A1[row] = Q1(x[t]) with the row's expert's scale
//                                       (up to 1024 routes both are one launch: route.cuh's
//                                       route_gather_kernel)
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
#include "kernels/common/gather_combine.cuh"
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
    if (p.f16_words) codes = make_uint2(standard_word_from_f16(codes.x), standard_word_from_f16(codes.y));
    if (p.bf16_words) codes = make_uint2(standard_word_from_bf16(codes.x), standard_word_from_bf16(codes.y));
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

  if constexpr (kFc1) fc1_store_rows<BN, false>(p, &sm.c[0][0], BN + 4, valid, row0, e, y, tid, kThreads);  // → A2
  else fc2_store_rows<BN>(p, &sm.c[0][0], BN + 4, valid, row0, y, tid, kThreads);                    // → Y
}

// The gather and the combine may be launched as programmatic dependents (dynamic's chain,
// launch_dynamic.cu): each waits for the kernels before it first; the gather lets the GEMM after it
// launch early.
__global__ void __launch_bounds__(kGatherWarps * 32) gather_quantize_kernel(GatherParams p) {
  ptx::launch_dependents();
  ptx::wait_prior_grids();
  gather_unit(p, static_cast<int64_t>(blockIdx.x) * kGatherWarps + (threadIdx.x >> 5), threadIdx.x & 31);
}

__global__ void __launch_bounds__(kCombineThreads) combine_kernel(CombineParams p) {
  ptx::wait_prior_grids();
  const int c = (blockIdx.y * kCombineThreads + threadIdx.x) * 4;
  if (c < p.hidden) combine4(p, blockIdx.x, c);
}

}  // namespace fp4moe::kernels::generic
