// Device side of the expert-parallel layer (src/ep/): packing tokens and routed rows for NCCL and
// combining what comes back. Launched from src/ep/launch_ep.cu.
//
//   all-gather + reduce-scatter
//     ag_pack_kernel       this rank's ids → int32 (−1 outside [0, E) and on pad rows), weights
//                          (0 on pad rows), into its slot of the gathered buffers
//     cast_out_kernel      fp32 [T, H] → bf16 (round to nearest even, as every backend's store)
//   all-to-all of routed rows
//     a2a_count_kernel     per block of kRouteBlock routes: how many go to each destination rank
//     a2a_scan_kernel      one CTA: per (block, destination) offsets, per destination totals → the
//                          rank's row of the count matrix, and where each destination's rows start
//     a2a_place_kernel     each route's position in the send buffer (stable: route order within a
//                          destination), its id and weight there; route_pos[route] = position or −1
//     a2a_gather_x_kernel  send_x[pos] = x[token of the route at pos]
//     a2a_combine_kernel   out[t] = Σ_j back[route_pos[t·K + j]] in slot order from 0 (fp32), then
//                          stored as MoeRunner's combine stores (common/epilogue.cuh)
// Everything is deterministic: positions come from warp match + prefix sums, never from atomics.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "kernels/common/epilogue.cuh"

namespace fp4moe::kernels::ep {

inline constexpr int kRouteBlock = 256;  // routes per CTA in count/place (8 warps)
inline constexpr int kRouteWarps = kRouteBlock / 32;
inline constexpr int kScanThreads = 1024;

// ---- all-gather + reduce-scatter ---------------------------------------------------------------

template <typename IdT>
__global__ void ag_pack_kernel(const IdT* __restrict__ ids, const float* __restrict__ w, int64_t routes,
                               int64_t padded_routes, int num_experts, int32_t* __restrict__ ids_out,
                               float* __restrict__ w_out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= padded_routes) return;
  if (i < routes) {
    const int64_t e = static_cast<int64_t>(ids[i]);
    ids_out[i] = (e >= 0 && e < num_experts) ? static_cast<int32_t>(e) : -1;
    w_out[i] = w[i];
  } else {
    ids_out[i] = -1;
    w_out[i] = 0.0f;
  }
}

// out[i .. i+3] (bf16) = in[i .. i+3] (fp32); n is a multiple of 4.
__global__ void cast_out_kernel(const float* __restrict__ in, void* __restrict__ out, int64_t n) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i >= n) return;
  store_out4(out, false, i, *reinterpret_cast<const float4*>(in + i));
}

// ---- all-to-all of routed rows -----------------------------------------------------------------

// Destination rank of a route: owner[e] for e in [0, E), −1 otherwise.
template <typename IdT>
__device__ __forceinline__ int route_dest(const IdT* ids, int64_t i, int64_t routes, const int* owner, int E,
                                          int32_t* expert) {
  *expert = -1;
  if (i >= routes) return -1;
  const int64_t e = static_cast<int64_t>(ids[i]);
  if (e < 0 || e >= E) return -1;
  *expert = static_cast<int32_t>(e);
  return owner[e];
}

// Counts of one CTA's routes per destination into smem cnt[warp][d] (every lane of every warp
// takes part; lanes past `routes` have destination −1). Returns the lane's rank among the lanes of
// its warp with the same destination.
__device__ __forceinline__ int warp_rank_and_count(int dest, int* cnt, int world) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned same = __match_any_sync(0xffffffffu, dest);
  const int rank = __popc(same & ((1u << lane) - 1u));
  for (int k = threadIdx.x; k < kRouteWarps * world; k += blockDim.x) cnt[k] = 0;
  __syncthreads();
  if (dest >= 0 && rank == 0) cnt[warp * world + dest] = __popc(same);
  __syncthreads();
  return rank;
}

// block_counts[b][d]: routes of CTA b going to rank d. Dynamic smem: kRouteWarps · world ints.
template <typename IdT>
__global__ void __launch_bounds__(kRouteBlock) a2a_count_kernel(const IdT* __restrict__ ids, int64_t routes,
                                                                const int* __restrict__ owner, int E, int world,
                                                                int* __restrict__ block_counts) {
  extern __shared__ int cnt[];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kRouteBlock + threadIdx.x;
  int32_t e;
  const int dest = route_dest(ids, i, routes, owner, E, &e);
  warp_rank_and_count(dest, cnt, world);
  for (int d = threadIdx.x; d < world; d += blockDim.x) {
    int s = 0;
    for (int w = 0; w < kRouteWarps; ++w) s += cnt[w * world + d];
    block_counts[static_cast<int64_t>(blockIdx.x) * world + d] = s;
  }
}

