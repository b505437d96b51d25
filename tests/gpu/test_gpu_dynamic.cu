// The dynamic backend's GEMM core, in two layers, so that a failure says which layer is wrong:
//
//   GpuWgmmaProbe       one warpgroup, one 64 × 128 × 64 product: operands written into shared
//                       memory at kmajor_offset(), read by wgmma through operand_desc(),
//                       accumulator read back through acc_row/acc_col (wgmma_layout.h). Small
//                       integers, so the result is exact. On failure it also tries the descriptor
//                       with LBO and SBO exchanged and says whether that one matches. Others take
//                       the 128B-swizzled layout at N = 128 and N = 256 (the bf16 path's m64n256k16),
//                       and A from registers in the m16n8k16 fragment layout (the dynamic kernel's
//                       weights).
//   GpuDynamicGemm      the library's kernel (dynamic::gemm_kernel<fc2> through
//                       gpu::launch_dynamic_gemm) on random bf16 activations and random FP4
//                       weights + block scales, with alpha = 1, no bias and router weight 1, so
//                       Y = A · dequant(W)ᵀ; against a float64 CPU GEMM of the exactly dequantised
//                       values. Several experts (some empty), row counts across m-tile boundaries,
//                       N with a partial last n-tile, K of 1 to 45 stages (not multiples of the
//                       4-stage ring), both formats, a grid smaller than the work (persistent loop);
//                       the NVFP4 cases again on the f16 variant (f16 activations, f16 wgmma).
//
// The whole backend against the reference: tests/gpu/test_gpu_moe.cpp (kDynamic is in
// expect_matches_reference's list; GpuDynamic.* are the issue #5 edge cases).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "fp4moe/formats.h"
#include "gpu/gpu_util.h"
#include "host/device_weights.h"
#include "host/launch.h"
#include "host/launch_dynamic_gemm.cuh"  // register_path_maps
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/moe_gemm.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/common/wgmma_layout.h"
#include "kernels/dynamic.cuh"
#include "kernels/dynamic_bf16.cuh"
#include "testing/problem.h"

namespace fp4moe {
namespace {

using testgpu::DeviceArray;
namespace wg = kernels::wgmma;

using testgpu::device_is_sm90;

// ---- layer 1: one wgmma k-loop in one warpgroup ---------------------------------------------------

// a: [128][64] bf16 bits (tile rows; the operand is rows [r0, r0 + 64)), b: [kN][64], d: [64][kN]
// with the wgmma of that N (m64n128k16 or m64n256k16, the bf16 path's).
// sw128: both tiles in the 128B-swizzled layout (sw128_offset / operand_desc_sw128) instead.
template <int kN = 128>
__global__ void wgmma_probe_kernel(const uint16_t* a, const uint16_t* b, int r0, bool swap_lbo_sbo, bool sw128,
                                   float* d) {
  __shared__ __align__(1024) unsigned char sa[128 * 64 * 2];
  __shared__ __align__(1024) unsigned char sb[kN * 64 * 2];
  const int t = threadIdx.x;
  for (int idx = t; idx < kN * 64; idx += blockDim.x) {
    const int r = idx / 64, k = idx % 64;
    if (r < 128) *reinterpret_cast<uint16_t*>(sa + (sw128 ? wg::sw128_offset(r, k) : wg::kmajor_offset(128, r, k))) = a[idx];
    *reinterpret_cast<uint16_t*>(sb + (sw128 ? wg::sw128_offset(r, k) : wg::kmajor_offset(kN, r, k))) = b[idx];
  }
  kernels::ptx::fence_proxy_async_smem();
  __syncthreads();
  float acc[kN / 2];
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;
  const uint32_t a_addr = kernels::ptx::smem_addr(sa), b_addr = kernels::ptx::smem_addr(sb);
  kernels::ptx::fence_operand(acc);
  kernels::ptx::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    uint64_t da = wg::operand_desc(a_addr, 128, r0, ks), db = wg::operand_desc(b_addr, kN, 0, ks);
    if (sw128) da = wg::operand_desc_sw128(a_addr, r0, ks), db = wg::operand_desc_sw128(b_addr, 0, ks);
    if (swap_lbo_sbo) {
      da = wg::make_desc(a_addr + wg::kmajor_offset(128, r0, 16 * ks), wg::kSbo, wg::kmajor_lbo(128));
      db = wg::make_desc(b_addr + wg::kmajor_offset(kN, 0, 16 * ks), wg::kSbo, wg::kmajor_lbo(kN));
    }
    if constexpr (kN == 128) kernels::ptx::mma_m64n128k16_bf16(acc, da, db, 1);
    else kernels::ptx::mma_m64n256k16_bf16(acc, da, db, 1);
  }
  kernels::ptx::wgmma_commit();
  kernels::ptx::wgmma_wait<0>();
  kernels::ptx::fence_operand(acc);
  for (int i = 0; i < kN / 2; ++i) d[wg::acc_row(t, i) * kN + wg::acc_col(t, i)] = acc[i];
}

// n bf16 integers in [-4, 4]: every product and partial sum of the probes is exact in fp32.
std::vector<uint16_t> small_ints(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-4, 4);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = fmt::bf16_from_f32(static_cast<float>(small(rng)));
  return v;
}

// Elements of d (64 × N, N = b's rows) that differ from the exact product of rows [r0, r0 + 64) of a
// (rows of 64 k) and b (rows of 64 k); the first one is described in *first_bad.
int64_t count_wrong(const std::vector<uint16_t>& a, int r0, const std::vector<uint16_t>& b, const std::vector<float>& d,
                    std::string* first_bad) {
  const int N = static_cast<int>(b.size() / 64);
  int64_t bad = 0;
  for (int i = 0; i < 64; ++i)
    for (int n = 0; n < N; ++n) {
      double ref = 0;
      for (int k = 0; k < 64; ++k) ref += double(fmt::f32_from_bf16(a[(r0 + i) * 64 + k])) * fmt::f32_from_bf16(b[n * 64 + k]);
      if (d[i * N + n] != ref && bad++ == 0 && first_bad) {
        std::ostringstream s;
        s << "D[" << i << "][" << n << "] = " << d[i * N + n] << ", expected " << ref;
        *first_bad = s.str();
      }
    }
  return bad;
}

// Runs the probe (N = b's rows: 128, or 256 with sw128); returns the number of elements that differ
// from the exact product.
int64_t run_probe(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, int r0, bool swap,
                  std::string* first_bad, bool sw128 = false) {
  DeviceArray<uint16_t> da(a), db(b);
  DeviceArray<float> dd(b.size());
  const uint32_t poison = testkit::kPoisonF32;
  dd.fill_bytes(&poison, 4);
  if (b.size() == 256 * 64) wgmma_probe_kernel<256><<<1, 128>>>(da.get(), db.get(), r0, swap, sw128, dd.get());
  else wgmma_probe_kernel<128><<<1, 128>>>(da.get(), db.get(), r0, swap, sw128, dd.get());
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("wgmma_probe_kernel failed");
  return count_wrong(a, r0, b, dd.download(), first_bad);
}

TEST(GpuWgmmaProbe, DescriptorsAndAccumulatorLayoutGiveTheExactProduct) {
  REQUIRE_SM90();
  const std::vector<uint16_t> a = small_ints(128 * 64, 5), b = small_ints(128 * 64, 50);
  for (int r0 : {0, 64}) {  // consumer warpgroup 0 and 1 of the dynamic kernel
    std::string first;
    const int64_t bad = run_probe(a, b, r0, false, &first);
    if (bad != 0) {
      std::string first_swapped;
      const int64_t bad_swapped = run_probe(a, b, r0, true, &first_swapped);
      ADD_FAILURE() << "rows [" << r0 << ", " << r0 + 64 << "): " << bad << " of 8192 elements wrong, first: " << first
                    << ". With LBO and SBO exchanged: " << bad_swapped << " wrong"
                    << (bad_swapped == 0 ? " -> the descriptor fields are swapped in wgmma_layout.h" : "");
    }
  }
}

// The same product with both tiles in the 128B-swizzled layout, with N = 128 and with N = 256 (the
// bf16 path's m64n256k16: the same descriptor, 8-row groups 1024 bytes apart, twice the accumulators).
TEST(GpuWgmmaProbe, Swizzle128DescriptorsGiveTheExactProduct) {
  REQUIRE_SM90();
  const std::vector<uint16_t> a = small_ints(128 * 64, 7);
  for (int n : {128, 256}) {
    const std::vector<uint16_t> b = small_ints(n * 64, 70 + n);
    for (int r0 : {0, 64}) {
      std::string first;
      const int64_t bad = run_probe(a, b, r0, false, &first, true);
      EXPECT_EQ(bad, 0) << "N = " << n << ", rows [" << r0 << ", " << r0 + 64 << "): " << bad << " of " << 64 * n
                        << " elements wrong, first: " << first;
    }
  }
}

