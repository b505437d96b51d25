// PreparedWeights::Impl — what a prepared set of weights holds. Internal.
#pragma once

#include <memory>
#include <optional>

#include "fp4moe/weights.h"
#include "host/gpu_backend.h"

namespace fp4moe {

struct PreparedWeights::Impl {
  MoeConfig config;
  int device = -1;                              // -1: host
  std::optional<QuantizedCheckpoint> host;      // canonical form (host device, or keep_host_copy)
  std::shared_ptr<const gpu::DeviceWeights> dev;  // device layouts (device >= 0)
};

}  // namespace fp4moe
