// One-line wrappers over the PTX the kernels use. Each says what it does and on which shapes.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "fp4moe/formats.h"

namespace fp4moe::kernels::ptx {

// Programmatic dependent launch (sm_90). A kernel launched with the programmatic-serialization
// attribute (host: launch.h DependentLaunch) may start while the kernel before it in the stream is still
// running, once every CTA of that kernel has called launch_dependents() or exited; wait_prior_grids()
// then blocks until the kernels before it have completed and their memory is visible. A kernel so
// launched must call wait_prior_grids() in every CTA before it touches memory the kernels before it
// write or read (and before any early exit: the kernel after it counts on its completion meaning its
// predecessors' too). Both are no-ops where no such launch is involved.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void wait_prior_grids() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// Shared-memory address of a generic pointer (for ldmatrix / cp.async operands).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Loads from a shared-memory address (smem_addr), for loops that keep their addresses as 32-bit
// offsets rather than convert a generic pointer at every use.
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u16(uint32_t a) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(a));
  return v;
}

// 16-byte global → shared copy that bypasses registers (sm_80+). src_bytes < 16 zero-fills the rest.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Bulk copy (sm_90, TMA engine without a tensor map): `bytes` contiguous bytes global → shared,
// both 16-byte aligned, bytes a multiple of 16; completes `bytes` transactions on the shared
// mbarrier `bar` (mbarrier.cuh: mbar_arrive_expect_tx first). The data arrives through the async
// proxy, so wgmma may read it once the barrier's phase completes, without a proxy fence.
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// Tensor copy (sm_90 TMA, 2-D tensor map): the box at element coordinates (c0, c1) of the map's
// tensor (c0 the contiguous dimension) → shared memory at `smem`, laid out and swizzled as the map
// says (a 128B swizzle needs `smem` 1024-byte aligned); elements outside the tensor arrive as zeros.
// Completes the box's bytes on the mbarrier `bar` (mbar_arrive_expect_tx first), through the async
// proxy like bulk_copy_g2s. `tmap`: the address of a __grid_constant__ CUtensorMap parameter.
__device__ __forceinline__ void tma_load_2d(void* smem, const void* tmap, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}

// Tensor copy through a 3-D tensor map: the box at element coordinates (c0, c1, c2), c0 the contiguous
// dimension, otherwise as tma_load_2d (no swizzle needs `smem` 128-byte aligned).
__device__ __forceinline__ void tma_load_3d(void* smem, const void* tmap, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}

// A request that L2 fetch the box at (c0, c1, c2) of a 3-D tensor map (no shared memory, no barrier).
// Used by the stream diagnostics only: prefetching the weights inside the register path's stream
// measured slower (bench/results/NOTES.md, session 25).
__device__ __forceinline__ void tma_prefetch_l2_3d(const void* tmap, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tmap)),
               "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

// ldmatrix.x4: four 8x8 b16 matrices; lane l supplies the row address of matrix l/8, row l%8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row)));
}

// D = A·B + D, m16n8k16, bf16 inputs (f16 with kF16), fp32 accumulators. A: 4 regs (row-major
// 16x16), B: 2 regs (col-major 16x8), C/D: 4 floats — rows lane/4 and lane/4+8, columns
// 2·(lane%4) + {0, 1}.
template <bool kF16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#define FP4MOE_MMA_16816(TYPES)                                                                          \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPES ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, " \
               "{%0,%1,%2,%3};\n"                                                                        \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
  if constexpr (kF16) FP4MOE_MMA_16816("f16.f16");
  else FP4MOE_MMA_16816("bf16.bf16");
#undef FP4MOE_MMA_16816
}

// Two E4M3 bytes (the low, kHi = false, or high 16 bits of v) → f16x2, exact (sm_89+;
// fmt::e4m3x2_to_f16x2_bits).
template <bool kHi>
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  return fmt::e4m3x2_to_f16x2_bits<kHi>(v);
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// Acquire / release accesses at GPU scope, for the grid barrier and static's per-m-tile counters.
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// *p += v with release semantics at GPU scope (no value returned): a counter others acquire.
__device__ __forceinline__ void red_release_gpu_add(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

}  // namespace fp4moe::kernels::ptx