// The same product with A (64 × 64, rows [0, 64) of `a`) from registers: warp w holds rows
// 16w..16w+15 in the mma.m16n8k16 A layout (common/frag_dequant.cuh), the layout the dynamic kernel
// dequantises its weights into; B (128 × 64) 128B-swizzled, as the kernel's activation tiles.
__global__ void wgmma_rs_probe_kernel(const uint16_t* a, const uint16_t* b, float* d) {
  __shared__ __align__(1024) unsigned char sb[128 * 64 * 2];
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31, g = lane >> 2, c = lane & 3;
  for (int idx = t; idx < 128 * 64; idx += blockDim.x)
    *reinterpret_cast<uint16_t*>(sb + wg::sw128_offset(idx / 64, idx % 64)) = b[idx];
  kernels::ptx::fence_proxy_async_smem();
  __syncthreads();
  auto pair = [&](int row, int k) {  // bf16 (row, k) and (row, k + 1) as one register
    return static_cast<uint32_t>(a[row * 64 + k]) | (static_cast<uint32_t>(a[row * 64 + k + 1]) << 16);
  };
  uint32_t frag[4][4];
  for (int ks = 0; ks < 4; ++ks) {
    const int r = 16 * warp + g, k = 16 * ks + 2 * c;
    frag[ks][0] = pair(r, k), frag[ks][1] = pair(r + 8, k), frag[ks][2] = pair(r, k + 8), frag[ks][3] = pair(r + 8, k + 8);
  }
  float acc[64];
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  const uint32_t b_addr = kernels::ptx::smem_addr(sb);
  kernels::ptx::fence_operand(acc);
  kernels::ptx::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
    kernels::ptx::mma_m64nNk16_rs<128>(acc, frag[ks], wg::operand_desc_sw128(b_addr, 0, ks), 1);
  kernels::ptx::wgmma_commit();
  kernels::ptx::wgmma_wait<0>();
  kernels::ptx::fence_operand(acc);
  for (int i = 0; i < 64; ++i) d[wg::acc_row(t, i) * 128 + wg::acc_col(t, i)] = acc[i];
}

TEST(GpuWgmmaProbe, RegisterAOperandGivesTheExactProduct) {
  REQUIRE_SM90();
  const std::vector<uint16_t> a = small_ints(64 * 64, 6), b = small_ints(128 * 64, 60);
  DeviceArray<uint16_t> da(a), db(b);
  DeviceArray<float> dd(64 * 128);
  const uint32_t poison = testkit::kPoisonF32;
  dd.fill_bytes(&poison, 4);
  wgmma_rs_probe_kernel<<<1, 128>>>(da.get(), db.get(), dd.get());
  GPU_CHECK(cudaGetLastError());
  GPU_CHECK(cudaDeviceSynchronize());
  std::string first;
  const int64_t bad = count_wrong(a, 0, b, dd.download(), &first);
  EXPECT_EQ(bad, 0) << bad << " of 8192 elements wrong, first: " << first;
}

// ---- layer 2: the library's dynamic GEMM kernel -----------------------------------------------------

struct GemmCase {
  bool nvfp4;
  std::vector<int> rows_per_expert;  // routed rows of each expert (0 = an expert without rows)
  int n;                             // weight rows = output columns (multiple of 64, as h_pad)
  int k;                             // multiple of 64
};

std::string describe(const GemmCase& g) {
  std::ostringstream s;
  s << (g.nvfp4 ? "nvfp4" : "mxfp4") << " N=" << g.n << " K=" << g.k << " rows/expert={";
  for (size_t i = 0; i < g.rows_per_expert.size(); ++i) s << (i ? "," : "") << g.rows_per_expert[i];
  s << "}";
  return s.str();
}

// A GemmCase's routing schedule, as the pre-pass builds it with tile_m = bm: row offsets, m-tile
// offsets and the m-tile list, and each row's expert.
struct GemmSchedule {
  std::vector<int> offset, tile_offset, tile_expert, tile_row0, row_expert;
  int rows = 0, tiles = 0;
};
GemmSchedule gemm_schedule(const std::vector<int>& rows_per_expert, int bm) {
  const int E = static_cast<int>(rows_per_expert.size());
  GemmSchedule s;
  s.offset.assign(E + 1, 0), s.tile_offset.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) {
    s.offset[e + 1] = s.offset[e] + rows_per_expert[e];
    s.tile_offset[e + 1] = s.tile_offset[e] + (rows_per_expert[e] + bm - 1) / bm;
    for (int r = s.offset[e]; r < s.offset[e + 1]; r += bm) s.tile_expert.push_back(e), s.tile_row0.push_back(r);
    for (int r = s.offset[e]; r < s.offset[e + 1]; ++r) s.row_expert.push_back(e);
  }
  s.rows = s.offset[E], s.tiles = static_cast<int>(s.tile_expert.size());
  return s;
}

// A GemmCase's operands on the device (activations, weights in fragment order, the schedule, router
// weights and alphas of 1) and Y, poisoned, with the MoeGemmParams of an FC2-like GEMM over them
// (no bias, Y = A · Wᵀ). The router weights are padded as the workspace's (a tile reads up to
// kRowWeightPad rows past the last).
struct GemmDeviceCase {
  DeviceArray<uint16_t> a;
  DeviceArray<uint8_t> fcodes, fscales;
  DeviceArray<int> offset, tile_offset, tile_expert, tile_row0, num_tiles;
  DeviceArray<float> ones, alpha, y;
  kernels::MoeGemmParams p{};
  GemmDeviceCase(const GemmCase& g, const GemmSchedule& s, const std::vector<uint16_t>& a_host,
                 const std::vector<uint8_t>& fcodes_host, const std::vector<uint8_t>& fscales_host, bool f16)
      : a(a_host), fcodes(fcodes_host), fscales(fscales_host), offset(s.offset), tile_offset(s.tile_offset),
        tile_expert(s.tile_expert), tile_row0(s.tile_row0), num_tiles(std::vector<int>{s.tiles}),
        ones(std::vector<float>(s.rows + kernels::kRowWeightPad, 1.0f)),
        alpha(std::vector<float>(g.rows_per_expert.size(), 1.0f)), y(static_cast<size_t>(s.rows) * g.n) {
    const uint32_t poison = testkit::kPoisonF32;
    y.fill_bytes(&poison, 4);
    p.a = reinterpret_cast<const __nv_bfloat16*>(a.get());
    p.a_rows = s.rows;
    p.w_frag = reinterpret_cast<const uint4*>(fcodes.get());
    p.s_frag = fscales.get();
    p.w_rows = g.n, p.k_pad = g.k;
    p.w_experts = static_cast<int>(g.rows_per_expert.size());  // the register path's weight tensor maps span them
    p.nvfp4 = g.nvfp4, p.block = g.nvfp4 ? 16 : 32;
    p.f16 = f16;
    p.f16_words = f16;  // the f16 kernels read f16 words (upload_weights stores them so for NVFP4-a4)
    p.tile_expert = tile_expert.get(), p.tile_row0 = tile_row0.get(), p.num_tiles = num_tiles.get();
    p.expert_offset = offset.get();
    p.expert_tile_offset = tile_offset.get();
    p.alpha = alpha.get();
    p.bias = nullptr;
    p.hidden = g.n, p.top_k = 1;
    p.row_weight = ones.get();
    p.y = y.get();
  }
};

