// direct_micro: the decode kernel. One cooperative launch, four phases separated by the software
// grid barrier (common/grid_barrier.cuh):
//
//   routing   every CTA parses the top-k ids into its own shared memory (no pre-pass launch): the
//             touched local experts in ascending order (the same in every CTA) and, per expert, its
//             routes in an order that differs between CTAs — so work is only ever split across CTAs
//             by route index or by (expert, slice), and every buffer is indexed by route r = t·K + j
//   phase 0   A1[r] = Q1(x[t]) with expert e's FC1 input scale                      → barrier
//   phase 1   FC1 tasks (expert, 32 intermediate columns): stream the 4 W13 row tiles
//             (up, up, gate, gate) once, epilogue alpha + bias → act → bf16 → Q2 → A2[r] → barrier
//   phase 2   FC2 tasks (expert, 16 rows of H): stream the W2 row tile once,
//             epilogue alpha + bias → · router weight → Y[r] (fp32)                    → barrier
//   phase 3   out[t] = Σ_j Y[t·K + j] in slot order (deterministic, written once)
//
// Weights are the A operand of mma.m16n8k16 ("swap-AB"): 16 weight rows × 16 k, read straight
// from global memory in fragment order (one 16-byte load per lane per 16 × 64 tile, see
// device_weights.h), dequantised in registers through two shared-memory tables (E2M1 byte → bf16x2,
// scale byte → bf16x2; exact, dequant.cuh). Routed rows are the N = 8 operand, in groups of 8; a
// weight tile feeds kGroups groups per pass, so an expert with up to 8·kGroups routes streams its
// weights exactly once. Activations A1/A2 are stored permuted inside each 64-column chunk so a lane
// reads its B fragments for 4 k16 steps with two 16-byte loads.
#pragma once

#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cstdint>

#include "fp4moe/activation.h"
#include "kernels/common/dequant.cuh"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/grid_barrier.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/quantize.cuh"

