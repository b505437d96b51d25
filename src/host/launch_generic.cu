// Launches of the generic path (src/kernels/generic.cuh).
#include <algorithm>
#include <cuda_runtime.h>

#include "fp4moe/errors.h"
#include "host/launch.h"
#include "kernels/route.cuh"
#include "kernels/generic.cuh"

namespace fp4moe::gpu {
namespace {

namespace gk = kernels::generic;

int64_t max_tiles(int64_t routes, int experts) {
  // Σ_e ceil(r_e / m) ≤ ceil(R / m) + (number of non-empty experts) − 1, for the smallest m asked for.
  return (routes + kMinTileM - 1) / kMinTileM + std::min<int64_t>(experts, routes);
}

}  // namespace

GenericWorkspace::GenericWorkspace(const MoeConfig& c, const DeviceWeights& w, int64_t max_tokens) {
  const int64_t R = max_tokens * c.top_k;
  const int EL = c.local_count();
  const int64_t tiles = max_tiles(R, EL);
  route_row = DeviceBuffer(R * sizeof(int), "workspace.route_row");
  // Zeroed once: a GEMM tile may read up to kRowWeightPad entries past a call's rows (routing.cuh).
  row_weight = DeviceBuffer((R + kernels::kRowWeightPad) * sizeof(float), "workspace.row_weight");
  FP4MOE_CUDA_CHECK(cudaMemset(row_weight.get(), 0, row_weight.bytes()));
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());  // zeroed before any stream uses it
  row_expert = DeviceBuffer(R * sizeof(int), "workspace.row_expert");
  row_route = DeviceBuffer(R * sizeof(int), "workspace.row_route");
  expert_offset = DeviceBuffer((EL + 1) * sizeof(int), "workspace.expert_offset");
  expert_tile_offset = DeviceBuffer((EL + 1) * sizeof(int), "workspace.expert_tile_offset");
  route_counts = DeviceBuffer(EL * sizeof(int), "workspace.route_counts");
  route_cursor = DeviceBuffer(EL * sizeof(int), "workspace.route_cursor");
  tile_expert = DeviceBuffer(tiles * sizeof(int), "workspace.tile_expert");
  tile_row0 = DeviceBuffer(tiles * sizeof(int), "workspace.tile_row0");
  tile_capacity = tiles;
  num_tiles = DeviceBuffer(sizeof(int), "workspace.num_tiles");
  a1 = DeviceBuffer(R * w.h_pad * sizeof(__nv_bfloat16), "workspace.a1");
  a2 = DeviceBuffer(R * w.i_pad * sizeof(__nv_bfloat16), "workspace.a2");
  y = DeviceBuffer(R * c.hidden * sizeof(float), "workspace.y");
}

size_t GenericWorkspace::bytes() const {
  size_t s = 0;
  for (const DeviceBuffer* b : {&route_row, &row_weight, &row_expert, &row_route, &expert_offset, &expert_tile_offset,
                                &route_counts, &route_cursor, &tile_expert, &tile_row0, &num_tiles, &a1, &a2, &y})
    s += b->bytes();
  return s;
}

kernels::RoutingParams routing_params(const MoeConfig& c, GenericWorkspace& ws, const RunArgs& a, int tile_m) {
  const int EL = c.local_count();
  const int64_t R = a.tokens * c.top_k;
  FP4MOE_REQUIRE(tile_m >= kMinTileM && max_tiles(R, EL) <= ws.tile_capacity, InvalidArgument, "tile_m",
                 "the workspace's tile list holds ", ws.tile_capacity, " entries (sized for m-tiles of ", kMinTileM,
                 " rows), asked for m-tiles of ", tile_m);
  return {a.ids, a.ids_type == IndexType::kInt64, a.topk_weights, R, c.local_expert_first, EL, tile_m,
          ws.expert_offset.get<int>(), ws.expert_tile_offset.get<int>(), ws.route_row.get<int>(),
          ws.row_weight.get<float>(), ws.row_expert.get<int>(), ws.tile_expert.get<int>(), ws.tile_row0.get<int>(),
          ws.num_tiles.get<int>(), ws.row_route.get<int>()};
}

// The one-CTA routing (up to kRouteChunk routes).
void launch_route_one_cta(const kernels::RoutingParams& rp, cudaStream_t stream) {
  kernels::route_kernel<<<1, kernels::kRouteThreads, 0, stream>>>(rp);
  FP4MOE_CHECK_LAUNCH("route_kernel");
}

