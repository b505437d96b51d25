// The boundary between the host layer and the GPU backends. Internal.
//
// The host layer (runner.cpp, prepare.cpp) validates everything user-facing and then calls only
// these functions; everything behind them lives in src/host/launch_*.cu and src/kernels/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fp4moe/config.h"
#include "fp4moe/runner.h"
#include "fp4moe/weights.h"

namespace fp4moe::gpu {

// Weights in the layouts the kernels read, on one device. Defined in src/host/device_weights.h.
struct DeviceWeights;

// Repack the canonical host form once (on up to `threads` host threads, 0: all) and upload it to
// `device`.
std::shared_ptr<const DeviceWeights> upload_weights(const MoeConfig& config, const QuantizedCheckpoint& canonical,
                                                    int device, int threads = 0);

// Workspace and launches for one runner on one device. Created once per MoeRunner; run() allocates
// nothing and never synchronises.
class Runner {
 public:
  virtual ~Runner() = default;
  // Throws Unsupported when `backend` cannot run T tokens of this config (never falls back).
  virtual void run(Backend backend, const void* x, const void* topk_ids, IndexType ids_type,
                   const float* topk_weights, void* out, int64_t num_tokens, CUstream_st* stream) = 0;
  // The backend kAuto resolves to for T tokens.
  virtual Backend select(int64_t num_tokens) const = 0;
  // Whether `backend` can run T tokens of this config; `why` says why not.
  virtual bool supports(Backend backend, int64_t num_tokens, std::string* why) const = 0;
  virtual size_t workspace_bytes() const = 0;
  // Whether `backend` running T tokens dequantises the weights once into the bf16 copy.
  virtual bool uses_bf16_copy(Backend backend, int64_t num_tokens) const = 0;
};

std::unique_ptr<Runner> make_runner(const MoeConfig& config, std::shared_ptr<const DeviceWeights> weights,
                                    const RunnerOptions& options, int device);

}  // namespace fp4moe::gpu
