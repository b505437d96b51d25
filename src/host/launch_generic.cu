// The GPU runner: workspace, backend choice and the launches of the generic path
// (src/kernels/generic.cuh).
#include <algorithm>
#include <cuda_runtime.h>

#include "fp4moe/errors.h"
#include "host/cuda_check.h"
#include "host/device_weights.h"
#include "host/gpu_backend.h"
#include "kernels/common/routing.cuh"
#include "kernels/generic.cuh"

namespace fp4moe::gpu {
namespace {

namespace gk = kernels::generic;

int64_t max_tiles(int64_t routes, int experts) {
  // Σ_e ceil(r_e / BM) ≤ ceil(R / BM) + (number of non-empty experts) − 1.
  return (routes + gk::BM - 1) / gk::BM + std::min<int64_t>(experts, routes);
}

class GpuRunner final : public Runner {
 public:
  GpuRunner(const MoeConfig& c, std::shared_ptr<const DeviceWeights> w, const RunnerOptions& o, int device)
      : c_(c), w_(std::move(w)), o_(o), device_(device) {
    FP4MOE_REQUIRE(w_ != nullptr, InvalidArgument, "weights", "no device weights");
    FP4MOE_REQUIRE(w_->device == device, InvalidArgument, "weights", "prepared for device ", w_->device,
                   ", runner on device ", device);
    DeviceGuard guard(device_);
    const int64_t R = o.max_tokens * c.top_k;
    const int EL = c.local_count();
    const int64_t tiles = max_tiles(R, EL);
    route_row_ = DeviceBuffer(R * sizeof(int), "workspace.route_row");
    row_route_ = DeviceBuffer(R * sizeof(int), "workspace.row_route");
    row_expert_ = DeviceBuffer(R * sizeof(int), "workspace.row_expert");
    expert_offset_ = DeviceBuffer((EL + 1) * sizeof(int), "workspace.expert_offset");
    tile_expert_ = DeviceBuffer(tiles * sizeof(int), "workspace.tile_expert");
    tile_row0_ = DeviceBuffer(tiles * sizeof(int), "workspace.tile_row0");
    num_tiles_ = DeviceBuffer(sizeof(int), "workspace.num_tiles");
    a1_ = DeviceBuffer(R * w_->h_pad * sizeof(__nv_bfloat16), "workspace.a1");
    a2_ = DeviceBuffer(R * w_->i_pad * sizeof(__nv_bfloat16), "workspace.a2");
    y_ = DeviceBuffer(R * c.hidden * sizeof(float), "workspace.y");
  }

  Backend select(int64_t) const override { return Backend::kGeneric; }

  bool supports(Backend b, int64_t, std::string* why) const override {
    if (b == Backend::kGeneric) return true;
    if (why) *why = "this backend is not built yet; the generic GPU path serves every call";
    return false;
  }

  size_t workspace_bytes() const override {
    size_t s = 0;
    for (const DeviceBuffer* b : {&route_row_, &row_route_, &row_expert_, &expert_offset_, &tile_expert_, &tile_row0_,
                                  &num_tiles_, &a1_, &a2_, &y_})
      s += b->bytes();
    return s;
  }

