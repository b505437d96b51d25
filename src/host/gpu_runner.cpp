// The GPU runner: owns the workspaces, chooses the backend per call, launches.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>

#include "fp4moe/errors.h"
#include "host/gpu_backend.h"
#include "host/launch.h"

namespace fp4moe::gpu {
namespace {

// kAuto on sm_90, from session 17's sweep for a4 (bench/results/h100-decode-sweep-20261205-s17.md:
// qwen3-30b-a3b, gpt-oss-120b, mixtral-8x7b, deepseek-v3 at T = 1…128, a4 and a16, direct_micro and
// dynamic forced on the same inputs) and session 18's for a16 (…-s18-a16.md, the same shapes and
// seed), both on an H100, the card lent those sessions. Session 16's tensor-copy producer had made
// dynamic's register path ~21 % faster than session 13's sweep (h200-decode-sweep-20261203-s13.md)
// measured it:
//  - the f16 variant (NVFP4-a4): direct_micro while T·K ≤ 16 routes (and ≤ 896 MiB touched), or
//    while the touched experts' weights (min(E_local, T·K) experts) are at most 256 MB and the mean
//    touched expert has at most 4 routes. Up to 16 routes it won every point (deepseek-v3 T = 2
//    178.1 against dynamic's 183.2 µs, mixtral-8x7b T = 8 306.0 against 315.7), mostly on dynamic's
//    fixed costs (its pre-pass and two launches, ~6 µs at qwen3-30b-a3b T = 1) and, where few
//    experts are touched, on dynamic's FC2 having fewer n-tiles than SMs (mixtral T = 1: 2 experts ×
//    32 tiles; 136.6 against 98.8). Past 16 routes it won only where the weights are few
//    (qwen3-30b-a3b T = 8, 64 experts × 2.7 MB: 83.6 against 90.4; T = 16, 340 MB, a tie at 124.4 /
//    124.3); with more bytes dynamic's weight stream is the faster one (deepseek-v3 T = 4, 32
//    routes, 0.79 GB: 324.6 against 326.9; gpt-oss-120b T = 8, 0.45 GB: 200.7 against 208.0; mixtral
//    T = 16: 337.6 against 357.7). This rule takes the faster backend at all 32 a4 points of the
//    sweep. Session 18's sweep of the two shapes left out
//    (h100-decode-sweep-20261205-s18-llama4-qwen235.md) capped the "≤ 16 routes" clause at 896 MiB
//    of touched weights: llama4-scout T = 16 (16 routes over 16 experts, 1080 MiB) went to
//    direct_micro at 375.4 µs against dynamic's 310.9; the heaviest point the clause still wins is
//    mixtral-8x7b T = 8 (756 MiB, 306.0 against 315.7). With the cap: 15 of 16 a4 points of that
//    sweep (qwen3-235b-a22b T = 4, 324 MiB, dynamic 154.8 against 151.9: +1.9 %).
//  - the bf16 variant (a16, MXFP4, a8), re-read after it took two CTAs per SM at 32-row m-tiles
//    (session 18, −14 to −24 % on dynamic's a16 rows; h100-decode-sweep-20261205-s18-a16.md):
//    direct_micro while T·K ≤ 4 routes, or while the touched experts' weights are at most 200 MiB,
//    and in both cases at most 4 routes per touched expert. It won at ≤ 4 routes whatever the bytes
//    (mixtral-8x7b T = 2, 0.4 GB: 201.4 against 244.1 µs) and below ~190 MiB (deepseek-v3 T = 1,
//    8 × 23.6 MiB: 113.9 against 122.0; qwen3-30b-a3b T = 8, 162 MiB: 95.9 against 102.6); past
//    ~210 MiB dynamic won (gpt-oss-120b T = 4, 214 MiB: 138.8 against 144.6; mixtral T = 4: 311.9
//    against 322.9). The faster backend at 31 of the 32 a16 points; the miss is deepseek-v3 T = 2
//    (16 routes, 378 MiB: dynamic 208.3 against 204.4, +1.9 %); of the llama4-scout / qwen3-235b-a22b
//    sweep 15 of 16 (qwen3-235b-a22b T = 4, 324 MiB: dynamic 178.9 against 174.4, +2.6 %). Session
//    17's line (4 routes per expert alone) would take direct_micro at 17 of the four-shape sweep's
//    points, where dynamic is faster by 1–36 %.
//  - both up to the variant's capacity (T·K = 1024 routes f16, 512 bf16); the mean touched expert's
//    routes are T·K over min(E_local, T·K), the most experts the routes can touch.
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
  constexpr int64_t kRoutesPerExpert = 4;              // sm_90, both variants
  constexpr int64_t kRoutesPerExpertGeneric = 32;      // not sm_90
  const bool f16 = f16_operands(c);
  const int64_t always_routes = f16 ? 16 : 4;
  // The "always" clause's cap on the touched weights (the f16 variant's only).
  const int64_t always_max_bytes = f16 ? int64_t{896} << 20 : std::numeric_limits<int64_t>::max();
  const int64_t max_touched_bytes = (f16 ? int64_t{256} : int64_t{200}) << 20;
  const int64_t touched_max = std::min<int64_t>(c.local_count(), routes);
  if (!dynamic_runs) return routes <= kRoutesPerExpertGeneric * touched_max;
  if (routes > kRoutesPerExpert * touched_max) return false;
  const int64_t touched_bytes = touched_max * expert_weight_bytes(c);
  if (routes <= always_routes && touched_bytes <= always_max_bytes) return true;
  return touched_bytes <= max_touched_bytes;
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