namespace fp4moe::kernels::direct_micro {

inline constexpr int kThreads = 256, kWarps = kThreads / 32;
inline constexpr int kMaxRoutes = 512;   // T·K this kernel accepts (shared-memory route lists)
inline constexpr int kMaxExperts = 1024; // E_local
inline constexpr int kGroups = 2;        // groups of 8 routes fed by one pass over a weight tile
inline constexpr int kRoutesPerPass = 8 * kGroups;

struct Params {
  // inputs
  const __nv_bfloat16* x;  // [T, H]
  const void* ids;         // [T, K]
  bool ids_int64;
  const float* topk_weights;
  int tokens, top_k, routes;  // routes = T·K
  int first, experts;         // local expert range
  int hidden, h_pad, i_pad;
  bool gated, nvfp4;
  int block;                  // weight scale block (16 / 32)
  QuantKind q;                // activation quantiser (both GEMM inputs)
  Activation activation;
  float sw_alpha, sw_beta, sw_limit;
  // weights (fragment order)
  const uint4* w13;
  const uint8_t* s13;
  const uint4* w2;
  const uint8_t* s2;
  const float *alpha1, *alpha2, *g1, *g2, *b13, *b2;
  // workspace
  __nv_bfloat16* a1;  // [zero_row + 1][h_pad], permuted chunks; row zero_row stays 0
  __nv_bfloat16* a2;  // [zero_row + 1][i_pad]
  float* y;           // [routes][hidden]
  int zero_row;
  GridBarrier barrier;
  void* out;
  bool out_fp32;
};

struct Smem {
  int count[kMaxExperts];      // routes per local expert, then the expert's slot in `touched`
  int cursor[kMaxExperts];     // next free place in the route list, per slot
  int touched[kMaxExperts];    // local experts with routes, ascending
  int start[kMaxExperts + 1];  // their route-list offsets
  int list[kMaxRoutes];        // route indices grouped by expert
  int num_touched;
  uint32_t e2m1x2[256];        // E2M1 byte → bf16x2
  uint32_t scale2[256];        // scale byte → bf16x2 (both halves)
  float h[kWarps][kRoutesPerPass][33];  // FC1 epilogue staging, per warp (33: no bank conflicts)
};

// Logical column w (0..63) of a 64-column chunk → its position in the permuted chunk.
__device__ __forceinline__ int permuted(int w) {
  const int t = w >> 4, r = w & 15, half = r >> 3, c = (r & 7) >> 1, e = r & 1;
  return c * 16 + t * 4 + half * 2 + e;
}
__device__ __forceinline__ int64_t permuted_col(int col) { return (col & ~63) + permuted(col & 63); }

__device__ __forceinline__ int local_expert(const Params& p, int r) {
  const int64_t id = p.ids_int64 ? static_cast<const int64_t*>(p.ids)[r] : static_cast<const int32_t*>(p.ids)[r];
  const int64_t e = id - p.first;
  return (e >= 0 && e < p.experts) ? static_cast<int>(e) : -1;
}

__device__ __forceinline__ uint4 ld_stream(const uint4* ptr) {  // read once: skip L1
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// Routing into shared memory; identical in every CTA.
__device__ void build_routing(const Params& p, Smem& sm) {
  using Scan = cub::BlockScan<int, kThreads>;
  constexpr int kPer = kMaxExperts / kThreads;
  __shared__ typename Scan::TempStorage scan;
  const int tid = threadIdx.x;
  for (int e = tid; e < kMaxExperts; e += kThreads) sm.count[e] = 0;
  __syncthreads();
  for (int r = tid; r < p.routes; r += kThreads) {
    const int e = local_expert(p, r);
    if (e >= 0) atomicAdd(&sm.count[e], 1);
  }
  __syncthreads();
  // Blocked arrangement: thread tid owns experts [tid·kPer, tid·kPer + kPer).
  int cnt[kPer], flag[kPer], off[kPer], slot[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    cnt[i] = sm.count[tid * kPer + i];
    flag[i] = cnt[i] > 0;
  }
  int total_routes, total_touched;
  Scan(scan).ExclusiveSum(cnt, off, total_routes);
  __syncthreads();
  Scan(scan).ExclusiveSum(flag, slot, total_touched);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (flag[i]) {
      sm.touched[slot[i]] = tid * kPer + i;
      sm.start[slot[i]] = off[i];
      sm.cursor[slot[i]] = off[i];
      sm.count[tid * kPer + i] = slot[i];
    }
  if (tid == 0) {
    sm.num_touched = total_touched;
    sm.start[total_touched] = total_routes;
  }
  __syncthreads();
  for (int r = tid; r < p.routes; r += kThreads) {
    const int e = local_expert(p, r);
    if (e >= 0) sm.list[atomicAdd(&sm.cursor[sm.count[e]], 1)] = r;
  }
  __syncthreads();
}

__device__ void fill_tables(const Params& p, Smem& sm) {
  for (int b = threadIdx.x; b < 256; b += kThreads) {
    sm.e2m1x2[b] = static_cast<uint32_t>(e2m1_to_bf16_bits(b & 0xF)) |
                   (static_cast<uint32_t>(e2m1_to_bf16_bits(b >> 4)) << 16);
    const uint16_t s = fmt::bf16_from_f32(p.nvfp4 ? fmt::e4m3_decode(b) : fmt::ue8m0_decode(b));
    sm.scale2[b] = static_cast<uint32_t>(s) | (static_cast<uint32_t>(s) << 16);
  }
}

// Phase 0: one routed row per warp.
template <int kBlock>
__device__ void quantize_row(const Params& p, int r, float g, int lane) {
  const int t = r / p.top_k;
  const __nv_bfloat16* xr = p.x + static_cast<int64_t>(t) * p.hidden;
  __nv_bfloat16* dst = p.a1 + static_cast<int64_t>(r) * p.h_pad;
  for (int b = lane; b < p.h_pad / kBlock; b += 32) {
    float v[kBlock];
    __nv_bfloat16 q[kBlock];
    const bool inside = b * kBlock < p.hidden;
#pragma unroll
    for (int i = 0; i < kBlock; i += 8) {
      uint4 raw = inside ? *reinterpret_cast<const uint4*>(xr + b * kBlock + i) : make_uint4(0, 0, 0, 0);
      const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[i + j] = __bfloat162float(h[j]);
    }
    quant_dequant_block<kBlock>(p.q, v, g, q);
#pragma unroll
    for (int i = 0; i < kBlock; ++i) dst[permuted_col(b * kBlock + i)] = q[i];
  }
}

// Streams kS weight row tiles of one expert over KT k-tiles, against kGroups groups of routed rows.
// w[s]/sc[s]: the k-tile-0 code and scale pointers of stream s; brow[q]: this lane's B row of
// group q. acc[s][q]: m16n8 accumulators.
template <int kS, int kUnroll>
__device__ __forceinline__ void stream_gemm(const Params& p, const Smem& sm, const uint4* const (&w)[kS],
                                            const uint8_t* const (&sc)[kS], int KT,
                                            const __nv_bfloat16* const (&brow)[kGroups], float (&acc)[kS][kGroups][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int sb = 64 / p.block;  // scale bytes per row per tile: 4 (NVFP4) or 2 (MX)
  for (int kt0 = 0; kt0 < KT; kt0 += kUnroll) {
    uint4 wv[kUnroll][kS];
    uint32_t slo[kUnroll][kS], shi[kUnroll][kS];
    uint4 bv[kUnroll][kGroups][2];
    // Issue every load of kUnroll tiles before the first use.
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kt = min(kt0 + u, KT - 1);  // clamped loads past the end are never used
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        wv[u][s] = ld_stream(w[s] + kt * 32 + lane);
        const uint8_t* st = sc[s] + static_cast<int64_t>(kt) * 16 * sb;
        if (sb == 4) {
          slo[u][s] = *reinterpret_cast<const uint32_t*>(st + g * 4);
          shi[u][s] = *reinterpret_cast<const uint32_t*>(st + (g + 8) * 4);
        } else {
          slo[u][s] = *reinterpret_cast<const uint16_t*>(st + g * 2);
          shi[u][s] = *reinterpret_cast<const uint16_t*>(st + (g + 8) * 2);
        }
      }
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
        // A1/A2 were written earlier in this launch by other CTAs: coherent (L2) loads, never the
        // read-only path.
        const uint4* b = reinterpret_cast<const uint4*>(brow[q] + kt * 64 + c * 16);
        bv[u][q][0] = __ldcg(b);
        bv[u][q][1] = __ldcg(b + 1);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (kt0 + u >= KT) break;
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int j = sb == 4 ? t : t >> 1;
#pragma unroll
        for (int s = 0; s < kS; ++s) {
          const uint32_t word = t == 0 ? wv[u][s].x : t == 1 ? wv[u][s].y : t == 2 ? wv[u][s].z : wv[u][s].w;
          const uint32_t s_lo = sm.scale2[(slo[u][s] >> (8 * j)) & 0xFF];
          const uint32_t s_hi = sm.scale2[(shi[u][s] >> (8 * j)) & 0xFF];
          uint32_t a[4];
          a[0] = bf16x2_mul(sm.e2m1x2[word & 0xFF], s_lo);          // row g,   k 2c
          a[1] = bf16x2_mul(sm.e2m1x2[(word >> 8) & 0xFF], s_hi);   // row g+8, k 2c
          a[2] = bf16x2_mul(sm.e2m1x2[(word >> 16) & 0xFF], s_lo);  // row g,   k 2c+8
          a[3] = bf16x2_mul(sm.e2m1x2[word >> 24], s_hi);           // row g+8, k 2c+8
#pragma unroll
          for (int q = 0; q < kGroups; ++q) {
            const uint4& lo = bv[u][q][t >> 1];
            uint32_t b[2];
            b[0] = (t & 1) ? lo.z : lo.x;
            b[1] = (t & 1) ? lo.w : lo.y;
            ptx::mma_bf16_16816(acc[s][q], a, b);
          }
        }
      }
    }
  }
}

