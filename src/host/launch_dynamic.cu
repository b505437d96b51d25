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

// The top-k sum on the register path without RunnerOptions::deterministic, from this many routes
// (T·K) on: FC2's epilogue adds each routed row's weighted values into an fp32 sum per token
// (MoeGemmParams::out_acc: the fp32 output itself, or Y's buffer rounded into a bf16 output by the
// combine launch), zeroed before the routing, instead of storing Y for the combine to sum in slot
// order. Why: at qwen3-30b-a3b a4 T = 16384 (H100, session 32's ncu-times,
// bench/results/h100-ncu-times-20261207-s32-dynamic-qwen3-a4-4096-16384.txt) the combine took ~390
// of ~3520 µs reading Y's 1.07 GB (T·K rows × H fp32), and FC2 wrote the same bytes. Measured in
// session 36 (H100, bench/results/h100-ncu-times-20261207-s36-sc.txt): where the sums (T × H fp32)
// fit L2 the reductions cost FC2 nothing (qwen3-30b-a3b a4 T = 2048: FC2 144 → 140 µs, combine
// 50 → 10, the call −8 to −9 %); at T = 16384 (134 MB of sums) they miss L2 and FC2 grows by 204 µs
// against the combine's 305 saved (−2 %, inside the run-to-run spread). The sums are the same
// up to fp32 summation order (each route's value is); the order varies from run to run, and the
// reductions (REDG.ADD.F32x4.FTZ) flush fp32 subnormals, below bf16's smallest normal too. Below the
// line the deterministic chain stays: at decode the combine is a few µs and a memset node would
// cost about as much.
constexpr int64_t kScatterMinRoutes = 4096;

// Σ_e ceil(r_e / tile_m) ≤ ceil(R / tile_m) + (number of non-empty experts) − 1.
int64_t max_tiles(int64_t routes, int experts, int tile_m) {
  return (routes + tile_m - 1) / tile_m + std::min<int64_t>(experts, routes);
}

void launch_gemm(const DynamicWorkspace& ws, const kernels::MoeGemmParams& p, bool fc1, int64_t tiles, int tile_m,
                 int* watchdog, cudaStream_t s) {
  switch (tile_m) {
    case 16: return launch_dynamic_gemm_bm<16>(ws, p, fc1, tiles, watchdog, s);
    case 32: return launch_dynamic_gemm_bm<32>(ws, p, fc1, tiles, watchdog, s);
    case 64: return launch_dynamic_gemm_bm<64>(ws, p, fc1, tiles, watchdog, s);
    case 128: return launch_dynamic_gemm_bm<128>(ws, p, fc1, tiles, watchdog, s);
  }
  FP4MOE_REQUIRE(false, InvalidArgument, "tile_m", "dynamic's register path has m-tiles of 16, 32, 64 or 128 rows, got ",
                 tile_m);
}

}  // namespace

// A gated FC1 tile holds BN/2 up and BN/2 gate rows (i_pad % 64 == 0); otherwise BN rows, the last
// tile partial where w_rows (i_pad or h_pad, multiples of 64) is not a multiple of BN.
int dynamic_n_tiles(const kernels::MoeGemmParams& p, bool fc1) {
  return fc1 && p.gated ? p.i_pad / (dk::BN / 2) : (p.w_rows + dk::BN - 1) / dk::BN;
}

std::string wgmma_device_problem(int device, size_t smem) {
  int major = 0, optin = 0;
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (major != 9)
    return "needs an sm_90 (Hopper) GPU for wgmma, device " + std::to_string(device) + " is sm_" +
           std::to_string(major) + "x";
  if (static_cast<size_t>(optin) < smem)
    return "needs " + std::to_string(smem) + " bytes of shared memory per CTA, device " + std::to_string(device) +
           " allows " + std::to_string(optin);
  return {};
}

DynamicWorkspace::DynamicWorkspace(int device) {
  FP4MOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  unsupported = wgmma_device_problem(device, std::max({dynamic_gemm_smem<16>(), dynamic_gemm_smem<32>(), dynamic_gemm_smem<64>(),
                                                       dynamic_gemm_smem<128>(), dynamic_bf16_smem_bytes()}));
  if (unsupported.empty()) {
    dynamic_bf16_opt_in();
    for (std::string why : {dynamic_gemm_opt_in<16>(), dynamic_gemm_opt_in<32>(), dynamic_gemm_opt_in<64>(),
                            dynamic_gemm_opt_in<128>()})
      if (unsupported.empty() && !why.empty()) unsupported = why;
  }
  if (unsupported.empty()) {
    // A slot of BN × kSplitTileM floats and a flag a CTA of the split kernels' grid (every resident
    // CTA: register_path_ctas_per_sm an SM).
    constexpr size_t kCtas = std::max(dk::kCtasPerSm<dk::kSplitTileM, false>, dk::kCtasPerSm<dk::kSplitTileM, true>);
    split_partials = DeviceBuffer(static_cast<size_t>(sms) * kCtas * dk::BN * dk::kSplitTileM * sizeof(float),
                                  "workspace.dynamic_split_partials");
    split_flags = DeviceBuffer(static_cast<size_t>(sms) * kCtas * sizeof(unsigned), "workspace.dynamic_split_flags");
    FP4MOE_CUDA_CHECK(cudaMemset(split_flags.get(), 0, split_flags.bytes()));
    FP4MOE_CUDA_CHECK(cudaDeviceSynchronize());  // the flags are 0 before any stream uses them
  }
}

bool dynamic_supports(const DynamicWorkspace& ws, std::string* why) {
  if (ws.unsupported.empty()) return true;
  if (why) *why = ws.unsupported;
  return false;
}

