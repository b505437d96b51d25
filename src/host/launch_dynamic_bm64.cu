// dynamic's register-path GEMM with m-tiles of 64 routed rows (launch_dynamic_gemm.cuh).
#include "host/launch_dynamic_gemm.cuh"

namespace fp4moe::gpu {
FP4MOE_INSTANTIATE_DYNAMIC_GEMM(64)
}  // namespace fp4moe::gpu