void launch_route(const MoeConfig& c, GenericWorkspace& ws, const RunArgs& a, int tile_m) {
  const kernels::RoutingParams rp = routing_params(c, ws, a, tile_m);
  const int64_t R = rp.routes;
  const int EL = rp.experts;
  if (R <= kernels::kRouteChunk) return launch_route_one_cta(rp, a.stream);
  // Many CTAs, one chunk each (routing.cuh): counts from zero, scans, placement.
  const unsigned chunks = static_cast<unsigned>((R + kernels::kRouteChunk - 1) / kernels::kRouteChunk);
  int* const counts = ws.route_counts.get<int>();
  int* const cursor = ws.route_cursor.get<int>();
  FP4MOE_CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<size_t>(EL) * sizeof(int), a.stream));
  kernels::route_count_kernel<<<chunks, kernels::kRouteChunkThreads, 0, a.stream>>>(rp, counts);
  FP4MOE_CHECK_LAUNCH("route_count_kernel");
  kernels::route_scan_kernel<<<1, kernels::kRouteThreads, 0, a.stream>>>(rp, counts, cursor);
  FP4MOE_CHECK_LAUNCH("route_scan_kernel");
  kernels::route_place_kernel<<<chunks, kernels::kRouteChunkThreads, 0, a.stream>>>(rp, cursor);
  FP4MOE_CHECK_LAUNCH("route_place_kernel");
}

// A kernel without dynamic shared memory taking one parameter struct, launched as a programmatic
// dependent of the kernel before (DependentLaunch) or as an ordinary launch.
template <class Params>
void launch_small(void (*kernel)(Params), dim3 grid, dim3 block, cudaStream_t stream, bool dependent, const Params& p) {
  const DependentLaunch l(grid, block, 0, stream, dependent);
  FP4MOE_CUDA_CHECK(cudaLaunchKernelEx(&l.config, kernel, p));
}

// The gather-quantise kernel for given parameters: a warp per unit of tokens · gather_chunks.
void launch_gather(const gk::GatherParams& gp, cudaStream_t stream, bool dependent) {
  const int64_t warps = static_cast<int64_t>(gp.tokens) * gk::gather_chunks(gp.h_pad, gp.q1);
  launch_small(gk::gather_quantize_kernel, dim3(static_cast<unsigned>((warps + gk::kGatherWarps - 1) / gk::kGatherWarps)),
               dim3(gk::kGatherWarps * 32), stream, dependent, gp);
}

void launch_route_gather_kernels(const kernels::RoutingParams& rp, const kernels::generic::GatherParams& gp, bool fused,
                                 cudaStream_t stream) {
  if (!fused) {
    FP4MOE_REQUIRE(rp.routes <= kernels::kRouteChunk, InvalidArgument, "routes", "the one-CTA routing takes at most ",
                   kernels::kRouteChunk, " routes, got ", rp.routes);
    launch_route_one_cta(rp, stream);
    launch_gather(gp, stream, /*dependent=*/true);
    return;
  }
  FP4MOE_REQUIRE(kernels::route_gather_fits(rp.routes, rp.experts), InvalidArgument, "routes",
                 "the fused routing + gather holds at most ", kernels::kRouteThreads, " routes and ",
                 kernels::kRouteGatherPrefixBytes, " bytes of per-warp counts, got ", rp.routes, " routes over ",
                 rp.experts, " experts");
  const int64_t warps = static_cast<int64_t>(gp.tokens) * gk::gather_chunks(gp.h_pad, gp.q1);
  const unsigned grid = static_cast<unsigned>(
      std::max<int64_t>(1, (warps + kernels::kRouteGatherWarps - 1) / kernels::kRouteGatherWarps));
  const size_t smem = kernels::route_gather_prefix_bytes(rp.routes, rp.experts);
  if (kernels::quant_block(gp.q1) == 16)
    kernels::route_gather_kernel<16><<<grid, kernels::kRouteGatherThreads, smem, stream>>>(rp, gp);
  else
    kernels::route_gather_kernel<32><<<grid, kernels::kRouteGatherThreads, smem, stream>>>(rp, gp);
  FP4MOE_CHECK_LAUNCH("route_gather_kernel");
}

void launch_route_gather(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& ws, const RunArgs& a, int tile_m,
                         bool a1_f16) {
  const kernels::RoutingParams rp = routing_params(c, ws, a, tile_m);
  if (!kernels::route_gather_fits(rp.routes, rp.experts)) {
    launch_route(c, ws, a, tile_m);
    launch_gather_quantize(c, w, ws, a, a1_f16, /*dependent=*/true);
    return;
  }
  launch_route_gather_kernels(rp, gather_params(c, w, ws, a, a1_f16), /*fused=*/true, a.stream);
}

kernels::generic::GatherParams gather_params(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& ws,
                                             const RunArgs& a, bool a1_f16) {
  FP4MOE_REQUIRE(!a1_f16 || f16_operands(c), InvalidArgument, "a1_f16",
                 "f16 activations hold NVFP4-a4 values only (format nvfp4, mode a4)");
  return {static_cast<const __nv_bfloat16*>(a.x), static_cast<int>(a.tokens), c.hidden, w.h_pad, c.top_k,
          kernels::quant_kind(c.format, c.mode), w.fc1_input_scale.get<float>(), ws.route_row.get<int>(),
          ws.row_expert.get<int>(), ws.a1.get<__nv_bfloat16>(), a1_f16};
}