// A tile twice the average: the register path dequantises an expert's weights once per m-tile, so an
// expert whose rows spill into a second m-tile costs more than the MACs a smaller tile saves. Measured
// on the H200 (bench/results/NOTES.md, session 9, `h200-prefill-20261203-s9-a4.md` against the BM = 128
// rows of `…-s9-table.md`): at 8 and 16 rows per expert 32-row tiles were 14–17 % faster (qwen3-30b-a3b
// T = 128 448 → 381 µs, deepseek-v3 T = 512 6.63 → 5.58 ms); with the tile equal to the average they
// were 12–30 % slower (qwen3 T = 512 at 32 rows: 481 → 549 µs; deepseek-v3 T = 2048 at 64: 7.52 →
// 9.82 ms). Re-measured with the tile forced after the two-CTA BM = 32 kernel (session 12,
// `h200-prefill-20261203-s12-tile{32,64}.jsonl`): at 32 rows per expert 64-row tiles were as fast or
// faster (qwen3 T = 512 397.2 against 397.1 µs, deepseek-v3 T = 1024 5464 against 5607), at 8–16 rows
// 32-row tiles won by 28–41 %; so the rule stands.
// 16-row tiles (session 27, `h100-20261206-s27-bm16-ab.md`, H100, every named shape at T = 2…64,
// --dynamic-tile-m 16 against 32): faster at 70 of 72 points (median 0.954; deepseek-v3 a4 T = 64
// 2135 → 1923 µs, mixtral-8x7b a4 T = 4 254 → 221) up to 8 rows per expert (mixtral T = 32: 0.96–0.97),
// slower at 16 (mixtral T = 64: +21 / +35 %, some experts' rows spill into a second tile); so twice
// the average within 16 takes 16. With the rule in (session 29, `h100-20261206-s29-bm16-ab.md`, kAuto's
// rows against the rule within 32..128): median 0.977 over 60 points at T = 4…512, 46 faster
// (llama4-scout a16 T = 32 and 128 −8.4 %), none slower past noise (deepseek-v3 a16 T = 512 +8.1 %
// runs 32-row tiles in both trees).
int dynamic_tile_m(int64_t routes, int experts, int forced) {
  if (forced > 0) return forced;
  const int64_t per_expert = experts > 0 ? (routes + experts - 1) / experts : routes;
  return 2 * per_expert <= 16 ? 16 : 2 * per_expert <= 32 ? 32 : 2 * per_expert <= 64 ? 64 : 128;
}

void launch_dynamic_gemm(const DynamicWorkspace& ws, const kernels::MoeGemmParams& p, bool fc1, int64_t max_tiles,
                         int tile_m, int* watchdog, cudaStream_t stream) {
  FP4MOE_REQUIRE(ws.unsupported.empty(), Unsupported, "backend", "dynamic: ", ws.unsupported);
  FP4MOE_REQUIRE(p.k_pad % dk::BK == 0 && p.k_pad > 0, InvalidArgument, "k_pad", "must be a positive multiple of ",
                 dk::BK, ", got ", p.k_pad);
  launch_gemm(ws, p, fc1, max_tiles, tile_m, watchdog, stream);
}

void launch_dynamic(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& gws, DynamicWorkspace& ws,
                    const RunArgs& a) {
  // The m-tile (dynamic_bf16.cuh: 256 routed rows; here 16, 32, 64 or 128 from the rows per expert) is
  // chosen before the routing builds the tile list, and with it the path.
  const bool bf16 = dynamic_uses_bf16(c, ws, a.tokens);
  const int tile_m = bf16 ? dynamic_bf16_tile_m() : dynamic_tile_m(a.tokens * c.top_k, c.local_count(), ws.tile_m);
  const int64_t tiles = max_tiles(a.tokens * c.top_k, c.local_count(), tile_m);
  // NVFP4-a4 on the register path: A1 and A2 in f16 and the f16 kernels (dynamic.cuh, kF16).
  const bool f16 = !bf16 && f16_operands(c);
  // route → gather → FC1 → FC2 → combine (the first two one launch at decode sizes,
  // launch_route_gather): each launch after the routing is a programmatic dependent of the one
  // before (DependentLaunch): it starts as the one before has started all its CTAs, sets up, and
  // waits for it to complete (ptx::wait_prior_grids) before reading its output. The routing is an
  // ordinary launch, so a call still begins after everything before it in the stream.
  // The scatter-add (kScatterMinRoutes) sums into the fp32 output itself, or into Y's buffer (T·K ≥ T
  // rows of H floats) for a bf16 one; zeroed before the routing, an ordinary launch.
  const bool scatter = !bf16 && !ws.deterministic && a.tokens * c.top_k >= kScatterMinRoutes;
  const bool out_fp32 = c.output_dtype == OutputDType::kFP32;
  float* acc = scatter ? (out_fp32 ? static_cast<float*>(a.out) : gws.y.get<float>()) : nullptr;
  if (scatter) FP4MOE_CUDA_CHECK(cudaMemsetAsync(acc, 0, a.tokens * c.hidden * sizeof(float), a.stream));
  launch_route_gather(c, w, gws, a, tile_m, f16);
  if (bf16) {
    launch_dynamic_bf16_groups(c, w, gws, ws, a, tiles);
  } else {
    for (const bool fc1 : {true, false}) {
      kernels::MoeGemmParams p = moe_gemm_params(c, w, gws, a, fc1);
      p.f16 = f16;
      if (!fc1 && scatter) p.out_acc = acc, p.row_route = gws.row_route.get<int>();
      launch_gemm(ws, p, fc1, tiles, tile_m, nullptr, a.stream);
    }
  }
  if (!scatter) launch_combine(c, gws, a, /*dependent=*/true);
  else if (!out_fp32) launch_combine(c, gws, a, /*dependent=*/true, acc);
}

}  // namespace fp4moe::gpu
