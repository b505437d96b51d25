// Launches of dynamic's bf16 path (src/kernels/dynamic_bf16.cuh): per group of local experts,
// dequantise one GEMM's weights into the workspace's bf16 copy, then run the GEMM over it.
#include <cuda_runtime.h>

#include <algorithm>

#include "fp4moe/errors.h"
#include "host/launch.h"
#include "host/tensor_map.h"
#include "kernels/dynamic_bf16.cuh"

namespace fp4moe::gpu {
namespace {

namespace db = kernels::dynamic_bf16;

constexpr size_t kSmemBytes = sizeof(db::Smem) + db::kSmemAlign;  // slack to align the tiles to 1024 B

// The shape fields of one GEMM's parameters that fix its weight tiles (dynamic_n_tiles, k_pad).
kernels::MoeGemmParams gemm_shape(const MoeConfig& c, const DeviceWeights& w, bool fc1) {
  kernels::MoeGemmParams p{};
  p.gated = c.gated();
  p.i_pad = w.i_pad;
  p.w_rows = fc1 ? w.n1_pad : w.h_pad;
  p.k_pad = fc1 ? w.h_pad : w.i_pad;
  return p;
}

int64_t copy_bytes(const kernels::MoeGemmParams& p, bool fc1) {
  return db::tiles_per_slot(dynamic_n_tiles(p, fc1), p.k_pad) * db::kWTileBytes;
}

template <bool kFc1>
void launch_one(const DynamicWorkspace& ws, const kernels::MoeGemmParams& p, int64_t max_tiles, int* watchdog,
                cudaStream_t s) {
  const int n_tiles = dynamic_n_tiles(p, kFc1);
  const int64_t units = static_cast<int64_t>(p.expert_count) * n_tiles * (p.k_pad / db::BK) * 8;
  const int64_t work = max_tiles * n_tiles;
  if (units == 0 || work == 0 || p.a_rows <= 0) return;
  constexpr int kWarps = db::kDequantThreads / 32;
  const unsigned dq_grid = static_cast<unsigned>(std::min<int64_t>((units + kWarps - 1) / kWarps, 8 * ws.sms));
  db::dequant_kernel<kFc1><<<dq_grid, db::kDequantThreads, 0, s>>>(p, n_tiles);
  FP4MOE_CHECK_LAUNCH(kFc1 ? "dynamic_bf16::dequant_kernel<fc1>" : "dynamic_bf16::dequant_kernel<fc2>");
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ws.sms, work));
  db::gemm_kernel<kFc1><<<grid, db::kThreads, kSmemBytes, s>>>(p, activation_map(p, db::BM), n_tiles, watchdog);
  FP4MOE_CHECK_LAUNCH(kFc1 ? "dynamic_bf16::gemm_kernel<fc1>" : "dynamic_bf16::gemm_kernel<fc2>");
}

}  // namespace

size_t dynamic_bf16_smem_bytes() { return kSmemBytes; }
int dynamic_bf16_tile_m() { return db::BM; }

void dynamic_bf16_opt_in() {
  require_tensor_map_encoder();  // looked up here, outside any stream capture
  FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(db::gemm_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmemBytes)));
  FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(db::gemm_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmemBytes)));
}

int64_t dynamic_bf16_expert_bytes(const MoeConfig& c, const DeviceWeights& w) {
  return std::max(copy_bytes(gemm_shape(c, w, true), true), copy_bytes(gemm_shape(c, w, false), false));
}

void reserve_dynamic_bf16(DynamicWorkspace& ws, const MoeConfig& c, const DeviceWeights& w, int64_t budget,
                          int64_t min_rows, bool reachable) {
  const int64_t per_expert = dynamic_bf16_expert_bytes(c, w);
  FP4MOE_REQUIRE(budget >= per_expert, InvalidArgument, "options.prefill_bf16_bytes", "holds ", budget,
                 " bytes, less than one expert's bf16 weights (", per_expert, " bytes for ", c.to_string(),
                 "); give at least that, or 0 to never dequantise once per call");
  if (!reachable) return;
  ws.bf16_group = static_cast<int>(std::min<int64_t>(c.local_count(), budget / per_expert));
  ws.bf16_min_rows = min_rows;
  ws.w_bf16 = DeviceBuffer(static_cast<size_t>(ws.bf16_group * per_expert), "workspace.prefill_bf16");
}

bool dynamic_uses_bf16(const MoeConfig& c, const DynamicWorkspace& ws, int64_t tokens) {
  return ws.bf16_group > 0 && tokens * c.top_k >= ws.bf16_min_rows * c.num_experts;
}

void launch_dynamic_bf16_groups(const MoeConfig& c, const DeviceWeights& w, GenericWorkspace& gws,
                                DynamicWorkspace& ws, const RunArgs& a, int64_t max_tiles) {
  const int EL = c.local_count();
  for (int e0 = 0; e0 < EL; e0 += ws.bf16_group) {
    for (const bool fc1 : {true, false}) {
      kernels::MoeGemmParams p = moe_gemm_params(c, w, gws, a, fc1);
      p.expert_tile_offset = gws.expert_tile_offset.get<int>();
      p.expert_base = e0;
      p.expert_count = std::min(ws.bf16_group, EL - e0);
      p.w_bf16 = ws.w_bf16.get<__nv_bfloat16>();
      if (fc1) launch_one<true>(ws, p, max_tiles, nullptr, a.stream);
      else launch_one<false>(ws, p, max_tiles, nullptr, a.stream);
    }
  }
}

void launch_dynamic_bf16_gemm(const DynamicWorkspace& ws, const kernels::MoeGemmParams& p, bool fc1,
                              int64_t max_tiles, int* watchdog, cudaStream_t stream) {
  FP4MOE_REQUIRE(ws.unsupported.empty(), Unsupported, "backend", "dynamic: ", ws.unsupported);
  FP4MOE_REQUIRE(p.k_pad % db::BK == 0 && p.k_pad > 0, InvalidArgument, "k_pad", "must be a positive multiple of ",
                 db::BK, ", got ", p.k_pad);
  if (fc1) launch_one<true>(ws, p, max_tiles, watchdog, stream);
  else launch_one<false>(ws, p, max_tiles, watchdog, stream);
}

}  // namespace fp4moe::gpu
