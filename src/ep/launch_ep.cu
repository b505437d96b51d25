// Launches of src/kernels/ep_pack.cuh. See launch_ep.h.
#include <cuda_runtime.h>

#include "ep/launch_ep.h"
#include "fp4moe/errors.h"
#include "host/cuda_check.h"
#include "kernels/ep_pack.cuh"

namespace fp4moe::ep {
namespace k = kernels::ep;

void launch_ag_pack(const void* ids, IndexType ids_type, const float* w, int64_t routes, int64_t padded_routes,
                    int num_experts, int32_t* ids_out, float* w_out, cudaStream_t s) {
  if (padded_routes == 0) return;
  const unsigned grid = static_cast<unsigned>((padded_routes + 255) / 256);
  if (ids_type == IndexType::kInt32)
    k::ag_pack_kernel<int32_t><<<grid, 256, 0, s>>>(static_cast<const int32_t*>(ids), w, routes, padded_routes,
                                                    num_experts, ids_out, w_out);
  else
    k::ag_pack_kernel<int64_t><<<grid, 256, 0, s>>>(static_cast<const int64_t*>(ids), w, routes, padded_routes,
                                                    num_experts, ids_out, w_out);
  FP4MOE_CHECK_LAUNCH("ag_pack_kernel");
}

void launch_cast_out(const float* in, void* out, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const unsigned grid = static_cast<unsigned>((n / 4 + 255) / 256);
  k::cast_out_kernel<<<grid, 256, 0, s>>>(in, out, n);
  FP4MOE_CHECK_LAUNCH("cast_out_kernel");
}

int64_t a2a_blocks(int64_t routes) { return (routes + k::kRouteBlock - 1) / k::kRouteBlock; }

namespace {
template <typename IdT>
void pack_typed(const A2aPack& p, cudaStream_t s) {
  const int64_t routes = p.tokens * p.top_k;
  const int64_t blocks = a2a_blocks(routes);
  const size_t smem = sizeof(int) * k::kRouteWarps * p.world;
  const IdT* ids = static_cast<const IdT*>(p.ids);
  if (blocks > 0) {
    k::a2a_count_kernel<IdT><<<static_cast<unsigned>(blocks), k::kRouteBlock, smem, s>>>(
        ids, routes, p.owner, p.num_experts, p.world, p.block_counts);
    FP4MOE_CHECK_LAUNCH("a2a_count_kernel");
  }
  k::a2a_scan_kernel<<<1, k::kScanThreads, 0, s>>>(p.block_counts, static_cast<int>(blocks), p.world,
                                                   p.block_offsets, p.send_count, p.send_base);
  FP4MOE_CHECK_LAUNCH("a2a_scan_kernel");
  if (blocks == 0) return;
  k::a2a_place_kernel<IdT><<<static_cast<unsigned>(blocks), k::kRouteBlock, smem, s>>>(
      ids, p.w, routes, p.owner, p.num_experts, p.world, p.block_offsets, p.send_base, p.route_pos, p.send_route,
      p.send_id, p.send_w);
  FP4MOE_CHECK_LAUNCH("a2a_place_kernel");
  const int vecs = p.hidden * 2 / 16;
  k::a2a_gather_x_kernel<<<static_cast<unsigned>(routes), 128, 0, s>>>(
      static_cast<const uint4*>(p.x), p.send_route, p.send_base, p.world, p.top_k, vecs,
      static_cast<uint4*>(p.send_x));
  FP4MOE_CHECK_LAUNCH("a2a_gather_x_kernel");
}
}  // namespace

void launch_a2a_pack(const A2aPack& p, cudaStream_t s) {
  FP4MOE_REQUIRE(p.hidden % 8 == 0, InvalidArgument, "hidden", "must be a multiple of 8 for the row copies, got ",
                 p.hidden);
  if (p.ids_type == IndexType::kInt32) pack_typed<int32_t>(p, s);
  else pack_typed<int64_t>(p, s);
}

void launch_a2a_combine(const float* back, const int* route_pos, int64_t tokens, int top_k, int hidden, void* out,
                        bool out_fp32, cudaStream_t s) {
  if (tokens == 0) return;
  const unsigned cy = static_cast<unsigned>((hidden / 4 + k::kCombineThreads - 1) / k::kCombineThreads);
  k::a2a_combine_kernel<<<dim3(static_cast<unsigned>(tokens), cy), k::kCombineThreads, 0, s>>>(
      back, route_pos, top_k, hidden, out, out_fp32);
  FP4MOE_CHECK_LAUNCH("a2a_combine_kernel");
}

}  // namespace fp4moe::ep
