// Launch of the direct_micro decode kernel (src/kernels/direct_micro.cuh): one cooperative launch
// with a grid no larger than the compiled kernel's occupancy (reference F4).
#include <cuda_runtime.h>

#include <algorithm>

#include "fp4moe/errors.h"
#include "host/launch.h"
#include "kernels/direct_micro.cuh"

namespace fp4moe::gpu {

namespace dm = kernels::direct_micro;
static_assert(kDirectMicroTraceStamps == dm::kTraceStamps && kDirectMicroTraceSlots == dm::kTraceSlots);

namespace {
// The compiled variants: kG route groups of 8 per pass over a weight tile, and kF16 for NVFP4
// weights with NVFP4 activations (a4). kG = 1 keeps twice the weight loads in flight per warp (the
// loop is latency-bound, not arithmetic-bound), and an expert with more than 8 routes simply takes
// more passes (its weights then come from L2). kG = 2 pays off only when the mean expert has more
// than 8 routes: T·K routes over min(E, T·K) touched experts at most.
bool wide_groups(int64_t routes, int64_t local_experts) {
  return routes > 8 * std::min<int64_t>(local_experts, routes);
}
// T·K the config's variant accepts (direct_micro.cuh kMaxRoutes).
int route_capacity(const MoeConfig& c) { return f16_operands(c) ? dm::kMaxRoutes<true> : dm::kMaxRoutes<false>; }
const char* variant_name(const MoeConfig& c) {
  return f16_operands(c) ? "f16 variant (NVFP4 weights, a4)" : "bf16 variant (lookup tables)";
}
size_t smem_bytes(bool f16) { return f16 ? dm::kSmemBytes<true> : dm::kSmemBytes<false>; }
void* kernel_for(bool wide, bool f16) {
  if (f16)
    return wide ? reinterpret_cast<void*>(dm::direct_micro_kernel<2, true>)
                : reinterpret_cast<void*>(dm::direct_micro_kernel<1, true>);
  return wide ? reinterpret_cast<void*>(dm::direct_micro_kernel<2, false>)
              : reinterpret_cast<void*>(dm::direct_micro_kernel<1, false>);
}
}  // namespace

DirectMicroFc2Plan direct_micro_fc2_plan(bool f16, int64_t routes, int64_t local_experts, int parts16, int parts32) {
  // A function of the routes (T·K), never of T alone, so that a call and the expert-parallel path's
  // K = 1 call over the same routes (T·K tokens) take the same items and k-chunks (fc2_chunks counts
  // them per part) and give the same bits (EpWorldOfOne.EqualsMoeRunnerBitForBit).
  // - Fewer than kFc2SplitRoutes routes: 16-column items, no split. At 8 routes (qwen3-30b-a3b T = 1)
  //   32-column items split over parts measured faster (a4 26.5 -> 25.3 us, a16 36.2 -> 34.2; gpt-oss-120b
  //   T = 2, 8 routes, a4 -4.5 %), at 2 and 4 routes slower (mixtral-8x7b T = 1 a4 +1.9 %, T = 2 a16
  //   +4.0 %; gpt-oss-120b T = 1 a4 +2.5 %): session 15's t1 tree against ho, bench/results/
  //   h200-decode-20261204-s15-wip-ab.md. Alone against main (session 16): qwen3-30b-a3b and
  //   deepseek-v3 T = 1 a4 -2.6 %, gpt-oss-120b T = 2 -1.0 %, h200-decode-20261204-s16-s8-ab.md.
  //   (Session 2's 16-column split lost at T = 1: bench/results/
  //   h200-direct-micro-phases-20261202-preload.txt.)
  // - From there, items of 32 columns where their sums fit the shared memory (half the B loads and
  //   A2 re-reads of 16-column items): against 16-column items, median 0.978 over qwen3-30b-a3b,
  //   gpt-oss-120b and mixtral-8x7b at T = 2, 32, 64, a4 and a16 (qwen3 a4 T = 2 -6.5 %, T = 32 -4 %;
  //   bench/results/NOTES.md, session 14). The kG = 2 kernels (wide route groups) keep 16 columns, as
  //   do calls past kFc2WideRoutes.
  constexpr int64_t kFc2SplitRoutes = 8;
  if (routes < kFc2SplitRoutes) return {false, 1};
  const bool wide = !wide_groups(routes, local_experts) &&
                    routes <= (f16 ? dm::kFc2WideRoutes<true> : dm::kFc2WideRoutes<false>);
  return {wide, wide ? parts32 : parts16};
}

bool direct_micro_supports(const MoeConfig& c, int64_t tokens, std::string* why) {
  if (tokens * c.top_k > route_capacity(c)) {
    if (why)
      *why = detail::concat("T·K = ", tokens, "·", c.top_k, " = ", tokens * c.top_k, " routes is past the ",
                            route_capacity(c), " that direct_micro's ", variant_name(c), " takes");
    return false;
  }
  if (c.local_count() > dm::kMaxExperts) {
    if (why) *why = detail::concat("E_local = ", c.local_count(), " is past direct_micro's ", dm::kMaxExperts);
    return false;
  }
  return true;
}

DirectMicroWorkspace::DirectMicroWorkspace(const MoeConfig& c, const DeviceWeights& w, int64_t max_tokens) {
  max_routes = static_cast<int>(std::min<int64_t>(max_tokens * c.top_k, route_capacity(c)));
  // Row max_routes of a1 and a2 is the zero row that idle lanes of a route group read.
  a1 = DeviceBuffer(static_cast<size_t>(max_routes + 1) * w.h_pad * 2, "workspace.dm_a1");
  a2 = DeviceBuffer(static_cast<size_t>(max_routes + 1) * w.i_pad * 2, "workspace.dm_a2");
  barrier = DeviceBuffer(2 * sizeof(unsigned), "workspace.dm_barrier");
  FP4MOE_CUDA_CHECK(cudaMemset(a1.get(), 0, a1.bytes()));
  FP4MOE_CUDA_CHECK(cudaMemset(a2.get(), 0, a2.bytes()));
  FP4MOE_CUDA_CHECK(cudaMemset(barrier.get(), 0, barrier.bytes()));
  int sms = 0;
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, w.device));
  // One grid for both variants: the smaller of their co-resident CTA counts.
  int per_sm = dm::kBlocksPerSm;
  for (bool wide : {false, true}) {
    const void* k = kernel_for(wide, f16_operands(c));
    // The kernel's shared memory (lookup tables, routing, sums) is past the 48 KB default.
    FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem_bytes(f16_operands(c)))));
    int n = 0;
    FP4MOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, dm::kThreads, smem_bytes(f16_operands(c))));
    per_sm = std::min(per_sm, n);
  }
  FP4MOE_REQUIRE(per_sm >= 1, Unsupported, "backend", "direct_micro cannot be resident on this device");
  grid = sms * per_sm;
  // FC2 has h_pad / 16 items (h_pad / 32 wide); when that is at most half the grid, 2..4 CTAs share
  // each item by expert range, so every CTA streams FC2 weights (items · parts ≤ grid: no CTA holds
  // two, none waits on itself). The scratch holds h_pad columns of every route for either width.
  const int items = w.h_pad / 16;
  fc2_parts = std::clamp(grid / items, 1, dm::kMaxFc2Parts);
  fc2_parts_wide = std::clamp(grid / (items / 2), 1, dm::kMaxFc2Parts);
  if (fc2_parts_wide > 1) {
    fc2_scratch = DeviceBuffer(static_cast<size_t>(w.h_pad) * max_routes * sizeof(float), "workspace.dm_fc2_scratch");
    fc2_flags = DeviceBuffer(static_cast<size_t>(items) * dm::kMaxFc2Parts * sizeof(unsigned), "workspace.dm_fc2_flags");
    FP4MOE_CUDA_CHECK(cudaMemset(fc2_flags.get(), 0, fc2_flags.bytes()));
  }
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());  // the memsets are done before any stream uses the buffers
}

