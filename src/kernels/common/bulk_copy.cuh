// Hopper's bulk asynchronous copies (the TMA engine without a tensor map) and the mbarrier
// transaction count that tracks them. sm_90 only.
//
// PTX ISA 9.7.9.25 "cp.async.bulk" and 9.7.13.15 "mbarrier": one thread moves `bytes` (a multiple of
// 16; both addresses 16-byte aligned) from global to shared memory; on completion the copy performs
// complete-tx(bytes) on the given mbarrier. A phase of that mbarrier completes once its pending
// arrivals are zero *and* its transaction count is back to zero, so the issuing side announces the
// bytes with arrive.expect_tx before (or while) the copies run, and the readers' ordinary try_wait
// then also sees the copied data (the copies write through the async proxy; completion through the
// mbarrier makes them visible to the waiting threads).
#pragma once

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace fp4moe::kernels::ptx {

// After mbarrier.init, before the barriers are used by bulk copies: makes the initialisation visible
// to the async proxy (the copies' complete-tx). Then a __syncthreads publishes it to the CTA.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}

// One arrival on `bar` that also raises its expected transaction count by `bytes`.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// Global → shared bulk copy of `bytes` (multiple of 16, 16-byte aligned ends), completing on `bar`.
// The destination is this CTA's shared memory (a shared::cta address is a valid shared::cluster
// address of the executing CTA, also without a cluster launch).
__device__ __forceinline__ void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(smem_dst)),
               "l"(gmem_src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

}  // namespace fp4moe::kernels::ptx
