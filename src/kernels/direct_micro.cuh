// direct_micro: the decode kernel. One cooperative launch, two grid barriers
// (common/grid_barrier.cuh):
//
//   setup     every CTA fills its lookup tables and parses the top-k ids into its own shared
//             memory (no pre-pass launch): the touched local experts in ascending order (the same in
//             every CTA) and, per expert, its routes r = t·K + j in an order that differs between CTAs
//             (atomics) — so nothing ever depends on a route's position in that list
//   phase 0   A1[r] = Q1(x[t]) with expert e's FC1 input scale, a warp per (route, 32 columns),
//             a lane per column                                                            → barrier
//   phase 1   one CTA item per (expert, 32 intermediate columns): its 8 warps split the reduction
//             over H, stream the up and gate weight tiles once, add their partial sums in shared
//             memory in warp order, and apply alpha, bias, activation, bf16 rounding and Q2 → A2[r]
//             (one warp per route, a lane per column, block amax by shuffles)
//                                                                                          → barrier
//   phase 2   one CTA item per 16 output columns (32 when Params::fc2_wide: two W2 row tiles per
//             unit share its B fragments): its warps take (expert, k-chunk) units of W2 for
//             every touched expert, leave per-route sums in shared memory, and the CTA writes
//             out[t] = Σ_j w[t,j]·(alpha2·Σ_kc + b2) in slot order — each output element once
//
// Every sum runs in a fixed order, so results are deterministic. Neither GEMM leaves partial sums in
// global memory: the only cross-CTA traffic is A1 and A2.
//
// Weights are the A operand of mma.m16n8k16 ("swap-AB"): 16 weight rows × 16 k, read straight
// from global memory in fragment order (one 16-byte load per lane per 16 × 64 tile, see
// device_weights.h), dequantised in registers through shared-memory tables (E2M1 byte → bf16x2,
// one copy per lane so a warp's 32 lookups hit 32 banks; scale byte → bf16x2, one copy per row
// group). Routed rows are the N = 8 operand, kG groups of 8 per pass over a weight tile. Activations
// A1/A2 are stored permuted inside each 64-column chunk so a lane reads its B fragments for 4 k16
// steps with two 16-byte loads (fragment_layout.h).
#pragma once

#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstddef>
#include <cstdint>

#include "fp4moe/activation.h"
#include "kernels/common/dequant.cuh"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/frag_dequant.cuh"
#include "kernels/common/fragment_layout.h"
#include "kernels/common/grid_barrier.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/quantize.cuh"

namespace fp4moe::kernels::direct_micro {

inline constexpr int kThreads = 256, kWarps = kThreads / 32;
inline constexpr int kBlocksPerSm = 2;   // two co-resident CTAs: 16 warps per SM in flight
inline constexpr int kMaxExperts = 1024; // E_local
inline constexpr int kMaxGroups = 2;     // route groups of 8 per pass (template kG ≤ this)
inline constexpr int kMaxFc2Parts = 4;   // CTAs that share one FC2 item's experts (fc2_parts)
// T·K each variant accepts: its shared-memory route lists and FC2 sums grow with it (SmemT). The f16
// path has no lookup tables, so 1024 routes still leave two CTAs per SM; the bf16 path's 40 KB of
// tables do not (1024 routes there: ~150 KB, one CTA per SM).
inline constexpr int kMaxRoutesF16 = 1024;
inline constexpr int kMaxRoutesBf16 = 512;
template <bool kF16>
inline constexpr int kMaxRoutes = kF16 ? kMaxRoutesF16 : kMaxRoutesBf16;
// sm_90's shared memory (H100, H200): 228 KB per SM, of which the hardware reserves 1 KB per CTA.
inline constexpr size_t kSmemPerSm = 228 * 1024, kSmemReservedPerCta = 1024;

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
  bool bf16_words;            // NVFP4 codes stored as bf16 words (DeviceWeights::bf16_words): alpha × 2^8
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
  int zero_row;
  GridBarrier barrier;
  // FC2 items split over fc2_parts CTAs by touched-expert range when there are fewer items (h_pad / 16,
  // or h_pad / 32 wide) than half the grid: parts 1.. leave their routes' sums in fc2_scratch
  // [items][zero_row][item columns] and publish fc2_flags[item · kMaxFc2Parts + part] = this launch's
  // barrier epoch; part 0 adds all. The k-chunks depend on the parts (fc2_chunks), and the launch
  // picks parts and width from the routes alone, so calls over the same routes sum alike.
  int fc2_parts;
  // FC2 items of 32 output columns (two 16-row tiles of W2 streamed against the same B fragments:
  // half the B loads and half the A2 re-reads of 16-column items) instead of 16. The launch sets it
  // only when routes ≤ kFc2WideRoutes (the per-route sums of 32 columns fill the same shared memory),
  // and only for kG = 1 kernels (the kG = 2 kernels ignore it).
  bool fc2_wide;
  float* fc2_scratch;
  unsigned* fc2_flags;
  void* out;
  bool out_fp32;
  unsigned long long* trace;  // diagnostics: null, or [grid][kTraceSlots] per CTA (kTraceStamps, kTraceSums, kTraceWhere)
};

// The unit the dequantised weights are read in: 2^6 on the f16 path (code × scale × 2^-6), 2^8 on bf16
// words (× 2^-8), 1 on the tables; alpha is multiplied by it (exact).
template <bool kF16>
__device__ __forceinline__ float weight_unit(const Params& p) {
  return kF16 ? 64.f : (p.bf16_words ? 256.f : 1.f);
}