  void run(Backend backend, const void* x, const void* ids, IndexType ids_type, const float* topk_weights, void* out,
           int64_t T, CUstream_st* stream) override {
    std::string why;
    FP4MOE_REQUIRE(supports(backend, T, &why), Unsupported, "options.backend", why);
    DeviceGuard guard(device_);
    const int EL = c_.local_count(), K = c_.top_k;
    const int64_t R = T * K;
    const int64_t tiles = max_tiles(R, EL);
    const kernels::QuantKind q = kernels::quant_kind(c_.format, c_.mode);
    cudaStream_t s = stream;

    kernels::RoutingParams rp{ids, ids_type == IndexType::kInt64, R, c_.local_expert_first, EL, gk::BM,
                              expert_offset_.get<int>(), route_row_.get<int>(), row_route_.get<int>(),
                              row_expert_.get<int>(), tile_expert_.get<int>(), tile_row0_.get<int>(),
                              num_tiles_.get<int>()};
    kernels::route_kernel<<<1, kernels::kRouteThreads, 0, s>>>(rp);
    FP4MOE_CHECK_LAUNCH("route_kernel");

    gk::GatherParams gp{static_cast<const __nv_bfloat16*>(x), c_.hidden, w_->h_pad, K, q,
                        w_->fc1_input_scale.get<float>(), expert_offset_.get<int>(), EL, row_route_.get<int>(),
                        row_expert_.get<int>(), a1_.get<__nv_bfloat16>()};
    gk::gather_quantize_kernel<<<static_cast<unsigned>((R + gk::kGatherWarps - 1) / gk::kGatherWarps),
                                 gk::kGatherWarps * 32, 0, s>>>(gp);
    FP4MOE_CHECK_LAUNCH("gather_quantize_kernel");

    gk::GemmParams g{};
    g.tile_expert = tile_expert_.get<int>();
    g.tile_row0 = tile_row0_.get<int>();
    g.num_tiles = num_tiles_.get<int>();
    g.expert_offset = expert_offset_.get<int>();
    g.nvfp4 = c_.format == WeightFormat::kNVFP4;
    g.block = c_.weight_block();
    g.gated = c_.gated();
    g.i_pad = w_->i_pad;
    g.activation = c_.activation;
    g.sw_alpha = c_.swiglu.alpha, g.sw_beta = c_.swiglu.beta, g.sw_limit = c_.swiglu.limit;
    g.q2 = q;
    g.q2_scale = w_->fc2_input_scale.get<float>();
    g.hidden = c_.hidden;
    g.top_k = K;
    g.row_route = row_route_.get<int>();
    g.topk_weights = topk_weights;

    // FC1: A1 · W13ᵀ, epilogue → A2.
    gk::GemmParams g1 = g;
    g1.a = a1_.get<__nv_bfloat16>();
    g1.w_packed = w_->w13_packed.get<uint8_t>();
    g1.w_scales = w_->w13_scales.get<uint8_t>();
    g1.w_rows = w_->n1_pad;
    g1.k_pad = w_->h_pad;
    g1.alpha = w_->alpha1.get<float>();
    g1.bias = c_.has_bias ? w_->b13.get<float>() : nullptr;
    g1.a2 = a2_.get<__nv_bfloat16>();
    const int n1_tiles = c_.gated() ? w_->i_pad / (gk::BN / 2) : w_->i_pad / gk::BN;
    gk::gemm_kernel<true><<<dim3(static_cast<unsigned>(tiles), n1_tiles), gk::kThreads, sizeof(gk::GemmSmem), s>>>(g1);
    FP4MOE_CHECK_LAUNCH("gemm_kernel<fc1>");

    // FC2: A2 · W2ᵀ, epilogue → Y.
    gk::GemmParams g2 = g;
    g2.a = a2_.get<__nv_bfloat16>();
    g2.w_packed = w_->w2_packed.get<uint8_t>();
    g2.w_scales = w_->w2_scales.get<uint8_t>();
    g2.w_rows = w_->h_pad;
    g2.k_pad = w_->i_pad;
    g2.alpha = w_->alpha2.get<float>();
    g2.bias = c_.has_bias ? w_->b2.get<float>() : nullptr;
    g2.y = y_.get<float>();
    gk::gemm_kernel<false><<<dim3(static_cast<unsigned>(tiles), w_->h_pad / gk::BN), gk::kThreads,
                             sizeof(gk::GemmSmem), s>>>(g2);
    FP4MOE_CHECK_LAUNCH("gemm_kernel<fc2>");

    gk::CombineParams cp{y_.get<float>(), route_row_.get<int>(), K, c_.hidden, out,
                         c_.output_dtype == OutputDType::kFP32};
    const unsigned cy = static_cast<unsigned>((c_.hidden / 4 + gk::kCombineThreads - 1) / gk::kCombineThreads);
    gk::combine_kernel<<<dim3(static_cast<unsigned>(T), cy), gk::kCombineThreads, 0, s>>>(cp);
    FP4MOE_CHECK_LAUNCH("combine_kernel");
  }

 private:
  MoeConfig c_;
  std::shared_ptr<const DeviceWeights> w_;
  RunnerOptions o_;
  int device_;
  DeviceBuffer route_row_, row_route_, row_expert_, expert_offset_, tile_expert_, tile_row0_, num_tiles_, a1_, a2_, y_;
};

}  // namespace

std::unique_ptr<Runner> make_runner(const MoeConfig& config, std::shared_ptr<const DeviceWeights> weights,
                                    const RunnerOptions& options, int device) {
  return std::make_unique<GpuRunner>(config, std::move(weights), options, device);
}

}  // namespace fp4moe::gpu
