// The launchers of the GPU backends and their workspaces. Internal; used by gpu_runner.cpp.
// Each launcher file has the stem of its kernel header: launch_generic.cu ↔ kernels/generic.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "fp4moe/config.h"
#include "host/cuda_check.h"
#include "host/device_weights.h"

namespace fp4moe::gpu {

struct RunArgs {
  const void* x;
  const void* ids;
  IndexType ids_type;
  const float* topk_weights;
  void* out;
  int64_t tokens;
  cudaStream_t stream;
  unsigned long long* trace = nullptr;  // diagnostics of kernels that support it (direct_micro: per-phase stamps)
};

// ---- generic: routing pre-pass + grouped GEMMs + combine (any shape) ---------------------------
struct GenericWorkspace {
  GenericWorkspace(const MoeConfig& c, const DeviceWeights& w, int64_t max_tokens);
  size_t bytes() const;
  DeviceBuffer route_row, row_route, row_expert, expert_offset, tile_expert, tile_row0, num_tiles, a1, a2, y;
};
void launch_generic(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& ws, const RunArgs& a);

// ---- direct_micro: one cooperative launch for decode ---------------------------------------------
struct DirectMicroWorkspace {
  DirectMicroWorkspace(const MoeConfig& c, const DeviceWeights& w, int64_t max_tokens);
  size_t bytes() const;
  int max_routes = 0;  // routes (T·K) this workspace holds
  int grid = 0;        // co-resident CTAs of the compiled kernel on this device
  DeviceBuffer a1, a2, barrier;
};
// RunArgs::trace of direct_micro: [grid][kDirectMicroTraceStamps] %globaltimer stamps per CTA (start, setup,
// phase 0, barrier, phase 1, barrier, end).
inline constexpr int kDirectMicroTraceStamps = 7;
bool direct_micro_supports(const MoeConfig& c, int64_t tokens, std::string* why);
void launch_direct_micro(const MoeConfig& c, const DeviceWeights& w, DirectMicroWorkspace& ws, const RunArgs& a);

}  // namespace fp4moe::gpu