// bf16_group > 0: the bf16 path (dynamic_bf16.cuh), experts dequantised and multiplied bf16_group
// at a time through one copy buffer, the way launch_dynamic_bf16_groups runs them; its m-tiles are
// dynamic_bf16::BM (256) routed rows; otherwise the register path's, with m-tiles of tile_m (32, 64
// or 128) routed rows. f16 (NVFP4 only): the register path's f16 variant (MoeGemmParams::f16), the
// activations uploaded as f16 (each random value rounded to f16 first, so the reference multiplies
// exactly what the kernel reads).
// bf16_words (NVFP4, not f16): the codes stored as bf16 words (DeviceWeights::bf16_words, what the
// runner stores for NVFP4 with bf16 operands), the scales drawn with random signs and some ±0, then
// folded as upload_weights folds them (fold_scale_signs); the reference takes the drawn ones.
void run_gemm_case(const GemmCase& g, uint64_t seed, int bf16_group = 0, int tile_m = 128, bool f16 = false,
                   bool bf16_words = false) {
  const int E = static_cast<int>(g.rows_per_expert.size()), N = g.n, K = g.k, bs = g.nvfp4 ? 16 : 32;
  const int BM = bf16_group > 0 ? kernels::dynamic_bf16::BM : tile_m;
  std::mt19937_64 rng(seed);
  // Routing schedule as the pre-pass builds it with tile_m = BM.
  const GemmSchedule sch = gemm_schedule(g.rows_per_expert, BM);
  const std::vector<int>& offset = sch.offset;
  const std::vector<int>& row_expert = sch.row_expert;
  const int rows = sch.rows, tiles = sch.tiles;
  ASSERT_GT(rows, 0);
  // Activations: bf16 normals. Weights: random E2M1 codes; block scales from a range that keeps
  // every product and sum far from overflow (E4M3 2^-3 .. 2^3; UE8M0 2^-3 .. 2^3).
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> a(static_cast<size_t>(rows) * K);
  std::vector<double> af(a.size());  // the values the kernel reads
  for (size_t i = 0; i < a.size(); ++i) {
    const float v = normal(rng);
    if (f16) {
      const __half h = __float2half_rn(v);
      a[i] = __half_as_ushort(h), af[i] = __half2float(h);
    } else {
      a[i] = fmt::bf16_from_f32(v), af[i] = fmt::f32_from_bf16(a[i]);
    }
  }
  std::vector<uint8_t> codes(static_cast<size_t>(E) * N * K / 2), scales(static_cast<size_t>(E) * N * (K / bs));
  for (auto& c : codes) c = static_cast<uint8_t>(rng());
  for (auto& s : scales)
    s = g.nvfp4 ? static_cast<uint8_t>(((4 + rng() % 7) << 3) | (rng() % 8)) : static_cast<uint8_t>(124 + rng() % 7);
  if (bf16_words)
    for (auto& s : scales) {
      if (rng() % 2) s |= 0x80;           // negative: its sign goes into the codes
      if (rng() % 64 == 0) s &= 0x80;     // ±0: its codes are zeroed
    }
  std::vector<double> wdeq(static_cast<size_t>(E) * N * K);  // exactly dequantised W[e][n][k]
  for (size_t en = 0; en < static_cast<size_t>(E) * N; ++en)
    for (int k = 0; k < K; ++k) {
      const uint8_t byte = codes[en * (K / 2) + k / 2], s = scales[en * (K / bs) + k / bs];
      wdeq[en * K + k] = double(fmt::e2m1_decode((byte >> ((k & 1) * 4)) & 0xF)) *
                         (g.nvfp4 ? double(fmt::e4m3_decode(s)) : double(fmt::ue8m0_decode(s)));
    }

  std::vector<uint8_t> fcodes, fscales;  // the mma-fragment order the kernel streams
  if (bf16_words) {
    std::vector<uint8_t> folded_codes = codes, folded_scales = scales;
    gpu::fold_scale_signs(folded_codes.data(), folded_scales.data(), int64_t(E) * N, K, bs);
    gpu::to_fragment_order(folded_codes, folded_scales, E, N, K, bs, fcodes, fscales, kernels::WordLayout::kBf16);
  } else {
    gpu::to_fragment_order(codes, scales, E, N, K, bs, fcodes, fscales,
                           f16 ? kernels::WordLayout::kF16 : kernels::WordLayout::kStandard);
  }
  GemmDeviceCase dc(g, sch, a, fcodes, fscales, f16);
  kernels::MoeGemmParams& p = dc.p;
  p.bf16_words = bf16_words;
  DeviceArray<int> d_watchdog(std::vector<int>(kernels::ptx::kWatchdogReportInts, 0));

  gpu::DynamicWorkspace ws(0);
  ASSERT_TRUE(ws.unsupported.empty()) << ws.unsupported;
  ws.sms = std::min(ws.sms, 7);  // fewer CTAs than work items: each CTA loops over several tiles
  const int64_t slot_elems = kernels::dynamic_bf16::tiles_per_slot((N + 127) / 128, K) * kernels::dynamic_bf16::kWTileElems;
  DeviceArray<uint16_t> d_bf16(bf16_group > 0 ? bf16_group * slot_elems : 0);
  if (bf16_group == 0) {
    gpu::launch_dynamic_gemm(ws, p, /*fc1=*/false, tiles, tile_m, d_watchdog.get(), nullptr);
  } else {
    const uint16_t nan_bf16 = 0x7FC1;  // a stale copy would show as NaN in Y
    d_bf16.fill_bytes(&nan_bf16, 2);
    p.w_bf16 = reinterpret_cast<__nv_bfloat16*>(d_bf16.get());
    for (int e0 = 0; e0 < E; e0 += bf16_group) {
      p.expert_base = e0;
      p.expert_count = std::min(bf16_group, E - e0);
      gpu::launch_dynamic_bf16_gemm(ws, p, /*fc1=*/false, tiles, d_watchdog.get(), nullptr);
    }
  }
  GPU_CHECK(cudaDeviceSynchronize());
  const auto wd = d_watchdog.download();
  ASSERT_EQ(wd[0], 0) << describe(g) << ": pipeline watchdog fired: block " << wd[1] << " thread " << wd[2]
                      << " step " << wd[3] << " waiting on "
                      << (wd[4] == kernels::dynamic::kWaitEmpty ? "empty" : wd[4] == kernels::dynamic::kWaitSplit ? "a split's partial sums" : "full")
                      << " parity " << wd[5];
  const auto y = dc.y.download();

  int64_t bad = 0, unwritten = 0;
  double worst = 0;
  std::ostringstream first;
  // Wrong elements by consumer warpgroup (weight rows 64c.. of the n-tile), by 128-row part of the
  // m-tile (the bf16 path's epilogue parts) and by n-tile.
  std::vector<int64_t> bad_by_consumer(2, 0), bad_by_part((BM + 127) / 128, 0), bad_by_ntile((N + 127) / 128, 0);
  for (int n = 0; n < N; ++n) {
    for (int r = 0; r < rows; ++r) {
      const int e = row_expert[r];
      const double* wr = &wdeq[(static_cast<size_t>(e) * N + n) * K];
      const double* ar = &af[static_cast<size_t>(r) * K];
      double ref = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        const double prod = ar[k] * wr[k];
        ref += prod, mag += std::fabs(prod);
      }
      const float got = y[static_cast<size_t>(r) * N + n];
      uint32_t bits;
      std::memcpy(&bits, &got, 4);
      if (bits == testkit::kPoisonF32) {
        ++unwritten;
        continue;
      }
      // fp32 accumulation of exact products: |error| <= K·2^-24·Σ|products| in the worst case.
      const double err = std::fabs(double(got) - ref) / (mag + 1e-30);
      worst = std::max(worst, err);
      if (!(err <= 2e-4)) {
        const int tr = (r - offset[e]) % BM;
        ++bad_by_consumer[n % 128 / 64];
        ++bad_by_part[tr / 128];
        ++bad_by_ntile[n / 128];
        if (bad++ < 5)
          first << "\n  Y[" << r << "][" << n << "] (expert " << e << ", tile row " << tr << ", n-tile " << n / 128
                << " col " << n % 128 << " = consumer " << n % 128 / 64 << ") = " << got << ", expected " << ref;
      }
    }
  }
  auto list = [](const std::vector<int64_t>& v) {
    std::ostringstream s;
    for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
    return s.str();
  };
  EXPECT_EQ(unwritten, 0) << describe(g) << ": elements of Y never written";
  EXPECT_EQ(bad, 0) << describe(g) << ": " << bad << " of " << int64_t(rows) * N << " wrong (worst relative "
                    << worst << "; by consumer " << list(bad_by_consumer) << "; by 128-row part of the m-tile "
                    << list(bad_by_part) << "; by n-tile " << list(bad_by_ntile) << ")" << first.str();
}

// The register path's cases: both formats, and the shapes that stress its tiles. At 128-row m-tiles
// their items run every width of the narrow MMAs (dynamic.cuh consume_item, kNarrow): 32 (1, 3, 17
// rows, and the 1- and 2-row tails of 129 and 130), 64 (64, and 300's tail of 44), 96 (65, and
// 200's tail of 72) and 128 (127, and the full tiles).
std::vector<GemmCase> register_path_cases() {
  return {
      {true, {1}, 128, 64},                        // one row, one stage
      {true, {64}, 128, 128},                      // exactly one consumer's rows; 2 stages
      {false, {65}, 192, 320},                     // second consumer has 1 row; partial n-tile; 5 stages
      {true, {0, 130, 0, 127, 300}, 256, 704},     // empty experts, m-tiles across boundaries; 11 stages
      {false, {128, 129, 3}, 2880, 256},           // H = 2880: 22.5 n-tiles
      {true, {200, 17}, 128, 2880},                // K = 2880: 45 stages
      // 16-row tiles on 7 SMs (14 CTAs): the last wave's split (dynamic.cuh SplitPlan) in 5 pieces of
      // 18 stages, and 3 items in 14 pieces of 19-20
      {true, {5}, 128, 5760},
      {false, {3, 20}, 128, 5760},
  };
}

TEST(GpuDynamicGemm, MatchesCpuGemmOfDequantisedWeights) {
  REQUIRE_SM90();
  uint64_t seed = 100;
  for (const GemmCase& g : register_path_cases())
    for (int tile_m : {16, 32, 64, 128}) {  // every m-tile the dispatcher picks (dynamic_tile_m)
      SCOPED_TRACE(describe(g) + " m-tiles of " + std::to_string(tile_m) + (g.nvfp4 ? ", bf16 words" : ""));
      run_gemm_case(g, seed++, 0, tile_m, false, /*bf16_words=*/g.nvfp4);  // NVFP4 as the runner stores it
    }
}

