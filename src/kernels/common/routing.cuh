// The routing pre-pass: top-k ids → routed rows grouped by local expert, and an m-tile schedule.
//
// One CTA of kRouteThreads threads (E_local ≤ 1024 counters live in shared memory):
//   1. histogram of routes per local expert (ids outside [first, first + E_local) — −1, ids of other
//      ranks, ids ≥ E — are skipped and never used to index anything);
//   2. exclusive scans of the counts (row offsets) and of ceil(count / tile_m) (tile offsets: expert e's
//      m-tiles are [expert_tile_offset[e], expert_tile_offset[e + 1]) of the list);
//   3. the tile list: tile i covers rows [tile_row0[i], min(tile_row0[i] + tile_m, end of expert));
//   4. placement: each route gets a row; route_row[t·K + j] = row (−1 if not routed).
// Row order inside an expert depends on atomics, but no result does: every row is computed
// independently and the top-k sum reads rows through route_row in slot order.
//
// Past kRouteChunk routes the same steps run on many CTAs in three launches (route_count_kernel,
// route_scan_kernel, route_place_kernel): one CTA took 0.28 ms for qwen3-30b-a3b T = 16384's 131072
// routes and 38 µs for T = 2048's 16384 (NOTES session 7).
#pragma once

#include <cub/block/block_scan.cuh>
#include <cstdint>

namespace fp4moe::kernels {

inline constexpr int kRouteThreads = 1024;

struct RoutingParams {
  const void* ids;      // [T, K] int32 or int64
  bool ids_int64;
  int64_t routes;       // T · K
  int first, experts;   // local range
  int tile_m;
  // outputs (workspace)
  int* expert_offset;   // [experts + 1]
  int* expert_tile_offset;  // [experts + 1] first m-tile of each expert in the tile list; [experts] = total
  int* route_row;       // [routes]
  int* row_route;       // [routes] route index t·K + j of each row
  int* row_expert;      // [routes] local expert of each row
  int* tile_expert;     // [max_tiles]
  int* tile_row0;       // [max_tiles]
  int* num_tiles;       // [1]
};

__device__ __forceinline__ int local_expert(const RoutingParams& p, int64_t r) {
  const int64_t id = p.ids_int64 ? static_cast<const int64_t*>(p.ids)[r] : static_cast<const int32_t*>(p.ids)[r];
  const int64_t e = id - p.first;
  return (e >= 0 && e < p.experts) ? static_cast<int>(e) : -1;
}

// Route r goes to `row` of local expert e (both -1 when it is not routed here): the maps both ways.
__device__ __forceinline__ void record_route(const RoutingParams& p, int64_t r, int e, int row) {
  if (row >= 0) {
    p.row_route[row] = static_cast<int>(r);
    p.row_expert[row] = e;
  }
  p.route_row[r] = row;
}

// Thread tid of a kRouteThreads CTA holds local expert tid's route count (0 past the experts): the
// exclusive scans give each expert its first row and first m-tile, written with the tile list and
// the totals. Returns the expert's first row. Shared by the one-CTA routing and the many-CTA scan.
template <class Scan>
__device__ __forceinline__ int scan_counts_and_list_tiles(const RoutingParams& p, typename Scan::TempStorage& storage,
                                                          int count) {
  const int tid = threadIdx.x;
  const int tiles = (count + p.tile_m - 1) / p.tile_m;
  int row0, tile0, total_rows, total_tiles;
  Scan(storage).ExclusiveSum(count, row0, total_rows);
  __syncthreads();
  Scan(storage).ExclusiveSum(tiles, tile0, total_tiles);
  if (tid < p.experts) {
    p.expert_offset[tid] = row0;
    p.expert_tile_offset[tid] = tile0;
    for (int m = 0; m < tiles; ++m) {
      p.tile_expert[tile0 + m] = tid;
      p.tile_row0[tile0 + m] = row0 + m * p.tile_m;
    }
  }
  if (tid == 0) {
    p.expert_offset[p.experts] = total_rows;
    p.expert_tile_offset[p.experts] = total_tiles;
    *p.num_tiles = total_tiles;
  }
  return row0;
}

__global__ void __launch_bounds__(kRouteThreads) route_kernel(RoutingParams p) {
  using Scan = cub::BlockScan<int, kRouteThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int cursor[kRouteThreads];
  const int tid = threadIdx.x;

  cursor[tid] = 0;
  __syncthreads();
  for (int64_t r = tid; r < p.routes; r += kRouteThreads) {
    const int e = local_expert(p, r);
    if (e >= 0) atomicAdd(&cursor[e], 1);
  }
  __syncthreads();

  const int row0 = scan_counts_and_list_tiles<Scan>(p, scan_storage, tid < p.experts ? cursor[tid] : 0);
  __syncthreads();
  cursor[tid] = row0;  // now the next free row of expert tid
  __syncthreads();

  for (int64_t r = tid; r < p.routes; r += kRouteThreads) {
    const int e = local_expert(p, r);
    record_route(p, r, e, e >= 0 ? atomicAdd(&cursor[e], 1) : -1);
  }
}

// ---- many CTAs: chunks of kRouteChunk routes, one per CTA -----------------------------------------
inline constexpr int kRouteChunk = 2048;
inline constexpr int kRouteChunkThreads = 512;
inline constexpr int kRouteMaxExperts = kRouteThreads;  // local experts: one scan thread each

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

}  // namespace fp4moe::kernels
