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

template <int BM>
void dynamic_gemm_opt_in() {
  // Above 48 KB a kernel must opt in, once per device (the caller has made the device current).
  FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(kernels::dynamic::gemm_kernel<true, BM>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(dynamic_gemm_smem<BM>())));
  FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(kernels::dynamic::gemm_kernel<false, BM>,
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
  if (fc1) {
    kernels::dynamic::gemm_kernel<true, BM><<<grid, kernels::dynamic::kThreads, smem, s>>>(p, n_tiles, watchdog);
    FP4MOE_CHECK_LAUNCH("dynamic::gemm_kernel<fc1>");
  } else {
    kernels::dynamic::gemm_kernel<false, BM><<<grid, kernels::dynamic::kThreads, smem, s>>>(p, n_tiles, watchdog);
    FP4MOE_CHECK_LAUNCH("dynamic::gemm_kernel<fc2>");
  }
}

// One translation unit's instantiations for BM.
#define FP4MOE_INSTANTIATE_DYNAMIC_GEMM(BM)                                                                      \
  template size_t dynamic_gemm_smem<BM>();                                                                      \
  template void dynamic_gemm_opt_in<BM>();                                                                      \
  template void launch_dynamic_gemm_bm<BM>(const DynamicWorkspace&, const kernels::MoeGemmParams&, bool, int64_t, \
                                           int*, cudaStream_t);

}  // namespace fp4moe::gpu