inline constexpr int kTraceStamps = 7;  // %globaltimer at start, setup, phase 0, barrier, phase 1, barrier, end
// ns summed over the CTA's items: FC1 GEMM (to the partial sums' barrier), FC1 epilogue + Q2, FC2 GEMM
// (to the sums' barrier), FC2 hand-over + top-k sum.
inline constexpr int kTraceSums = 4;
// Where the work ran: the CTA's %smid, its FC1 items and its FC2 items (how evenly items spread over
// SMs, not only over CTAs).
inline constexpr int kTraceWhere = 3;
inline constexpr int kTraceSlots = kTraceStamps + kTraceSums + kTraceWhere;

// The bf16 path's lookup tables (common/frag_dequant.cuh) follow Smem in dynamic shared memory; the
// f16 path (kF16) needs none and its launch leaves them out (40 KB less per CTA).
using Tables = FragTables;

// A CTA's shared memory for calls of up to kR routes. Touched experts are at most
// min(routes, E_local), so the per-slot arrays hold kSlots of them.
template <int kR>
struct alignas(16) SmemT {
  static constexpr int kSlots = kR < kMaxExperts ? kR : kMaxExperts;
  // (k-chunk, route) rows of 16-column FC2 sums: fc2_chunks keeps KC · routes ≤ this, one chunk per
  // route at kR routes. Rows of 32 columns (fc2_wide) reuse the storage: half as many.
  static constexpr int kFc2Slots = kR;
  int count[kMaxExperts];      // routes per local expert, then the expert's slot in `touched`
  int cursor[kMaxExperts];     // next free place in the route list, per slot
  int touched[kMaxExperts];    // local experts with routes, ascending
  int start[kMaxExperts + 1];  // their route-list offsets
  int list[kR];                // route indices grouped by expert
  int num_touched;
  // Staged once in setup so no later phase waits on a dependent global load (ids → expert → scale):
  int route_slot[kR];          // route r's expert slot in `touched`, or -1 (id outside the local range)
  float route_w[kR];           // its router weight
  float alpha1[kSlots], alpha2[kSlots], g1[kSlots], g2[kSlots];  // per touched slot
  union {
    struct {
      float part[kWarps][8 * kMaxGroups][64];  // FC1 per-warp partial sums [warp][route in pass][up 0..31, gate 32..63]
    } fc1;
    float fc2[kFc2Slots][16];                  // FC2 sums [k-chunk · routes + r][column]
  } u;
};
template <bool kF16>
using Smem = SmemT<kMaxRoutes<kF16>>;
// Routes up to which a variant's FC2 can take items of 32 columns (Params::fc2_wide).
template <bool kF16>
inline constexpr int kFc2WideRoutes = Smem<kF16>::kFc2Slots / 2;
// Row `row` of the FC2 sums when rows are kCols floats wide (16, or 32 for fc2_wide).
template <int kCols, int kR>
__device__ __forceinline__ float* fc2_sums(SmemT<kR>& sm, int row) {
  return &sm.u.fc2[0][0] + row * kCols;
}
template <int kCols, int kR>
__device__ __forceinline__ const float* fc2_sums(const SmemT<kR>& sm, int row) {
  return &sm.u.fc2[0][0] + row * kCols;
}
// Dynamic shared memory of a variant's launch.
template <bool kF16>
inline constexpr size_t kSmemBytes = sizeof(Smem<kF16>) + (kF16 ? 0 : sizeof(Tables));
template <int kR>
__device__ __forceinline__ Tables& tables(const SmemT<kR>& sm) {
  auto* base = const_cast<unsigned char*>(reinterpret_cast<const unsigned char*>(&sm));
  return *reinterpret_cast<Tables*>(base + sizeof(sm));
}

// build_routing's block scan: the kernel's only static shared memory.
using RoutingScan = cub::BlockScan<int, kThreads>;
// Per CTA: dynamic + static shared memory + the hardware's reserved KB; kBlocksPerSm of them must fit
// an SM, or the launch's occupancy check finds fewer co-resident CTAs and the grid shrinks.
template <bool kF16>
inline constexpr size_t kSmemPerCta = kSmemBytes<kF16> + sizeof(RoutingScan::TempStorage) + kSmemReservedPerCta;
static_assert(sizeof(Smem<true>) % 16 == 0 && sizeof(Smem<false>) % 16 == 0,
              "Tables follow Smem: 16-byte aligned for the per-lane lookups");
static_assert(kBlocksPerSm * kSmemPerCta<true> <= kSmemPerSm, "f16 variant: kBlocksPerSm CTAs no longer fit an SM");
static_assert(kBlocksPerSm * kSmemPerCta<false> <= kSmemPerSm, "bf16 variant: kBlocksPerSm CTAs no longer fit an SM");

__device__ __forceinline__ int local_expert(const Params& p, int r) {
  const int64_t id = p.ids_int64 ? static_cast<const int64_t*>(p.ids)[r] : static_cast<const int32_t*>(p.ids)[r];
  const int64_t e = id - p.first;
  return (e >= 0 && e < p.experts) ? static_cast<int>(e) : -1;
}

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Thread 0 records value v in where-slot i of the trace (no-op without a trace).
__device__ __forceinline__ void where(const Params& p, int i, unsigned long long v) {
  if (p.trace != nullptr && threadIdx.x == 0) p.trace[blockIdx.x * kTraceSlots + kTraceStamps + kTraceSums + i] = v;
}
__device__ __forceinline__ void stamp(const Params& p, int i) {
  if (p.trace != nullptr && threadIdx.x == 0) p.trace[blockIdx.x * kTraceSlots + i] = now_ns();
}
// Thread 0 adds the time since *t0 to sum i of the trace and restarts *t0 (no-op without a trace).
__device__ __forceinline__ void lap(const Params& p, unsigned long long* t0, int i) {
  if (p.trace != nullptr && threadIdx.x == 0) {
    const unsigned long long t = now_ns();
    p.trace[blockIdx.x * kTraceSlots + kTraceStamps + i] += t - *t0;
    *t0 = t;
  }
}

