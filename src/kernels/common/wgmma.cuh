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

// Make this thread's generic-proxy writes to global memory visible to later async-proxy reads (TMA
// and bulk copies) that are ordered after it by synchronisation: the static backend's producers
// read A1 and A2 by tensor copy after the grid barrier that follows their generic writes.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
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

// Accumulator operands of the wrappers below. wgmma names its N/2 fp32 accumulators in one brace
// list; these spell out the register names %i of such a list and the matching "+f" operands of the
// accumulator array d, 64 at a time.
#define FP4MOE_WGMMA_D_REGS_0_63 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FP4MOE_WGMMA_D_REGS_64_127 \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define FP4MOE_WGMMA_D8(i)                                                                                 \
  "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), \
      "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define FP4MOE_WGMMA_D64(i)                                                                                \
  FP4MOE_WGMMA_D8(i), FP4MOE_WGMMA_D8((i) + 8), FP4MOE_WGMMA_D8((i) + 16), FP4MOE_WGMMA_D8((i) + 24),     \
      FP4MOE_WGMMA_D8((i) + 32), FP4MOE_WGMMA_D8((i) + 40), FP4MOE_WGMMA_D8((i) + 48), FP4MOE_WGMMA_D8((i) + 56)

// D(64 × 128, fp32) = A(64 × 16, bf16, shared, K-major) · B(16 × 128: 128 rows × 16 k, bf16, shared,
// K-major)ᵀ + (accumulate ? D : 0). One warpgroup; d is this thread's accumulator fragment
// (wgmma_layout.h: acc_row / acc_col). Immediates: scale-a = scale-b = 1, no transpose (K-major).
__device__ __forceinline__ void mma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" FP4MOE_WGMMA_D_REGS_0_63
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : FP4MOE_WGMMA_D64(0)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The same with N = 256 (B: 256 rows × 16 k): d holds 128 floats, acc_row / acc_col (wgmma_layout.h)
// with i in [0, 128); floats [64h, 64h + 64) are columns [128h, 128h + 128).
__device__ __forceinline__ void mma_m64n256k16_bf16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" FP4MOE_WGMMA_D_REGS_0_63 ", " FP4MOE_WGMMA_D_REGS_64_127
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : FP4MOE_WGMMA_D64(0), FP4MOE_WGMMA_D64(64)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D(64 × N, fp32) = A(64 × 16, registers) · B(16 × N: N rows × 16 k, shared, K-major)ᵀ +
// (accumulate ? D : 0) for N = 8, 16, 32, 64, 96 or 128 (8: only GpuDiagnostics' rate probe); A and B bf16, or both f16 (kF16: the NVFP4-a4
// register path, frag_a_f16). 96: dynamic's narrow MMAs (consume_item's kNarrow). A is this thread's
// fragment in the m16n8k16 layout of its warp's 16 rows (common/frag_dequant.cuh); the registers are
// read asynchronously, so they must not change until a wgmma_wait covers this instruction's group.
// d: N / 2 floats (acc_row / acc_col).
#define FP4MOE_WGMMA_D_REGS_0_3 "%0, %1, %2, %3"
#define FP4MOE_WGMMA_D_REGS_0_7 "%0, %1, %2, %3, %4, %5, %6, %7"
#define FP4MOE_WGMMA_D_REGS_0_15 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define FP4MOE_WGMMA_D_REGS_0_31 \
    FP4MOE_WGMMA_D_REGS_0_15 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FP4MOE_WGMMA_D_REGS_0_47 \
    FP4MOE_WGMMA_D_REGS_0_31 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define FP4MOE_WGMMA_D4(i) "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3])