// The register path's f16 variant (NVFP4 weights with f16 activations: what dynamic runs for
// NVFP4-a4): the same cases with NVFP4 weights, at every m-tile width (BM = 32 is the two-CTA
// kernel, whose row tiles past w_rows (N = 192, 2880) dequantise the producer's zeros).
TEST(GpuDynamicGemm, F16PathMatchesCpuGemmOfDequantisedWeights) {
  REQUIRE_SM90();
  uint64_t seed = 300;
  for (GemmCase g : register_path_cases()) {
    g.nvfp4 = true;
    for (int tile_m : {16, 32, 64, 128}) {
      SCOPED_TRACE(describe(g) + " m-tiles of " + std::to_string(tile_m) + ", f16");
      run_gemm_case(g, seed++, 0, tile_m, /*f16=*/true);
    }
  }
}

// The register path's m-tile per call (no GPU needed): the smallest of 16, 32, 64, 128 routed rows that
// holds twice the average rows per local expert; a small call after a large one picks its own small
// tile again; a forced tile (RunnerOptions::dynamic_tile_m) is taken as it is.
TEST(DynamicTileM, SmallestTileHoldingTwiceTheAverageRowsPerExpert) {
  EXPECT_EQ(gpu::dynamic_tile_m(128 * 8, 128), 16);      // qwen3-30b-a3b T = 128: 8 rows per expert
  EXPECT_EQ(gpu::dynamic_tile_m(128 * 8 + 1, 128), 32);
  EXPECT_EQ(gpu::dynamic_tile_m(64 * 2, 8), 32);         // mixtral-8x7b T = 64: 16 per expert
  EXPECT_EQ(gpu::dynamic_tile_m(16 * 128, 128), 32);     // exactly 16 per expert
  EXPECT_EQ(gpu::dynamic_tile_m(16 * 128 + 1, 128), 64);
  EXPECT_EQ(gpu::dynamic_tile_m(512 * 8, 128), 64);      // qwen3 T = 512: 32 per expert
  EXPECT_EQ(gpu::dynamic_tile_m(512 * 8 + 1, 128), 128);
  EXPECT_EQ(gpu::dynamic_tile_m(1024 * 8, 128), 128);    // qwen3 T = 1024: 64 per expert
  EXPECT_EQ(gpu::dynamic_tile_m(4096 * 2, 8), 128);      // mixtral-8x7b T = 4096: 1024 per expert
  EXPECT_EQ(gpu::dynamic_tile_m(1, 256), 16);            // T = 1, K = 1
  EXPECT_EQ(gpu::dynamic_tile_m(100000, 1), 128);        // one local expert
  EXPECT_EQ(gpu::dynamic_tile_m(16, 8), 16);             // after a large call, a small one: 16 again
  // RunnerOptions::dynamic_tile_m: a forced tile wins over the rule, whichever way it differs.
  EXPECT_EQ(gpu::dynamic_tile_m(1024 * 8, 128, 32), 32);  // the rule says 128
  EXPECT_EQ(gpu::dynamic_tile_m(128 * 8, 128, 128), 128); // the rule says 16
  EXPECT_EQ(gpu::dynamic_tile_m(512 * 8, 128, 64), 64);
  EXPECT_EQ(gpu::dynamic_tile_m(128 * 8, 128, 0), 16);    // 0: the rule
}

// The last wave's split (dynamic.cuh SplitPlan, PieceCursor, finish_end), on the host: for grids and
// item counts around the waves' edges, every k-stage of every item is taken by exactly one CTA, in
// k order; an item is either one whole piece or a finishing piece (stages 0..k1, its CTA's last piece)
// followed by hand-off pieces of the CTAs [b + 1, finish_end) (each that CTA's first piece, so no
// CTA holds two slots), whose stages continue the finisher's in CTA order; and no CTA takes fewer
// than the minimum stages of the rest. A rest past half the grid, or of items shorter than
// kSplitMinItemStages, runs whole.
TEST(DynamicSplit, EveryStageOnceAndEachHandOffSummedOnce) {
  namespace dk = kernels::dynamic;
  struct Owner {
    int cta, k0, k1;
    dk::Piece kind;
  };
  int split_cases = 0;
  for (const int grid : {1, 2, 7, 132, 264})
    for (const int ktiles : {1, 4, 32, 39, 40, 44, 45, 64, 112, 224})
      for (const int work : {1, 2, 5, grid / 2, grid - 1, grid, grid + 1, grid + grid / 4, 2 * grid - 3,
                             3 * grid + grid / 2, 3 * grid + grid / 2 + 1, 4 * grid}) {
        if (work < 1) continue;
        const dk::SplitPlan pl = dk::split_plan(true, work, grid, ktiles);
        ASSERT_LE(pl.ctas, grid);
        if (2 * (work % grid) > grid) ASSERT_EQ(pl.ctas, 0) << "a rest past half the grid is split";
        if (ktiles < dk::kSplitMinItemStages) ASSERT_EQ(pl.ctas, 0) << "items of " << ktiles << " stages are split";
        if (pl.ctas > 0) {
          ++split_cases;
          ASSERT_EQ(pl.whole % grid, 0);
          ASSERT_EQ(pl.stages, (work - pl.whole) * ktiles);
          ASSERT_GT(pl.ctas, work - pl.whole) << "a split where no item is shared";
        } else {
          ASSERT_EQ(pl.whole, work);
        }
        std::vector<std::vector<Owner>> items(static_cast<size_t>(work));
        std::vector<int> handoffs(static_cast<size_t>(grid), 0);
        for (int b = 0; b < grid; ++b) {
          for (int w = b; w < pl.whole; w += grid) items[static_cast<size_t>(w)].push_back({b, 0, ktiles, dk::Piece::kWhole});
          dk::PieceCursor cur(pl, b);  // then its pieces of the rest
          dk::ItemPiece pc{};
          int rest_pieces = 0, rest_stages = 0;
          while (cur.next(pl, ktiles, pc)) {
            ASSERT_GE(pc.w, 0);
            ASSERT_LT(pc.w, work);
            ASSERT_LT(pc.k0, pc.k1);
            if (pc.kind == dk::Piece::kHandOff) {
              ASSERT_EQ(rest_pieces, 0) << "a hand-off that is not its CTA's first piece of the rest";
              ++handoffs[static_cast<size_t>(b)];
            }
            if (pc.w >= pl.whole) {
              ++rest_pieces;
              rest_stages += pc.k1 - pc.k0;
            }
            items[static_cast<size_t>(pc.w)].push_back({b, pc.k0, pc.k1, pc.kind});
          }
          if (b < pl.ctas) ASSERT_GE(rest_stages, dk::kSplitMinStages) << "grid " << grid << " cta " << b;
          ASSERT_LE(handoffs[static_cast<size_t>(b)], 1) << "CTA " << b << " would need two slots";
        }
        for (int w = 0; w < work; ++w) {
          const auto& o = items[static_cast<size_t>(w)];
          ASSERT_FALSE(o.empty()) << "item " << w << " never taken (grid " << grid << ", work " << work << ")";
          if (o.size() == 1) {
            ASSERT_EQ(o[0].kind, dk::Piece::kWhole);
            ASSERT_EQ(o[0].k0, 0);
            ASSERT_EQ(o[0].k1, ktiles);
            continue;
          }
          // Sorted by CTA (the cursor runs CTAs in order): the finisher first, then the hand-offs.
          ASSERT_EQ(o[0].kind, dk::Piece::kFinish);
          ASSERT_EQ(o[0].k0, 0);
          const int e = dk::finish_end(pl, o[0].cta, w, ktiles);
          ASSERT_EQ(e - o[0].cta - 1, static_cast<int>(o.size()) - 1) << "the finisher's slots are the item's hand-offs";
          for (size_t i = 1; i < o.size(); ++i) {
            ASSERT_EQ(o[i].kind, dk::Piece::kHandOff);
            ASSERT_EQ(o[i].cta, o[0].cta + static_cast<int>(i));
            ASSERT_EQ(o[i].k0, o[i - 1].k1) << "k order";
          }
          ASSERT_EQ(o.back().k1, ktiles);
          // The finisher's piece is its CTA's last: every CTA it waits for has handed off first.
          dk::PieceCursor cur(pl, o[0].cta);
          dk::ItemPiece pc{}, lastpc{};
          while (cur.next(pl, ktiles, pc)) lastpc = pc;
          ASSERT_EQ(lastpc.w, w);
        }
      }
  EXPECT_GT(split_cases, 50);  // the loop reaches the split, not only whole items
  // The calls session 31 measured, on 132 SMs (264 CTAs at 16-row tiles): qwen3-30b-a3b T = 1's items
  // (FC1 96 of 32 stages, FC2 128 of 12) run whole; llama4-scout T = 1's (FC1 128 of 80, FC2 40 of 128)
  // and gpt-oss-120b T = 1's FC2 (92 of 45) split; so do GpuDynamic.LastWaveSplit's (test_gpu_moe.cpp:
  // FC1 88 of 45, FC2 46 of 44), which it relies on to run the hand-offs.
  EXPECT_EQ(dk::split_plan(true, 96, 264, 32).ctas, 0);
  EXPECT_EQ(dk::split_plan(true, 128, 264, 12).ctas, 0);
  for (const auto& [work, ktiles] : {std::pair{128, 80}, std::pair{40, 128}, std::pair{92, 45}, std::pair{88, 45},
                                     std::pair{46, 44}})
    EXPECT_GT(dk::split_plan(true, work, 264, ktiles).ctas, work) << work << " items of " << ktiles << " stages";
}

