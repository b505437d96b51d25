// Temporary: the GPU backends are not built yet (issue 3). Every entry point says so.
#include "fp4moe/errors.h"
#include "host/gpu_backend.h"

namespace fp4moe::gpu {

std::shared_ptr<const DeviceWeights> upload_weights(const MoeConfig&, const QuantizedCheckpoint&, int) {
  throw Unsupported("options.device", "options.device: GPU backends are not built in this version");
}

std::unique_ptr<Runner> make_runner(const MoeConfig&, std::shared_ptr<const DeviceWeights>, const RunnerOptions&, int) {
  throw Unsupported("options.device", "options.device: GPU backends are not built in this version");
}

}  // namespace fp4moe::gpu
