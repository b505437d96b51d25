// tools/gpu_kernels.h — small device helpers shared by ceilings.cu, gpu_timing.cu and
// peer_cublas.cu (defined in gpu_timing.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace fp4moe::cli {

// Reads `bytes` (a multiple of 16, 16-byte aligned) with 16-byte non-coherent loads, four in flight
// per thread; writes to *sink only if the XOR of everything read hits a magic value (so the loads
// cannot be optimised away, and practically nothing is written).
void launch_read_stream(const void* p, size_t bytes, unsigned* sink, int grid, cudaStream_t stream);
// Grid for launch_read_stream: resident blocks per SM (from occupancy, at most 8) × SMs.
int read_stream_grid(int device);

// Fill with pseudo-random values from a counter hash (no zeros, no NaN):
//   bf16 uniform in [-scale, scale]; e4m3 random finite bytes.
void launch_fill_bf16(void* p, size_t count, float scale, uint64_t seed, cudaStream_t stream);
void launch_fill_e4m3(void* p, size_t count, uint64_t seed, cudaStream_t stream);

}  // namespace fp4moe::cli