// static's m-tile per call (no GPU needed): dynamic's rule within 32 and 64 rows (static has
// kernels for 32 and 64 only; launch_static_moe.cu).
TEST(StaticTileM, DynamicRuleWithin32And64) {
  EXPECT_EQ(gpu::static_tile_m(128 * 8, 128), 32);   // 8 rows per expert: the rule says 16
  EXPECT_EQ(gpu::static_tile_m(1, 256), 32);         // T = 1, K = 1: the rule says 16
  EXPECT_EQ(gpu::static_tile_m(512 * 8, 128), 64);   // 32: the rule says 64
  EXPECT_EQ(gpu::static_tile_m(512 * 2, 8), 64);     // mixtral-8x7b T = 512: the rule says 128
  EXPECT_EQ(gpu::static_tile_m(4096, 1), 64);        // one local expert
}

// The bf16 path: the same cases, dequantised once into a copy (all experts at once, and two at a
// time through a smaller copy), then multiplied with both operands in shared memory, in m-tiles of
// 256 routed rows whose epilogue runs in two parts of 128. Rows per expert and the m-tiles they
// make: 1, 65, 17: one part-filled first part; 130, 200: a partial second part; 127, 3: an empty
// second part (skipped); 300 = 256 + 44 and 513 = 2·256 + 1: a full tile, then one with an empty
// second part; 400 = 256 + 144: a partial second part after a full tile.
TEST(GpuDynamicGemm, Bf16PathMatchesCpuGemmOfDequantisedWeights) {
  REQUIRE_SM90();
  const std::vector<GemmCase> cases = {
      {true, {1}, 128, 64},
      {false, {65}, 192, 320},
      {true, {0, 130, 0, 127, 300}, 256, 704},
      {false, {128, 129, 3}, 2880, 256},
      {true, {200, 17, 1100}, 128, 2880},  // 5 m-tiles of one expert: more than a band of 4
      {false, {300, 0, 513, 400}, 384, 512},  // partial 256-row tiles (above); 3 n-tiles, 8 stages
  };
  uint64_t seed = 200;
  for (const GemmCase& g : cases)
    for (int group : {static_cast<int>(g.rows_per_expert.size()), 2}) {
      SCOPED_TRACE(describe(g) + " bf16 groups of " + std::to_string(group) + (g.nvfp4 ? ", bf16 words" : ""));
      run_gemm_case(g, seed++, group, 128, false, /*bf16_words=*/g.nvfp4);
    }
}

// ---- diagnostics (run with --gtest_also_run_disabled_tests) -------------------------------------

// best[v]: the best time in ms of `reps` calls of launch(v) for each of two variants v = 0, 1,
// interleaved (a first round warms up and is not counted), from events around each call. (void:
// GPU_CHECK returns from the function on a failure.)
template <class Launch>
void best_of_two_ms(int reps, Launch&& launch, std::array<float, 2>& best) {
  cudaEvent_t e0, e1;
  GPU_CHECK(cudaEventCreate(&e0));
  GPU_CHECK(cudaEventCreate(&e1));
  best = {1e30f, 1e30f};
  for (int rep = 0; rep <= reps; ++rep)
    for (int v = 0; v < 2; ++v) {
      GPU_CHECK(cudaEventRecord(e0));
      launch(v);
      GPU_CHECK(cudaGetLastError());
      GPU_CHECK(cudaEventRecord(e1));
      GPU_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      GPU_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (rep > 0) best[v] = std::min(best[v], ms);
    }
  GPU_CHECK(cudaEventDestroy(e0));
  GPU_CHECK(cudaEventDestroy(e1));
}

// The register path's weight stream without the GEMM: does the order in which a stage takes its
// bytes cost HBM bandwidth? A work item is 8 row tiles × ktiles fragment tiles of 512 B, stored row
// tile by row tile (device_weights.h), so a stage (one k-tile of all 8) reads 8 pieces of 512 B
// ktiles · 512 B apart: 8 interleaved sequential streams a CTA, ~2100 over the grid (kOrder 0, what
// dynamic's tensor copies do). kOrder 1 reads the same item's bytes in address order, 4 KB a stage
// (one stream a CTA: a layout with a stage's 8 tiles side by side). Plain 16-byte loads, 8 stages in
// flight per thread (32 KB a CTA, two CTAs an SM as at 32-row m-tiles), the items striped over the
// CTAs as dynamic's work list. Session 24 (H100): 3.18–3.22 TB/s both ways at ktiles 12, 32 and 112
// (address order / stage order 0.991–0.995): the order is not what keeps dynamic's FC1 at ~68 % of
// the stream rate.
template <int kOrder>
__global__ void __launch_bounds__(256, 2) weight_order_kernel(const uint4* w, int64_t items, int ktiles, uint32_t* sink) {
  const int t = threadIdx.x, j = t >> 5, lane = t & 31;
  uint32_t x = 0;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const uint4* base = w + item * 8 * ktiles * 32;
#pragma unroll 8
    for (int kt = 0; kt < ktiles; ++kt) {
      const int64_t off = kOrder == 0 ? (static_cast<int64_t>(j) * ktiles + kt) * 32 + lane : static_cast<int64_t>(kt) * 256 + t;
      const uint4 v = __ldg(base + off);
      x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (x == 0x9E3779B9u) sink[blockIdx.x] = x;  // keeps the loads; never true for the zeroed buffer
}

TEST(GpuDiagnostics, DISABLED_WeightStreamOrder) {
  REQUIRE_GPU();
  int sms = 0;
  GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr size_t kBytes = size_t{4} << 30;  // 80× the L2: every pass streams from HBM
  uint4* w = nullptr;
  GPU_CHECK(cudaMalloc(&w, kBytes));
  GPU_CHECK(cudaMemset(w, 0, kBytes));
  DeviceArray<uint32_t> sink(static_cast<size_t>(sms) * 2);
  for (const int ktiles : {12, 32, 112}) {  // FC2 of qwen3-30b-a3b, FC1 of it, FC1 of deepseek-v3
    const int64_t items = static_cast<int64_t>(kBytes / (size_t{8} * ktiles * 512));
    std::array<float, 2> best{};
    best_of_two_ms(
        3,
        [&](int order) {
          if (order == 0) weight_order_kernel<0><<<sms * 2, 256>>>(w, items, ktiles, sink.get());
          else weight_order_kernel<1><<<sms * 2, 256>>>(w, items, ktiles, sink.get());
        },
        best);
    const double gb = static_cast<double>(items) * 8 * ktiles * 512 / 1e9;
    std::printf("[weight stream] ktiles %3d: row tile by row tile (dynamic's stages) %7.1f GB/s, "
                "address order %7.1f GB/s (%.3f)\n",
                ktiles, gb / (best[0] * 1e-3), gb / (best[1] * 1e-3), best[1] / best[0]);
  }
  GPU_CHECK(cudaFree(w));
}

// The stream diagnostics' GEMM: qwen3-30b-a3b FC1's shape at T = 16 (E experts of kStreamN weight
// rows × kStreamK, 2 routed rows each, 32-row m-tiles), random NVFP4 codes and scales as f16 words,
// activations f16 1.0; tiles: its m-tiles.
constexpr int kStreamN = 1536, kStreamK = 2048;
GemmDeviceCase stream_case(int E, uint64_t seed, int& tiles) {
  constexpr int bs = 16;
  std::mt19937_64 rng(seed);
  const GemmCase g{true, std::vector<int>(E, 2), kStreamN, kStreamK};
  const GemmSchedule sch = gemm_schedule(g.rows_per_expert, 32);
  tiles = sch.tiles;
  std::vector<uint16_t> a(static_cast<size_t>(sch.rows) * kStreamK, 0x3C00);  // f16 1.0
  std::vector<uint8_t> codes(static_cast<size_t>(E) * kStreamN * kStreamK / 2),
      scales(static_cast<size_t>(E) * kStreamN * (kStreamK / bs));
  for (auto& c : codes) c = static_cast<uint8_t>(rng());
  for (auto& x : scales) x = static_cast<uint8_t>(((4 + rng() % 7) << 3) | (rng() % 8));
  std::vector<uint8_t> fcodes, fscales;
  gpu::to_fragment_order(codes, scales, E, kStreamN, kStreamK, bs, fcodes, fscales, kernels::WordLayout::kF16);
  return GemmDeviceCase(g, sch, a, fcodes, fscales, /*f16=*/true);
}

// The register path's weight stream in parts (next-steps, session 24): the real GEMM (f16 variant,
// 32-row m-tiles, the shape of qwen3-30b-a3b's FC1 at T = 16: experts of 1536 weight rows × 2048 k,
// 2 routed rows each, 12 n-tiles an m-tile) against its producer and ring alone (ring_only_kernel:
// dynamic's produce() and consumers that only wait on "full" and release "empty"), at 81 experts
// (972 items: 3.7 waves of 264 CTAs) and 88 (1056: 4 whole waves). If the ring alone streams near
// the read ceiling, the consumers hold the GEMM back; if not, the copies' shape does. Times: best of
// 5 after a warm-up, weights (codes and scales) 150-170 MB against the 50 MB L2.
template <int BM, bool kF16>
__global__ void __launch_bounds__(kernels::dynamic::kThreads, kernels::dynamic::kCtasPerSm<BM, kF16>)
    ring_only_kernel(kernels::MoeGemmParams p, const __grid_constant__ kernels::dynamic::TensorMaps maps, int n_tiles) {
  namespace dk = kernels::dynamic;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  dk::Smem<BM, kF16>& sm = dk::aligned_smem<dk::Smem<BM, kF16>>(smem_raw);
  dk::start_cta(sm, p.nvfp4, p.bf16_words);
  const kernels::ptx::Watchdog wd{&sm.aborted, nullptr};
  const int work = *p.num_tiles * n_tiles, ktiles = p.k_pad / dk::BK;
  constexpr int kRing = dk::Smem<BM, kF16>::kStages;
  uint32_t it = 0;
  if (dk::take_role<BM, kF16>()) {
    dk::produce<false, BM, kF16>(p, &maps, sm, n_tiles, dk::Split{}, work, wd, it);  // whole items
    return;
  }
  for (int w = blockIdx.x; w < work; w += gridDim.x)
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
      kernels::ptx::mbar_wait(&sm.full[it % kRing], (it / kRing) & 1, wd, dk::kWaitFull, static_cast<int>(it));
      kernels::ptx::mbar_arrive(&sm.empty[it % kRing]);
    }
}

