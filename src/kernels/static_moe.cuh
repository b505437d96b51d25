// static: the decode and middle-range backend. After the routing and the gather (the generic path's
// launches: launch_route_gather, one launch up to 1024 routes), FC1, FC2 and the top-k sum in one
// cooperative launch of dynamic's register-path CTA (dynamic.cuh: a producer warpgroup, two consumer
// warpgroups that dequantise the weights into wgmma A fragments), with one grid barrier
// (common/grid_barrier.cuh) and per-m-tile counters:
//
//   FC1   work items (m-tile × n-tile), produce_item / consume_item of dynamic.cuh → A2; each item, once its
//         epilogue has stored its A2 rows, adds 1 to its m-tile's counter (release)
//   FC2   work items on the same ring of stages → Y (fp32, one row a route); an item's first copy
//         waits for its m-tile's count to reach n1_tiles (acquire), so FC2 fills the SMs that
//         FC1's last wave leaves idle, with no barrier between the GEMMs             → barrier
//   sum   out[t] = Σ_j Y[route_row[t, j]] in slot order (common/gather_combine.cuh combine4); CTA 0's
//         producer warpgroup zeroes the call's counters for the next call
//
// Safe without a barrier between the GEMMs because the launch is cooperative (every CTA resident)
// and FC1 items wait on nothing. The tile assignment is fixed at launch (CTA b takes work items b,
// b + grid, …): graph-safe. Until session 25 the routing ran in CTA 0 and the gather grid-wide
// inside this launch, behind two more barriers, and FC1 and FC2 were separated by a third.
// The GEMM core, the tile list, the epilogues and the top-k sum are dynamic's and generic's, so the
// results are theirs bit for bit (same rows, same summation order), and deterministic.
//
// Registers: the launch's allocation (kLaunchRegs: 168, or 80 for the two CTAs per SM at 32-row
// m-tiles), then the producer gives registers back to 40 and the consumers take them (setmaxnreg,
// as dynamic's gemm_kernel); the top-k sum runs on the consumers.
#pragma once

#include <cstdint>

#include "kernels/common/gather_combine.cuh"
#include "kernels/common/grid_barrier.cuh"
#include "kernels/dynamic.cuh"

