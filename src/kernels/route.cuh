// The routing pre-pass's kernels (the steps are common/routing.cuh's): the routing and the gather
// in one launch at decode sizes (route_gather_kernel), one CTA up to kRouteChunk routes, three
// launches of many CTAs past that. Launched by launch_generic.cu (launch_route, launch_route_gather).
#pragma once

#include <cub/block/block_scan.cuh>
#include <cstdint>

#include "kernels/common/gather_combine.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/routing.cuh"

namespace fp4moe::kernels {

// route_kernel and route_place_kernel end the routing: the gather after them may be launched early
// (ptx::launch_dependents; dynamic's chain, launch_dynamic.cu), and waits for them to complete.
__global__ void __launch_bounds__(kRouteThreads) route_kernel(RoutingParams p) {
  ptx::launch_dependents();
  __shared__ typename cub::BlockScan<int, kRouteThreads>::TempStorage scan_storage;
  __shared__ int count[kRouteThreads];
  route_one_cta<kRouteThreads, 1>(p, count, scan_storage);
}

// Histogram of this CTA's chunk in shared memory (hist: kRouteMaxExperts ints).
__device__ __forceinline__ void chunk_histogram(const RoutingParams& p, int* hist) {
  for (int e = threadIdx.x; e < p.experts; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRouteChunk;
  const int64_t r1 = min(p.routes, r0 + kRouteChunk);
  for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
    const int e = local_expert(p, r);
    if (e >= 0) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
}

// 1. counts[e] += this chunk's routes to e (counts zeroed before the launch).
__global__ void __launch_bounds__(kRouteChunkThreads) route_count_kernel(RoutingParams p, int* counts) {
  __shared__ int hist[kRouteMaxExperts];
  chunk_histogram(p, hist);
  for (int e = threadIdx.x; e < p.experts; e += blockDim.x)
    if (hist[e] > 0) atomicAdd(&counts[e], hist[e]);
}

// 2. One CTA of kRouteThreads: the scans and the tile list from counts (scan_counts_and_list_tiles,
// as route_kernel); cursor[e] = expert e's first row.
__global__ void __launch_bounds__(kRouteThreads) route_scan_kernel(RoutingParams p, const int* counts, int* cursor) {
  using Scan = cub::BlockScan<int, kRouteThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int tid = threadIdx.x;
  const int row0 = scan_counts_and_list_tiles<Scan>(p, scan_storage, tid < p.experts ? counts[tid] : 0);
  if (tid < p.experts) cursor[tid] = row0;
}

// 3. Per chunk again: the histogram, one global atomic per touched expert to take a run of rows,
// then each route a row of its expert's run.
__global__ void __launch_bounds__(kRouteChunkThreads) route_place_kernel(RoutingParams p, int* cursor) {
  ptx::launch_dependents();
  __shared__ int hist[kRouteMaxExperts], base[kRouteMaxExperts];
  chunk_histogram(p, hist);
  for (int e = threadIdx.x; e < p.experts; e += blockDim.x) {
    base[e] = hist[e] > 0 ? atomicAdd(&cursor[e], hist[e]) : 0;
    hist[e] = 0;  // now the next free row of the run
  }
  __syncthreads();
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRouteChunk;
  const int64_t r1 = min(p.routes, r0 + kRouteChunk);
  for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
    const int e = local_expert(p, r);
    record_route(p, r, e, e >= 0 ? base[e] + atomicAdd(&hist[e], 1) : -1);
  }
}

// ---- The routing and the gather in one launch (decode sizes) -------------------------------------
// Every CTA computes the whole call's routing in shared memory (two routes a thread), then its warps
// gather their units of tokens · gather_chunks into A1 from it; CTA 0 also writes the routing's
// outputs for the GEMMs and the top-k sum. Why: the routing kernel and the gather waiting for it were
// two launches and a grid dependency in series, and the gather's first loads (route_row, then
// row_expert, then q1_scale) three dependent round trips, on every decode call's critical path
// (session 24's durations at qwen3-30b-a3b a4 T = 16: routing 5.1, gather 7.5 µs).
//
// The CTAs must agree on every route's row, so the placement is not the atomics' order: route r of
// local expert e gets row first_row[e] + (routes of e before r), the rows of an expert in route
// order. A warp counts its routes per expert with __match_any_sync; warp_prefix[w][e] (dynamic shared
// memory, uint16) holds warp w's count, then, after a pass over the warps by expert e's thread, the
// routes of e in warps before w.
// Grid: ceil(tokens · gather_chunks / kRouteGatherWarps) CTAs (at least one), kRouteGatherThreads
// threads, route_gather_prefix_bytes of dynamic shared memory; kBlock = quant_block(g.q1). Needs
// route_gather_fits. An ordinary launch: the GEMM after it may be launched early.
template <int kBlock>
__global__ void __launch_bounds__(kRouteGatherThreads) route_gather_kernel(RoutingParams p, generic::GatherParams g) {
  ptx::launch_dependents();
  constexpr int kThreads = kRouteGatherThreads;
  constexpr int kPer = kRouteThreads / kThreads;  // routes and experts a thread
  using Scan = cub::BlockScan<int, kThreads>;
  extern __shared__ uint16_t warp_prefix[];  // [warps of routes][p.experts], a row padded to whole words
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int first_row[kRouteMaxExperts];
  __shared__ int slot_row[kRouteThreads];
  __shared__ float slot_g[kRouteThreads];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int stride = (p.experts + 1) & ~1;

  // This warp's unit: its lane's block of x first (the call's input: nothing in the chain writes it),
  // then this thread's routes tid + kThreads·i, their router weights and their experts' scales.
  const int chunks = generic::gather_chunks(g.h_pad, g.q1);
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * kRouteGatherWarps + warp;
  const int t = static_cast<int>(unit / chunks);
  const int b = static_cast<int>(unit % chunks) * 32 + lane;
  const bool active = t < g.tokens && b < g.h_pad / kBlock;
  const generic::XBlock<kBlock> x = generic::load_x_block<kBlock>(g, t, b, active);
  int e[kPer];
  float w[kPer], gs[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int r = tid + kThreads * i;
    e[i] = r < p.routes ? local_expert(p, r) : -1;
    w[i] = r < p.routes ? p.topk_weights[r] : 0.0f;  // not after e: one round trip fewer
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) gs[i] = e[i] >= 0 ? g.q1_scale[e[i]] : 0.0f;

  // Route r's warp of routes is r / 32 (warp + kThreads / 32 · i for this thread's i-th).
  const int warps = static_cast<int>((p.routes + 31) / 32);
  uint32_t* const words = reinterpret_cast<uint32_t*>(warp_prefix);
  for (int i = tid; i < warps * stride / 2; i += kThreads) words[i] = 0;
  __syncthreads();
  unsigned before[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const unsigned peers = __match_any_sync(0xffffffffu, e[i]);
    before[i] = peers & ((1u << lane) - 1u);  // the routes of e[i] before this one in its warp of routes
    if (e[i] >= 0 && before[i] == 0)
      warp_prefix[(warp + kThreads / 32 * i) * stride + e[i]] = static_cast<uint16_t>(__popc(peers));
  }
  __syncthreads();
  // Experts kPer·tid + j: their counts, and each warp's entry turned into the routes before it.
  int count[kPer], row0[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int ex = kPer * tid + j;
    count[j] = 0;
    if (ex < p.experts)
      for (int v = 0; v < warps; ++v) {
        uint16_t& c = warp_prefix[v * stride + ex];
        const int n = c;
        c = static_cast<uint16_t>(count[j]);
        count[j] += n;
      }
  }
  scan_counts_and_list_tiles<Scan, kPer>(p, scan_storage, count, row0, blockIdx.x == 0);
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (kPer * tid + j < p.experts) first_row[kPer * tid + j] = row0[j];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int r = tid + kThreads * i;
    if (r >= p.routes) break;
    const int row =
        e[i] >= 0 ? first_row[e[i]] + warp_prefix[(warp + kThreads / 32 * i) * stride + e[i]] + __popc(before[i]) : -1;
    slot_row[r] = row;
    slot_g[r] = gs[i];
    if (blockIdx.x == 0) record_route(p, r, e[i], row, w[i]);
  }
  __syncthreads();

  const int slot = t < g.tokens && lane < g.top_k ? t * g.top_k + lane : -1;
  generic::quantize_routes<kBlock>(g, x, b, active, slot >= 0 ? slot_row[slot] : -1, slot >= 0 ? slot_g[slot] : 0.0f);
}

}  // namespace fp4moe::kernels