__device__ __forceinline__ uint4 ld_stream(const uint4* ptr) {  // read once: skip L1
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

// Routing into shared memory; identical in every CTA.
template <int kR>
__device__ void build_routing(const Params& p, SmemT<kR>& sm) {
  using Scan = RoutingScan;
  constexpr int kPer = kMaxExperts / kThreads;
  __shared__ typename Scan::TempStorage scan;
  const int tid = threadIdx.x;
  // The per-expert scales of the experts this thread owns in the blocked arrangement below, loaded
  // now, beside the ids: they do not depend on the routing, and loaded after it (per touched
  // expert) they were a second dependent round before phase 0 could use g1.
  float a1[kPer], a2[kPer], s1[kPer], s2[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid * kPer + i;
    const bool in = e < p.experts;
    a1[i] = in ? p.alpha1[e] : 0.f, a2[i] = in ? p.alpha2[e] : 0.f;
    s1[i] = in ? p.g1[e] : 0.f, s2[i] = in ? p.g2[e] : 0.f;
  }
  // This thread's routes r = tid + kThreads·i: their experts and router weights, one round of loads.
  constexpr int kRPer = (kR + kThreads - 1) / kThreads;
  int re[kRPer];
  float rw[kRPer];
#pragma unroll
  for (int i = 0; i < kRPer; ++i) {
    const int r = tid + kThreads * i;
    re[i] = r < p.routes ? local_expert(p, r) : -1;
    rw[i] = r < p.routes ? p.topk_weights[r] : 0.f;
  }
  for (int e = tid; e < kMaxExperts; e += kThreads) sm.count[e] = 0;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kRPer; ++i)
    if (re[i] >= 0) atomicAdd(&sm.count[re[i]], 1);
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
      sm.alpha1[slot[i]] = a1[i], sm.alpha2[slot[i]] = a2[i], sm.g1[slot[i]] = s1[i], sm.g2[slot[i]] = s2[i];
    }
  if (tid == 0) {
    sm.num_touched = total_touched;
    sm.start[total_touched] = total_routes;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kRPer; ++i) {
    const int r = tid + kThreads * i, e = re[i];
    if (r >= p.routes) break;
    if (e >= 0) sm.list[atomicAdd(&sm.cursor[sm.count[e]], 1)] = r;
    sm.route_slot[r] = e >= 0 ? sm.count[e] : -1;
    sm.route_w[r] = rw[i];
  }
  __syncthreads();
}

// Activations as the GEMMs read them: bf16, or f16 on the NVFP4-a4 path (kF16, act_f16: exact).
template <bool kF16>
__device__ __forceinline__ void store_act(__nv_bfloat16* dst, long long i, __nv_bfloat16 v) {
  if constexpr (kF16) {
    reinterpret_cast<__half*>(dst)[i] = act_f16(v);
  } else {
    dst[i] = v;
  }
}

// Phase 0 item, one warp: columns [32·cb, 32·cb + 32) of routed row r, a lane per column:
// A1[r] = Q1(x[t]) (blocks of 16 or 32 lanes, amax by shuffles; columns past H are zeros). The warp's
// stores fill half of one permuted 64-column chunk. Short chains: for calls of one item per warp.
// x_col: this lane's x value of item (r, cb); quantize_cols: the item from it.
__device__ __forceinline__ float x_col(const Params& p, int r, int cb) {
  const int col = 32 * cb + (threadIdx.x & 31);
  return col < p.hidden ? __bfloat162float(p.x[static_cast<int64_t>(r / p.top_k) * p.hidden + col]) : 0.f;
}
template <bool kF16>
__device__ __forceinline__ void quantize_cols(const Params& p, int r, int cb, float v, float g) {
  const int col = 32 * cb + (threadIdx.x & 31);
  const __nv_bfloat16 q = quant_dequant_lanes(p.q, v, g);
  store_act<kF16>(p.a1 + static_cast<int64_t>(r) * p.h_pad, permuted_col(col), q);
}

// Phase 0's item assignment: warp gw of nw (CTA-interleaved, so small calls spread over the SMs),
// and whether the call takes the f16 variant's lane-per-block items.
__device__ __forceinline__ int phase0_warp() { return (threadIdx.x >> 5) * gridDim.x + blockIdx.x; }
template <bool kF16>
__device__ __forceinline__ bool phase0_lanes(const Params& p) {
  return kF16 && p.routes * (p.h_pad / 32) > static_cast<int>(gridDim.x) * kWarps;
}
// This lane's x value of the warp's first warp item (0 if it has none, or on the lane path): x is the
// call's input, so the kernel loads it before the routing and phase 0 does not wait a round for it.
template <bool kF16>
__device__ __forceinline__ float phase0_first_x(const Params& p) {
  const int gw = phase0_warp(), nc = p.h_pad / 32;
  return !phase0_lanes<kF16>(p) && gw < p.routes * nc ? x_col(p, gw / nc, gw % nc) : 0.f;
}