namespace fp4moe::kernels::static_moe {

namespace dk = dynamic;

inline constexpr int kThreads = dk::kThreads;  // 384

struct Params {
  const int* num_tiles;       // the routing's m-tiles (tile_m = BM), written before this launch
  int tokens;
  MoeGemmParams fc1, fc2;     // their tile list, A and Y are the routing's, gather's and FC1's outputs
  dk::TensorMaps maps1, maps2; // fc1's and fc2's operands for the producers' tensor copies (gpu::register_path_maps)
  int n1_tiles, n2_tiles;     // weight n-tiles per m-tile (dynamic_n_tiles)
  generic::CombineParams combine;
  GridBarrier barrier;
  unsigned* fc1_done;         // [max m-tiles]: FC1 items finished per m-tile (zero between calls: CTA 0
                              // resets the call's entries once every FC2 item has read them)
  int* watchdog;              // as dynamic's gemm_kernel (tests); null in production
  unsigned long long* trace;  // diagnostics (RunArgs::trace): [grid][kTraceSlots], zeroed by the caller; null
                              // in production
};

// The trace of a CTA (Params::trace), %globaltimer ns: kernel entry and past the gather's wait
// (producer thread), the consumers' end of FC1's items, of FC2's, past the grid barrier and at the
// end; the CTA's %smid and its FC1 | FC2 << 16 item counts; then for each of its first kTraceItems
// items (FC1's, then FC2's) the producer's start of the item, its first copy (past the counter wait
// of an FC2 item) and the consumers' end of the item. GpuDiagnostics.DISABLED_StaticItems reads it.
enum : int {
  kTraceEntry,
  kTraceWaited,
  kTraceFc1End,
  kTraceFc2End,
  kTraceBarrier,
  kTraceEnd,
  kTraceSm,
  kTraceItemCounts,
  kTraceHead
};
inline constexpr int kTraceItems = 24;
inline constexpr int kTraceSlots = kTraceHead + 3 * kTraceItems;

// The same pointer, which the compiler can no longer see through: each GEMM phase derives its
// shared-memory addresses anew instead of keeping FC1's live through FC1's epilogues into FC2 (with
// them live, the f16 kernel's consumers, at 96 registers, spilled and reloaded them every stage).
template <class T>
__device__ __forceinline__ T* opaque(T* q) {
  asm volatile("" : "+l"(q));
  return q;
}

// Writes stamp v at slot `slot` of this CTA's trace, if tracing.
__device__ __forceinline__ void trace_at(const Params& p, int slot, unsigned long long v) {
  if (p.trace) p.trace[static_cast<int64_t>(blockIdx.x) * kTraceSlots + slot] = v;
}
// The slot of stamp `part` (0 producer start, 1 first copy, 2 consumers' end) of the CTA's item i, or
// null when not tracing or past kTraceItems.
__device__ __forceinline__ unsigned long long* trace_ptr(const Params& p, int i, int part) {
  if (!p.trace || i >= kTraceItems) return nullptr;
  return p.trace + static_cast<int64_t>(blockIdx.x) * kTraceSlots + kTraceHead + 3 * i + part;
}
// Writes the time now to trace_ptr(p, i, part), if any.
__device__ __forceinline__ void stamp_item(const Params& p, int i, int part) {
  if (unsigned long long* q = trace_ptr(p, i, part)) *q = ptx::globaltimer_ns();
}

template <int BM, bool kF16>
__global__ void __launch_bounds__(kThreads, dk::kCtasPerSm<BM, kF16>) static_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  dk::Smem<BM, kF16>& sm = dk::aligned_smem<dk::Smem<BM, kF16>>(smem_raw);
  if (threadIdx.x == 0) trace_at(p, kTraceEntry, ptx::globaltimer_ns());
  dk::start_cta(sm, p.fc1.nvfp4, p.fc1.bf16_words);
  // A programmatic dependent of the gather (launch_static_moe.cuh): the set-up above overlapped its
  // tail; from here on the routing's and the gather's outputs are visible.
  ptx::wait_prior_grids();
  const ptx::Watchdog wd{&sm.aborted, p.watchdog};
  const int tiles = *p.num_tiles;
  const int work1 = tiles * p.n1_tiles, work2 = tiles * p.n2_tiles;
  // This CTA's items b, b + grid, … of FC1, then of FC2, counted alike by both roles (trace slots).
  const int b = blockIdx.x, g = gridDim.x;
  uint32_t it = 0;  // the ring's stages used so far: FC2 continues where FC1 left the barriers' phases
  if (dk::take_role<BM, kF16>()) {
    if (threadIdx.x == 0) {
      trace_at(p, kTraceWaited, ptx::globaltimer_ns());
      if (p.trace) {
        unsigned smid;
        asm("mov.u32 %0, %%smid;" : "=r"(smid));
        trace_at(p, kTraceSm, smid);
      }
      // A1 came from the launches before this one (generic writes); the tensor copies read it through
      // the async proxy. A2's writers fence per item (consume_item's `done`), this thread again
      // (produce_item's `ready`).
      ptx::fence_proxy_async_global();
      int i = 0;
      for (int w = b; w < work1; w += g, ++i) {
        stamp_item(p, i, 0);
        dk::produce_item<true, BM, kF16>(p.fc1, &p.maps1, sm, p.n1_tiles, w, wd, it, nullptr, 0, trace_ptr(p, i, 1));
      }
      const int n1 = i;
      // No grid barrier between the GEMMs: an FC2 item starts once its m-tile's n1_tiles FC1 items have
      // stored their A2 rows (fc1_done), so FC2 fills the SMs that FC1's last wave leaves idle.
      for (int w = b; w < work2; w += g, ++i) {
        stamp_item(p, i, 0);
        dk::produce_item<false, BM, kF16>(p.fc2, &p.maps2, sm, p.n2_tiles, w, wd, it, p.fc1_done,
                                          static_cast<unsigned>(p.n1_tiles), trace_ptr(p, i, 1));
      }
      trace_at(p, kTraceItemCounts,
               static_cast<unsigned long long>(n1) | static_cast<unsigned long long>(i - n1) << 16);
    }
    grid_sync(p.barrier);  // every FC2 producer is past its last counter wait: the next call's are zero
    if (blockIdx.x == 0)
      for (int t = threadIdx.x; t < tiles; t += dk::kWarpgroup) p.fc1_done[t] = 0;
  } else {
    const bool stamp = p.trace && threadIdx.x == dk::kWarpgroup;  // the consumers' first thread
    int i = 0;
    for (int w = b; w < work1; w += g, ++i) {
      dk::consume_item<true, BM, kF16>(p.fc1, *opaque(&sm), p.n1_tiles, w, wd, it, p.fc1_done);
      if (stamp) stamp_item(p, i, 2);
    }
    if (stamp) trace_at(p, kTraceFc1End, ptx::globaltimer_ns());
    for (int w = b; w < work2; w += g, ++i) {
      dk::consume_item<false, BM, kF16>(p.fc2, *opaque(&sm), p.n2_tiles, w, wd, it);
      if (stamp) stamp_item(p, i, 2);
    }
    if (stamp) trace_at(p, kTraceFc2End, ptx::globaltimer_ns());
    grid_sync(p.barrier);  // Y is complete
    if (stamp) trace_at(p, kTraceBarrier, ptx::globaltimer_ns());
    // The top-k sum over the consumers of the grid: 4 columns of one token per thread.
    const int quads = p.combine.hidden / 4;
    const int64_t n = static_cast<int64_t>(p.tokens) * quads;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * dk::kConsumers * dk::kWarpgroup;
    for (int64_t q = static_cast<int64_t>(blockIdx.x) * dk::kConsumers * dk::kWarpgroup + threadIdx.x - dk::kWarpgroup;
         q < n; q += stride)
      generic::combine4(p.combine, static_cast<int>(q / quads), static_cast<int>(q % quads) * 4);
    if (stamp) trace_at(p, kTraceEnd, ptx::globaltimer_ns());
  }
}

}  // namespace fp4moe::kernels::static_moe
