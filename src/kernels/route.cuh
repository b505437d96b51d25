// The routing pre-pass's kernels (the steps are common/routing.cuh's): one CTA up to kRouteChunk
// routes, three launches of many CTAs past that. Launched by launch_generic.cu (launch_route).
#pragma once

#include <cub/block/block_scan.cuh>
#include <cstdint>

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

}  // namespace fp4moe::kernels