// Phase 0 item of the f16 variant (NVFP4 a4), one lane: NVFP4 block b (columns 16·b … 16·b + 15) of
// routed row r, from two 16-byte loads, quantised whole in the lane (quant_dequant_block: no
// shuffles, one scale and one division per block), then f16 (act_f16x2, exact); blocks past H are
// zeros. Stored in 8-byte pieces: the permuted chunk layout puts logical column 16·t + 8·half + 2·c + e
// at c·16 + 4·t + 2·half + e, so columns {2c, 2c + 1, 8 + 2c, 9 + 2c} sit side by side. Fewer
// instructions per value than quantize_cols: for calls of several items per warp.
__device__ __forceinline__ void quantize_block_f16(const Params& p, int r, int b, float g) {
  const int col0 = 16 * b;
  float v[16];
  if (col0 < p.hidden) {  // hidden is a multiple of 16 (config.cpp), x 16-byte aligned (runner.cpp)
    const uint4* xb = reinterpret_cast<const uint4*>(p.x + static_cast<int64_t>(r / p.top_k) * p.hidden + col0);
    const uint4 u[2] = {xb[0], xb[1]};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t w = reinterpret_cast<const uint32_t*>(u)[i / 2];
      v[i] = fmt::f32_from_bf16(static_cast<uint16_t>(i & 1 ? w >> 16 : w & 0xFFFFu));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = 0.0f;  // padding columns: zeros
  }
  __nv_bfloat16 q[16];
  quant_dequant_block<16>(p.q, v, g, q);
  __half* chunk = reinterpret_cast<__half*>(p.a1 + static_cast<int64_t>(r) * p.h_pad + (col0 & ~63));
  const int t = (col0 & 63) >> 4;
#pragma unroll
  for (int c = 0; c < 4; ++c) {  // columns 2c, 2c + 1 and 8 + 2c, 9 + 2c
    const __half2 l = act_f16x2(__halves2bfloat162(q[2 * c], q[2 * c + 1]));
    const __half2 h = act_f16x2(__halves2bfloat162(q[8 + 2 * c], q[9 + 2 * c]));
    *reinterpret_cast<uint2*>(chunk + c * 16 + t * 4) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&l), *reinterpret_cast<const uint32_t*>(&h));
  }
}

// Phase 0: quantise each routed row of x with its expert's FC1 input scale over the whole grid (items
// CTA-interleaved, so small calls spread over the SMs): a warp per (route, 32 columns); in the f16
// variant, once a call has more of those items than warps, a lane per (route, NVFP4 block) instead.
// Session 22 (H100, qwen3-30b-a3b a4): T = 64 gave ~15 warp items a warp and phase 0 took 16.8 µs
// (issue-bound), a lane per block 2.7 µs (bench 208.8 → 196 µs); at T = 1 lanes took 1.66 µs against
// ~1.0-1.3. The bf16 variant keeps the warp items: with lanes per block, ptxas spilled 4-16 bytes in
// its kG = 1 kernel and a16 T = 1 rows ran 2-5 µs slower (a16's phase 0 is a copy: little to win).
// x0: phase0_first_x, loaded before the routing.
template <bool kF16>
__device__ __forceinline__ void quantize_routes(const Params& p, const Smem<kF16>& sm, float x0) {
  const int gw = phase0_warp(), nw = gridDim.x * kWarps;
  const int nc = p.h_pad / 32;
  if constexpr (kF16) {
    if (phase0_lanes<kF16>(p)) {
      const int nb = p.h_pad / 16, items = p.routes * nb;
      for (int i = 32 * gw + (threadIdx.x & 31); i < items; i += 32 * nw) {
        const int r = i / nb, slot = sm.route_slot[r];
        if (slot >= 0) quantize_block_f16(p, r, i - r * nb, sm.g1[slot]);
      }
      return;
    }
  }
  for (int i = gw; i < p.routes * nc; i += nw) {  // warp-uniform
    const int r = i / nc, slot = sm.route_slot[r];
    if (slot >= 0) quantize_cols<kF16>(p, r, i % nc, i == gw ? x0 : x_col(p, r, i % nc), sm.g1[slot]);
  }
}

// One stage of stream_gemm: kU k-tiles of kS weight row tiles (codes and scale words) and of kG
// route groups' B fragments, in registers.
template <int kS, int kU, int kG>
struct StreamStage {
  uint4 wv[kU][kS];
  uint32_t slo[kU][kS], shi[kU][kS];
  uint4 bv[kU][kG][2];
};

// Issues every load of the stage at k-tiles kt0 … kt0 + kU - 1 (clamped loads past the end are never used).
template <int kS, int kU, int kG>
__device__ __forceinline__ void load_stage(StreamStage<kS, kU, kG>& st, const uint4* const (&w)[kS],
                                           const uint8_t* const (&sc)[kS], int sb, int KT,
                                           const __nv_bfloat16* const (&brow)[kG], int kt0) {
  const int lane = threadIdx.x & 31, c = lane & 3;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int kt = min(kt0 + u, KT - 1);
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      st.wv[u][s] = ld_stream(w[s] + kt * 32 + lane);
      frag_scales(sc[s] + static_cast<int64_t>(kt) * 16 * sb, sb, st.slo[u][s], st.shi[u][s]);
    }
#pragma unroll
    for (int q = 0; q < kG; ++q) {
      // A1/A2 were written earlier in this launch by other CTAs: coherent (L2) loads, never the
      // read-only path.
      const uint4* b = reinterpret_cast<const uint4*>(brow[q] + kt * 64 + c * 16);
      st.bv[u][q][0] = __ldcg(b);
      st.bv[u][q][1] = __ldcg(b + 1);
    }
  }
}