// This lane's B row for each route group of the pass starting at list position `base`: the row of
// route list[base + 8q + g], or the zero row past the expert's routes.
__device__ __forceinline__ void group_rows(const Params& p, const Smem& sm, const __nv_bfloat16* buf, int ld,
                                           int base, int end, const __nv_bfloat16* (&brow)[kGroups]) {
  const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    const int i = base + q * 8 + g;
    brow[q] = buf + static_cast<int64_t>(i < end ? sm.list[i] : p.zero_row) * ld;
  }
}

__device__ void fc1_task(const Params& p, Smem& sm, int u, int s1, int warp, int lane) {
  const int e = sm.touched[u];
  const int begin = sm.start[u], end = sm.start[u + 1];
  const int g = lane >> 2, c = lane & 3;
  const int KT = p.h_pad / 64, RT = (p.gated ? 2 * p.i_pad : p.i_pad) / 16;
  const int kStreams = 4;
  // Row tiles: up 2·s1, 2·s1 + 1 and gate i_pad/16 + 2·s1, + 1 (relu2: the first two only).
  const uint4* w[kStreams];
  const uint8_t* sc[kStreams];
  const int sb = 64 / p.block;
  for (int s = 0; s < kStreams; ++s) {
    const int rt = (p.gated ? (s >> 1) * (p.i_pad / 16) : 0) + 2 * s1 + (s & 1);
    const int64_t tile0 = (static_cast<int64_t>(e) * RT + min(rt, RT - 1)) * KT;
    w[s] = p.w13 + tile0 * 32;
    sc[s] = p.s13 + tile0 * 16 * sb;
  }
  const float alpha = p.alpha1[e];
  for (int base = begin; base < end; base += kRoutesPerPass) {
    const __nv_bfloat16* brow[kGroups];
    group_rows(p, sm, p.a1, p.h_pad, base, end, brow);
    float acc[kStreams][kGroups][4] = {};
    if (p.gated) stream_gemm<4, 2>(p, sm, w, sc, KT, brow, acc);
    else {
      const uint4* w2s[2] = {w[0], w[1]};
      const uint8_t* sc2[2] = {sc[0], sc[1]};
      float acc2[2][kGroups][4] = {};
      stream_gemm<2, 4>(p, sm, w2s, sc2, KT, brow, acc2);
      for (int s = 0; s < 2; ++s)
        for (int q = 0; q < kGroups; ++q)
          for (int i = 0; i < 4; ++i) acc[s][q][i] = acc2[s][q][i];
    }
    // Epilogue: accumulator (s, q, i) is intermediate column 16·(s&1) + g + 8·(i/2) of this task
    // and route q·8 + 2c + i%2 of the pass.
    for (int m = 0; m < 2; ++m)
      for (int q = 0; q < kGroups; ++q)
        for (int i = 0; i < 4; ++i) {
          const int col = 16 * m + g + 8 * (i >> 1);
          const int ic = 32 * s1 + col;
          float h;
          if (p.gated) {
            float up = alpha * acc[m][q][i], gate = alpha * acc[2 + m][q][i];
            if (p.b13) {
              up += p.b13[static_cast<int64_t>(e) * 2 * p.i_pad + ic];
              gate += p.b13[static_cast<int64_t>(e) * 2 * p.i_pad + p.i_pad + ic];
            }
            h = apply_activation<float>(p.activation, gate, up, p.sw_alpha, p.sw_beta, p.sw_limit);
          } else {
            float v = alpha * acc[m][q][i];
            if (p.b13) v += p.b13[static_cast<int64_t>(e) * p.i_pad + ic];
            h = apply_activation<float>(p.activation, v, 0.0f, p.sw_alpha, p.sw_beta, p.sw_limit);
          }
          sm.h[warp][q * 8 + 2 * c + (i & 1)][col] = fmt::round_bf16(h);  // bf16 before Q2 (§2.4)
        }
    __syncwarp();
    const int qb = quant_block(p.q), nb = 32 / qb;
    const float g2 = p.g2[e];
    for (int task = lane; task < kRoutesPerPass * nb; task += 32) {
      const int rr = task / nb, b = task % nb;
      if (base + rr >= end) continue;
      __nv_bfloat16* dst = p.a2 + static_cast<int64_t>(sm.list[base + rr]) * p.i_pad;
      if (qb == 16) {
        float v[16];
        __nv_bfloat16 o[16];
        for (int i = 0; i < 16; ++i) v[i] = sm.h[warp][rr][b * 16 + i];
        quant_dequant_block<16>(p.q, v, g2, o);
        for (int i = 0; i < 16; ++i) dst[permuted_col(32 * s1 + b * 16 + i)] = o[i];
      } else {
        float v[32];
        __nv_bfloat16 o[32];
        for (int i = 0; i < 32; ++i) v[i] = sm.h[warp][rr][i];
        quant_dequant_block<32>(p.q, v, g2, o);
        for (int i = 0; i < 32; ++i) dst[permuted_col(32 * s1 + i)] = o[i];
      }
    }
    __syncwarp();
  }
}

