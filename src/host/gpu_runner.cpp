// The GPU runner: owns the workspaces, chooses the backend per call, launches.
#include <memory>

#include "fp4moe/errors.h"
#include "host/gpu_backend.h"
#include "host/launch.h"

namespace fp4moe::gpu {
namespace {

// Decode cutover: direct_micro up to this many routes (T·K, its capacity), generic above. Source:
// bench/results/h200-decode-sweep-20261202.md — direct_micro (commit "direct_micro v2") was 1.6–4.0×
// faster than generic at every point of T = 1…64 on qwen3-30b-a3b, mixtral-8x7b, gpt-oss-120b and
// llama4-scout (T·K up to 512), and passed `fp4moe check` on five named shapes at T = 1, 7, 64.
constexpr int64_t kDirectMicroMaxRoutes = 512;

class GpuRunner final : public Runner {
 public:
  GpuRunner(const MoeConfig& c, std::shared_ptr<const DeviceWeights> w, const RunnerOptions& o, int device)
      : c_(c), w_(std::move(w)), device_(device) {
    FP4MOE_REQUIRE(w_ != nullptr, InvalidArgument, "weights", "no device weights");
    FP4MOE_REQUIRE(w_->device == device, InvalidArgument, "weights", "prepared for device ", w_->device,
                   ", runner on device ", device);
    DeviceGuard guard(device_);
    generic_ = std::make_unique<GenericWorkspace>(c, *w_, o.max_tokens);
    // direct_micro's workspace only where a call can reach it: forced, or picked by kAuto.
    const bool dm_reachable =
        o.backend == Backend::kDirectMicro || (o.backend == Backend::kAuto && kDirectMicroMaxRoutes > 0);
    if (dm_reachable && direct_micro_supports(c, 1, nullptr))
      dm_ = std::make_unique<DirectMicroWorkspace>(c, *w_, o.max_tokens);
    // dynamic (prefill, wgmma): forced only until verified on the GPU; kAuto never picks it.
    if (o.backend == Backend::kDynamic) dyn_ = std::make_unique<DynamicWorkspace>(device_);
  }

  Backend select(int64_t T) const override {
    if (dm_ && T * c_.top_k <= kDirectMicroMaxRoutes && direct_micro_supports(c_, T, nullptr))
      return Backend::kDirectMicro;
    return Backend::kGeneric;
  }

  bool supports(Backend b, int64_t T, std::string* why) const override {
    switch (b) {
      case Backend::kGeneric: return true;
      case Backend::kDirectMicro:
        if (!dm_) {
          if (why) *why = "direct_micro is only built for runners created with backend = kDirectMicro";
          return false;
        }
        return direct_micro_supports(c_, T, why);
      case Backend::kDynamic:
        if (!dyn_) {
          if (why) *why = "dynamic is only built for runners created with backend = kDynamic";
          return false;
        }
        return dynamic_supports(*dyn_, why);
      default:
        if (why) *why = "this backend is not built yet";
        return false;
    }
  }

  size_t workspace_bytes() const override {
    return generic_->bytes() + (dm_ ? dm_->bytes() : 0) + (dyn_ ? dyn_->bytes() : 0);
  }

  void run(Backend backend, const void* x, const void* ids, IndexType ids_type, const float* topk_weights, void* out,
           int64_t T, CUstream_st* stream) override {
    std::string why;
    FP4MOE_REQUIRE(supports(backend, T, &why), Unsupported, "options.backend", "backend ", to_string(backend),
                   " cannot run num_tokens=", T, ": ", why);
    DeviceGuard guard(device_);
    const RunArgs a{x, ids, ids_type, topk_weights, out, T, stream};
    if (backend == Backend::kDirectMicro) launch_direct_micro(c_, *w_, *dm_, a);
    else if (backend == Backend::kDynamic) launch_dynamic(c_, *w_, *generic_, *dyn_, a);
    else launch_generic(c_, *w_, *generic_, a);
  }

 private:
  MoeConfig c_;
  std::shared_ptr<const DeviceWeights> w_;
  int device_;
  std::unique_ptr<GenericWorkspace> generic_;
  std::unique_ptr<DirectMicroWorkspace> dm_;
  std::unique_ptr<DynamicWorkspace> dyn_;
};

}  // namespace

std::unique_ptr<Runner> make_runner(const MoeConfig& config, std::shared_ptr<const DeviceWeights> weights,
                                    const RunnerOptions& options, int device) {
  return std::make_unique<GpuRunner>(config, std::move(weights), options, device);
}

}  // namespace fp4moe::gpu