// How mma_stage dequantises: f16 words (kF16), bf16 words (Params::bf16_words) or the tables.
enum class Dq { kF16, kBf16Words, kTables };

// Dequantises the stage's tiles and multiplies them into acc (k-tiles past KT skipped).
template <int kS, int kU, int kG, Dq kDq>
__device__ __forceinline__ void mma_stage_as(const StreamStage<kS, kU, kG>& st, const FragLut& lut, int KT, int kt0,
                                             float (&acc)[kS][kG][4]) {
  constexpr bool kF16 = kDq == Dq::kF16;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (kt0 + u >= KT) break;
    F16Scales f16s[kS];     // the f16 path's scales, converted once per tile
    Bf16wScales bws[kS];    // the bf16 words' (scale × 2^118), likewise
    if constexpr (kF16)
#pragma unroll
      for (int s = 0; s < kS; ++s) f16s[s] = frag_scales_f16(st.slo[u][s], st.shi[u][s]);
    if constexpr (kDq == Dq::kBf16Words)
#pragma unroll
      for (int s = 0; s < kS; ++s) bws[s] = frag_scales_bf16w(st.slo[u][s], st.shi[u][s]);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const uint4& v = st.wv[u][s];
        const uint32_t word = t == 0 ? v.x : t == 1 ? v.y : t == 2 ? v.z : v.w;
        uint32_t a[4];
        if constexpr (kF16) frag_a_f16(word, f16s[s], t, a);
        else if constexpr (kDq == Dq::kBf16Words) frag_a_bf16w(word, bws[s], t, a);
        else frag_a_bf16(lut, word, st.slo[u][s], st.shi[u][s], t, a);
#pragma unroll
        for (int q = 0; q < kG; ++q) {
          const uint4& lo = st.bv[u][q][t >> 1];
          uint32_t b[2];
          b[0] = (t & 1) ? lo.z : lo.x;
          b[1] = (t & 1) ? lo.w : lo.y;
          ptx::mma_16816<kF16>(acc[s][q], a, b);
        }
      }
    }
  }
}

// The bf16 variant picks its dequantisation once a stage (a uniform branch): bf16 words for NVFP4,
// the tables for MX.
template <int kS, int kU, int kG, bool kF16>
__device__ __forceinline__ void mma_stage(const StreamStage<kS, kU, kG>& st, const FragLut& lut, bool bf16_words,
                                          int KT, int kt0, float (&acc)[kS][kG][4]) {
  if constexpr (kF16) mma_stage_as<kS, kU, kG, Dq::kF16>(st, lut, KT, kt0, acc);
  else if (bf16_words) mma_stage_as<kS, kU, kG, Dq::kBf16Words>(st, lut, KT, kt0, acc);
  else mma_stage_as<kS, kU, kG, Dq::kTables>(st, lut, KT, kt0, acc);
}

// Streams kS weight row tiles of one expert over KT k-tiles against kG groups of routed rows.
// kStages = 2 (FC2): two register stages of kU k-tiles each, the next stage's loads issued before the
// current stage's dequantisation and MMAs, so a warp's load latency overlaps its own arithmetic (the loop is
// issue-bound, and the warps of a CTA run in step between the item's barriers); kStages = 1 (FC1):
// one stage, loaded then used. w[s]/sc[s]: the first
// k-tile's code and scale pointers of stream s; brow[q]: this lane's B row of group q. acc[s][q]:
// m16n8 accumulators.
template <int kS, int kU, int kG, bool kF16, int kStages>
__device__ __forceinline__ void stream_gemm(const Params& p, const Smem<kF16>& sm, const uint4* const (&w)[kS],
                                            const uint8_t* const (&sc)[kS], int KT,
                                            const __nv_bfloat16* const (&brow)[kG], float (&acc)[kS][kG][4]) {
  // Scale bytes per row per tile: 4 (NVFP4) or 2 (MX); a constant on the f16 path (NVFP4 only), so
  // frag_scales' MX spreading drops out of its loop.
  const int sb = kF16 ? 4 : 64 / p.block;
  const FragLut lut = frag_lut(tables(sm));  // bf16 path only (the f16 launch has no tables)
  // Two stages of FC1's tiles (kS = 2 or 4 streams, kU = 2 at kG = 1) spill 100-140 bytes under the
  // 128-register bound of two CTAs per SM; FC2's one or two streams fit with either route-group count.
  static_assert(kStages == 1 || kStages == 2, "one or two register stages");
  if constexpr (kStages == 1) {
    for (int kt0 = 0; kt0 < KT; kt0 += kU) {
      StreamStage<kS, kU, kG> st;
      load_stage(st, w, sc, sb, KT, brow, kt0);
      mma_stage<kS, kU, kG, kF16>(st, lut, p.bf16_words, KT, kt0, acc);
    }
  } else {
    StreamStage<kS, kU, kG> s0, s1;
    load_stage(s0, w, sc, sb, KT, brow, 0);
    for (int kt0 = 0; kt0 < KT; kt0 += 2 * kU) {  // warp-uniform
      if (kt0 + kU < KT) load_stage(s1, w, sc, sb, KT, brow, kt0 + kU);
      mma_stage<kS, kU, kG, kF16>(s0, lut, p.bf16_words, KT, kt0, acc);
      if (kt0 + kU >= KT) break;
      if (kt0 + 2 * kU < KT) load_stage(s0, w, sc, sb, KT, brow, kt0 + 2 * kU);
      mma_stage<kS, kU, kG, kF16>(s1, lut, p.bf16_words, KT, kt0 + kU, acc);
    }
  }
}

