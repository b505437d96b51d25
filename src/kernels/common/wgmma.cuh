// Inline PTX of Hopper's warpgroup MMA (wgmma) and the proxy fence its shared-memory operands need.
// sm_90a only. Operand layouts and descriptors: wgmma_layout.h.
//
// Rules the callers follow (PTX ISA 9.7.15 "wgmma"):
//   * wgmma.mma_async is issued by all 128 threads of a warpgroup; it runs asynchronously and owns
//     its accumulator registers until a wgmma.wait_group says its group is complete. Nothing may
//     touch those registers in between: fence_operand() keeps the compiler from moving accesses
//     across, fence() (wgmma.fence) orders earlier register writes before the next wgmma.
//   * The tensor cores read shared memory through the *async proxy*. Data written there with
//     ordinary stores or (non-bulk) cp.async belongs to the generic proxy, so the writer must issue
//     fence.proxy.async.shared::cta after its writes and before the synchronisation (our mbarrier
//     arrive) that the wgmma-issuing threads wait on (PTX ISA 8.6 "Proxies", "fence.proxy.async").
#pragma once

#include <cstdint>

namespace fp4moe::kernels::ptx {

// Make this thread's generic-proxy writes to shared memory visible to later async-proxy reads
// (wgmma operands, TMA stores) that are ordered after it by synchronisation.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// wgmma.fence: order this warpgroup's earlier register/shared accesses before the wgmma that follow.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Close the group of wgmma issued since the last commit.
// Warpgroup register reallocation (sm_90a): a warpgroup gives registers back (dec) or takes them
// (inc); every warp of the warpgroup executes it. Counts are multiples of 8 in [24, 256].
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most N committed groups are still pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7");
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Compiler-only fence on accumulator registers: no access to them moves across this point.
template <int N>
__device__ __forceinline__ void fence_operand(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D(64 × 128, fp32) = A(64 × 16, bf16, shared, K-major) · B(16 × 128: 128 rows × 16 k, bf16, shared,
// K-major)ᵀ + (accumulate ? D : 0). One warpgroup; d is this thread's accumulator fragment
// (wgmma_layout.h: acc_row / acc_col). Immediates: scale-a = scale-b = 1, no transpose (K-major).
__device__ __forceinline__ void mma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D(64 × 128, fp32) = A(64 × 16, registers) · B(16 × 128: 128 rows × 16 k, shared, K-major)ᵀ +
// (accumulate ? D : 0); A and B bf16, or f16 (kF16). A is this thread's fragment in the m16n8k16
// layout of its warp's 16 rows (common/frag_dequant.cuh); the registers are read asynchronously, so
// they must not change until a wgmma_wait covers this instruction's group.
template <bool kF16>
__device__ __forceinline__ void mma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                  int accumulate) {
#define FP4MOE_WGMMA_RS(TYPES)                                                                              \
  asm volatile(                                                                                             \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                           \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPES " {"                                             \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                              \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                    \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                    \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                      \
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"                                                      \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),     \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),            \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),          \
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),          \
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),          \
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),          \
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),          \
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),          \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])           \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
  if constexpr (kF16) FP4MOE_WGMMA_RS("f16.f16");
  else FP4MOE_WGMMA_RS("bf16.bf16");
#undef FP4MOE_WGMMA_RS
}

}  // namespace fp4moe::kernels::ptx
