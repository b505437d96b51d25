// The GPU runner: owns the workspaces, chooses the backend per call, launches.
#include <algorithm>
#include <memory>

#include "fp4moe/errors.h"
#include "host/gpu_backend.h"
#include "host/launch.h"

namespace fp4moe::gpu {
namespace {

// kAuto, from the crossover sweep bench/results/h200-crossover-20261202.md (five named shapes,
// T = 8…512, direct_micro / dynamic / generic forced, same inputs):
//  - direct_micro up to its variant's capacity (T·K = 1024 routes for the f16 variant, NVFP4-a4;
//    512 for the bf16 one) while the mean touched expert has at most kDirectMicroMaxRoutesPerExpert
//    routes (T·K over at most min(E_local, T·K) touched experts): it streams each expert's weights
//    once per 8–16 routes, so its cost grows with routes per expert.
//    Within that rule it won 24 of the sweep's 25 points by 1.17–3.3× and lost one (llama4-scout
//    T = 512, 7 %); mixtral-8x7b T = 256 (64 per expert) goes to dynamic, 1.4× faster there.
//    At 513…1024 routes (h200-crossover-20261203.md, h200-dm1024-20261203.md, session 6's dynamic):
//    inside the rule direct_micro won every point, qwen3-30b-a3b T = 128 350.7 against 517.3 µs,
//    gpt-oss-120b T = 192 / 256 1358 / 1691 against 2172 / 2174 µs; outside it (mixtral-8x7b
//    T = 384 / 512, 384 / 512 routes per expert) dynamic was 2.4–2.9× faster.
//  - dynamic above that on sm_90 (wgmma): faster than generic at 34 of the sweep's 35 points (up to
//    1.4×) and 1.3–1.8× faster at T = 2048–16384 (h200-prefill-20261202-2prod.md against
//    h200-nvfp4-a4-all-20261202.md); 4 % slower at qwen3-30b-a3b T = 512.
//  - generic where dynamic cannot run (not sm_90).
constexpr int64_t kDirectMicroMaxRoutes = 1024;
constexpr int64_t kDirectMicroMaxRoutesPerExpert = 32;

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
    // Sized for the variant's capacity, which kAuto's line (kDirectMicroMaxRoutes) reaches too.
    if (dm_reachable && direct_micro_supports(c, 1, nullptr))
      dm_ = std::make_unique<DirectMicroWorkspace>(c, *w_, o.max_tokens);
    // dynamic (prefill, wgmma) has no buffers of its own (generic's routing, gather and combine
    // buffers serve it); its workspace records whether the device can run it.
    // static: forced only, until the decode sweep places it in kAuto's order.
    if (o.backend == Backend::kStatic) st_ = std::make_unique<StaticWorkspace>(device_);
    if (o.backend == Backend::kDynamic || o.backend == Backend::kAuto) {
      dyn_ = std::make_unique<DynamicWorkspace>(device_);
      dyn_->tile_m = o.dynamic_tile_m;
    }
    // The budget is checked wherever dynamic runs; the copy is allocated only where a call can take
    // it (max_tokens reaches the line).
    if (dyn_ && dynamic_supports(*dyn_, nullptr) && o.prefill_bf16_bytes > 0)
      reserve_dynamic_bf16(*dyn_, c, *w_, o.prefill_bf16_bytes, o.prefill_bf16_min_rows,
                           o.max_tokens * c.top_k >= o.prefill_bf16_min_rows * c.num_experts);
  }

  Backend select(int64_t T) const override {
    const int64_t routes = T * c_.top_k;
    const int64_t touched_max = std::min<int64_t>(c_.local_count(), routes);
    if (dm_ && routes <= kDirectMicroMaxRoutes && routes <= kDirectMicroMaxRoutesPerExpert * touched_max &&
        direct_micro_supports(c_, T, nullptr))
      return Backend::kDirectMicro;
    if (dyn_ && dynamic_supports(*dyn_, nullptr)) return Backend::kDynamic;
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
      case Backend::kStatic:
        if (!st_) {
          if (why) *why = "static is only built for runners created with backend = kStatic";
          return false;
        }
        return static_supports(c_, *st_, T, why);
      default:
        if (why) *why = "this backend is not built yet";
        return false;
    }
  }

  bool uses_bf16_copy(Backend backend, int64_t T) const override {
    return backend == Backend::kDynamic && dyn_ && dynamic_uses_bf16(c_, *dyn_, T);
  }

  size_t workspace_bytes() const override {
    return generic_->bytes() + (dm_ ? dm_->bytes() : 0) + (dyn_ ? dyn_->bytes() : 0) + (st_ ? st_->bytes() : 0);
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
    else if (backend == Backend::kStatic) launch_static(c_, *w_, *generic_, *st_, a);
    else launch_generic(c_, *w_, *generic_, a);
  }

 private:
  MoeConfig c_;
  std::shared_ptr<const DeviceWeights> w_;
  int device_;
  std::unique_ptr<GenericWorkspace> generic_;
  std::unique_ptr<DirectMicroWorkspace> dm_;
  std::unique_ptr<DynamicWorkspace> dyn_;
  std::unique_ptr<StaticWorkspace> st_;
};

}  // namespace

std::unique_ptr<Runner> make_runner(const MoeConfig& config, std::shared_ptr<const DeviceWeights> weights,
                                    const RunnerOptions& options, int device) {
  return std::make_unique<GpuRunner>(config, std::move(weights), options, device);
}

}  // namespace fp4moe::gpu
