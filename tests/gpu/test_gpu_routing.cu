// The fused routing + gather (kernels/route.cuh, route_gather_kernel) against the CPU's placement of
// the routes (rows of an expert in route order: every CTA computes it alike) and against the two
// launches it replaces (route_kernel, then the gather), whose A1 rows it must equal bit for bit.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fp4moe/errors.h"
#include "gpu/gpu_util.h"
#include "host/launch.h"
#include "kernels/common/gather_combine.cuh"
#include "kernels/common/routing.cuh"

namespace fp4moe {
namespace {

using testgpu::DeviceArray;

struct RouteCase {
  std::string name;
  int tokens, top_k, experts, first, local;  // ids in [0, experts); local experts [first, first + local)
  int hidden, h_pad;
  kernels::QuantKind q;
  bool a1_f16 = false, ids_int64 = false, one_expert = false;
  int tile_m = 32;
};

// The placement every CTA of the fused kernel computes: counts, row offsets, m-tiles, and each route
// the next row of its expert in route order.
struct HostRouting {
  std::vector<int> expert_offset, expert_tile_offset, tile_expert, tile_row0, route_row;
};
HostRouting place(const RouteCase& c, const std::vector<int64_t>& ids) {
  HostRouting h;
  const int64_t R = ids.size();
  std::vector<int> count(c.local, 0);
  auto local = [&](int64_t r) {
    const int64_t e = ids[r] - c.first;
    return e >= 0 && e < c.local ? static_cast<int>(e) : -1;
  };
  for (int64_t r = 0; r < R; ++r)
    if (local(r) >= 0) ++count[local(r)];
  h.expert_offset.assign(c.local + 1, 0);
  h.expert_tile_offset.assign(c.local + 1, 0);
  for (int e = 0; e < c.local; ++e) {
    const int tiles = (count[e] + c.tile_m - 1) / c.tile_m;
    for (int m = 0; m < tiles; ++m) {
      h.tile_expert.push_back(e);
      h.tile_row0.push_back(h.expert_offset[e] + m * c.tile_m);
    }
    h.expert_offset[e + 1] = h.expert_offset[e] + count[e];
    h.expert_tile_offset[e + 1] = h.expert_tile_offset[e] + tiles;
  }
  std::vector<int> next(h.expert_offset.begin(), h.expert_offset.end() - 1);
  h.route_row.resize(R);
  for (int64_t r = 0; r < R; ++r) h.route_row[r] = local(r) >= 0 ? next[local(r)]++ : -1;
  return h;
}

// The device side of one run: routing outputs and A1, poisoned before the launch.
struct DeviceRun {
  DeviceArray<int> expert_offset, expert_tile_offset, route_row, row_expert, tile_expert, tile_row0, num_tiles;
  DeviceArray<float> row_weight;
  DeviceArray<__nv_bfloat16> a1;
  DeviceRun(int local, int64_t R, int64_t tiles, int h_pad)
      : expert_offset(local + 1), expert_tile_offset(local + 1), route_row(R), row_expert(R), tile_expert(tiles),
        tile_row0(tiles), num_tiles(1), row_weight(R + kernels::kRowWeightPad), a1(R * h_pad) {
    const uint32_t poison = 0x7fbadbadu;  // a NaN as float, a huge int, two bf16 NaNs
    for (auto* a : {&expert_offset, &expert_tile_offset, &route_row, &row_expert, &tile_expert, &tile_row0, &num_tiles})
      a->fill_bytes(&poison, 4);
    row_weight.fill_bytes(&poison, 4);
    a1.fill_bytes(&poison, 4);
  }
};

void run_case(const RouteCase& c) {
  SCOPED_TRACE(c.name);
  const int64_t R = static_cast<int64_t>(c.tokens) * c.top_k;
  std::mt19937_64 rng(1234 + c.tokens * 31 + c.experts);
  std::vector<int64_t> ids(R);
  for (int64_t r = 0; r < R; ++r) {
    const int pick = static_cast<int>(rng() % 100);
    ids[r] = c.one_expert ? c.first + 3 : static_cast<int64_t>(rng() % c.experts);
    if (!c.one_expert && pick < 4) ids[r] = -1;                  // unrouted slot
    if (!c.one_expert && pick >= 4 && pick < 7) ids[r] = c.experts + static_cast<int64_t>(rng() % 5);  // ≥ E
  }
  std::vector<float> weights(R), scales(c.local);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& w : weights) w = normal(rng);
  for (float& s : scales) s = 0.5f + static_cast<float>(rng() % 8) * 0.25f;  // repeats: shared and distinct scales
  std::vector<__nv_bfloat16> x(static_cast<size_t>(c.tokens) * c.hidden);
  for (auto& v : x) v = __float2bfloat16(3.0f * normal(rng));

  std::vector<int32_t> ids32(ids.begin(), ids.end());
  DeviceArray<int64_t> d_ids64(ids);
  DeviceArray<int32_t> d_ids32(ids32);
  DeviceArray<float> d_w(weights), d_scales(scales);
  DeviceArray<__nv_bfloat16> d_x(x);
  const int64_t tiles = (R + c.tile_m - 1) / c.tile_m + std::min<int64_t>(c.local, R);

