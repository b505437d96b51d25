// The GPU runner: owns the workspaces, chooses the backend per call, launches.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "fp4moe/errors.h"
#include "host/gpu_backend.h"
#include "host/launch.h"

namespace fp4moe::gpu {
namespace {

// kAuto on sm_90, from session 29's sweep (bench/results/h100-decode-sweep-20261206-s29.md: all six
// named shapes at T = 1, 2, 4, 6, 8, 16, a4 and a16, direct_micro and dynamic forced on the same
// inputs, on an H100, the card lent; dynamic with the 16-row m-tiles kAuto takes since then).
//  - direct_micro while T ≤ 2 tokens and T·K ≤ 4 routes, both variants (NVFP4-a4's f16 one and the
//    bf16 one): T = 1 up to K = 4, T = 2 up to K = 2. The 16-row tiles moved the line down from
//    session 24's 8 routes: dynamic now wins at T = 1 on the shapes of K = 8 (qwen3-30b-a3b a4 25.5
//    against 27.8 µs, deepseek-v3 a4 89.9 against 98.1, qwen3-235b-a22b a4 50.8 against 58.2) and at
//    T = 4 on the shapes of few, large experts (llama4-scout a4 122.7 against 143.3, mixtral-8x7b a4
//    221.0 against 243.3). direct_micro keeps T = 1, 2 of llama4-scout (K = 1; a4 T = 1 48.3 against
//    75.8) and of mixtral-8x7b (K = 2; T = 1 99.1 against 139.8, T = 2 a4 172.3 against 192.2, a16
//    195.3 against 234.7), where dynamic's few items leave most CTAs idle. The token bound is what
//    separates mixtral-8x7b T = 2 from llama4-scout T = 4 (4 routes each, over at most 4 experts):
//    direct_micro's FC2 works per output row, so its cost follows the tokens, dynamic's the experts.
//  - The rule takes the faster backend at 69 of the sweep's 72 points; over them it costs 0.08 % on
//    average (session 29's 2-route line 0.51 %: it gave mixtral-8x7b T = 2 to dynamic, 11.6 / 20.2 %
//    slower, a4 / a16; session 24's 8-route line 2.39 %). The misses: gpt-oss-120b a4 T = 1 (4
//    routes; dynamic 1.9 % faster; a16 is direct_micro's by 0.9 %) and qwen3-235b-a22b T = 2 (16
//    routes; direct_micro 0.5 / 3.3 % faster). Read with `python3 bench/sweep.py FILE --line
//    direct_micro,dynamic` for the routes-only lines (2: 0.51 %, 4: 0.55 %, which gives llama4-scout
//    T = 4 to direct_micro, 17 % slower).
//  - static is not taken: at no point of session 13's sweep was it faster than dynamic by more than
//    0.7 % (a16; a4 4–10 % slower), since both run the same GEMM core and static saves only launches.
//  - dynamic above that on sm_90 (wgmma): faster than generic at 34 of session 13's 35 points (up
//    to 1.4×) and 1.3–1.8× faster at T = 2048–16384 (h200-prefill-20261202-2prod.md against
//    h200-nvfp4-a4-all-20261202.md).
//  - generic where dynamic cannot run (not sm_90); there direct_micro keeps session 6's line of 32
//    routes per expert (h200-crossover-20261202.md: it beat generic by 1.17–3.3× inside it).
constexpr int64_t kDirectMicroMaxRoutes = 1024;
// kAuto's line beside dynamic (sm_90, both variants; session 29's sweep, above): both bounds.
constexpr int64_t kMaxTokensBesideDynamic = 2;
constexpr int64_t kMaxRoutesBesideDynamic = 4;
// The most tokens a call of top-k K can have and still be on that line.
int64_t tokens_beside_dynamic(int64_t top_k) { return std::min(kMaxTokensBesideDynamic, kMaxRoutesBesideDynamic / top_k); }

}  // namespace

bool direct_micro_preferred(const MoeConfig& c, int64_t routes, bool dynamic_runs) {
  constexpr int64_t kRoutesPerExpertGeneric = 32;  // not sm_90
  if (dynamic_runs) return routes <= tokens_beside_dynamic(c.top_k) * c.top_k;
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
    // dynamic (prefill, wgmma): generic's routing, gather and combine buffers serve it; its own
    // workspace records whether the device can run it and holds the last wave's split slots
    // (sms × 16 KB, kernels/dynamic.cuh Split).
    if (o.backend == Backend::kDynamic || o.backend == Backend::kAuto) {
      dyn_ = std::make_unique<DynamicWorkspace>(device_);
      dyn_->tile_m = o.dynamic_tile_m;
    }
    // direct_micro's workspace only for the calls that can reach it: forced, every T up to
    // max_tokens (within the variant's capacity); kAuto, its line: T ≤ 2 and T·K ≤ 4 beside dynamic
    // on sm_90 (none at all for K > 4), up to the capacity elsewhere. Its buffers grow with the routes
    // (at 1024 routes ~19 MB a runner at deepseek-v3, ~14 MB at qwen3-30b-a3b; one runner a layer).
    int64_t dm_tokens = 0;
    if (o.backend == Backend::kDirectMicro) dm_tokens = o.max_tokens;
    if (o.backend == Backend::kAuto)
      dm_tokens = std::min(o.max_tokens, dynamic_runs() ? tokens_beside_dynamic(c.top_k) : kDirectMicroMaxRoutes / c.top_k);
    if (dm_tokens > 0 && direct_micro_supports(c, 1, nullptr))
      dm_ = std::make_unique<DirectMicroWorkspace>(c, *w_, dm_tokens);
    // static: forced only, until the decode sweep places it in kAuto's order.
    if (o.backend == Backend::kStatic) st_ = std::make_unique<StaticWorkspace>(device_);
    // The budget is checked wherever dynamic runs; the copy is allocated only where a call can take
    // it (max_tokens reaches the line).
    if (dynamic_runs() && o.prefill_bf16_bytes > 0)
      reserve_dynamic_bf16(*dyn_, c, *w_, o.prefill_bf16_bytes, o.prefill_bf16_min_rows,
                           o.max_tokens * c.top_k >= o.prefill_bf16_min_rows * c.num_experts);
  }

  Backend select(int64_t T) const override {
    if (direct_micro_preferred(c_, T * c_.top_k, dynamic_runs()) && supports(Backend::kDirectMicro, T, nullptr))
      return Backend::kDirectMicro;
    if (dynamic_runs()) return Backend::kDynamic;
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
        if (!direct_micro_supports(c_, T, why)) return false;
        if (T * c_.top_k > dm_->max_routes) {  // kAuto's workspace holds only its line's routes
          if (why)
            *why = detail::concat("T·K = ", T, "·", c_.top_k, " = ", T * c_.top_k, " routes is past the ",
                                  dm_->max_routes, " that this runner's direct_micro workspace holds");
          return false;
        }
        return true;
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
  // dynamic can take calls: a kDynamic or kAuto runner on an sm_90 device.
  bool dynamic_runs() const { return dyn_ && dynamic_supports(*dyn_, nullptr); }

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
