// direct_micro: the decode kernel. One cooperative launch, five phases separated by the software
// grid barrier (common/grid_barrier.cuh):
//
//   routing   every CTA parses the top-k ids into its own shared memory (no pre-pass launch): the
//             touched local experts in ascending order (the same in every CTA) and, per expert, its
//             routes in an order that differs between CTAs — so work is only ever split across CTAs
//             by route index or by (expert, tile, k-chunk), and every buffer is indexed by route
//             r = t·K + j
//   phase 0   A1[r] = Q1(x[t]) with expert e's FC1 input scale                            → barrier
//   phase 1   FC1 partial sums, items (expert, 16-row up+gate tile pair, k-chunk): each W13 byte
//             is streamed once, into P1[k-chunk][r]                                         → barrier
//   phase 1b  per (route, 32 columns): Σ over k-chunks in order, alpha + bias → act → bf16 → Q2
//             → A2[r]                                                                       → barrier
//   phase 2   FC2 partial sums, items (expert, 16 rows of H, k-chunk) → P2[k-chunk][r]      → barrier
//   phase 3   out[t] = Σ_j w[t,j]·(alpha2·Σ_kc P2[kc][t·K + j] + b2), slot order, written once
//
// Why k-chunks: at decode sizes there are too few (expert, row tile) pairs to give every warp
// enough bytes in flight (qwen3-30b at T = 1 has 8 experts × 48 FC1 tile pairs for 1056 warps), so
// the reduction dimension is split until there are about four items per warp; partial sums are
// added in a fixed order, so the result stays deterministic.
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
#include <cstddef>
#include <cstdint>

#include "fp4moe/activation.h"
#include "kernels/common/dequant.cuh"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/fragment_layout.h"
#include "kernels/common/grid_barrier.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/quantize.cuh"

namespace fp4moe::kernels::direct_micro {

inline constexpr int kThreads = 256, kWarps = kThreads / 32;
inline constexpr int kMaxRoutes = 512;   // T·K this kernel accepts (shared-memory route lists)
inline constexpr int kMaxExperts = 1024; // E_local
inline constexpr int kGroups = 2;        // groups of 8 routes fed by one pass over a weight tile
inline constexpr int kRoutesPerPass = 8 * kGroups;
inline constexpr int kMaxKChunks = 8;    // partial-sum buffers hold kMaxKChunks × routes rows

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
  float* p1;          // FC1 partial sums [k-chunks][routes][n1_pad]
  float* p2;          // FC2 partial sums [k-chunks][routes][h_pad]
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
  // Lookup tables replicated once per bank: entry b of lane l at [b][l], so the 32 lanes of a warp
  // looking up 32 arbitrary bytes hit 32 different banks (a single 256-entry table serialises up to
  // 32 ways, and these lookups run once per two weights).
  alignas(16) uint32_t e2m1x2[256][32];  // E2M1 byte → bf16x2 (filled with 16-byte stores)
  alignas(16) uint32_t scale2[256][32];  // scale byte → bf16x2 (both halves)
  float h[kWarps][1][32];      // FC1 epilogue staging, per warp
};
static_assert(offsetof(Smem, e2m1x2) % 16 == 0 && offsetof(Smem, scale2) % 16 == 0,
              "the lookup tables are filled with 16-byte stores");

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
    const uint32_t v = static_cast<uint32_t>(e2m1_to_bf16_bits(b & 0xF)) |
                       (static_cast<uint32_t>(e2m1_to_bf16_bits(b >> 4)) << 16);
    const uint16_t h = fmt::bf16_from_f32(p.nvfp4 ? fmt::e4m3_decode(b) : fmt::ue8m0_decode(b));
    const uint32_t s = static_cast<uint32_t>(h) | (static_cast<uint32_t>(h) << 16);
    uint4* e = reinterpret_cast<uint4*>(sm.e2m1x2[b]);
    uint4* c = reinterpret_cast<uint4*>(sm.scale2[b]);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      e[i] = make_uint4(v, v, v, v);
      c[i] = make_uint4(s, s, s, s);
    }
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
          const uint32_t s_lo = sm.scale2[(slo[u][s] >> (8 * j)) & 0xFF][lane];
          const uint32_t s_hi = sm.scale2[(shi[u][s] >> (8 * j)) & 0xFF][lane];
          uint32_t a[4];
          a[0] = bf16x2_mul(sm.e2m1x2[word & 0xFF][lane], s_lo);          // row g,   k 2c
          a[1] = bf16x2_mul(sm.e2m1x2[(word >> 8) & 0xFF][lane], s_hi);   // row g+8, k 2c
          a[2] = bf16x2_mul(sm.e2m1x2[(word >> 16) & 0xFF][lane], s_lo);  // row g,   k 2c+8
          a[3] = bf16x2_mul(sm.e2m1x2[word >> 24][lane], s_hi);           // row g+8, k 2c+8
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

