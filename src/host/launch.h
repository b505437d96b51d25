// The launchers of the GPU backends and their workspaces. Internal; used by gpu_runner.cpp.
// Each launcher file has the stem of its kernel header: launch_generic.cu ↔ kernels/generic.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "fp4moe/config.h"
#include "host/cuda_check.h"
#include "host/device_weights.h"

namespace fp4moe::kernels {
struct MoeGemmParams;  // kernels/common/moe_gemm.cuh
struct RoutingParams;  // kernels/common/routing.cuh
namespace generic {
struct GatherParams;   // kernels/common/gather_combine.cuh
struct CombineParams;
}  // namespace generic
namespace static_moe {
struct Params;  // kernels/static_moe.cuh
}
}

namespace fp4moe::gpu {

// The configuration of a launch that may start while the kernel before it in the stream still runs
// (programmatic dependent launch, sm_90; captured into CUDA graphs as a programmatic edge): the
// kernel must call ptx::wait_prior_grids() in every CTA before it touches what the kernels before it
// write (kernels/common/ptx.cuh). dynamic's chain uses it (launch_dynamic.cu). Launch with
// cudaLaunchKernelEx(&l.config, kernel, args...) or cudaLaunchKernelExC(&l.config, kernel, argv).
struct DependentLaunch {
  cudaLaunchAttribute attr[2];
  cudaLaunchConfig_t config;
  // dependent = false: an ordinary launch through the same call. cooperative: also the cooperative
  // attribute (static's grid barrier needs every CTA resident).
  DependentLaunch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool dependent = true,
                  bool cooperative = false) {
    config = cudaLaunchConfig_t{};
    config.gridDim = grid, config.blockDim = block, config.dynamicSmemBytes = smem, config.stream = stream;
    config.attrs = attr, config.numAttrs = 0;
    if (dependent) {
      attr[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[config.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cooperative) {
      attr[config.numAttrs].id = cudaLaunchAttributeCooperative;
      attr[config.numAttrs++].val.cooperative = 1;
    }
  }
  DependentLaunch(const DependentLaunch&) = delete;  // config.attrs points into this object
  DependentLaunch& operator=(const DependentLaunch&) = delete;
};

// NVFP4 weights with NVFP4 activations (mode a4): every operand value is exact in f16
// (docs/numerics.md), so direct_micro and dynamic's register path run these calls on f16 tensor cores.
inline bool f16_operands(const MoeConfig& c) { return c.format == WeightFormat::kNVFP4 && c.mode == ActMode::kA4; }
// NVFP4 weights with bf16 operands (a16, a8): the codes are stored as bf16 words (DeviceWeights::
// bf16_words), which the register path and direct_micro dequantise with one HMUL2 a register and no
// table loads (frag_a_bf16w). MX weights stay on the tables: their UE8M0 scales reach 2^127, past
// what a scale × 2^118 factor can hold.
inline bool bf16_word_operands(const MoeConfig& c) { return c.format == WeightFormat::kNVFP4 && c.mode != ActMode::kA4; }

struct RunArgs {
  const void* x;
  const void* ids;
  IndexType ids_type;
  const float* topk_weights;
  void* out;
  int64_t tokens;
  cudaStream_t stream;
  unsigned long long* trace = nullptr;  // diagnostics of kernels that support it (direct_micro: per-phase stamps)
};

// ---- generic: routing pre-pass + grouped GEMMs + combine (any shape) ---------------------------
// The smallest m-tile (routed rows) any GEMM asks the routing for: dynamic's register path at few
// rows per expert (dynamic_tile_m). The tile list is sized for it.
inline constexpr int kMinTileM = 16;
struct GenericWorkspace {
  GenericWorkspace(const MoeConfig& c, const DeviceWeights& w, int64_t max_tokens);
  size_t bytes() const;
  DeviceBuffer route_row, row_weight, row_expert, row_route, expert_offset, expert_tile_offset, tile_expert, tile_row0,
      num_tiles, a1, a2, y;
  DeviceBuffer route_counts, route_cursor;  // the multi-CTA routing's per-expert counts and next rows
  int64_t tile_capacity = 0;  // entries of tile_expert / tile_row0 (enough for tile_m >= kMinTileM)
};
void launch_generic(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& ws, const RunArgs& a);

// The generic path's pieces that other backends reuse with the same workspace (launch_generic.cu):
// routing pre-pass with m-tiles of tile_m rows (tile_m >= kMinTileM), gather-quantise into A1 (as f16
// with a1_f16: dynamic's NVFP4-a4 register path), the top-k sum of Y into out, and the GEMM
// parameters of FC1 (fc1) or FC2.
void launch_route(const MoeConfig& c, GenericWorkspace& ws, const RunArgs& a, int tile_m);
// dependent: launched as a programmatic dependent of the kernel before (DependentLaunch).
void launch_gather_quantize(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& ws, const RunArgs& a,
                            bool a1_f16 = false, bool dependent = false);
// Both: at decode sizes (kernels::route_gather_fits: T·K ≤ 1024 routes and a small table) one launch
// of kernels/route.cuh's route_gather_kernel, whose rows follow the route order within each expert;
// otherwise launch_route, then the gather as its programmatic dependent.
void launch_route_gather(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& ws, const RunArgs& a, int tile_m,
                         bool a1_f16);
// The routing and the gather for given parameters (the kernel-level tests compare the two): fused
// (route_gather_kernel; needs kernels::route_gather_fits) or as a call past that line takes them up
// to kernels::kRouteChunk routes (route_kernel, then the gather as its dependent). InvalidArgument
// past those limits.
void launch_route_gather_kernels(const kernels::RoutingParams& rp, const kernels::generic::GatherParams& gp, bool fused,
                                 cudaStream_t stream);
// acc: the sums of the dynamic backend's scatter-add (MoeGemmParams::out_acc) to round into out
// instead of summing Y.
void launch_combine(const MoeConfig& c, GenericWorkspace& ws, const RunArgs& a, bool dependent = false,
                    const float* acc = nullptr);
kernels::MoeGemmParams moe_gemm_params(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& ws,
                                       const RunArgs& a, bool fc1);
// The parameters of those pieces, for the static backend, which runs them inside its own launch:
// the routing's (checks the tile list holds m-tiles of tile_m), the gather's (a1_f16 as above) and
// the top-k sum's.
kernels::RoutingParams routing_params(const MoeConfig& c, GenericWorkspace& ws, const RunArgs& a, int tile_m);
kernels::generic::GatherParams gather_params(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& ws,
                                             const RunArgs& a, bool a1_f16);
kernels::generic::CombineParams combine_params(const MoeConfig& c, GenericWorkspace& ws, const RunArgs& a);

// ---- dynamic: the generic path with wgmma GEMMs (prefill; kernels/dynamic.cuh) ---------------------
// Uses the GenericWorkspace's buffers (a runner runs one call at a time on its stream); owns the
// device facts its launches need and, when reserved, the bf16 path's weight copy.
struct DynamicWorkspace {
  explicit DynamicWorkspace(int device);
  size_t bytes() const { return w_bf16.bytes() + split_partials.bytes() + split_flags.bytes(); }
  int sms = 0;              // persistent grid size
  std::string unsupported;  // why this device cannot run the kernels (empty: it can)
  // The bf16 path (kernels/dynamic_bf16.cuh): room for one GEMM's bf16 weights of bf16_group
  // experts, taken by calls with at least bf16_min_rows routes per expert (T·K / E). 0: never.
  DeviceBuffer w_bf16;
  int bf16_group = 0;
  int64_t bf16_min_rows = 0;
  int tile_m = 0;  // the register path's m-tile (RunnerOptions::dynamic_tile_m): 0 = dynamic_tile_m per call
  bool deterministic = false;  // RunnerOptions::deterministic: no scatter-add (launch_dynamic.cu)
  // The register path's last-wave split (kernels/dynamic.cuh Split, kSplitTileM-row tiles): a slot of
  // BN × 16 fp32 partial sums and a flag per CTA (sms × 16 KB in all), the flags 0 between launches.
  DeviceBuffer split_partials, split_flags;
};
bool dynamic_supports(const DynamicWorkspace& ws, std::string* why);
// Why `device` cannot run the wgmma kernels with `smem` bytes of shared memory per CTA (empty: it can).
std::string wgmma_device_problem(int device, size_t smem);
void launch_dynamic(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& gws, DynamicWorkspace& ws,
                    const RunArgs& a);
// The dynamic GEMM alone, for the kernel-level tests: p with its tile schedule already on the device,
// at most max_tiles m-tiles. watchdog: null, or a zeroed device int[kernels::ptx::kWatchdogReportInts]
// that a pipeline wait which timed out fills (kernels/common/mbarrier.cuh says with what).
// tile_m: the m-tile the schedule was built with, 16, 32, 64 or 128 (others: InvalidArgument).
void launch_dynamic_gemm(const DynamicWorkspace& ws, const kernels::MoeGemmParams& p, bool fc1, int64_t max_tiles,
                         int tile_m, int* watchdog, cudaStream_t stream);
// The register path's m-tile for a call of `routes` routes over `experts` local experts: `forced`
// when it is not 0 (RunnerOptions::dynamic_tile_m, validated by the runner), otherwise the smallest
// of 16, 32, 64 and 128 routed rows that holds twice the average rows per expert (launch_dynamic.cu says
// why twice; a tile's rows past its expert are MACs spent for nothing).
int dynamic_tile_m(int64_t routes, int experts, int forced = 0);
// The register path's GEMM with m-tiles of BM (16, 32, 64, 128) routed rows: shared memory, opt-in and
// launch (launch_dynamic_gemm.cuh, instantiated in launch_dynamic_bm{16,32,64,128}.cu).
template <int BM>
size_t dynamic_gemm_smem();
template <int BM>
std::string dynamic_gemm_opt_in();  // empty, or why the kernels cannot run on this device
template <int BM>
void launch_dynamic_gemm_bm(const DynamicWorkspace& ws, const kernels::MoeGemmParams& p, bool fc1, int64_t tiles,
                            int* watchdog, cudaStream_t s);
// Weight n-tiles per m-tile of dynamic's GEMMs (both paths).
int dynamic_n_tiles(const kernels::MoeGemmParams& p, bool fc1);

// The bf16 path (launch_dynamic_bf16.cu). Bytes of one expert's bf16 copy for the larger GEMM.
int64_t dynamic_bf16_expert_bytes(const MoeConfig& c, const DeviceWeights& w);
// Reserves the copy for as many whole local experts as `budget` bytes hold; InvalidArgument naming
// options.prefill_bf16_bytes when it holds none. min_rows: routes per expert from which calls take
// it. reachable = false (max_tokens below the line): the budget is checked, nothing is allocated.
void reserve_dynamic_bf16(DynamicWorkspace& ws, const MoeConfig& c, const DeviceWeights& w, int64_t budget,
                          int64_t min_rows, bool reachable);
bool dynamic_uses_bf16(const MoeConfig& c, const DynamicWorkspace& ws, int64_t tokens);
// Shared memory of the bf16 GEMM, and its once-per-device opt-in (DynamicWorkspace's constructor).
size_t dynamic_bf16_smem_bytes();
// Routed rows per m-tile of the bf16 GEMM: the routing's tile_m when a call takes the bf16 path.
int dynamic_bf16_tile_m();
void dynamic_bf16_opt_in();
// Everything between the routing/gather and the combine on the bf16 path: per group of experts,
// dequantise FC1's weights, FC1, dequantise FC2's, FC2.
void launch_dynamic_bf16_groups(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& gws,
                                DynamicWorkspace& ws, const RunArgs& a, int64_t max_tiles);
// One GEMM on the bf16 path for the kernel-level tests: p names the group (expert_base,
// expert_count, w_bf16 of at least expert_count experts) and its tile schedule (expert_tile_offset
// included); dequantises, then multiplies.
void launch_dynamic_bf16_gemm(const DynamicWorkspace& ws, const kernels::MoeGemmParams& p, bool fc1,
                              int64_t max_tiles, int* watchdog, cudaStream_t stream);

// ---- static: FC1, FC2 and the top-k sum in one cooperative launch ---------------------------------
// (kernels/static_moe.cuh: dynamic's register-path CTA, one grid barrier and per-m-tile counters,
// after the generic path's routing and gather). Uses the GenericWorkspace's buffers; owns the grid
// barrier's two words, the counters and the device facts.
// Routes (T·K) static takes: its decode and middle range (its grid barrier and fixed assignment
// pay only while the GEMMs are short); past a few thousand routes dynamic is the backend to use.
inline constexpr int64_t kStaticMaxRoutes = 4096;
struct StaticWorkspace {
  explicit StaticWorkspace(int device);
  size_t bytes() const { return barrier.bytes() + fc1_done.bytes(); }
  int sms = 0;
  std::string unsupported;  // why this device cannot run the kernels (empty: it can)
  DeviceBuffer barrier;     // grid barrier: count, epoch (zeroed once; grid_barrier.cuh)
  DeviceBuffer fc1_done;    // FC1 items finished per m-tile (static_moe.cuh; zeroed by each call)
};
// Whether static takes T = tokens: the device can run it and T·K <= kStaticMaxRoutes.
bool static_supports(const MoeConfig& c, const StaticWorkspace& ws, int64_t tokens, std::string* why);
// The m-tile of a call: dynamic_tile_m's rule within 32 and 64 rows (static's kernels).
int static_tile_m(int64_t routes, int experts);
void launch_static(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& gws, StaticWorkspace& ws,
                   const RunArgs& a);
// Per m-tile width BM (32, 64): opt-in and checks (empty, or why the kernels cannot run here), and
// the launch of a grid of every SM's resident CTAs (launch_static_moe.cuh).
template <int BM>
std::string static_opt_in();
template <int BM>
void launch_static_bm(const kernels::static_moe::Params& p, int sms, cudaStream_t s);

// ---- direct_micro: one cooperative launch for decode ---------------------------------------------
struct DirectMicroWorkspace {
  // Holds min(max_tokens · K, the config's variant capacity) routes.
  DirectMicroWorkspace(const MoeConfig& c, const DeviceWeights& w, int64_t max_tokens);
  size_t bytes() const;
  int max_routes = 0;  // routes (T·K) this workspace holds
  int grid = 0;        // co-resident CTAs of the compiled kernel on this device
  int fc2_parts = 1;       // CTAs per FC2 item of 16 columns (direct_micro.cuh Params::fc2_parts)
  int fc2_parts_wide = 1;  // the same for items of 32 columns (Params::fc2_wide)
  DeviceBuffer a1, a2, barrier, fc2_scratch, fc2_flags;
};
// RunArgs::trace of direct_micro: [grid][kDirectMicroTraceSlots] per CTA, zeroed by the caller: %globaltimer
// stamps (start, setup, phase 0, barrier, phase 1, barrier, end), then ns summed over the CTA's items
// (FC1 GEMM, FC1 epilogue + Q2, FC2 GEMM, FC2 top-k sum), then the CTA's %smid, FC1 items, FC2 items.
inline constexpr int kDirectMicroTraceStamps = 7;
inline constexpr int kDirectMicroTraceSums = 4;
inline constexpr int kDirectMicroTraceSlots = kDirectMicroTraceStamps + kDirectMicroTraceSums + 3;
// Whether direct_micro takes T = tokens: T·K within the capacity of the variant the config uses
// (f16 for NVFP4 weights with a4 activations: 1024 routes; bf16 otherwise: 512) and E_local ≤ 1024.
bool direct_micro_supports(const MoeConfig& c, int64_t tokens, std::string* why);
// kAuto's choice of direct_micro for T·K = `routes` (capacity and support checked apart), from the
// measured sweeps cited in gpu_runner.cpp; dynamic_runs: dynamic can take the call (sm_90).
bool direct_micro_preferred(const MoeConfig& c, int64_t routes, bool dynamic_runs);
// direct_micro's FC2 items for a call of `routes` routes (T·K): 32 output columns (wide) or 16, and
// the CTAs that share each (parts: the workspace's fc2_parts_wide or fc2_parts, given here as parts32
// and parts16, or 1). Depends on the routes, never on T alone (launch_direct_micro.cu says why).
struct DirectMicroFc2Plan {
  bool wide;
  int parts;
};
DirectMicroFc2Plan direct_micro_fc2_plan(bool f16, int64_t routes, int64_t local_experts, int parts16, int parts32);
void launch_direct_micro(const MoeConfig& c, const DeviceWeights& w, DirectMicroWorkspace& ws, const RunArgs& a);

}  // namespace fp4moe::gpu
