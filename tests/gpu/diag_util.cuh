// Helpers of the GpuDiagnostics traces (test_direct_micro_trace.cu, test_static_trace.cu): evict the
// weights from L2 the way the bench does, and keep the SMs' clocks up before a traced launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>

#include "gpu/gpu_util.h"

namespace fp4moe::testgpu {

// Streams an unrelated buffer (4× the L2) through the SMs, as the bench's L2 flush does.
static __global__ void flush_read(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x)
    acc ^= __ldcs(p + i).x;
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads; practically never taken
}

// Busy every SM for `ns` nanoseconds, so the clocks are up when the traced launch runs.
static __global__ void spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (t - t0 < ns);
}

// An unrelated buffer of 4× the device's L2 and its flush (flush_read over it).
struct L2Flusher {
  L2Flusher() : n(bytes_of_l2() * 4 / sizeof(uint4)), buf(n), sink(1) {
    if (cudaMemset(buf.get(), 0x5A, n * sizeof(uint4)) != cudaSuccess) throw std::runtime_error("L2Flusher: memset");
  }
  void run() const { flush_read<<<1056, 256>>>(buf.get(), n, sink.get()); }
  static size_t bytes_of_l2() {
    int dev = 0, l2 = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess)
      throw std::runtime_error("L2Flusher: device attributes");
    return static_cast<size_t>(l2);
  }
  size_t n;
  DeviceArray<uint4> buf;
  DeviceArray<unsigned> sink;
};

}  // namespace fp4moe::testgpu
