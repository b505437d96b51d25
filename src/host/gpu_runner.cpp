// The GPU runner: owns the workspaces, chooses the backend per call, launches.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "fp4moe/errors.h"
#include "host/gpu_backend.h"
#include "host/launch.h"

namespace fp4moe::gpu {
namespace {

// kAuto on sm_90, from the H200 sweep of session 39 (bench/results/h200-sweep-20261207-s39.md: all
// six named shapes at T = 1, 2, 4, 6, 8, 16, NVFP4 a4 and a16, direct_micro and dynamic forced on
// the same inputs, main at bbda34c) and session 32's on an H100 (below), which agree on the rule:
//  - direct_micro beside dynamic at T = 2 tokens of top-k 2 (both variants) and at T = 1 token of
//    top-k 1 in NVFP4-a4 (direct_micro's f16 variant). The second is llama4-scout a4 T = 1 (one
//    route into a 16-expert layer of 8192 intermediate columns): 42.6 against dynamic's 45.6 µs on
//    the H200, 47.7 against 49.6 on the H100; its a16 (the bf16 tables) is dynamic's on both cards
//    (dynamic 50.1 against 51.6 µs, 51.5 against 54.3). MXFP4-a4 runs direct_micro's bf16 variant
//    and keeps dynamic (the f16 variant is launch.h's f16_operands).
//  - Over the H200 sweep's 72 points the rule costs 0.12 % on average against the faster backend
//    (`python3 bench/sweep.py bench/results/h200-sweep-20261207-s39.jsonl --line direct_micro,dynamic
//    --rule "(T == 2 and K == 2) or (T == 1 and K == 1 and mode == 'a4')"`; T = 2 of top-k 2 alone
//    0.22 %, dynamic everywhere 0.17 %); on session 32's H100 sweep 0.00 % (0.05 % without the
//    second clause). Its misses on the H200, each within 4 %: mixtral-8x7b a4 T = 1 and 4
//    (direct_micro by 1.5 and 1.4 %; on the H100 dynamic's by 1.2 and 8 %), qwen3-30b-a3b a4 T = 1
//    (direct_micro by 2.3 %, before the session-39 direct_micro setup change that took it ~1.6 µs
//    more; on the H100 dynamic's by 11 %), mixtral-8x7b a16 T = 2 (dynamic by 3.6 %; on the H100
//    direct_micro's by 10 %). Re-sweep T = 1, 2, 4 before moving the line for them.
// Session 32's reading (H100, the card lent then; dynamic with the 16-row m-tiles and the last
// wave's split):
//  - direct_micro beside dynamic only at T = 2 tokens of top-k 2, both variants (NVFP4-a4's f16 one
//    and the bf16 one): mixtral-8x7b T = 2 (4 routes over up to 4 experts of 99 MB), a4 172.5
//    against dynamic's 192.0 µs, a16 194.8 against 215.1. Everywhere else dynamic was faster or
//    within 4 %: the last wave's split (kernels/dynamic.cuh) gave dynamic the T = 1–2 calls of few,
//    long items that had kept session 31's line at T ≤ 2 and T·K ≤ 4 (llama4-scout T = 2 a16 75.5
//    against 92.8 µs, a4 72.9 against 80.3; gpt-oss-120b T = 1 a16 47.3 against 52.0; mixtral-8x7b
//    T = 1 a16 104.9 against 111.4, a4 98.1 against 99.3). Why mixtral-8x7b T = 2 stays with
//    direct_micro is measured, not explained: it is direct_micro's most efficient point (75 % of
//    the floor), and dynamic runs 67–69 % of it at mixtral-8x7b T = 2–4. mixtral-8x7b is the
//    only named shape of top-k 2, so the rule is one shape's point; a shape of top-k 2 with small
//    experts would likely be dynamic's (every small-expert point of the sweep is), and a sweep of
//    it would move the rule.
//  - T = 2 of top-k 2 alone took the faster backend at 71 of that sweep's 72 points (0.05 % on
//    average); the miss, llama4-scout a4 T = 1 (direct_micro 47.7 against 49.6 µs, 3.9 %; its a16
//    dynamic's by 5.4 %), is the second clause above since session 39. Session 31's line (T ≤ 2
//    and T·K ≤ 4) costs 0.86 % on this sweep (llama4-scout a16 T = 2 22.8 %), dynamic everywhere
//    0.36 % (mixtral-8x7b T = 2 10.5 / 11.3 %).
//    Read with `python3 bench/sweep.py FILE --line direct_micro,dynamic --rule "T == 2 and K == 2"
//    --rule "T <= 2 and routes <= 4"` (the routes-only lines: 0 routes 0.36 %, 2: 0.94 %, 4: 1.30 %).
//  - static is not taken: at no point of session 13's sweep was it faster than dynamic by more than
//    0.7 % (a16; a4 4–10 % slower), since both run the same GEMM core and static saves only launches.
//  - dynamic above that on sm_90 (wgmma): faster than generic at 34 of session 13's 35 points (up
//    to 1.4×) and 1.3–1.8× faster at T = 2048–16384 (h200-prefill-20261202-2prod.md against
//    h200-nvfp4-a4-all-20261202.md).
//  - generic where dynamic cannot run (not sm_90); there direct_micro keeps session 6's line of 32
//    routes per expert (h200-crossover-20261202.md: it beat generic by 1.17–3.3× inside it).
constexpr int64_t kDirectMicroMaxRoutes = 1024;
// The tokens of a kAuto call that goes to direct_micro beside dynamic (sm_90; the sweeps above), 0 for
// none, which is also its workspace's size: the rule and the workspace read this one helper.
// T = 2 of top-k 2, both variants; T = 1 of top-k 1 in NVFP4-a4 (the f16 variant).
int64_t tokens_beside_dynamic(const MoeConfig& c) {
  if (c.top_k == 2) return 2;
  if (c.top_k == 1 && f16_operands(c)) return 1;
  return 0;
}

}  // namespace

bool direct_micro_preferred(const MoeConfig& c, int64_t routes, bool dynamic_runs) {
  constexpr int64_t kRoutesPerExpertGeneric = 32;  // not sm_90
  if (dynamic_runs) {
    const int64_t tokens = tokens_beside_dynamic(c);
    return tokens > 0 && routes == tokens * c.top_k;
  }
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
      dyn_->deterministic = o.deterministic;
    }
    // direct_micro's workspace only for the calls that can reach it: forced, every T up to
    // max_tokens (within the variant's capacity); kAuto, its line beside dynamic on sm_90 (T = 2 of
    // top-k 2, T = 1 of top-k 1 in NVFP4-a4; none at all otherwise), up to the capacity elsewhere.
    // Its buffers grow with the routes (at 1024 routes ~19 MB a runner at deepseek-v3, ~14 MB at
    // qwen3-30b-a3b; one runner a layer).
    int64_t dm_tokens = 0;
    if (o.backend == Backend::kDirectMicro) dm_tokens = o.max_tokens;
    if (o.backend == Backend::kAuto)
      dm_tokens = std::min(o.max_tokens, dynamic_runs() ? tokens_beside_dynamic(c) : kDirectMicroMaxRoutes / c.top_k);
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
