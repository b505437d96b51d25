// The static backend with m-tiles of 64 routed rows (launch_static_moe.cuh).
#include "host/launch_static_moe.cuh"

namespace fp4moe::gpu {
FP4MOE_INSTANTIATE_STATIC(64)
}  // namespace fp4moe::gpu
