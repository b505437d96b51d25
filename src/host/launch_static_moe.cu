// Launch of the static backend (src/kernels/static_moe.cuh): the generic path's routing and gather,
// then FC1, FC2 and the top-k sum in one cooperative launch of dynamic's register-path CTA.
#include <cuda_runtime.h>

#include <algorithm>

#include "fp4moe/errors.h"
#include "host/launch.h"
#include "host/launch_dynamic_gemm.cuh"  // register_path_maps
#include "host/tensor_map.h"
#include "kernels/static_moe.cuh"

namespace fp4moe::gpu {

namespace sk = kernels::static_moe;

StaticWorkspace::StaticWorkspace(int device) {
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int cooperative = 0;
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
  // Its CTAs are dynamic's register-path CTAs (m-tiles of 32 and 64 rows).
  unsupported = wgmma_device_problem(device, std::max(dynamic_gemm_smem<32>(), dynamic_gemm_smem<64>()));
  if (unsupported.empty() && !cooperative)
    unsupported = "needs cooperative launches, which device " + std::to_string(device) + " does not offer";
  if (!unsupported.empty()) return;
  for (std::string why : {static_opt_in<32>(), static_opt_in<64>()})
    if (unsupported.empty() && !why.empty()) unsupported = why;
  barrier = DeviceBuffer(2 * sizeof(unsigned), "workspace.static_barrier");
  // m-tiles of at least 32 rows over at most kStaticMaxRoutes routes and kMaxExperts local experts.
  fc1_done = DeviceBuffer((kStaticMaxRoutes / 32 + kMaxExperts) * sizeof(unsigned), "workspace.static_fc1_done");
  FP4MOE_CUDA_CHECK(cudaMemset(fc1_done.get(), 0, fc1_done.bytes()));  // each call leaves them zero
  FP4MOE_CUDA_CHECK(cudaMemset(barrier.get(), 0, barrier.bytes()));
  FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());  // zeroed before any stream uses it
}

bool static_supports(const MoeConfig& c, const StaticWorkspace& ws, int64_t tokens, std::string* why) {
  if (!ws.unsupported.empty()) {
    if (why) *why = ws.unsupported;
    return false;
  }
  if (tokens * c.top_k > kStaticMaxRoutes) {
    if (why) *why = detail::concat("T·K = ", tokens, "·", c.top_k, " = ", tokens * c.top_k, " routes is past the ",
                                   kStaticMaxRoutes, " of static's decode and middle range (dynamic takes more)");
    return false;
  }
  return true;
}

// dynamic's rule (twice the average rows per expert), with 64 rows the largest tile: static serves
// at most kStaticMaxRoutes routes, so a 128-row tile would only be chosen past 64 routes per expert
// (few experts), where dynamic is the backend to use. 32 the smallest: static has no 16-row kernels,
// which dynamic's rule takes up to 8 routed rows per expert.
int static_tile_m(int64_t routes, int experts) { return std::clamp(dynamic_tile_m(routes, experts), 32, 64); }

void launch_static(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& gws, StaticWorkspace& ws,
                   const RunArgs& a) {
  // The runner checks this before every call; it guards the routing's limit for other callers.
  std::string why;
  FP4MOE_REQUIRE(static_supports(c, ws, a.tokens, &why), Unsupported, "backend", "static: ", why);
  const bool f16 = f16_operands(c);
  sk::Params p{};
  const int tile_m = static_tile_m(a.tokens * c.top_k, c.local_count());
  // The routing and the gather: the generic path's launches (one up to 1024 routes), before static's.
  launch_route_gather(c, w, gws, a, tile_m, f16);
  p.num_tiles = gws.num_tiles.get<int>();
  p.tokens = static_cast<int>(a.tokens);
  p.fc1 = moe_gemm_params(c, w, gws, a, true);
  p.fc2 = moe_gemm_params(c, w, gws, a, false);
  p.fc1.f16 = p.fc2.f16 = f16;
  p.maps1 = register_path_maps(p.fc1, tile_m, true);
  p.maps2 = register_path_maps(p.fc2, tile_m, false);
  p.n1_tiles = dynamic_n_tiles(p.fc1, true);
  p.n2_tiles = dynamic_n_tiles(p.fc2, false);
  p.combine = combine_params(c, gws, a);
  p.barrier = {ws.barrier.get<unsigned>(), ws.barrier.get<unsigned>() + 1};
  p.fc1_done = ws.fc1_done.get<unsigned>();
  p.watchdog = nullptr;  // pipeline waits without a time limit, as dynamic's production launches
  p.trace = a.trace;     // diagnostics only (GpuDiagnostics.DISABLED_StaticItems)
  if (tile_m == 32) launch_static_bm<32>(p, ws.sms, a.stream);
  else launch_static_bm<64>(p, ws.sms, a.stream);
}

}  // namespace fp4moe::gpu