TEST(GpuDiagnostics, DISABLED_RegisterPathStreamParts) {
  REQUIRE_SM90();
  namespace dk = kernels::dynamic;
  constexpr int N = kStreamN, K = kStreamK, BM = 32;
  for (const int E : {81, 88}) {
    int tiles = 0;
    const GemmDeviceCase dc = stream_case(E, 24, tiles);
    const kernels::MoeGemmParams& p = dc.p;
    gpu::DynamicWorkspace ws(0);
    ASSERT_TRUE(ws.unsupported.empty()) << ws.unsupported;
    const int n_tiles = gpu::dynamic_n_tiles(p, /*fc1=*/false);
    const int work = tiles * n_tiles, grid = std::min(ws.sms * dk::kCtasPerSm<BM, true>, work);
    const dk::TensorMaps maps = gpu::register_path_maps(p, BM, /*fc1=*/false);
    constexpr size_t kSmem = dk::smem_bytes<BM, true>;
    GPU_CHECK(cudaFuncSetAttribute(ring_only_kernel<BM, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(kSmem)));
    // Its register hand-over (take_role) needs the launch's registers, as the GEMM's (register_path_opt_in).
    cudaFuncAttributes attr{};
    GPU_CHECK(cudaFuncGetAttributes(&attr, ring_only_kernel<BM, true>));
    ASSERT_EQ(attr.numRegs, (dk::kLaunchRegs<BM, true>)) << "ring_only_kernel's setmaxnreg would wait forever";
    std::array<float, 2> best{};
    best_of_two_ms(
        5,
        [&](int part) {
          if (part == 0) gpu::launch_dynamic_gemm(ws, p, /*fc1=*/false, tiles, BM, nullptr, nullptr);
          else ring_only_kernel<BM, true><<<grid, dk::kThreads, kSmem>>>(p, maps, n_tiles);
        },
        best);
    const double bytes = static_cast<double>(E) * N * K * 9 / 16;  // codes and E4M3 scales
    std::printf("[stream parts] %d experts, %d items over %d CTAs (%.2f waves), %.0f MB: GEMM %.1f us (%.2f TB/s), "
                "producer and ring alone %.1f us (%.2f TB/s)\n",
                E, work, grid, static_cast<double>(work) / grid, bytes / 1e6, best[0] * 1e3, bytes / (best[0] * 1e6),
                best[1] * 1e3, bytes / (best[1] * 1e6));
  }
}

// The register path's weight stream with its parts as knobs (session 25: the producer and ring
// alone stream at 2.61 TB/s, plain loads at 3.2). One producer thread issues each stage's copies as
// produce() does (the work list, the tile's metadata, the same tensor maps), one consumer lane
// waits on "full" and frees the stage at once. Knobs: the ring's stages (kRing) and CTAs per SM
// (kCtas), whether a stage also copies the activation tile (kAct, from L2) and the scales (kScales),
// and the codes' shape: the 3-D box of 8 row tiles 512 B each a k-tile apart (produce's) or one 4 KB
// bulk copy of contiguous bytes (kFlat: the same bytes, item by item); kPf > 0: the producer also
// asks L2 for the codes and scales kPf k-tiles ahead of the stage it fills (within the item), more
// bytes in flight without more shared memory.
template <int kRing, bool kAct, bool kScales>
struct ProbeSmem {
  __nv_bfloat16 a[kAct ? kRing : 1][32 * kernels::dynamic::BK];  // 1024-aligned: the 128B-swizzled box
  alignas(128) uint4 w[kRing][kernels::dynamic::kRowTiles][32];
  alignas(128) uint8_t ws[kScales ? kRing : 1][kernels::dynamic::kRowTiles * 64];
  uint64_t full[kRing], empty[kRing];
};
template <int kRing, bool kAct, bool kScales>
inline constexpr size_t kProbeSmem = sizeof(ProbeSmem<kRing, kAct, kScales>) + kernels::dynamic::kSmemAlign;

template <int kRing, int kCtas, bool kAct, bool kScales, bool kFlat, int kPf = 0>
__global__ void __launch_bounds__(64, kCtas)
    stream_probe_kernel(kernels::MoeGemmParams p, const __grid_constant__ kernels::dynamic::TensorMaps maps,
                        int n_tiles) {
  namespace dk = kernels::dynamic;
  namespace ptx = kernels::ptx;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& sm = dk::aligned_smem<ProbeSmem<kRing, kAct, kScales>>(smem_raw);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kRing; ++s) ptx::mbar_init(&sm.full[s], 1), ptx::mbar_init(&sm.empty[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const ptx::Watchdog wd{nullptr, nullptr};
  const int work = *p.num_tiles * n_tiles, ktiles = p.k_pad / dk::BK;
  constexpr uint32_t kBytes = (kAct ? 32 * dk::BK * 2 : 0) + dk::kRowTiles * (512 + (kScales ? 64 : 0));
  uint32_t it = 0;
  if (threadIdx.x == 0) {
    for (int w = blockIdx.x; w < work; w += gridDim.x) {
      const dk::TileInfo ti = dk::tile_info<32>(p, w, n_tiles);
      const int tile0 = dk::map_row_tile<false>(p, ti, 0);
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = it % kRing;
        ptx::mbar_wait(&sm.empty[s], ((it / kRing) & 1) ^ 1, wd, dk::kWaitEmpty, it);
        ptx::mbar_arrive_expect_tx(&sm.full[s], kBytes);
        if constexpr (kAct) ptx::tma_load_2d(sm.a[s], &maps.a, kt * dk::BK, ti.row0, &sm.full[s]);
        if constexpr (kFlat)
          ptx::bulk_copy_g2s(sm.w[s][0], p.w_frag + (static_cast<int64_t>(w) * ktiles + kt) * dk::kRowTiles * 32,
                             dk::kRowTiles * 512, &sm.full[s]);
        else ptx::tma_load_3d(sm.w[s][0], &maps.codes, 0, kt, tile0, &sm.full[s]);
        if constexpr (kScales) ptx::tma_load_3d(&sm.ws[s][0], &maps.scales, 0, kt, tile0, &sm.full[s]);
        if (kPf > 0 && kt + kPf < ktiles) {
          ptx::tma_prefetch_l2_3d(&maps.codes, 0, kt + kPf, tile0);
          ptx::tma_prefetch_l2_3d(&maps.scales, 0, kt + kPf, tile0);
        }
      }
    }
  } else if (threadIdx.x == 32) {
    for (int w = blockIdx.x; w < work; w += gridDim.x)
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        ptx::mbar_wait(&sm.full[it % kRing], (it / kRing) & 1, wd, dk::kWaitFull, it);
        ptx::mbar_arrive(&sm.empty[it % kRing]);
      }
  }
}