  auto launch = [&](DeviceRun& d, bool fused) {
    const kernels::RoutingParams rp{c.ids_int64 ? static_cast<const void*>(d_ids64.get()) : d_ids32.get(),
                                    c.ids_int64, d_w.get(), R, c.first, c.local, c.tile_m, d.expert_offset.get(),
                                    d.expert_tile_offset.get(), d.route_row.get(), d.row_weight.get(),
                                    d.row_expert.get(), d.tile_expert.get(), d.tile_row0.get(), d.num_tiles.get()};
    const kernels::generic::GatherParams gp{d_x.get(), c.tokens, c.hidden, c.h_pad, c.top_k, c.q, d_scales.get(),
                                            d.route_row.get(), d.row_expert.get(), d.a1.get(), c.a1_f16};
    gpu::launch_route_gather_kernels(rp, gp, fused, nullptr);
    GPU_CHECK(cudaDeviceSynchronize());
  };
  DeviceRun fused(c.local, R, tiles, c.h_pad), chain(c.local, R, tiles, c.h_pad);
  ASSERT_NO_THROW(launch(fused, true));
  ASSERT_NO_THROW(launch(chain, false));

  const HostRouting h = place(c, ids);
  const int rows = h.expert_offset[c.local];
  EXPECT_EQ(fused.num_tiles.download()[0], static_cast<int>(h.tile_expert.size()));
  EXPECT_EQ(fused.expert_offset.download(), h.expert_offset);
  EXPECT_EQ(fused.expert_tile_offset.download(), h.expert_tile_offset);
  EXPECT_EQ(fused.route_row.download(), h.route_row);  // route order within each expert
  EXPECT_EQ(chain.expert_offset.download(), h.expert_offset);
  std::vector<int> te = fused.tile_expert.download(), tr = fused.tile_row0.download();
  te.resize(h.tile_expert.size()), tr.resize(h.tile_row0.size());
  EXPECT_EQ(te, h.tile_expert);
  EXPECT_EQ(tr, h.tile_row0);

  const std::vector<int> chain_row = chain.route_row.download(), row_expert = fused.row_expert.download();
  const std::vector<float> row_weight = fused.row_weight.download();
  const std::vector<__nv_bfloat16> a_f = fused.a1.download(), a_c = chain.a1.download();
  int bad = 0;
  for (int64_t r = 0; r < R && bad < 5; ++r) {
    const int row = h.route_row[r];
    if (row < 0) continue;
    ASSERT_GE(chain_row[r], 0) << "route " << r;
    if (row_expert[row] != ids[r] - c.first || std::memcmp(&row_weight[row], &weights[r], 4) != 0) {
      ADD_FAILURE() << "route " << r << " row " << row << ": expert " << row_expert[row] << " weight "
                    << row_weight[row] << ", expected " << ids[r] - c.first << ", " << weights[r];
      ++bad;
    }
    // A1 rows: equal bit for bit to the chain's row of the same route, every element written.
    if (std::memcmp(&a_f[static_cast<size_t>(row) * c.h_pad], &a_c[static_cast<size_t>(chain_row[r]) * c.h_pad],
                    c.h_pad * sizeof(__nv_bfloat16)) != 0) {
      ADD_FAILURE() << "route " << r << ": A1 row " << row << " differs from the chain's row " << chain_row[r];
      ++bad;
    }
  }
  // The chain's A1 is the comparison, so it must have written every element of its rows: no poison
  // half-word left (x is finite, so no quantised value is the poison's NaN or its -9.7e16).
  for (size_t i = 0; i < static_cast<size_t>(rows) * c.h_pad; ++i) {
    uint16_t v;
    std::memcpy(&v, &a_c[i], 2);
    ASSERT_TRUE(v != 0xdbad && v != 0x7fba) << "the chain left A1 element " << i << " unwritten";
  }
}

TEST(GpuRouteGather, StablePlacementAndTheChainsA1BitForBit) {
  REQUIRE_GPU();
  using kernels::QuantKind;
  const std::vector<RouteCase> cases = {
      {"qwen3-like T=16 K=8 E=128 nvfp4 f16", 16, 8, 128, 0, 128, 2048, 2048, QuantKind::kNvfp4, true},
      {"T=1 K=10 E=512 H=2880 nvfp4", 1, 10, 512, 0, 512, 2880, 2944, QuantKind::kNvfp4},
      {"T=128 K=8 every route to one expert mxfp4", 128, 8, 64, 0, 64, 1024, 1024, QuantKind::kMxfp4, false, false,
       true},
      {"T=37 K=4 local 16..47 of 64 int64 a16", 37, 4, 64, 16, 32, 512, 512, QuantKind::kNone, false, true},
      {"T=64 K=8 E=256 H=7168 mxfp8 many CTAs", 64, 8, 256, 0, 256, 7168, 7168, QuantKind::kMxfp8},
      {"T=8 K=2 E=1024", 8, 2, 1024, 0, 1024, 256, 256, QuantKind::kNvfp4, false, false, false, 64},
      {"T=3 K=1 odd expert count", 3, 1, 7, 0, 7, 128, 128, QuantKind::kMxfp4},
  };
  for (const RouteCase& c : cases) {
    ASSERT_TRUE(kernels::route_gather_fits(static_cast<int64_t>(c.tokens) * c.top_k, c.local)) << c.name;
    run_case(c);
  }
}

TEST(GpuRouteGather, PastItsLimitsATypedError) {
  REQUIRE_GPU();
  EXPECT_FALSE(kernels::route_gather_fits(1025, 8));
  EXPECT_FALSE(kernels::route_gather_fits(1024, 1024));  // 32 warps × 1024 experts × 2 bytes: 64 KB of counts
  kernels::RoutingParams rp{};
  rp.routes = 1025, rp.experts = 8;
  kernels::generic::GatherParams gp{};
  gp.h_pad = 128, gp.q1 = kernels::QuantKind::kNvfp4;
  EXPECT_THROW(gpu::launch_route_gather_kernels(rp, gp, true, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace fp4moe