__device__ void fc2_task(const Params& p, const Smem& sm, int u, int rt) {
  const int e = sm.touched[u];
  const int begin = sm.start[u], end = sm.start[u + 1];
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int KT = p.i_pad / 64, RT = p.h_pad / 16;
  const int64_t tile0 = (static_cast<int64_t>(e) * RT + rt) * KT;
  const uint4* w[1] = {p.w2 + tile0 * 32};
  const uint8_t* sc[1] = {p.s2 + tile0 * 16 * (64 / p.block)};
  const float alpha = p.alpha2[e];
  for (int base = begin; base < end; base += kRoutesPerPass) {
    const __nv_bfloat16* brow[kGroups];
    group_rows(p, sm, p.a2, p.i_pad, base, end, brow);
    float acc[1][kGroups][4] = {};
    stream_gemm<1, 8>(p, sm, w, sc, KT, brow, acc);
    for (int q = 0; q < kGroups; ++q)
      for (int i = 0; i < 4; ++i) {
        const int idx = base + q * 8 + 2 * c + (i & 1);
        const int col = rt * 16 + g + 8 * (i >> 1);
        if (idx >= end || col >= p.hidden) continue;
        const int r = sm.list[idx];
        float v = alpha * acc[0][q][i];
        if (p.b2) v += p.b2[static_cast<int64_t>(e) * p.h_pad + col];
        p.y[static_cast<int64_t>(r) * p.hidden + col] = p.topk_weights[r] * v;
      }
  }
}

