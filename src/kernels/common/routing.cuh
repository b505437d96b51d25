// The routing pre-pass: top-k ids → routed rows grouped by local expert, and an m-tile schedule.
//
// One CTA of kRouteThreads threads (E_local ≤ 1024 counters live in shared memory):
//   1. histogram of routes per local expert (ids outside [first, first + E_local) — −1, ids of other
//      ranks, ids ≥ E — are skipped and never used to index anything);
//   2. exclusive scans of the counts (row offsets) and of ceil(count / tile_m) (tile offsets: expert e's
//      m-tiles are [expert_tile_offset[e], expert_tile_offset[e + 1]) of the list);
//   3. the tile list: tile i covers rows [tile_row0[i], min(tile_row0[i] + tile_m, end of expert));
//   4. placement: each route gets a row; route_row[t·K + j] = row (−1 if not routed), and the row its
//      router weight (row_weight[row] = topk_weights[t·K + j]: FC2's epilogue reads it with one load
//      whose address needs only the tile's first row, NOTES session 23).
// Row order inside an expert depends on atomics, but no result does: every row is computed
// independently and the top-k sum reads rows through route_row in slot order.
//
// Past kRouteChunk routes the same steps run on many CTAs in three launches (route_count_kernel,
// route_scan_kernel, route_place_kernel): one CTA took 0.28 ms for qwen3-30b-a3b T = 16384's 131072
// routes and 38 µs for T = 2048's 16384 (NOTES session 7). The kernels are in kernels/route.cuh,
// the steps here.
#pragma once

#include <cub/block/block_scan.cuh>
#include <cstdint>

namespace fp4moe::kernels {

inline constexpr int kRouteThreads = 1024;

// Rows past a call's last routed row that a GEMM tile may read in row_weight (up to 256 routed rows a
// tile, dynamic_bf16's BM; each consumer thread of the register path loads one): the workspace holds
// routes + kRowWeightPad entries, zeroed once, so such reads stay inside it and read a finite value
// (another row's weight or 0) that no epilogue stores.
inline constexpr int kRowWeightPad = 256;

struct RoutingParams {
  const void* ids;      // [T, K] int32 or int64
  bool ids_int64;
  const float* topk_weights;  // [T, K]
  int64_t routes;       // T · K
  int first, experts;   // local range
  int tile_m;
  // outputs (workspace)
  int* expert_offset;   // [experts + 1]
  int* expert_tile_offset;  // [experts + 1] first m-tile of each expert in the tile list; [experts] = total
  int* route_row;       // [routes]
  float* row_weight;    // [routes + kRowWeightPad] router weight of each row (topk_weights of its route)
  int* row_expert;      // [routes] local expert of each row
  int* tile_expert;     // [max_tiles]
  int* tile_row0;       // [max_tiles]
  int* num_tiles;       // [1]
  // [routes] the route (t·K + j) of each row, or null: the dynamic backend's FC2 scatter-add reads
  // the row's token from it (moe_gemm.cuh fc2_store_rows, MoeGemmParams::out_acc).
  int* row_route = nullptr;
};

__device__ __forceinline__ int local_expert(const RoutingParams& p, int64_t r) {
  const int64_t id = p.ids_int64 ? static_cast<const int64_t*>(p.ids)[r] : static_cast<const int32_t*>(p.ids)[r];
  const int64_t e = id - p.first;
  return (e >= 0 && e < p.experts) ? static_cast<int>(e) : -1;
}

// Route r goes to `row` of local expert e (both -1 when it is not routed here): the maps both ways,
// and the row's router weight w (topk_weights[r]).
__device__ __forceinline__ void record_route(const RoutingParams& p, int64_t r, int e, int row, float w) {
  if (row >= 0) {
    p.row_weight[row] = w;
    p.row_expert[row] = e;
    if (p.row_route) p.row_route[row] = static_cast<int>(r);
  }
  p.route_row[r] = row;
}
__device__ __forceinline__ void record_route(const RoutingParams& p, int64_t r, int e, int row) {
  record_route(p, r, e, row, row >= 0 ? p.topk_weights[r] : 0.0f);
}

// Thread tid of the CTA holds the route counts of local experts kItems·tid … kItems·tid + kItems − 1
// (0 past the experts; Scan a cub::BlockScan over the CTA's threads, which must cover the experts):
// the exclusive scans give each expert its first row and first m-tile, written with the tile list
// and the totals; row0[i] is expert kItems·tid + i's first row. Shared by the one-CTA routing, the
// many-CTA scan (kItems = 1, kRouteThreads threads) and the fused routing + gather (route.cuh: two
// experts a thread; only its CTA 0 writes, `write` false elsewhere, the same in every thread of a CTA).
template <class Scan, int kItems>
__device__ __forceinline__ void scan_counts_and_list_tiles(const RoutingParams& p, typename Scan::TempStorage& storage,
                                                           int (&count)[kItems], int (&row0)[kItems],
                                                           bool write = true) {
  int tiles[kItems], tile0[kItems], total_rows, total_tiles;
#pragma unroll
  for (int i = 0; i < kItems; ++i) tiles[i] = (count[i] + p.tile_m - 1) / p.tile_m;
  Scan(storage).ExclusiveSum(count, row0, total_rows);
  if (!write) return;
  __syncthreads();
  Scan(storage).ExclusiveSum(tiles, tile0, total_tiles);
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int e = kItems * static_cast<int>(threadIdx.x) + i;
    if (e >= p.experts) break;
    p.expert_offset[e] = row0[i];
    p.expert_tile_offset[e] = tile0[i];
    for (int m = 0; m < tiles[i]; ++m) {
      p.tile_expert[tile0[i] + m] = e;
      p.tile_row0[tile0[i] + m] = row0[i] + m * p.tile_m;
    }
  }
  if (threadIdx.x == 0) {
    p.expert_offset[p.experts] = total_rows;
    p.expert_tile_offset[p.experts] = total_tiles;
    *p.num_tiles = total_tiles;
  }
}
template <class Scan>
__device__ __forceinline__ int scan_counts_and_list_tiles(const RoutingParams& p, typename Scan::TempStorage& storage,
                                                          int count) {
  int counts[1] = {count};
  int row0[1];
  scan_counts_and_list_tiles<Scan, 1>(p, storage, counts, row0);
  return row0[0];
}

