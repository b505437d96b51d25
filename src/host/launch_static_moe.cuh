// The static backend's launch for one m-tile width BM (kernels/static_moe.cuh). Included by one
// translation unit per BM (launch_static_moe_bm{32,64}.cu), which instantiates it, so the kernels
// build in parallel.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "fp4moe/errors.h"
#include "host/launch.h"
#include "host/launch_dynamic_gemm.cuh"  // dynamic_gemm_smem: the CTA is the register path's
#include "kernels/static_moe.cuh"

namespace fp4moe::gpu {

template <int BM>
const void* static_kernel_for(bool f16) {
  namespace sk = kernels::static_moe;
  return f16 ? reinterpret_cast<const void*>(sk::static_kernel<BM, true>)
             : reinterpret_cast<const void*>(sk::static_kernel<BM, false>);
}

// Once per device (the caller has made it current): opts both variants into their shared memory and
// checks what the cooperative launch and the register hand-over assume. Returns why they cannot run
// here (empty: they can).
template <int BM>
std::string static_opt_in() {
  require_tensor_map_encoder();  // looked up here, outside any stream capture
  for (const bool f16 : {true, false}) {
    const void* k = static_kernel_for<BM>(f16);
    const std::string name = "static_kernel (BM " + std::to_string(BM) + (f16 ? ", f16)" : ", bf16)");
    if (std::string why = register_path_opt_in<BM>(k, f16, name); !why.empty()) return why;
    // Every CTA of the grid (kCtasPerSm per SM) must be resident at once for the grid barriers.
    const int per_sm = register_path_ctas_per_sm<BM>(f16);
    int n = 0;
    FP4MOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kernels::static_moe::kThreads,
                                                                    dynamic_gemm_smem<BM>(f16)));
    if (n < per_sm)
      return name + " fits " + std::to_string(n) + " CTAs per SM, its grid needs " + std::to_string(per_sm);
  }
  return {};
}

template <int BM>
void launch_static_bm(const kernels::static_moe::Params& p, int sms, cudaStream_t s) {
  const bool f16 = p.fc1.f16;
  const int per_sm = register_path_ctas_per_sm<BM>(f16);
  kernels::static_moe::Params args = p;
  void* argv[] = {&args};
  // Cooperative (the grid barrier needs every CTA resident) and a programmatic dependent of the
  // gather (the CTAs' set-up overlaps the gather's tail).
  const DependentLaunch l(dim3(static_cast<unsigned>(sms * per_sm)), dim3(kernels::static_moe::kThreads),
                          dynamic_gemm_smem<BM>(f16), s, /*dependent=*/true, /*cooperative=*/true);
  FP4MOE_CUDA_CHECK(cudaLaunchKernelExC(&l.config, static_kernel_for<BM>(f16), argv));
}

#define FP4MOE_INSTANTIATE_STATIC(BM)                 \
  template std::string static_opt_in<BM>();           \
  template void launch_static_bm<BM>(const kernels::static_moe::Params&, int, cudaStream_t);

}  // namespace fp4moe::gpu