// This lane's B row for each route group of the pass starting at list position `base`: the row of
// route list[base + 8q + g], or the zero row past the expert's routes.
template <int kG, int kR>
__device__ __forceinline__ void group_rows(const Params& p, const SmemT<kR>& sm, const __nv_bfloat16* buf, int ld,
                                           int base, int end, const __nv_bfloat16* (&brow)[kG]) {
  const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int q = 0; q < kG; ++q) {
    const int i = base + q * 8 + g;
    brow[q] = buf + static_cast<int64_t>(i < end ? sm.list[i] : p.zero_row) * ld;
  }
}

// Phase 1 item: expert slot u, intermediate columns [32·cb, 32·cb + 32). Gated: four weight row
// tiles (up 2cb, 2cb+1; gate the same past i_pad); relu2: two. Warp w reduces k-tiles
// [w·per, (w+1)·per) of H; the CTA adds the 8 partial sums in warp order.
template <int kG, bool kGated, bool kF16>
__device__ void fc1_item(const Params& p, Smem<kF16>& sm, int u, int cb) {
  constexpr int kS = kGated ? 4 : 2, kU = kG == 1 ? 2 : 1, kRoutes = 8 * kG;  // k-tiles per stage
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int e = sm.touched[u];
  const int begin = sm.start[u], end = sm.start[u + 1];
  const int KT = p.h_pad / 64, n1 = kGated ? 2 * p.i_pad : p.i_pad, RT = n1 / 16;
  const int per = (KT + kWarps - 1) / kWarps, kt0 = warp * per, nkt = min(KT, kt0 + per) - kt0;
  const int sb = 64 / p.block;
  const uint4* w[kS];
  const uint8_t* sc[kS];
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const int rt = (s >= 2 ? p.i_pad / 16 : 0) + 2 * cb + (s & 1);
    const int64_t tile = (static_cast<int64_t>(e) * RT + rt) * KT + max(kt0, 0);
    w[s] = p.w13 + tile * 32;
    sc[s] = p.s13 + tile * 16 * sb;
  }
  for (int base = begin; base < end; base += kRoutes) {
    unsigned long long t0 = p.trace != nullptr ? now_ns() : 0;
    const int n_routes = min(kRoutes, end - base);
    float acc[kS][kG][4] = {};
    if (nkt > 0) {
      const __nv_bfloat16* brow[kG];
      group_rows<kG>(p, sm, p.a1 + kt0 * 64, p.h_pad, base, end, brow);
      stream_gemm<kS, kU, kG, kF16, 1>(p, sm, w, sc, nkt, brow, acc);
    }
    // accumulator (s, q, i): weight row 16·(s&1) + g + 8·(i/2) of the up (s < 2) or gate half,
    // route base + 8q + 2c + i%2.
#pragma unroll
    for (int q = 0; q < kG; ++q)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int s = 0; s < kS; ++s)
          sm.u.fc1.part[warp][8 * q + 2 * c + (i & 1)][(s >= 2 ? 32 : 0) + 16 * (s & 1) + g + 8 * (i >> 1)] =
              acc[s][q][i];
    __syncthreads();
    lap(p, &t0, 0);
    // Epilogue, one warp per route of the pass, lane = column: Σ over warps in order → alpha, bias →
    // act → bf16 → Q2 of the lanes' blocks (amax by shuffles) → A2[r] (permuted).
    const float alpha = sm.alpha1[u] * weight_unit<kF16>(p);  // the weights were read as code × scale × 2^-6 or 2^-8
    const int ic = 32 * cb + lane;
    float b_up = 0.f, b_gate = 0.f;
    if (p.b13) {
      const float* b = p.b13 + static_cast<int64_t>(e) * n1;
      if (kGated) b_up = b[ic], b_gate = b[p.i_pad + ic];
      else b_gate = b[ic];
    }
    for (int rho = warp; rho < n_routes; rho += kWarps) {  // warp-uniform: every lane shuffles
      float up = 0.f, gate = 0.f;
#pragma unroll
      for (int ww = 0; ww < kWarps; ++ww) {
        if (kGated) up += sm.u.fc1.part[ww][rho][lane];
        gate += sm.u.fc1.part[ww][rho][kGated ? 32 + lane : lane];
      }
      up *= alpha, gate *= alpha;
      if (p.b13) {
        if (kGated) up += b_up;
        gate += b_gate;
      }
      const float h = fmt::round_bf16(apply_activation<float>(p.activation, gate, up, p.sw_alpha, p.sw_beta,
                                                              p.sw_limit));  // bf16 before Q2 (reference §2.4)
      const __nv_bfloat16 o = quant_dequant_lanes(p.q, h, sm.g2[u]);
      store_act<kF16>(p.a2 + static_cast<int64_t>(sm.list[base + rho]) * p.i_pad, permuted_col(ic), o);
    }
    __syncthreads();  // part is reused by the next pass
    lap(p, &t0, 1);
  }
}

// FC2 k-chunks per touched expert: enough (expert, chunk) units for every warp of a CTA, none
// empty, and their sums fit the CTA's `slots` rows (SmemT::kFc2Slots): KC · routes ≤ slots, since
// routes ≤ slots (the launch's capacity check) makes fit ≥ 1 and k_chunk_count never exceeds it; it
// picks the count that loads the busiest warp least (fragment_layout.h).
// A CTA's units are those of its part's experts (touched / parts, rounded up), so the chunks are
// counted from those: with every expert counted, an item split over parts left warps idle (mixtral
// T = 32, 32-column items in two parts of 4 experts: 4 units for 8 warps).
__device__ __forceinline__ int fc2_chunks(int touched, int parts, int KT, int routes, int slots) {
  const int fit = slots / max(routes, 1);
  return k_chunk_count((touched + parts - 1) / parts, KT, kWarps, min(fit, kWarps));
}