// One CTA. block_offsets[b][d] = Σ_{b' < b} block_counts[b'][d]; send_count[d] (int64, the rank's
// row of the count matrix) = Σ_b block_counts[b][d]; send_base[d] = Σ_{d' < d} send_count[d'].
__global__ void __launch_bounds__(kScanThreads) a2a_scan_kernel(const int* __restrict__ block_counts, int blocks,
                                                                int world, int* __restrict__ block_offsets,
                                                                int64_t* __restrict__ send_count,
                                                                int* __restrict__ send_base) {
  for (int d = threadIdx.x; d < world; d += blockDim.x) {
    int run = 0;
    for (int b = 0; b < blocks; ++b) {
      block_offsets[static_cast<int64_t>(b) * world + d] = run;
      run += block_counts[static_cast<int64_t>(b) * world + d];
    }
    send_count[d] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int d = 0; d < world; ++d) {
      send_base[d] = run;
      run += static_cast<int>(send_count[d]);
    }
    send_base[world] = run;  // total rows sent (self included)
  }
}

template <typename IdT>
__global__ void __launch_bounds__(kRouteBlock) a2a_place_kernel(
    const IdT* __restrict__ ids, const float* __restrict__ w, int64_t routes, const int* __restrict__ owner, int E,
    int world, const int* __restrict__ block_offsets, const int* __restrict__ send_base, int* __restrict__ route_pos,
    int* __restrict__ send_route, int32_t* __restrict__ send_id, float* __restrict__ send_w) {
  extern __shared__ int cnt[];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kRouteBlock + threadIdx.x;
  int32_t e;
  const int dest = route_dest(ids, i, routes, owner, E, &e);
  const int rank = warp_rank_and_count(dest, cnt, world);
  if (i >= routes) return;
  if (dest < 0) {
    route_pos[i] = -1;
    return;
  }
  const int warp = threadIdx.x >> 5;
  int before = 0;
  for (int v = 0; v < warp; ++v) before += cnt[v * world + dest];
  const int pos = send_base[dest] + block_offsets[static_cast<int64_t>(blockIdx.x) * world + dest] + before + rank;
  route_pos[i] = pos;
  send_route[pos] = static_cast<int>(i);
  send_id[pos] = e;
  send_w[pos] = w[i];
}

// One CTA per possible row (grid = routes); rows past send_base[world] exit. 16-byte copies:
// H · 2 bytes is a multiple of 32 (H is a multiple of the 16- or 32-element block).
__global__ void a2a_gather_x_kernel(const uint4* __restrict__ x, const int* __restrict__ send_route,
                                    const int* __restrict__ send_base, int world, int top_k, int vecs_per_row,
                                    uint4* __restrict__ send_x) {
  const int pos = blockIdx.x;
  if (pos >= send_base[world]) return;
  const int64_t t = send_route[pos] / top_k;
  const uint4* src = x + t * vecs_per_row;
  uint4* dst = send_x + static_cast<int64_t>(pos) * vecs_per_row;
  for (int v = threadIdx.x; v < vecs_per_row; v += blockDim.x) dst[v] = src[v];
}

inline constexpr int kCombineThreads = 128;

// grid (T, ceil(H / 4 / kCombineThreads)).
__global__ void __launch_bounds__(kCombineThreads) a2a_combine_kernel(const float* __restrict__ back,
                                                                      const int* __restrict__ route_pos, int top_k,
                                                                      int hidden, void* out, bool out_fp32) {
  const int64_t t = blockIdx.x;
  const int c = (blockIdx.y * kCombineThreads + threadIdx.x) * 4;
  if (c >= hidden) return;
  float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int j = 0; j < top_k; ++j) {
    const int pos = route_pos[t * top_k + j];
    if (pos < 0) continue;
    add4(s, *reinterpret_cast<const float4*>(back + static_cast<int64_t>(pos) * hidden + c));
  }
  store_out4(out, out_fp32, t * hidden + c, s);
}

}  // namespace fp4moe::kernels::ep