// Write m16n8 accumulators of kS weight row tiles as partial sums: accumulator (s, q, i) is weight
// row row0[s] + g + 8·(i/2) and route list[base + 8q + 2c + i%2]; part is [routes][ld].
template <int kS>
__device__ __forceinline__ void store_partials(const Params& p, const Smem& sm, float* part, int ld, int base, int end,
                                               const int (&row0)[kS], const float (&acc)[kS][kGroups][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int q = 0; q < kGroups; ++q)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = base + q * 8 + 2 * c + (i & 1);
      if (idx >= end) continue;
      float* dst = part + static_cast<int64_t>(sm.list[idx]) * ld + g + 8 * (i >> 1);
#pragma unroll
      for (int s = 0; s < kS; ++s) dst[row0[s]] = acc[s][q][i];
    }
}

// How many k-chunks to cut a reduction of KT k-tiles into so that `tiles` independent weight row
// tiles (× chunks) give every warp of the grid about four items (fragment_layout.h). Depends only on the layer shape,
// the grid and the number of touched experts — not on the route count or the workspace — so a
// route's result does not depend on which other routes share the call (what lets the expert-
// parallel path equal the plain one bit for bit).
__device__ __forceinline__ int k_chunks(int tiles, int KT) {
  return k_chunk_count(tiles, KT, 4 * gridDim.x * kWarps, kMaxKChunks);
}

// Phase 1 item: FC1 partial sums of one 16-row tile pair (up + gate; relu2: one tile) of expert
// slot u over k-chunk kc, for every route of the expert. P1[kc][r][n] (fp32, n over n1 rows).
__device__ void fc1_partial(const Params& p, const Smem& sm, int u, int p16, int kc, int KC) {
  const int e = sm.touched[u];
  const int begin = sm.start[u], end = sm.start[u + 1];
  const int KT = p.h_pad / 64, n1 = p.gated ? 2 * p.i_pad : p.i_pad, RT = n1 / 16;
  const int per = (KT + KC - 1) / KC, kt0 = kc * per, nkt = min(KT, kt0 + per) - kt0;
  if (nkt <= 0) return;
  const int sb = 64 / p.block;
  const int rt_up = p16, rt_gate = p.i_pad / 16 + p16;
  const int64_t t_up = (static_cast<int64_t>(e) * RT + rt_up) * KT + kt0;
  const int64_t t_gate = (static_cast<int64_t>(e) * RT + (p.gated ? rt_gate : rt_up)) * KT + kt0;
  float* part = p.p1 + static_cast<int64_t>(kc) * p.routes * n1;
  for (int base = begin; base < end; base += kRoutesPerPass) {
    const __nv_bfloat16* brow[kGroups];
    group_rows(p, sm, p.a1 + kt0 * 64, p.h_pad, base, end, brow);
    if (p.gated) {
      const uint4* w[2] = {p.w13 + t_up * 32, p.w13 + t_gate * 32};
      const uint8_t* sc[2] = {p.s13 + t_up * 16 * sb, p.s13 + t_gate * 16 * sb};
      float acc[2][kGroups][4] = {};
      stream_gemm<2, 4>(p, sm, w, sc, nkt, brow, acc);
      store_partials<2>(p, sm, part, n1, base, end, {16 * rt_up, 16 * rt_gate}, acc);
    } else {
      const uint4* w[1] = {p.w13 + t_up * 32};
      const uint8_t* sc[1] = {p.s13 + t_up * 16 * sb};
      float acc[1][kGroups][4] = {};
      stream_gemm<1, 8>(p, sm, w, sc, nkt, brow, acc);
      store_partials<1>(p, sm, part, n1, base, end, {16 * rt_up}, acc);
    }
  }
}

// Phase 1b item: route r, 32 intermediate columns: Σ_kc P1 → alpha, bias → act → bf16 → Q2 → A2.
__device__ void fc1_epilogue(const Params& p, Smem& sm, int r, int b32, int KC, int warp) {
  const int lane = threadIdx.x & 31;
  const int e = local_expert(p, r);
  const int n1 = p.gated ? 2 * p.i_pad : p.i_pad;
  const int ic = 32 * b32 + lane;
  float up = 0.f, gate = 0.f;
  for (int kc = 0; kc < KC; ++kc) {  // fixed order: deterministic
    const float* row = p.p1 + (static_cast<int64_t>(kc) * p.routes + r) * n1;
    if (p.gated) {
      up += __ldcg(row + ic);
      gate += __ldcg(row + p.i_pad + ic);
    } else {
      gate += __ldcg(row + ic);
    }
  }
  const float alpha = p.alpha1[e];
  up *= alpha, gate *= alpha;
  if (p.b13) {
    const float* b = p.b13 + static_cast<int64_t>(e) * n1;
    if (p.gated) up += b[ic], gate += b[p.i_pad + ic];
    else gate += b[ic];
  }
  const float h = apply_activation<float>(p.activation, gate, up, p.sw_alpha, p.sw_beta, p.sw_limit);
  sm.h[warp][0][lane] = fmt::round_bf16(h);  // bf16 before Q2 (reference §2.4)
  __syncwarp();
  const int qb = quant_block(p.q);
  __nv_bfloat16* dst = p.a2 + static_cast<int64_t>(r) * p.i_pad;
  if (lane < 32 / qb) {
    if (qb == 16) {
      float v[16];
      __nv_bfloat16 o[16];
      for (int i = 0; i < 16; ++i) v[i] = sm.h[warp][0][lane * 16 + i];
      quant_dequant_block<16>(p.q, v, p.g2[e], o);
      for (int i = 0; i < 16; ++i) dst[permuted_col(32 * b32 + lane * 16 + i)] = o[i];
    } else {
      float v[32];
      __nv_bfloat16 o[32];
      for (int i = 0; i < 32; ++i) v[i] = sm.h[warp][0][i];
      quant_dequant_block<32>(p.q, v, p.g2[e], o);
      for (int i = 0; i < 32; ++i) dst[permuted_col(32 * b32 + i)] = o[i];
    }
  }
  __syncwarp();
}