// The whole routing in one CTA of kThreads threads, kItems local experts each (kThreads · kItems ≥
// experts): the histogram into `count` (kThreads · kItems ints of shared memory), the scans and the
// tile list, then each route's row (count then holds the next free row of each expert). Row order
// inside an expert depends on the atomics. route_kernel runs it (kRouteThreads threads, one expert
// each).
template <int kThreads, int kItems>
__device__ __forceinline__ void route_one_cta(const RoutingParams& p, int* count,
                                              typename cub::BlockScan<int, kThreads>::TempStorage& storage) {
  const int tid = threadIdx.x;
  // At most one route a thread (decode calls): its expert and router weight are loaded once, before
  // the histogram, and kept for the placement (the loop form loads the ids again there, and the
  // weight only then: two more round trips on every dynamic call's critical path).
  const bool one = p.routes <= kThreads;
  const int e_mine = one && tid < p.routes ? local_expert(p, tid) : -1;
  const float w_mine = e_mine >= 0 ? p.topk_weights[tid] : 0.0f;
  for (int e = tid; e < p.experts; e += kThreads) count[e] = 0;
  __syncthreads();
  if (one) {
    if (e_mine >= 0) atomicAdd(&count[e_mine], 1);
  } else {
    for (int64_t r = tid; r < p.routes; r += kThreads) {
      const int e = local_expert(p, r);
      if (e >= 0) atomicAdd(&count[e], 1);
    }
  }
  __syncthreads();
  int mine[kItems], row0[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int e = kItems * tid + i;
    mine[i] = e < p.experts ? count[e] : 0;
  }
  scan_counts_and_list_tiles<cub::BlockScan<int, kThreads>, kItems>(p, storage, mine, row0);
  __syncthreads();  // every count was read
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int e = kItems * tid + i;
    if (e < p.experts) count[e] = row0[i];  // now the next free row of expert e
  }
  __syncthreads();
  if (one) {
    if (tid < p.routes) record_route(p, tid, e_mine, e_mine >= 0 ? atomicAdd(&count[e_mine], 1) : -1, w_mine);
    return;
  }
  for (int64_t r = tid; r < p.routes; r += kThreads) {
    const int e = local_expert(p, r);
    record_route(p, r, e, e >= 0 ? atomicAdd(&count[e], 1) : -1);
  }
}

// Past kRouteChunk routes the pre-pass runs on many CTAs, one chunk of routes each (route.cuh).
inline constexpr int kRouteChunk = 2048;
inline constexpr int kRouteChunkThreads = 512;
inline constexpr int kRouteMaxExperts = kRouteThreads;  // local experts: one scan thread each

// The fused routing + gather at decode sizes (route.cuh, route_gather_kernel): its limits.
// kRouteGatherThreads threads, each two routes and two experts' counts (kRouteThreads of each in
// all): 512 threads leave the gather's quantisation 128 registers (1024 spilled MX's 32-value
// blocks at 64). The static arrays take ~14 KB of the 48 KB a CTA has without an opt-in.
inline constexpr int kRouteGatherThreads = 512;
inline constexpr int kRouteGatherWarps = kRouteGatherThreads / 32;
inline constexpr int kRouteGatherPrefixBytes = 32 * 1024;

__host__ __device__ inline int route_gather_prefix_bytes(int64_t routes, int experts) {
  return static_cast<int>((routes + 31) / 32) * ((experts + 1) / 2) * 4;  // uint16 [warps][experts], whole words
}
// Whether a call's routing fits the kernel: at most kRouteThreads routes and local experts (two of
// each a thread) and the prefix table within kRouteGatherPrefixBytes.
__host__ __device__ inline bool route_gather_fits(int64_t routes, int experts) {
  return routes <= kRouteThreads && experts <= kRouteMaxExperts &&
         route_gather_prefix_bytes(routes, experts) <= kRouteGatherPrefixBytes;
}

}  // namespace fp4moe::kernels
