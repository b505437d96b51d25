// The GPU runner: owns the workspaces, chooses the backend per call, launches.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "fp4moe/errors.h"
#include "host/gpu_backend.h"
#include "host/launch.h"

namespace fp4moe::gpu {
namespace {

// kAuto on sm_90, from session 24's sweep (bench/results/h100-decode-sweep-20261206-s24.md: all six
// named shapes at T = 1, 2, 4, 6, 8, 16, 32, 64, a4 and a16, direct_micro and dynamic forced on the
// same inputs, on an H100, the card lent). Its T = 1…8 points ran twice (the second run's are in
// h100-20261206-s24-epilogue-warps-ab.md, tree main): the same backend won at 45 of 48.
//  - direct_micro while T·K ≤ 8 routes, both variants (NVFP4-a4's f16 one and the bf16 one). Session
//    23's 32-row FC1 epilogue (dc9cb78: −10 to −12 % on dynamic's decode rows) moved the line down
//    from sessions 17/18's (up to 16 routes, or up to 256 / 200 MiB of touched weights): dynamic now
//    wins from 16 routes on at nearly every point (qwen3-30b-a3b T = 2: 34.3 against 39.2 µs;
//    gpt-oss-120b T = 4: 115.3 against 118.8; mixtral-8x7b T = 8: 286.7 against 297.3), and at
//    qwen3-30b-a3b T = 8, which the old byte clause gave direct_micro, by 7 % (73.4 against 79.1).
//    direct_micro keeps the points of few, large experts, where dynamic's FC2 has fewer n-tiles than
//    SMs (mixtral-8x7b T = 1, 2 experts: 96.2 against 155.3; llama4-scout T = 1: 46.9 against 83.3;
//    gpt-oss-120b T = 2: 67.6 against 75.8).
//  - The rule takes the faster backend at 50 of the sweep's 60 points at T ≤ 8 and at all 36 past
//    it; over the 96 points it costs 0.47 % on average (session 17/18's line: 1.3 %, up to 17 % at
//    qwen3-30b-a3b T = 2). The misses: llama4-scout a16 T = 4 and 6 (4–6 routes over 4–5 experts of
//    67.5 MiB; dynamic 6.8 and 13 % faster, at a4 T = 6 2.7 %), qwen3-235b-a22b T = 1 (8 routes;
//    dynamic 1.5 / 4.1 % faster) and T = 2 (16 routes; direct_micro 7.5 / 5.7 % faster), deepseek-v3
//    a4 T = 4 (direct_micro 2.9 % faster), and two ties. No line in routes or touched bytes took these
//    without losing more elsewhere (a 16-route line: 1.4 % on average, qwen3-30b-a3b T = 2 +14–17 %).
//  - static is not taken: at no point of session 13's sweep was it faster than dynamic by more than
//    0.7 % (a16; a4 4–10 % slower), since both run the same GEMM core and static saves only launches.
//  - dynamic above that on sm_90 (wgmma): faster than generic at 34 of session 13's 35 points (up
//    to 1.4×) and 1.3–1.8× faster at T = 2048–16384 (h200-prefill-20261202-2prod.md against
//    h200-nvfp4-a4-all-20261202.md).
//  - generic where dynamic cannot run (not sm_90); there direct_micro keeps session 6's line of 32
//    routes per expert (h200-crossover-20261202.md: it beat generic by 1.17–3.3× inside it).
constexpr int64_t kDirectMicroMaxRoutes = 1024;

}  // namespace

bool direct_micro_preferred(const MoeConfig& c, int64_t routes, bool dynamic_runs) {
  constexpr int64_t kMaxRoutesBesideDynamic = 8;   // sm_90, both variants (session 24)
  constexpr int64_t kRoutesPerExpertGeneric = 32;  // not sm_90
  if (dynamic_runs) return routes <= kMaxRoutesBesideDynamic;
  const int64_t touched_max = std::min<int64_t>(c.local_count(), routes);
  return routes <= kRoutesPerExpertGeneric * touched_max;
}

namespace {

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
    const bool dynamic_runs = dyn_ && dynamic_supports(*dyn_, nullptr);
    if (dm_ && routes <= kDirectMicroMaxRoutes && direct_micro_preferred(c_, routes, dynamic_runs) &&
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
