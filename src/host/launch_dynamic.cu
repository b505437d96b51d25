// Launches of the dynamic (prefill) path: the generic path's routing, gather and combine around the
// wgmma GEMMs of src/kernels/dynamic.cuh.
#include <cuda_runtime.h>

#include <algorithm>

#include "fp4moe/errors.h"
#include "host/launch.h"
#include "kernels/common/moe_gemm.cuh"
#include "kernels/dynamic.cuh"

namespace fp4moe::gpu {
namespace {

namespace dk = kernels::dynamic;

constexpr size_t kSmemBytes = sizeof(dk::Smem);

// Σ_e ceil(r_e / tile_m) ≤ ceil(R / tile_m) + (number of non-empty experts) − 1.
int64_t max_tiles(int64_t routes, int experts, int tile_m) {
  return (routes + tile_m - 1) / tile_m + std::min<int64_t>(experts, routes);
}

template <bool kFc1>
void launch_gemm(const DynamicWorkspace& ws, const kernels::MoeGemmParams& p, int64_t tiles, int* watchdog,
                 cudaStream_t s) {
  const int n_tiles = dynamic_n_tiles(p, kFc1);
  const int64_t work = tiles * n_tiles;
  if (work == 0) return;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ws.sms, work));
  dk::gemm_kernel<kFc1><<<grid, dk::kThreads, kSmemBytes, s>>>(p, n_tiles, watchdog);
  FP4MOE_CHECK_LAUNCH(kFc1 ? "dynamic::gemm_kernel<fc1>" : "dynamic::gemm_kernel<fc2>");
}

}  // namespace

// A gated FC1 tile holds BN/2 up and BN/2 gate rows (i_pad % 64 == 0); otherwise BN rows, the last
// tile partial where w_rows (i_pad or h_pad, multiples of 64) is not a multiple of BN.
int dynamic_n_tiles(const kernels::MoeGemmParams& p, bool fc1) {
  return fc1 && p.gated ? p.i_pad / (dk::BN / 2) : (p.w_rows + dk::BN - 1) / dk::BN;
}

DynamicWorkspace::DynamicWorkspace(int device) {
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int major = 0, optin = 0;
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (major != 9) {
    unsupported = "needs an sm_90 (Hopper) GPU for wgmma, device " + std::to_string(device) + " is sm_" +
                  std::to_string(major) + "x";
  } else if (const size_t need = std::max(kSmemBytes, dynamic_bf16_smem_bytes()); static_cast<size_t>(optin) < need) {
    unsupported = "needs " + std::to_string(need) + " bytes of shared memory per CTA, device " +
                  std::to_string(device) + " allows " + std::to_string(optin);
  } else {
    dynamic_bf16_opt_in();
    // Above 48 KB a kernel must opt in, once per device (the caller has made `device` current).
    FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(dk::gemm_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kSmemBytes)));
    FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(dk::gemm_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kSmemBytes)));
  }
}

bool dynamic_supports(const DynamicWorkspace& ws, std::string* why) {
  if (ws.unsupported.empty()) return true;
  if (why) *why = ws.unsupported;
  return false;
}

void launch_dynamic_gemm(const DynamicWorkspace& ws, const kernels::MoeGemmParams& p, bool fc1, int64_t max_tiles,
                         int* watchdog, cudaStream_t stream) {
  FP4MOE_REQUIRE(ws.unsupported.empty(), Unsupported, "backend", "dynamic: ", ws.unsupported);
  FP4MOE_REQUIRE(p.k_pad % dk::BK == 0 && p.k_pad > 0, InvalidArgument, "k_pad", "must be a positive multiple of ",
                 dk::BK, ", got ", p.k_pad);
  if (fc1) launch_gemm<true>(ws, p, max_tiles, watchdog, stream);
  else launch_gemm<false>(ws, p, max_tiles, watchdog, stream);
}

void launch_dynamic(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& gws, DynamicWorkspace& ws,
                    const RunArgs& a) {
  // The two paths' m-tiles differ (dynamic_bf16.cuh: 256 routed rows, here BM = 128), so the
  // path is chosen before the routing builds the tile list.
  const bool bf16 = dynamic_uses_bf16(c, ws, a.tokens);
  const int tile_m = bf16 ? dynamic_bf16_tile_m() : dk::BM;
  const int64_t tiles = max_tiles(a.tokens * c.top_k, c.local_count(), tile_m);
  launch_route(c, gws, a, tile_m);
  launch_gather_quantize(c, w, gws, a);
  if (bf16) {
    launch_dynamic_bf16_groups(c, w, gws, ws, a, tiles);
  } else {
    launch_gemm<true>(ws, moe_gemm_params(c, w, gws, a, true), tiles, nullptr, a.stream);
    launch_gemm<false>(ws, moe_gemm_params(c, w, gws, a, false), tiles, nullptr, a.stream);
  }
  launch_combine(c, gws, a);
}

}  // namespace fp4moe::gpu