size_t DirectMicroWorkspace::bytes() const {
  return a1.bytes() + a2.bytes() + barrier.bytes() + fc2_scratch.bytes() + fc2_flags.bytes();
}

void launch_direct_micro(const MoeConfig& c, const DeviceWeights& w, DirectMicroWorkspace& ws, const RunArgs& a) {
  // The runner checks T against max_tokens and T·K against the variant's capacity
  // (direct_micro_supports), so this holds for its calls; it guards the workspace's bounds for others.
  FP4MOE_REQUIRE(a.tokens * c.top_k <= ws.max_routes, CapacityError, "num_tokens", "T·K = ", a.tokens * c.top_k,
                 " routes is past the ", ws.max_routes, " that this runner's direct_micro workspace holds");
  dm::Params p{};
  p.x = static_cast<const __nv_bfloat16*>(a.x);
  p.ids = a.ids;
  p.ids_int64 = a.ids_type == IndexType::kInt64;
  p.topk_weights = a.topk_weights;
  p.tokens = static_cast<int>(a.tokens);
  p.top_k = c.top_k;
  p.routes = static_cast<int>(a.tokens * c.top_k);
  p.first = c.local_expert_first;
  p.experts = c.local_count();
  p.hidden = c.hidden, p.h_pad = w.h_pad, p.i_pad = w.i_pad;
  p.gated = c.gated();
  p.nvfp4 = c.format == WeightFormat::kNVFP4;
  p.bf16_words = w.bf16_words;
  p.block = c.weight_block();
  p.q = kernels::quant_kind(c.format, c.mode);
  p.activation = c.activation;
  p.sw_alpha = c.swiglu.alpha, p.sw_beta = c.swiglu.beta, p.sw_limit = c.swiglu.limit;
  p.w13 = w.w13_frag.get<uint4>();
  p.s13 = w.w13_frag_scales.get<uint8_t>();
  p.w2 = w.w2_frag.get<uint4>();
  p.s2 = w.w2_frag_scales.get<uint8_t>();
  p.alpha1 = w.alpha1.get<float>(), p.alpha2 = w.alpha2.get<float>();
  p.g1 = w.fc1_input_scale.get<float>(), p.g2 = w.fc2_input_scale.get<float>();
  p.b13 = c.has_bias ? w.b13.get<float>() : nullptr;
  p.b2 = c.has_bias ? w.b2.get<float>() : nullptr;
  p.a1 = ws.a1.get<__nv_bfloat16>();
  p.a2 = ws.a2.get<__nv_bfloat16>();
  p.zero_row = ws.max_routes;
  p.barrier = {ws.barrier.get<unsigned>(), ws.barrier.get<unsigned>() + 1};
  const bool f16 = f16_operands(c), groups2 = wide_groups(p.routes, c.local_count());
  const DirectMicroFc2Plan fc2 = direct_micro_fc2_plan(f16, p.routes, c.local_count(), ws.fc2_parts, ws.fc2_parts_wide);
  p.fc2_wide = fc2.wide;
  p.fc2_parts = fc2.parts;
  p.fc2_scratch = p.fc2_parts > 1 ? ws.fc2_scratch.get<float>() : nullptr;
  p.fc2_flags = p.fc2_parts > 1 ? ws.fc2_flags.get<unsigned>() : nullptr;
  p.out = a.out;
  p.out_fp32 = c.output_dtype == OutputDType::kFP32;
  p.trace = a.trace;
  void* args[] = {&p};
  FP4MOE_CUDA_CHECK(cudaLaunchCooperativeKernel(kernel_for(groups2, f16), ws.grid,
                                                dm::kThreads, args, smem_bytes(f16), a.stream));
}

}  // namespace fp4moe::gpu
