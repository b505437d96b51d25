// static: the decode and middle-range backend. The whole MoE block in one cooperative launch of
// dynamic's register-path CTA (dynamic.cuh: a producer warpgroup, two consumer warpgroups that
// dequantise the weights into wgmma A fragments), with four grid barriers (common/grid_barrier.cuh):
//
//   phase 0   CTA 0 routes: top-k ids → rows grouped by local expert and the m-tile list, the
//             routing pre-pass of the other paths (common/routing.cuh) run by 384 threads  → barrier
//   phase 1   every warp of the grid gathers and quantises x into A1 (common/gather_combine.cuh gather_unit)
//                                                                                          → barrier
//   phase 2   FC1 work items (m-tile × n-tile), produce / consume of dynamic.cuh → A2       → barrier
//   phase 3   FC2 work items, the same on the same ring of stages → Y (fp32, one row a route)
//                                                                                          → barrier
//   phase 4   out[t] = Σ_j Y[route_row[t, j]] in slot order (common/gather_combine.cuh combine4)
//
// What it saves against dynamic: dynamic's four or five launches (route and gather, one launch up
// to 1024 routes; FC1; FC2; combine) become one, and the tile assignment is fixed at launch (CTA b
// takes work items b, b + grid, …), so with a CUDA graph the call costs one launch plus four
// barriers (~2 µs each, ../shared/h200-facts.md).
// The GEMM core, the tile list, the epilogues and the top-k sum are dynamic's and generic's, so the
// results are theirs bit for bit (same rows, same summation order), and deterministic.
//
// Registers: phases 0 and 1 run on all 384 threads with the launch's allocation (kLaunchRegs: 168,
// or 80 for the two CTAs per SM at 32-row m-tiles); then the producer gives registers back to 40 and the
// consumers take them (setmaxnreg, as dynamic's gemm_kernel), and phase 4 runs on the consumers.
#pragma once

#include <cub/block/block_scan.cuh>
#include <cstdint>

#include "kernels/common/gather_combine.cuh"
#include "kernels/common/grid_barrier.cuh"
#include "kernels/common/routing.cuh"
#include "kernels/dynamic.cuh"

namespace fp4moe::kernels::static_moe {

namespace dk = dynamic;

inline constexpr int kThreads = dk::kThreads;  // 384
inline constexpr int kWarps = kThreads / 32;
// Local experts the in-kernel routing counts: kRouteItems per thread.
inline constexpr int kRouteItems = 3;
inline constexpr int kMaxExperts = kRouteItems * kThreads;  // 1152; the runner allows up to 1024 (routing.cuh)

struct Params {
  RoutingParams route;        // tile_m = BM; outputs in the generic workspace
  generic::GatherParams gather;
  MoeGemmParams fc1, fc2;     // their tile list, A and Y are the routing's, gather's and FC1's outputs
  dk::TensorMaps maps1, maps2; // fc1's and fc2's operands for the producers' tensor copies (gpu::register_path_maps)
  int n1_tiles, n2_tiles;     // weight n-tiles per m-tile (dynamic_n_tiles)
  generic::CombineParams combine;
  GridBarrier barrier;
  int* watchdog;              // as dynamic's gemm_kernel (tests); null in production
};

// The routing's scratch in the epilogue staging (free until the first tile ends): per local expert
// a counter, then the scan's temporary storage.
using RouteScan = cub::BlockScan<int, kThreads>;
struct RouteScratch {
  int count[kMaxExperts];
  typename RouteScan::TempStorage scan;
};
template <int BM, bool kF16>
__device__ __forceinline__ RouteScratch& route_scratch(dk::Smem<BM, kF16>& sm) {
  static_assert(sizeof(RouteScratch) <= sizeof(sm.c), "the routing's scratch must fit the epilogue staging");
  return *reinterpret_cast<RouteScratch*>(sm.c);
}

// The same pointer, which the compiler can no longer see through: each GEMM phase derives its
// shared-memory addresses anew instead of keeping FC1's live through FC1's epilogues into FC2 (with
// them live, the f16 kernel's consumers, at 96 registers, spilled and reloaded them every stage).
template <class T>
__device__ __forceinline__ T* opaque(T* q) {
  asm volatile("" : "+l"(q));
  return q;
}

template <int BM, bool kF16>
__global__ void __launch_bounds__(kThreads, dk::kCtasPerSm<BM, kF16>) static_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  dk::Smem<BM, kF16>& sm = dk::aligned_smem<dk::Smem<BM, kF16>>(smem_raw);
  dk::start_cta(sm, p.fc1.nvfp4);
  const ptx::Watchdog wd{&sm.aborted, p.watchdog};

  if (blockIdx.x == 0) {
    RouteScratch& rs = route_scratch(sm);
    route_one_cta<kThreads, kRouteItems>(p.route, rs.count, rs.scan);
  }
  grid_sync(p.barrier);

  const int64_t units = static_cast<int64_t>(p.gather.tokens) * generic::gather_chunks(p.gather.h_pad, p.gather.q1);
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); u < units;
       u += static_cast<int64_t>(gridDim.x) * kWarps)
    generic::gather_unit(p.gather, u, threadIdx.x & 31);
  ptx::fence_proxy_async_global();  // A1's generic writes → the FC1 producers' tensor copies
  grid_sync(p.barrier);

  const int tiles = *p.route.num_tiles;  // written by CTA 0 before the first barrier
  uint32_t it = 0;  // the ring's stages used so far: FC2 continues where FC1 left the barriers' phases
  if (dk::take_role<BM, kF16>()) {
    // The writers fenced their generic writes for the async proxy before the barrier; the copies'
    // issuer fences again after it (the tensor copies read A1 / A2 through the async proxy).
    ptx::fence_proxy_async_global();
    dk::produce<true, BM, kF16>(p.fc1, &p.maps1, sm, p.n1_tiles, tiles * p.n1_tiles, wd, it);
    grid_sync(p.barrier);
    ptx::fence_proxy_async_global();
    dk::produce<false, BM, kF16>(p.fc2, &p.maps2, sm, p.n2_tiles, tiles * p.n2_tiles, wd, it);
    grid_sync(p.barrier);
  } else {
    dk::consume<true, BM, kF16>(p.fc1, *opaque(&sm), p.n1_tiles, tiles * p.n1_tiles, wd, it);
    ptx::fence_proxy_async_global();  // A2's generic writes (FC1's epilogue) → FC2's tensor copies
    grid_sync(p.barrier);  // A2 is complete
    dk::consume<false, BM, kF16>(p.fc2, *opaque(&sm), p.n2_tiles, tiles * p.n2_tiles, wd, it);
    grid_sync(p.barrier);  // Y is complete
    // The top-k sum over the consumers of the grid: 4 columns of one token per thread.
    const int quads = p.combine.hidden / 4;
    const int64_t n = static_cast<int64_t>(p.gather.tokens) * quads;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * dk::kConsumers * dk::kWarpgroup;
    for (int64_t q = static_cast<int64_t>(blockIdx.x) * dk::kConsumers * dk::kWarpgroup + threadIdx.x - dk::kWarpgroup;
         q < n; q += stride)
      generic::combine4(p.combine, static_cast<int>(q / quads), static_cast<int>(q % quads) * 4);
  }
}

}  // namespace fp4moe::kernels::static_moe