// Route r's FC2 result in column col of the current item: its k-chunk sums added in kc order. The
// part that computed them and part 0 (when the item is split) both read it through here, so a split
// item sums exactly like an unsplit one.
template <int kCols, int kR>
__device__ __forceinline__ float route_sum(const SmemT<kR>& sm, int routes, int KC, int r, int col) {
  float d = 0.f;
  for (int kc = 0; kc < KC; ++kc) d += fc2_sums<kCols>(sm, kc * routes + r)[col];
  return d;
}

// Slots a token's top-k sum loads at once (fc2_item).
inline constexpr int kSumGroup = 8;

// Phase 2 item: output columns [kCols·rc, kCols·rc + kCols) of the touched experts in slots [u0, u1)
// (part `part` of p.fc2_parts), kCols = 16·kW: kW W2 row tiles per unit, streamed against the same B
// fragments. Unit (expert slot u, k-chunk kc) → warp unit % kWarps; sums per (kc, route) in shared
// memory. Part 0 then writes each token's kCols outputs, once; other parts hand it their routes' sums
// through fc2_scratch. The sum of a route (Σ over kc in order) and the top-k sum are the same
// arithmetic however the item is split or however wide it is.
template <int kG, bool kF16, int kW>
__device__ void fc2_item(const Params& p, Smem<kF16>& sm, int rc, int part, int KC) {
  // k-tiles per stage (two stages): one stream holds two at kG = 1; two streams one.
  constexpr int kU = kW == 1 && kG == 1 ? 2 : 1, kRoutes = 8 * kG, kCols = 16 * kW;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  unsigned long long t0 = p.trace != nullptr ? now_ns() : 0;
  const int KT = p.i_pad / 64, RT = p.h_pad / 16, nt = sm.num_touched;
  const int u0 = part * nt / p.fc2_parts, u1 = (part + 1) * nt / p.fc2_parts;
  const int per = (KT + KC - 1) / KC;
  const int sb = 64 / p.block;
  for (int unit = warp; unit < (u1 - u0) * KC; unit += kWarps) {
    const int u = u0 + unit / KC, kc = unit % KC;
    const int e = sm.touched[u], begin = sm.start[u], end = sm.start[u + 1];
    const int kt0 = kc * per, nkt = min(KT, kt0 + per) - kt0;  // ≥ 1 (k_chunk_count)
    const uint4* w[kW];
    const uint8_t* sc[kW];
#pragma unroll
    for (int s = 0; s < kW; ++s) {
      const int64_t tile0 = (static_cast<int64_t>(e) * RT + kW * rc + s) * KT + kt0;
      w[s] = p.w2 + tile0 * 32;
      sc[s] = p.s2 + tile0 * 16 * sb;
    }
    float* slots = fc2_sums<kCols>(sm, kc * p.routes);
    for (int base = begin; base < end; base += kRoutes) {
      const __nv_bfloat16* brow[kG];
      group_rows<kG>(p, sm, p.a2 + kt0 * 64, p.i_pad, base, end, brow);
      float acc[kW][kG][4] = {};
      stream_gemm<kW, kU, kG, kF16, 2>(p, sm, w, sc, nkt, brow, acc);
      // accumulator (s, q, i): output column 16·s + g + 8·(i/2) of the item, route base + 8q + 2c + i%2.
#pragma unroll
      for (int q = 0; q < kG; ++q)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int idx = base + 8 * q + 2 * c + (i & 1);
          if (idx < end)
#pragma unroll
            for (int s = 0; s < kW; ++s) slots[sm.list[idx] * kCols + 16 * s + g + 8 * (i >> 1)] = acc[s][q][i];
        }
    }
  }
  __syncthreads();
  lap(p, &t0, 2);
  float* scratch = p.fc2_scratch + static_cast<int64_t>(rc) * p.zero_row * kCols;  // [route][kCols] of this item
  unsigned* flags = p.fc2_flags + rc * kMaxFc2Parts;
  if (part > 0) {  // hand this part's route sums to part 0
    for (int i = threadIdx.x; i < p.routes * kCols; i += kThreads) {
      const int r = i / kCols, slot = sm.route_slot[r];
      if (slot < u0 || slot >= u1) continue;  // also skips slot -1 (part > 0: u0 ≥ 0)
      scratch[i] = route_sum<kCols>(sm, p.routes, KC, r, i % kCols);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) ptx::st_release_gpu(flags + part, ptx::ld_acquire_gpu(p.barrier.epoch));
    __syncthreads();
    lap(p, &t0, 3);
    return;
  }
  if (p.fc2_parts > 1) {  // part 0: wait for the others (all resident: a cooperative launch)
    if (threadIdx.x == 0) {
      const unsigned epoch = ptx::ld_acquire_gpu(p.barrier.epoch);  // this launch's, fixed after barrier 2
      for (int q = 1; q < p.fc2_parts; ++q)
        while (ptx::ld_acquire_gpu(flags + q) != epoch) __nanosleep(32);
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < p.tokens * kCols; i += kThreads) {
    const int t = i / kCols, ci = i % kCols, col = kCols * rc + ci;
    if (col >= p.hidden) continue;
    float s = 0.f;
    // The slots in groups of kSumGroup: the group's global loads (other parts' sums, biases) are all
    // issued before its terms are added in slot order — the same sum, bit for bit, as one slot at a
    // time, with one round of L2 loads a group instead of one a slot. At T = 1 one warp sums the
    // whole item and the part-0 CTA's sum sits on FC2's critical path (session 38's trace,
    // qwen3-30b-a3b a4 T = 1: hand-over and top-k sum up to 5.6 µs), as the combine's did (combine4).
    for (int j0 = 0; j0 < p.top_k; j0 += kSumGroup) {
      int slot[kSumGroup];
      float d[kSumGroup], b[kSumGroup];
#pragma unroll
      for (int jj = 0; jj < kSumGroup; ++jj) slot[jj] = j0 + jj < p.top_k ? sm.route_slot[t * p.top_k + j0 + jj] : -1;
#pragma unroll
      for (int jj = 0; jj < kSumGroup; ++jj) {
        const int r = t * p.top_k + j0 + jj;
        // Another part's sums were written by another CTA in this launch: read through L2, not L1.
        d[jj] = slot[jj] >= u1 ? __ldcg(scratch + r * kCols + ci) : 0.f;  // slot -1 < u1: nothing
        b[jj] = slot[jj] >= 0 && p.b2 ? p.b2[static_cast<int64_t>(sm.touched[slot[jj]]) * p.h_pad + col] : 0.f;
      }
#pragma unroll
      for (int jj = 0; jj < kSumGroup; ++jj) {
        if (slot[jj] < 0) continue;
        const int r = t * p.top_k + j0 + jj;
        const float dd = slot[jj] < u1 ? route_sum<kCols>(sm, p.routes, KC, r, ci) : d[jj];
        // Weighted term rounded on its own, then added (no FMA contraction): the same arithmetic as a
        // K = 1 call per route followed by a slot-order sum, which the expert-parallel all-to-all path
        // runs, so both give the same bits.
        const float term = __fmul_rn(sm.route_w[r], fmaf(sm.alpha2[slot[jj]] * weight_unit<kF16>(p), dd, b[jj]));
        s = __fadd_rn(s, term);
      }
    }
    store_out1(p.out, p.out_fp32, static_cast<int64_t>(t) * p.hidden + col, s);
  }
  __syncthreads();  // the slots are reused by the next item
  lap(p, &t0, 3);
}