TEST(GpuDiagnostics, DISABLED_RegisterPathStreamProbe) {
  REQUIRE_SM90();
  namespace dk = kernels::dynamic;
  constexpr int N = kStreamN, K = kStreamK, E = 88, BM = 32;  // 4 waves of 264 CTAs
  int tiles = 0;
  const GemmDeviceCase dc = stream_case(E, 25, tiles);
  const kernels::MoeGemmParams& p = dc.p;
  int sms = 0;
  GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int n_tiles = gpu::dynamic_n_tiles(p, /*fc1=*/false);
  const dk::TensorMaps maps = gpu::register_path_maps(p, BM, /*fc1=*/false);
  const double codes_mb = static_cast<double>(E) * N * K / 2 / 1e6;
  auto probe = [&](const char* what, auto kernel, int ctas, size_t smem, double bytes) {
    GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    std::array<float, 2> best{};
    best_of_two_ms(5, [&](int) { kernel<<<sms * ctas, 64, smem>>>(p, maps, n_tiles); }, best);
    const float ms = std::min(best[0], best[1]);
    std::printf("[stream probe] %-44s %6.1f us  %.2f TB/s of HBM bytes (codes%s)\n", what, ms * 1e3,
                bytes / (ms * 1e9), bytes > codes_mb * 1e6 ? " + scales" : "");
  };
  const double with_scales = codes_mb * 1e6 * 9 / 8, codes_only = codes_mb * 1e6;
  probe("8 stages, 2 CTAs/SM (produce's copies)", stream_probe_kernel<8, 2, true, true, false>, 2,
        kProbeSmem<8, true, true>, with_scales);
  probe("4 stages, 2 CTAs/SM", stream_probe_kernel<4, 2, true, true, false>, 2, kProbeSmem<4, true, true>, with_scales);
  probe("12 stages, 2 CTAs/SM", stream_probe_kernel<12, 2, true, true, false>, 2, kProbeSmem<12, true, true>,
        with_scales);
  probe("16 stages, 1 CTA/SM", stream_probe_kernel<16, 1, true, true, false>, 1, kProbeSmem<16, true, true>,
        with_scales);
  probe("24 stages, 1 CTA/SM", stream_probe_kernel<24, 1, true, true, false>, 1, kProbeSmem<24, true, true>,
        with_scales);
  probe("6 stages, 4 CTAs/SM", stream_probe_kernel<6, 4, true, true, false>, 4, kProbeSmem<6, true, true>,
        with_scales);
  probe("8 stages, 2 CTAs/SM, no activation tile", stream_probe_kernel<8, 2, false, true, false>, 2,
        kProbeSmem<8, false, true>, with_scales);
  probe("8 stages, 2 CTAs/SM, no scales", stream_probe_kernel<8, 2, true, false, false>, 2, kProbeSmem<8, true, false>,
        codes_only);
  probe("8 stages, 2 CTAs/SM, codes as one 4 KB bulk copy", stream_probe_kernel<8, 2, true, true, true>, 2,
        kProbeSmem<8, true, true>, with_scales);
  probe("8 stages, 2 CTAs/SM, L2 prefetch 8 k-tiles ahead", stream_probe_kernel<8, 2, true, true, false, 8>, 2,
        kProbeSmem<8, true, true>, with_scales);
  probe("8 stages, 2 CTAs/SM, L2 prefetch 16 k-tiles ahead", stream_probe_kernel<8, 2, true, true, false, 16>, 2,
        kProbeSmem<8, true, true>, with_scales);
  probe("16 stages, 2 CTAs/SM, codes only, 4 KB bulk", stream_probe_kernel<16, 2, false, false, true>, 2,
        kProbeSmem<16, false, false>, codes_only);
}


// What limits one register-path CTA's stage rate at decode sizes (session 26: static's items took
// ~0.5 µs a 64-k stage at qwen3-30b-a3b T = 2 and T = 16 alike, and no faster with the weights in L2).
// The same stream (qwen3-30b-a3b FC1's shape, 88 experts, 1056 items of 32 stages) over grids of 16
// to 264 CTAs, printed as µs a stage of the busiest CTA: the real GEMM (gemm_kernel, f16, 32-row
// m-tiles), the same CTA with the ring alone (ring_only_kernel) and with its consumers running parts
// of a stage (stage_parts_kernel: the dequantisation alone, the wgmma alone; dynamic::consume_item's
// kParts), and one producer thread with a 64-thread CTA (stream_probe_kernel).
// With 16 CTAs HBM is far from busy: if the ring alone still takes ~0.5 µs a stage, one thread's
// copies are the limit; if the ring alone is several times faster, the part whose time matches the
// GEMM's is (next-steps.md, "First calls").
template <int kParts>
__global__ void __launch_bounds__(kernels::dynamic::kThreads, kernels::dynamic::kCtasPerSm<32, true>)
    stage_parts_kernel(kernels::MoeGemmParams p, const __grid_constant__ kernels::dynamic::TensorMaps maps,
                       int n_tiles) {
  namespace dk = kernels::dynamic;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  dk::Smem<32, true>& sm = dk::aligned_smem<dk::Smem<32, true>>(smem_raw);
  dk::start_cta(sm, p.nvfp4, p.bf16_words);
  const kernels::ptx::Watchdog wd{&sm.aborted, nullptr};
  const int work = *p.num_tiles * n_tiles;
  uint32_t it = 0;
  if (dk::take_role<32, true>()) {
    dk::produce<false, 32, true>(p, &maps, sm, n_tiles, dk::Split{}, work, wd, it);  // whole items
    return;
  }
  for (int w = blockIdx.x; w < work; w += gridDim.x) dk::consume_item<false, 32, true, kParts>(p, sm, n_tiles, w, wd, it);
}

TEST(GpuDiagnostics, DISABLED_RegisterPathStagePerCta) {
  REQUIRE_SM90();
  namespace dk = kernels::dynamic;
  constexpr int E = 88, BM = 32;
  int tiles = 0;
  const GemmDeviceCase dc = stream_case(E, 26, tiles);
  const kernels::MoeGemmParams& p = dc.p;
  const int n_tiles = gpu::dynamic_n_tiles(p, /*fc1=*/false), work = tiles * n_tiles, ktiles = p.k_pad / dk::BK;
  const dk::TensorMaps maps = gpu::register_path_maps(p, BM, /*fc1=*/false);
  constexpr size_t kGemmSmem = dk::smem_bytes<BM, true>, kProbe = kProbeSmem<8, true, true>;
  // This file's kernel instances (each translation unit has its own): opted in here, their registers
  // checked (the consumers' setmaxnreg.inc would wait forever on fewer).
  const void* cta_kernels[] = {reinterpret_cast<const void*>(dk::gemm_kernel<false, BM, true>),
                               reinterpret_cast<const void*>(ring_only_kernel<BM, true>),
                               reinterpret_cast<const void*>(stage_parts_kernel<dk::kDequant>),
                               reinterpret_cast<const void*>(stage_parts_kernel<dk::kMma>)};
  const char* names[] = {"GEMM", "ring alone", "dequant only", "wgmma only"};
  for (const void* k : cta_kernels) {
    GPU_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kGemmSmem)));
    cudaFuncAttributes attr{};
    GPU_CHECK(cudaFuncGetAttributes(&attr, k));
    ASSERT_EQ(attr.numRegs, (dk::kLaunchRegs<BM, true>)) << "setmaxnreg would wait forever";
  }
  auto* probe = stream_probe_kernel<8, 2, true, true, false>;
  GPU_CHECK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kProbe)));
  kernels::MoeGemmParams args = p;
  dk::TensorMaps margs = maps;
  int n = n_tiles;
  int* no_watchdog = nullptr;
  dk::Split no_split{};  // whole items, as the parts kernels run them
  void* gemm_argv[] = {&args, &margs, &n, &no_split, &no_watchdog};
  void* parts_argv[] = {&args, &margs, &n};
  for (const int grid : {16, 66, 132, 264}) {
    const double stages = static_cast<double>((work + grid - 1) / grid) * ktiles;  // the busiest CTA's
    std::printf("[stage per CTA] %3d CTAs, %4.0f stages each, µs a stage:", grid, stages);
    for (int v = 0; v <= 4; ++v) {
      std::array<float, 2> best{};
      best_of_two_ms(
          3,
          [&](int) {
            if (v == 4) probe<<<grid, 64, kProbe>>>(p, maps, n_tiles);
            else
              GPU_CHECK(cudaLaunchKernel(cta_kernels[v], dim3(grid), dim3(dk::kThreads), v == 0 ? gemm_argv : parts_argv,
                                         kGemmSmem, nullptr));
          },
          best);
      std::printf(" %s %.3f%s", v == 4 ? "one thread's copies (64-thread CTA)" : names[v],
                  std::min(best[0], best[1]) * 1e3 / stages, v == 4 ? "\n" : ",");
    }
  }
}

