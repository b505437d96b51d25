// The GPU runner: owns the workspaces, chooses the backend per call, launches.
#include <algorithm>
#include <memory>

#include "fp4moe/errors.h"
#include "host/gpu_backend.h"
#include "host/launch.h"

namespace fp4moe::gpu {
namespace {

// kAuto, from the decode sweep bench/results/h200-decode-sweep-20261203-s13.md (four named shapes,
// T = 16…256, a4 and a16, static / direct_micro / dynamic forced on the same inputs, session 13):
//  - direct_micro up to its variant's capacity (T·K = 1024 routes for the f16 variant, NVFP4-a4;
//    512 for the bf16 one) while the mean touched expert has at most kDirectMicroRoutesPerExpert
//    routes (T·K over min(E_local, T·K), the most experts the routes can touch): 4 on the f16
//    variant, 8 on the bf16 one. It streams each expert's weights once per 8–16 routes, so its cost
//    grows with routes per expert, while dynamic's register path dequantises them once per m-tile.
//    At 4 routes per expert direct_micro won every point of the sweep (qwen3-30b-a3b a4 T = 64
//    207.2 against dynamic's 215.3 µs, gpt-oss-120b a4 T = 128 913.9 against 951.7, deepseek-v3 a4
//    T = 128 2715 against 3135, mixtral-8x7b a4 T = 16 335.3 against 429.5); at 8 per expert dynamic
//    won every a4 point (qwen3 T = 128 219.9 against 296.2, gpt-oss T = 256 980.9 against 1389,
//    mixtral T = 32 431.4 against 507.3) and lost the a16 one (mixtral T = 32 701.6 against 600.2;
//    a16's register path uses lookup tables), which it won at 16 (mixtral T = 64 697.3 against 853.2).
//    Session 6's line was 32 routes per expert, measured against a register path 25–45 % slower
//    than today's (two CTAs per SM, f16 words).
//  - static is not taken: at no point of the sweep was it faster than dynamic by more than 0.7 %
//    (a16; a4 4–10 % slower), since both run the same GEMM core and static saves only the launches.
//  - dynamic above that on sm_90 (wgmma): faster than generic at 34 of the sweep's 35 points (up to
//    1.4×) and 1.3–1.8× faster at T = 2048–16384 (h200-prefill-20261202-2prod.md against
//    h200-nvfp4-a4-all-20261202.md); 4 % slower at qwen3-30b-a3b T = 512.
//  - generic where dynamic cannot run (not sm_90); there direct_micro keeps session 6's line of 32
//    routes per expert (h200-crossover-20261202.md: it beat generic by 1.17–3.3× inside it).
constexpr int64_t kDirectMicroMaxRoutes = 1024;
int64_t direct_micro_routes_per_expert(const MoeConfig& c, bool dynamic_runs) {
  if (!dynamic_runs) return 32;
  return f16_operands(c) ? 4 : 8;
}

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
    const bool dynamic_runs = dyn_ && dynamic_supports(*dyn_, nullptr);
    if (dm_ && routes <= kDirectMicroMaxRoutes &&
        routes <= direct_micro_routes_per_expert(c_, dynamic_runs) * touched_max &&
        direct_micro_supports(c_, T, nullptr))
      return Backend::kDirectMicro;
    if (dynamic_runs) return Backend::kDynamic;
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