// Phase 2 of a CTA: its FC2 items of 16·kW output columns.
template <int kG, bool kF16, int kW>
__device__ void fc2_phase(const Params& p, Smem<kF16>& sm) {
  const int KC2 = fc2_chunks(sm.num_touched, p.fc2_parts, p.i_pad / 64, p.routes, Smem<kF16>::kFc2Slots / kW);
  const int items2 = p.h_pad / (16 * kW) * p.fc2_parts;
  where(p, 2, static_cast<int>(blockIdx.x) < items2 ? (items2 - 1 - blockIdx.x) / gridDim.x + 1 : 0);
  for (int item = blockIdx.x; item < items2; item += gridDim.x)
    fc2_item<kG, kF16, kW>(p, sm, item / p.fc2_parts, item % p.fc2_parts, KC2);
}

// kG: route groups of 8 per weight pass. kF16: NVFP4 weights with NVFP4 (a4) activations, on f16
// tensor cores (both operands exact in f16, see stream_gemm); otherwise bf16 through lookup tables.
template <int kG, bool kF16>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) direct_micro_kernel(Params p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem<kF16>& sm = *reinterpret_cast<Smem<kF16>*>(smem_raw);
  stamp(p, 0);
  if (p.trace != nullptr) {
    unsigned smid;
    asm("mov.u32 %0, %%smid;" : "=r"(smid));
    where(p, 0, smid);
  }
  if (!kF16 && !p.bf16_words) fill_frag_tables(tables(sm), p.nvfp4, threadIdx.x, kThreads);  // MX only
  const float x0 = phase0_first_x<kF16>(p);
  build_routing(p, sm);
  const int nt = sm.num_touched;
  stamp(p, 1);

  quantize_routes<kF16>(p, sm, x0);  // phase 0
  stamp(p, 2);
  grid_sync(p.barrier);
  stamp(p, 3);

  // Phase 1: FC1 + epilogue per (expert, 32 intermediate columns), expert-major so neighbouring
  // CTAs stream neighbouring weight rows.
  const int C32 = p.i_pad / 32;
  where(p, 1, blockIdx.x < nt * C32 ? (nt * C32 - 1 - blockIdx.x) / gridDim.x + 1 : 0);
  for (int item = blockIdx.x; item < nt * C32; item += gridDim.x) {
    if (p.gated) fc1_item<kG, true, kF16>(p, sm, item / C32, item % C32);
    else fc1_item<kG, false, kF16>(p, sm, item / C32, item % C32);
  }
  stamp(p, 4);
  grid_sync(p.barrier);
  stamp(p, 5);

  // Phase 2: FC2 + top-k sum per 16 or 32 output columns. Only kG = 1 kernels have the 32-column
  // items (kWideW = 2): two route groups and two W2 row tiles in two stages spill.
  constexpr int kWideW = kG == 1 ? 2 : 1;
  if (kWideW == 2 && p.fc2_wide) fc2_phase<kG, kF16, kWideW>(p, sm);
  else fc2_phase<kG, kF16, 1>(p, sm);
  stamp(p, 6);
}

}  // namespace fp4moe::kernels::direct_micro