// The tensor pipe's rate for the register path's MMAs (A from registers, f16, B 128B-swizzled in
// shared memory), by N: each warpgroup issues groups of kMmas wgmma m64nNk16 into one accumulator
// and keeps one group in flight (wgmma_wait<1>), as consume_item's stage does (4 a 64-k stage).
// Why (session 40): on the H200 the decode GEMMs run at ~3.0 TB/s of weights with 16-row tiles, the
// same as on the H100, and session 27's stage parts at one CTA an SM had the wgmma alone at ~0.18 µs
// a stage, near the GEMM's 0.24: if an m64n16k16 costs the tensor pipe what an m64n64k16 does, the
// decode stage's 8 MMAs are a fixed cost that no ring or warp count moves, and 8-row tiles (m64n8k16)
// or fewer MMAs a weight byte are the lever. Contents are irrelevant (zeros and ones): only the
// time is read. kAccs = 2 alternates two accumulators between groups (no dependency between them).
// kWithin: a group's MMA ks accumulates into accumulator ks % kAccs instead (the 4 MMAs of a group
// are then kAccs independent chains). Session 41 (H100): no faster than one accumulator, and N = 8
// no cheaper than N = 16 (~14.5 clocks an MMA an SM either way at 2 warpgroups x 2 CTAs; N = 64 34,
// N = 128 68, ~93 % of the dense rate): two accumulators a stage and m64n8k16 at 16-row tiles both
// measured slower in the decode GEMMs (bench/results/NOTES.md, "Session 41").
template <int N, int kAccs, bool kWithin = false>
__global__ void __launch_bounds__(256) wgmma_rs_rate_kernel(int groups, float* sink) {
  __shared__ __align__(1024) unsigned char sb[128 * 64 * 2];
  for (int i = threadIdx.x; i < 128 * 64 * 2 / 16; i += blockDim.x) reinterpret_cast<uint4*>(sb)[i] = make_uint4(0, 0, 0, 0);
  kernels::ptx::fence_proxy_async_smem();
  __syncthreads();
  const uint32_t one = 0x3C003C00u;  // f16 (1, 1)
  uint32_t a[4][4];
  for (int ks = 0; ks < 4; ++ks)
    for (int j = 0; j < 4; ++j) a[ks][j] = one;
  float acc[kAccs][N / 2];
  for (int c = 0; c < kAccs; ++c)
    for (int i = 0; i < N / 2; ++i) acc[c][i] = 0.0f;
  const uint32_t b_addr = kernels::ptx::smem_addr(sb);
  if constexpr (kWithin) {
    for (int g = 0; g < groups; ++g) {
#pragma unroll
      for (int c = 0; c < kAccs; ++c) kernels::ptx::fence_operand(acc[c]);
      kernels::ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        kernels::ptx::mma_m64nNk16_rs<N, true>(acc[ks % kAccs], a[ks], wg::operand_desc_sw128(b_addr, 0, ks), 1);
      kernels::ptx::wgmma_commit();
      kernels::ptx::wgmma_wait<1>();
#pragma unroll
      for (int c = 0; c < kAccs; ++c) kernels::ptx::fence_operand(acc[c]);
    }
  } else {
    for (int g = 0; g < groups; g += kAccs) {
#pragma unroll
      for (int c = 0; c < kAccs; ++c) {
        kernels::ptx::fence_operand(acc[c]);
        kernels::ptx::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          kernels::ptx::mma_m64nNk16_rs<N, true>(acc[c], a[ks], wg::operand_desc_sw128(b_addr, 0, ks), 1);
        kernels::ptx::wgmma_commit();
        kernels::ptx::wgmma_wait<1>();
        kernels::ptx::fence_operand(acc[c]);
      }
    }
  }
  kernels::ptx::wgmma_wait<0>();
  float s = 0.0f;
  for (int c = 0; c < kAccs; ++c) {
    kernels::ptx::fence_operand(acc[c]);
    for (int i = 0; i < N / 2; ++i) s += acc[c][i];
  }
  if (s != 0.0f) *sink = s;  // B is zero: never taken, but the MMAs' results are used
}

// The same groups at m64n16k16 with A from shared memory too (SS: both operands 128B-swizzled, f16):
// if SS runs a group much faster than RS at N = 16, moving the dequantised A through the register
// file (4 registers a thread an MMA, read by the tensor pipe) is what an RS wgmma pays for, and a
// stage that writes its dequantised weights to shared memory for SS MMAs is the alternative design.
template <int kAccs>
__global__ void __launch_bounds__(256) wgmma_ss16_rate_kernel(int groups, float* sink) {
  __shared__ __align__(1024) unsigned char sa[64 * 64 * 2];
  __shared__ __align__(1024) unsigned char sb[128 * 64 * 2];
  for (int i = threadIdx.x; i < 64 * 64 * 2 / 16; i += blockDim.x) reinterpret_cast<uint4*>(sa)[i] = make_uint4(0, 0, 0, 0);
  for (int i = threadIdx.x; i < 128 * 64 * 2 / 16; i += blockDim.x) reinterpret_cast<uint4*>(sb)[i] = make_uint4(0, 0, 0, 0);
  kernels::ptx::fence_proxy_async_smem();
  __syncthreads();
  float acc[kAccs][8];
  for (int c = 0; c < kAccs; ++c)
    for (int i = 0; i < 8; ++i) acc[c][i] = 0.0f;
  const uint32_t a_addr = kernels::ptx::smem_addr(sa), b_addr = kernels::ptx::smem_addr(sb);
  for (int g = 0; g < groups; ++g) {
#pragma unroll
    for (int c = 0; c < kAccs; ++c) kernels::ptx::fence_operand(acc[c]);
    kernels::ptx::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      float(&d)[8] = acc[ks % kAccs];
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, "
          "0, 0;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
          : "l"(wg::operand_desc_sw128(a_addr, 0, ks)), "l"(wg::operand_desc_sw128(b_addr, 0, ks)), "r"(1));
    }
    kernels::ptx::wgmma_commit();
    kernels::ptx::wgmma_wait<1>();
#pragma unroll
    for (int c = 0; c < kAccs; ++c) kernels::ptx::fence_operand(acc[c]);
  }
  kernels::ptx::wgmma_wait<0>();
  float s = 0.0f;
  for (int c = 0; c < kAccs; ++c) {
    kernels::ptx::fence_operand(acc[c]);
    for (int i = 0; i < 8; ++i) s += acc[c][i];
  }
  if (s != 0.0f) *sink = s;  // A and B are zero: never taken, but the MMAs' results are used
}

TEST(GpuDiagnostics, DISABLED_WgmmaRsRate) {
  REQUIRE_SM90();
  int sms = 0, clock_khz = 0;
  GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  GPU_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  DeviceArray<float> sink(1);
  constexpr int kGroups = 4096;  // 16 K MMAs a warpgroup
  auto run = [&](const char* shape, int n, int accs, auto kernel, int warpgroups, int ctas_per_sm,
                 bool within = false) {
    std::array<float, 2> best{};
    best_of_two_ms(3, [&](int) { kernel<<<sms * ctas_per_sm, 128 * warpgroups>>>(kGroups, sink.get()); }, best);
    const double us = std::min(best[0], best[1]) * 1e3;
    const double groups_per_sm = static_cast<double>(kGroups) * warpgroups * ctas_per_sm;
    const double mma_ns = us * 1e3 / (groups_per_sm * 4);  // per MMA, the SM's
    const double macs = 64.0 * n * 16;
    std::printf("[wgmma rate] %-12s %d acc%s%s, %d warpgroup%s a CTA, %d CTA%s an SM: %6.2f ns a group of 4 per "
                "warpgroup, %5.2f ns an MMA per SM (%5.1f clocks at the max clock), %6.0f MAC a clock per SM\n",
                shape, accs, accs > 1 ? "s" : " ", within ? " within a group" : "", warpgroups, warpgroups > 1 ? "s" : " ",
                ctas_per_sm,
                ctas_per_sm > 1 ? "s" : " ", us * 1e3 / kGroups, mma_ns, mma_ns * clock_khz * 1e-6,
                macs / (mma_ns * clock_khz * 1e-6));
  };
  for (const int wgs : {1, 2})
    for (const int ctas : {1, 2, 3}) {
      run("m64n8k16", 8, 1, wgmma_rs_rate_kernel<8, 1>, wgs, ctas);
      run("m64n16k16", 16, 1, wgmma_rs_rate_kernel<16, 1>, wgs, ctas);
      run("m64n16k16", 16, 2, wgmma_rs_rate_kernel<16, 2>, wgs, ctas);
      run("m64n16k16", 16, 2, wgmma_rs_rate_kernel<16, 2, true>, wgs, ctas, true);
      run("m64n16k16", 16, 4, wgmma_rs_rate_kernel<16, 4, true>, wgs, ctas, true);
      run("m64n8k16", 8, 2, wgmma_rs_rate_kernel<8, 2, true>, wgs, ctas, true);
      run("SS m64n16k16", 16, 1, wgmma_ss16_rate_kernel<1>, wgs, ctas);
      run("SS m64n16k16", 16, 2, wgmma_ss16_rate_kernel<2>, wgs, ctas, true);
      run("m64n32k16", 32, 1, wgmma_rs_rate_kernel<32, 1>, wgs, ctas);
      run("m64n64k16", 64, 1, wgmma_rs_rate_kernel<64, 1>, wgs, ctas);
      run("m64n128k16", 128, 1, wgmma_rs_rate_kernel<128, 1>, wgs, ctas);
    }
}
}  // namespace
}  // namespace fp4moe
