// A software grid barrier for cooperative launches (reference §4.0, F4).
//
// State is two words in global memory, zeroed once when the workspace is created: `count` (CTAs
// arrived in the current phase) and `epoch` (phases completed). The last CTA to arrive resets
// count to 0 *before* it publishes epoch + 1 with release semantics, and every CTA read the epoch
// before arriving; so count is 0 again whenever any CTA can see the new epoch, and the same two
// words serve every later barrier, launch and graph replay without re-initialisation.
// Safe only when every CTA of the grid is resident: launch cooperatively, with a grid no larger
// than the kernel's occupancy (the host launcher checks).
#pragma once

#include "kernels/common/ptx.cuh"

namespace fp4moe::kernels {

struct GridBarrier {
  unsigned* count;
  unsigned* epoch;
};

__device__ __forceinline__ void grid_sync(const GridBarrier& b) {
  // Every thread makes its own writes visible at GPU scope before the CTA arrives, rather than
  // relying on thread 0's fence being cumulative over the CTA's writes through bar.sync.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    const unsigned expected = gridDim.x * gridDim.y * gridDim.z;
    const unsigned epoch = ptx::ld_acquire_gpu(b.epoch);
    __threadfence();  // this CTA's writes are visible before it is counted
    if (atomicAdd(b.count, 1u) + 1 == expected) {
      atomicExch(b.count, 0u);
      __threadfence();
      ptx::st_release_gpu(b.epoch, epoch + 1);
    } else {
      while (ptx::ld_acquire_gpu(b.epoch) == epoch) __nanosleep(64);
    }
  }
  __syncthreads();
}

}  // namespace fp4moe::kernels
