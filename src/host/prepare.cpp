// prepare_weights: validate the checkpoint once, keep the canonical host form and/or upload the
// device layouts.
#include "fp4moe/errors.h"
#include "fp4moe/weights.h"
#include "host/device_weights.h"
#include "host/prepared.h"

namespace fp4moe {

const MoeConfig& PreparedWeights::config() const {
  FP4MOE_REQUIRE(impl_ != nullptr, InvalidArgument, "weights", "PreparedWeights is empty");
  return impl_->config;
}

int PreparedWeights::device() const { return config(), impl_->device; }

bool PreparedWeights::has_host() const { return impl_ && impl_->host.has_value(); }

const QuantizedCheckpoint& PreparedWeights::host() const {
  FP4MOE_REQUIRE(has_host(), Unsupported, "weights",
                 "no host copy was kept (prepare with device = -1 or keep_host_copy = true)");
  return *impl_->host;
}

size_t PreparedWeights::device_bytes() const { return config(), impl_->dev ? impl_->dev->bytes : 0; }

PreparedWeights prepare_weights(const MoeConfig& config, const CheckpointView& checkpoint,
                                const PrepareOptions& options) {
  FP4MOE_REQUIRE(options.device >= -1, InvalidArgument, "options.device",
                 "must be -1 (host) or a CUDA device ordinal, got ", options.device);
  FP4MOE_REQUIRE(options.host_threads >= 0, InvalidArgument, "options.host_threads",
                 "must be 0 (all hardware threads) or a positive thread count, got ", options.host_threads);
  auto impl = std::make_shared<PreparedWeights::Impl>();
  impl->config = config;
  impl->device = options.device;
  QuantizedCheckpoint canonical = canonicalize(config, checkpoint, options.host_threads);  // validates config too
  if (options.device >= 0) impl->dev = gpu::upload_weights(config, canonical, options.device, options.host_threads);
  if (options.device < 0 || options.keep_host_copy) impl->host = std::move(canonical);
  return PreparedWeights(std::move(impl));
}

}  // namespace fp4moe
