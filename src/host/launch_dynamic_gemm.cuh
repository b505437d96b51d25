// The register path's GEMM launch for one m-tile width BM (kernels/dynamic.cuh). Included by one
// translation unit per BM (launch_dynamic_bm{32,64,128}.cu), which instantiates it, so the three
// pairs of kernels build in parallel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "fp4moe/errors.h"
#include "host/launch.h"
#include "kernels/dynamic.cuh"

namespace fp4moe::gpu {

template <int BM>
size_t dynamic_gemm_smem() {
  return sizeof(kernels::dynamic::Smem<BM>);
}

// The kernel instance of (FC1 or FC2, operand type): kF16 for p.f16, the NVFP4-a4 variant.
template <int BM>
const void* dynamic_gemm_kernel(bool fc1, bool f16) {
  namespace dk = kernels::dynamic;
  if (fc1) return f16 ? reinterpret_cast<const void*>(dk::gemm_kernel<true, BM, true>)
                      : reinterpret_cast<const void*>(dk::gemm_kernel<true, BM, false>);
  return f16 ? reinterpret_cast<const void*>(dk::gemm_kernel<false, BM, true>)
             : reinterpret_cast<const void*>(dk::gemm_kernel<false, BM, false>);
}

template <int BM>
void dynamic_gemm_opt_in() {
  // Above 48 KB a kernel must opt in, once per device (the caller has made the device current).
  for (const bool fc1 : {true, false})
    for (const bool f16 : {true, false})
      FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(dynamic_gemm_kernel<BM>(fc1, f16),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(dynamic_gemm_smem<BM>())));
}

template <int BM>
void launch_dynamic_gemm_bm(const DynamicWorkspace& ws, const kernels::MoeGemmParams& p, bool fc1, int64_t tiles,
                            int* watchdog, cudaStream_t s) {
  const int n_tiles = dynamic_n_tiles(p, fc1);
  const int64_t work = tiles * n_tiles;
  if (work == 0) return;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ws.sms, work));
  const size_t smem = dynamic_gemm_smem<BM>();
  FP4MOE_REQUIRE(!p.f16 || (p.nvfp4 && p.block == 16), InvalidArgument, "f16",
                 "dynamic's f16 register path reads NVFP4 weights (block 16), got ", p.nvfp4 ? "NVFP4" : "MX",
                 " with block ", p.block);
  kernels::MoeGemmParams args = p;
  int n = n_tiles;
  void* argv[] = {&args, &n, &watchdog};
  FP4MOE_CUDA_CHECK(cudaLaunchKernel(dynamic_gemm_kernel<BM>(fc1, p.f16), dim3(grid), dim3(kernels::dynamic::kThreads),
                                     argv, smem, s));
}

// One translation unit's instantiations for BM.
#define FP4MOE_INSTANTIATE_DYNAMIC_GEMM(BM)                                                                      \
  template size_t dynamic_gemm_smem<BM>();                                                                      \
  template void dynamic_gemm_opt_in<BM>();                                                                      \
  template void launch_dynamic_gemm_bm<BM>(const DynamicWorkspace&, const kernels::MoeGemmParams&, bool, int64_t, \
                                           int*, cudaStream_t);

}  // namespace fp4moe::gpu
