// `fp4moe info`: the build and the GPUs this process can see. Never fails for want of a GPU.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>

#include "commands.h"
#include "fp4moe/runner.h"
#include "gpu.h"

namespace fp4moe::cli {

int run_info(const Args&) {
  const BuildInfo b = build_info();
  std::printf("fp4moe %s (commit %s), built with CUDA %s for %s\n", b.version, b.git_commit, b.cuda_version,
              b.cuda_archs);
  int runtime = 0, driver = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  std::printf("CUDA runtime %d.%d, driver %s\n", runtime / 1000, (runtime % 1000) / 10,
              driver ? (std::to_string(driver / 1000) + "." + std::to_string((driver % 1000) / 10)).c_str()
                     : "none found");
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    std::printf("no CUDA device (%s%s%s): check and bench will use the CPU reference backend\n",
                err != cudaSuccess ? "cudaGetDeviceCount: " : "", err != cudaSuccess ? cudaGetErrorString(err) : "",
                err != cudaSuccess ? "" : "0 devices");
    (void)cudaGetLastError();
    return 0;
  }
  std::printf("%d CUDA device%s:\n", n, n == 1 ? "" : "s");
  for (int d = 0; d < n; ++d) {
    try {
      const GpuFacts f = gpu_facts(d);
      std::printf("  [%d] %s: sm_%d%d, %d SMs, %.1f GiB, L2 %.1f MiB, SM clock max %d MHz, memory %d MHz x %d-bit "
                  "(%.2f TB/s peak)%s\n",
                  d, f.name.c_str(), f.cc_major, f.cc_minor, f.sms, f.memory_gib, f.l2_mib, f.sm_clock_max_mhz,
                  f.mem_clock_mhz, f.bus_bits, f.peak_dram_tbs(),
                  f.cc_major == 9 && f.cc_minor == 0 ? "" : "  [this build's kernels target sm_90a only]");
    } catch (const std::exception& e) {
      std::printf("  [%d] unreadable: %s\n", d, e.what());
    }
  }
  return 0;
}

}  // namespace fp4moe::cli
