// Build facts and device discovery for `fp4moe info`.
#include <cuda_runtime_api.h>

#include "fp4moe/runner.h"
#include "fp4moe_git_commit.h"  // generated at build time (cmake/git_commit.cmake)

namespace fp4moe {

BuildInfo build_info() { return {FP4MOE_VERSION, FP4MOE_GIT_COMMIT, FP4MOE_CUDA_VERSION, "sm_90a"}; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return n;
}

}  // namespace fp4moe
