// dynamic's register-path GEMM with m-tiles of 16 routed rows (launch_dynamic_gemm.cuh): up to 8
// routed rows per expert (launch_dynamic.cu dynamic_tile_m).
#include "host/launch_dynamic_gemm.cuh"

namespace fp4moe::gpu {
FP4MOE_INSTANTIATE_DYNAMIC_GEMM(16)
}  // namespace fp4moe::gpu