void launch_gather_quantize(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& ws, const RunArgs& a,
                            bool a1_f16, bool dependent) {
  launch_gather(gather_params(c, w, ws, a, a1_f16), a.stream, dependent);
}

kernels::generic::CombineParams combine_params(const MoeConfig& c, GenericWorkspace& ws, const RunArgs& a) {
  return {ws.y.get<float>(), ws.route_row.get<int>(), c.top_k, c.hidden, a.out, c.output_dtype == OutputDType::kFP32};
}

void launch_combine(const MoeConfig& c, GenericWorkspace& ws, const RunArgs& a, bool dependent, const float* acc) {
  gk::CombineParams cp = combine_params(c, ws, a);
  cp.acc = acc;
  const unsigned cy = static_cast<unsigned>((c.hidden / 4 + gk::kCombineThreads - 1) / gk::kCombineThreads);
  launch_small(gk::combine_kernel, dim3(static_cast<unsigned>(a.tokens), cy), dim3(gk::kCombineThreads), a.stream,
               dependent, cp);
}

kernels::MoeGemmParams moe_gemm_params(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& ws,
                                       const RunArgs& a, bool fc1) {
  kernels::MoeGemmParams g{};
  g.tile_expert = ws.tile_expert.get<int>();
  g.tile_row0 = ws.tile_row0.get<int>();
  g.num_tiles = ws.num_tiles.get<int>();
  g.expert_offset = ws.expert_offset.get<int>();
  g.nvfp4 = c.format == WeightFormat::kNVFP4;
  g.f16_words = w.f16_words;
  g.bf16_words = w.bf16_words;
  g.block = c.weight_block();
  g.gated = c.gated();
  g.i_pad = w.i_pad;
  g.activation = c.activation;
  g.sw_alpha = c.swiglu.alpha, g.sw_beta = c.swiglu.beta, g.sw_limit = c.swiglu.limit;
  g.q2 = kernels::quant_kind(c.format, c.mode);
  g.q2_scale = w.fc2_input_scale.get<float>();
  g.hidden = c.hidden;
  g.top_k = c.top_k;
  g.row_weight = ws.row_weight.get<float>();
  g.a_rows = static_cast<int>(a.tokens * c.top_k);
  g.w_experts = c.local_count();
  if (fc1) {  // A1 · W13ᵀ, epilogue → A2
    g.a = ws.a1.get<__nv_bfloat16>();
    g.w_frag = w.w13_frag.get<uint4>();
    g.s_frag = w.w13_frag_scales.get<uint8_t>();
    g.w_rows = w.n1_pad;
    g.k_pad = w.h_pad;
    g.alpha = w.alpha1.get<float>();
    g.bias = c.has_bias ? w.b13.get<float>() : nullptr;
    g.a2 = ws.a2.get<__nv_bfloat16>();
  } else {  // A2 · W2ᵀ, epilogue → Y
    g.a = ws.a2.get<__nv_bfloat16>();
    g.w_frag = w.w2_frag.get<uint4>();
    g.s_frag = w.w2_frag_scales.get<uint8_t>();
    g.w_rows = w.h_pad;
    g.k_pad = w.i_pad;
    g.alpha = w.alpha2.get<float>();
    g.bias = c.has_bias ? w.b2.get<float>() : nullptr;
    g.y = ws.y.get<float>();
  }
  return g;
}

void launch_generic(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& ws, const RunArgs& a) {
  const int64_t tiles = max_tiles(a.tokens * c.top_k, c.local_count());
  cudaStream_t s = a.stream;
  launch_route_gather(c, w, ws, a, gk::BM, /*a1_f16=*/false);

  const kernels::MoeGemmParams g1 = moe_gemm_params(c, w, ws, a, true);
  const int n1_tiles = c.gated() ? w.i_pad / (gk::BN / 2) : w.i_pad / gk::BN;
  gk::gemm_kernel<true><<<dim3(static_cast<unsigned>(tiles), n1_tiles), gk::kThreads, sizeof(gk::GemmSmem), s>>>(g1);
  FP4MOE_CHECK_LAUNCH("gemm_kernel<fc1>");

  const kernels::MoeGemmParams g2 = moe_gemm_params(c, w, ws, a, false);
  gk::gemm_kernel<false><<<dim3(static_cast<unsigned>(tiles), w.h_pad / gk::BN), gk::kThreads,
                           sizeof(gk::GemmSmem), s>>>(g2);
  FP4MOE_CHECK_LAUNCH("gemm_kernel<fc2>");

  launch_combine(c, ws, a);
}

}  // namespace fp4moe::gpu