#define FP4MOE_WGMMA_D16(i) FP4MOE_WGMMA_D8(i), FP4MOE_WGMMA_D8((i) + 8)
#define FP4MOE_WGMMA_D32(i) FP4MOE_WGMMA_D16(i), FP4MOE_WGMMA_D16((i) + 16)
#define FP4MOE_WGMMA_D48(i) FP4MOE_WGMMA_D32(i), FP4MOE_WGMMA_D16((i) + 32)
// SHAPE: the instruction's; TYPES: its D.A.B types; DREGS: its accumulator registers; A, DESC, ACC:
// the operand numbers that follow them; the variadic rest: the accumulator operands (a list of
// commas, so it goes last, where a second macro can pass it on as __VA_ARGS__).
#define FP4MOE_WGMMA_RS(SHAPE, TYPES, DREGS, A, DESC, ACC, ...)                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n"                                              \
               "wgmma.mma_async.sync.aligned." SHAPE TYPES " {" DREGS "}, {" A "}, " DESC                      \
               ", p, 1, 1, 0;\n}\n"                                                                            \
               : __VA_ARGS__                                                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
// The same instruction with kF16's operand types: ".f32.f16.f16" or ".f32.bf16.bf16".
#define FP4MOE_WGMMA_RS_TYPED(SHAPE, DREGS, A, DESC, ACC, ...)                   \
  if constexpr (kF16) FP4MOE_WGMMA_RS(SHAPE, ".f32.f16.f16", DREGS, A, DESC, ACC, __VA_ARGS__); \
  else FP4MOE_WGMMA_RS(SHAPE, ".f32.bf16.bf16", DREGS, A, DESC, ACC, __VA_ARGS__)
template <int N, bool kF16 = false>
__device__ __forceinline__ void mma_m64nNk16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                                int accumulate) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 96 || N == 128, "the register path's tile widths");
  if constexpr (N == 128) {
    FP4MOE_WGMMA_RS_TYPED("m64n128k16", FP4MOE_WGMMA_D_REGS_0_63, "%64, %65, %66, %67", "%68", "%69",
                          FP4MOE_WGMMA_D64(0));
  } else if constexpr (N == 96) {
    FP4MOE_WGMMA_RS_TYPED("m64n96k16", FP4MOE_WGMMA_D_REGS_0_47, "%48, %49, %50, %51", "%52", "%53",
                          FP4MOE_WGMMA_D48(0));
  } else if constexpr (N == 64) {
    FP4MOE_WGMMA_RS_TYPED("m64n64k16", FP4MOE_WGMMA_D_REGS_0_31, "%32, %33, %34, %35", "%36", "%37",
                          FP4MOE_WGMMA_D32(0));
  } else if constexpr (N == 32) {
    FP4MOE_WGMMA_RS_TYPED("m64n32k16", FP4MOE_WGMMA_D_REGS_0_15, "%16, %17, %18, %19", "%20", "%21",
                          FP4MOE_WGMMA_D16(0));
  } else if constexpr (N == 16) {
    FP4MOE_WGMMA_RS_TYPED("m64n16k16", FP4MOE_WGMMA_D_REGS_0_7, "%8, %9, %10, %11", "%12", "%13", FP4MOE_WGMMA_D8(0));
  } else {
    FP4MOE_WGMMA_RS_TYPED("m64n8k16", FP4MOE_WGMMA_D_REGS_0_3, "%4, %5, %6, %7", "%8", "%9", FP4MOE_WGMMA_D4(0));
  }
}
#undef FP4MOE_WGMMA_RS_TYPED
#undef FP4MOE_WGMMA_RS
#undef FP4MOE_WGMMA_D48
#undef FP4MOE_WGMMA_D32
#undef FP4MOE_WGMMA_D16
#undef FP4MOE_WGMMA_D4
#undef FP4MOE_WGMMA_D_REGS_0_47
#undef FP4MOE_WGMMA_D_REGS_0_31
#undef FP4MOE_WGMMA_D_REGS_0_15
#undef FP4MOE_WGMMA_D_REGS_0_7
#undef FP4MOE_WGMMA_D_REGS_0_3

#undef FP4MOE_WGMMA_D64
#undef FP4MOE_WGMMA_D8
#undef FP4MOE_WGMMA_D_REGS_64_127
#undef FP4MOE_WGMMA_D_REGS_0_63

}  // namespace fp4moe::kernels::ptx