// Phase 2 item: FC2 partial sums of one 16-row tile of W2 (16 output columns) of expert slot u over
// k-chunk kc. P2[kc][r][col] (fp32).
__device__ void fc2_partial(const Params& p, const Smem& sm, int u, int rt, int kc, int KC) {
  const int e = sm.touched[u];
  const int begin = sm.start[u], end = sm.start[u + 1];
  const int KT = p.i_pad / 64, RT = p.h_pad / 16;
  const int per = (KT + KC - 1) / KC, kt0 = kc * per, nkt = min(KT, kt0 + per) - kt0;
  if (nkt <= 0) return;
  const int sb = 64 / p.block;
  const int64_t tile0 = (static_cast<int64_t>(e) * RT + rt) * KT + kt0;
  const uint4* w[1] = {p.w2 + tile0 * 32};
  const uint8_t* sc[1] = {p.s2 + tile0 * 16 * sb};
  float* part = p.p2 + static_cast<int64_t>(kc) * p.routes * p.h_pad;
  for (int base = begin; base < end; base += kRoutesPerPass) {
    const __nv_bfloat16* brow[kGroups];
    group_rows(p, sm, p.a2 + kt0 * 64, p.i_pad, base, end, brow);
    float acc[1][kGroups][4] = {};
    stream_gemm<1, 8>(p, sm, w, sc, nkt, brow, acc);
    store_partials<1>(p, sm, part, p.h_pad, base, end, {16 * rt}, acc);
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

  // Phase 1: FC1 partial sums over (expert, 16-row tile pair, k-chunk); k-chunk fastest so that
  // neighbouring warps stream neighbouring memory.
  const int P1 = p.i_pad / 16, KC1 = k_chunks(nt * P1, p.h_pad / 64);
  for (int i = gwarp; i < nt * P1 * KC1; i += nwarps) fc1_partial(p, sm, i / (P1 * KC1), (i / KC1) % P1, i % KC1, KC1);
  grid_sync(p.barrier);

  // Phase 1b: FC1 epilogue per (route, 32 intermediate columns).
  const int B32 = p.i_pad / 32;
  for (int i = gwarp; i < p.routes * B32; i += nwarps) {
    const int r = i / B32;
    if (local_expert(p, r) >= 0) fc1_epilogue(p, sm, r, i % B32, KC1, warp);
  }
  grid_sync(p.barrier);

  // Phase 2: FC2 partial sums over (expert, 16 output columns, k-chunk).
  const int P2 = p.h_pad / 16, KC2 = k_chunks(nt * P2, p.i_pad / 64);
  for (int i = gwarp; i < nt * P2 * KC2; i += nwarps) fc2_partial(p, sm, i / (P2 * KC2), (i / KC2) % P2, i % KC2, KC2);
  grid_sync(p.barrier);

  // Phase 3: out[t] = Σ_j w[t,j] · (alpha2 · Σ_kc P2[kc][t·K + j] + b2) over local routes, in slot
  // order (deterministic, written once).
  const int c4n = p.hidden / 4;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       item < static_cast<int64_t>(p.tokens) * c4n; item += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int t = static_cast<int>(item / c4n), c = static_cast<int>(item % c4n) * 4;
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < p.top_k; ++j) {
      const int r = t * p.top_k + j;
      const int e = local_expert(p, r);
      if (e < 0) continue;
      float4 d = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int kc = 0; kc < KC2; ++kc)
        add4(d, __ldcg(reinterpret_cast<const float4*>(p.p2 + (static_cast<int64_t>(kc) * p.routes + r) * p.h_pad + c)));
      const float a = p.alpha2[e], w = p.topk_weights[r];
      float4 b = p.b2 ? *reinterpret_cast<const float4*>(p.b2 + static_cast<int64_t>(e) * p.h_pad + c)
                      : make_float4(0.f, 0.f, 0.f, 0.f);
      add4(s, make_float4(w * (a * d.x + b.x), w * (a * d.y + b.y), w * (a * d.z + b.z), w * (a * d.w + b.w)));
    }
    store_out4(p.out, p.out_fp32, static_cast<int64_t>(t) * p.hidden + c, s);
  }
}

}  // namespace fp4moe::kernels::direct_micro