__global__ void __launch_bounds__(kThreads, 1) direct_micro_kernel(Params p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gwarp = blockIdx.x * kWarps + warp, nwarps = gridDim.x * kWarps;
  fill_tables(p, sm);
  build_routing(p, sm);
  const int nt = sm.num_touched;

  // Phase 0: quantise each routed row of x with its expert's FC1 input scale. Distributed by route
  // index, not list position: each CTA's list order differs (atomics), so positions would not
  // partition the routes across CTAs.
  for (int r = gwarp; r < p.routes; r += nwarps) {
    const int e = local_expert(p, r);
    if (e < 0) continue;
    const float g = p.g1[e];
    if (quant_block(p.q) == 16) quantize_row<16>(p, r, g, lane);
    else quantize_row<32>(p, r, g, lane);
  }
  grid_sync(p.barrier);

  // Phase 1: FC1 tasks (expert, 32 intermediate columns).
  const int s1n = p.i_pad / 32;
  for (int task = gwarp; task < nt * s1n; task += nwarps) fc1_task(p, sm, task / s1n, task % s1n, warp, lane);
  grid_sync(p.barrier);

  // Phase 2: FC2 tasks (expert, 16 rows of H). Expert-minor order spreads one expert over the grid.
  const int rtn = p.h_pad / 16;
  for (int task = gwarp; task < nt * rtn; task += nwarps) fc2_task(p, sm, task % nt, task / nt);
  grid_sync(p.barrier);

  // Phase 3: out[t] = Σ_j Y[t·K + j] over local routes, slot order.
  const int c4n = p.hidden / 4;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       item < static_cast<int64_t>(p.tokens) * c4n; item += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int t = static_cast<int>(item / c4n), c = static_cast<int>(item % c4n) * 4;
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < p.top_k; ++j) {
      const int r = t * p.top_k + j;
      if (local_expert(p, r) < 0) continue;
      add4(s, __ldcg(reinterpret_cast<const float4*>(p.y + static_cast<int64_t>(r) * p.hidden + c)));
    }
    store_out4(p.out, p.out_fp32, static_cast<int64_t>(t) * p.hidden + c, s);
  }
}

}  // namespace fp4moe::kernels::direct_micro
