// dynamic's bf16 path for large prefill: dequantise each touched expert's weights once per call,
// then run a plain bf16 grouped GEMM over them.
//
// Why: the register path (dynamic.cuh) dequantises every weight once per m-tile of 128 routed rows.
// Its cost is the dequantisation count (bench/results/NOTES.md, session 5: ~0.78 G weights per ms
// for the whole GPU), so at 4096 rows per expert (mixtral-8x7b T = 16384) each weight is
// dequantised 32 times. Here each weight is dequantised once per call, and the GEMM's consumers do
// nothing but wgmma. The numbers are the same: bf16 holds code × scale exactly, and both paths
// accumulate the same products in fp32 (results equal up to summation order).
//
//   dequant_kernel   one warp per (expert slot, n-tile, k-tile, 16-row group): the lane's 16 bytes of
//                    fragment-order codes (device_weights.h) and its scale bytes → code × scale in bf16,
//                    written to the bf16 copy. Experts without routed rows are skipped.
//   gemm_kernel      as dynamic's (3 warpgroups, persistent, the same epilogues), but both wgmma
//                    operands come from shared memory, and one producer thread fills each stage
//                    with two TMA copies: the n-tile's 128 × 64 weight tile as one bulk copy (no
//                    tensor map: the copy already holds the shared-memory image) and the 256 × 64
//                    activation tile through a tensor map over A1 / A2 (built per launch,
//                    launch_dynamic_bf16.cu) that applies the same 128B swizzle.
//
// Why TMA for the activations: with cp.async (16 per producer thread per stage, and each thread
// waiting for its previous stage to land before handing it over) the consumers waited on "full"
// for about half their time at mixtral T = 16384 (Nsight Compute, NOTES session 7: 35 % of all
// warp samples on that one wait, L2 at 68 % of its throughput). A tensor copy is one instruction,
// lands through the async proxy (no fence) and completes on the stage's barrier by itself, so the
// producer runs ahead as far as the ring allows. The rows of a tile past its expert are the next
// expert's rows (or zeros past the call's rows): they only reach accumulator columns that the
// epilogue never stores, since column n of Dᵀ depends on routed row n alone.
//
// Tile: 128 weight rows × BM = 256 routed rows (the register path's is 128 × 128), each consumer
// warpgroup 4 × wgmma m64n256k16 per stage. Why: at 128 × 128 a CTA moves 32 KB per 64-k step out of
// L2 (16 KB weights, 16 KB activations), which at the measured 44–45 % of the bf16 rate is ~5.6 TB/s
// over 132 SMs, near what Hopper's L2 delivers (docs/next-steps.md "Prefill"; derived, not
// measured). At 128 × 256 a step moves 48 KB for twice the MACs: 25 % fewer bytes per MAC. The cost:
// 48 KB stages; 4 fit beside FC1's 32 KB staging of h (kStages says how), FC2 stores from registers.
// The routing list is built with tile_m = 256 for this path (launch_dynamic.cu).
//
// Both operands are K-major with the 128-byte swizzle (wgmma_layout.h sw128_offset), the layout of
// the fast Hopper GEMMs. With the no-swizzle layout this GEMM measured no faster than the register
// path that dequantises in its k-loop (~32 % of the bf16 rate at mixtral T = 16384); with the
// swizzle its two GEMMs run at 44–45 % there (NOTES session 6).
//
// The bf16 copy, per group of experts: tile (slot, y, kt) of BN weight rows (the n-tile's virtual
// rows) × BK k, in the 128B-swizzled K-major layout (wgmma_layout.h), 16 KB each, tiles in
// (slot, y, kt) order. Virtual rows are moe_gemm.cuh weight_row's (rows past w_rows are zeros),
// except for a gated FC1, whose tile y holds intermediate columns j = 64y + jj (jj < 64) with an
// interleave of 8: virtual row 16q + r is the up row of j = 64y + 8q + r for r < 8 and the gate row
// of j = 64y + 8q + r - 8 otherwise, so that one accumulator thread holds both (fc1_finish).
//
// Work order: bands of kBand m-tiles × all n-tiles, m-tile fastest inside a band. The CTAs in
// flight then share weight tiles (read from HBM about once per band) while the band's activations
// stay in L2.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: the map is built on the host)
#include <cuda_bf16.h>
#include <cstdint>

#include "kernels/common/dequant.cuh"
#include "kernels/common/frag_dequant.cuh"
#include "kernels/dynamic.cuh"

namespace fp4moe::kernels::dynamic_bf16 {

using dynamic::BK;
using dynamic::BN;
using dynamic::kConsumers;
using dynamic::kLdc;
using dynamic::kThreads;
using dynamic::kWarpgroup;
using dynamic::TileInfo;

inline constexpr int BM = 256;                 // routed rows per m-tile: the wgmma N (the routing's tile_m)
inline constexpr int kAcc = BM / 2;            // fp32 accumulators per consumer thread (m64n256)
// 48 KB each. 4 fit because FC2 stores from registers (no staging) and FC1 stages 64 columns of h in
// bf16 (32 KB). With 3 stages and a 68 KB staging, the consumers waited for "full" ~36 % of their
// time in mixtral-8x7b's FC1 at T = 16384 (Nsight Compute, NOTES session 8): with one stage in the
// tensor cores and one waiting for its release, a copy had ~2 steps (~1.4 µs) to land.
inline constexpr int kStages = 4;
// m-tiles per band of the work order: 1024 routed rows, as at BM = 128 with 8 m-tiles, so a band's
// activations take the same room in L2 as in the measured configuration (mixtral FC2: 29 MB).
inline constexpr int kBand = 1024 / BM;
inline constexpr int kWTileElems = BN * BK;            // bf16 per weight tile
inline constexpr uint32_t kWTileBytes = kWTileElems * 2;  // 16 KB: one bulk copy per stage
inline constexpr int kDequantThreads = 256;

// Weight tiles per expert slot of one GEMM, and the copy's element offset of tile (slot, y, kt).
FP4MOE_HD int64_t tiles_per_slot(int n_tiles, int k_pad) { return static_cast<int64_t>(n_tiles) * (k_pad / BK); }
FP4MOE_HD int64_t wtile_offset(int slot, int y, int kt, int n_tiles, int k_pad) {
  return ((static_cast<int64_t>(slot) * n_tiles + y) * (k_pad / BK) + kt) * kWTileElems;
}

// A unit's registers through the tables: vals[t][r] = code pair (byte r of standard word t) × the
// row's scale (slo: rows g, shi: rows g + 8; byte t is k16 step t's scale in both formats, as
// frag_scales spreads MX words).
__device__ __forceinline__ void lookup_unit(const E2m1x2Table& e2m1, uint4 codes, uint32_t slo, uint32_t shi, bool nvfp4,
                                            uint32_t (&vals)[4][4]) {
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const __nv_bfloat162 s_lo = scale_bf16x2(static_cast<uint8_t>(slo >> (8 * t)), nvfp4);
    const __nv_bfloat162 s_hi = scale_bf16x2(static_cast<uint8_t>(shi >> (8 * t)), nvfp4);
    const uint32_t lo = *reinterpret_cast<const uint32_t*>(&s_lo), hi = *reinterpret_cast<const uint32_t*>(&s_hi);
#pragma unroll
    for (int r = 0; r < 4; ++r) vals[t][r] = hmul2_bf16_bits(e2m1.v[(words[t] >> (8 * r)) & 0xFF], (r & 1) ? hi : lo);
  }
}

// ---- the dequantisation pre-pass --------------------------------------------------------------------
// One warp per unit u = ((slot · n_tiles + y) · ktiles + kt) · 8 + q: the 16 weight rows 16q.. of
// tile (slot, y, kt). Lane (g, c) = (lane / 4, lane % 4) holds, for k16 step t, the codes of rows
// g, g + 8 at k 16t + 2c, +1 and 16t + 8 + 2c, +1 (frag_dequant.cuh). The unit's 16 rows are 2 KB
// contiguous in the swizzled tile (two atoms), so the warp builds them in shared memory with 4-byte
// stores (conflict-free: the swizzle spreads a store's 8 rows over 8 chunk positions) and writes
// them out as 16-byte chunks, 512 contiguous bytes per instruction. Writing the 4-byte values
// straight to global memory left each store's 8 chunks half-filled in 8 different 128-byte lines,
// and the pre-pass ran at ~0.3 G weights per ms (NOTES session 6).
template <bool kFc1>
__global__ void __launch_bounds__(kDequantThreads) dequant_kernel(MoeGemmParams p, int n_tiles) {
  __shared__ E2m1x2Table e2m1;
  __shared__ uint4 staged[kDequantThreads / 32][16 * 128 / 16];  // per warp: its unit's 16 rows, swizzled
  fill_e2m1x2_table(e2m1);
  __syncthreads();
  const int lane = threadIdx.x & 31, g = lane >> 2, cq = lane & 3;
  unsigned char* const st = reinterpret_cast<unsigned char*>(staged[threadIdx.x >> 5]);
  const int ktiles = p.k_pad / BK, sb = 64 / p.block;
  const int64_t units = static_cast<int64_t>(p.expert_count) * n_tiles * ktiles * 8;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kDequantThreads / 32);
  for (int64_t u = blockIdx.x * (kDequantThreads / 32) + (threadIdx.x >> 5); u < units; u += warps) {
    const int q = static_cast<int>(u & 7);
    const int64_t tile = u >> 3;
    const int kt = static_cast<int>(tile % ktiles);
    const int y = static_cast<int>((tile / ktiles) % n_tiles);
    const int slot = static_cast<int>(tile / (static_cast<int64_t>(ktiles) * n_tiles));
    const int e = p.expert_base + slot;
    if (p.expert_offset[e + 1] == p.expert_offset[e]) continue;  // no routed rows: never read
    const int v0 = 16 * q;
    // vals[t][r]: register r of k16 step t (row g + 8·(r & 1), k 16t + 8·(r >> 1) + 2c) as bf16x2.
    uint32_t vals[4][4];
    // NVFP4 on bf16 words (MoeGemmParams::bf16_words): frag_a_bf16w gives code × scale × 2^-8, and one
    // HMUL2 by 2^8 the value (exact), ~5 instructions a register against ~12 for the words read back
    // as standard ones and looked up.
    constexpr uint32_t kTwoTo8 = 0x43804380u;  // bf16x2 (256, 256)
    auto words_of = [](uint4 v, int t) { return t == 0 ? v.x : t == 1 ? v.y : t == 2 ? v.z : v.w; };
    bool ok;  // the unit's weight rows exist (else its values are zeros)
    if (kFc1 && p.gated) {
      // Interleaved unit (the copy's layout, file comment): its rows 0..7 are the up rows of
      // intermediate columns j0 = 64y + 8q .. j0 + 7, rows 8..15 their gate rows, each the top
      // (hh = 0) or bottom half of a fragment tile: weight_row's row tiles q / 2 (up) and 4 + q / 2
      // (gate). Lane (g, c)'s register r is row g + 8·(r & 1): take the up tile's register
      // (r & 2) | hh for even r and the gate tile's for odd r; the scales likewise.
      const int hh = q & 1;
      const dynamic::RowTile ru = dynamic::row_tile<kFc1>(p, TileInfo{y, e, 0, 0}, q / 2);
      const dynamic::RowTile rg = dynamic::row_tile<kFc1>(p, TileInfo{y, e, 0, 0}, 4 + q / 2);
      ok = ru.ok && rg.ok;  // i_pad is a multiple of 64: always
      const uint64_t tu = ru.tile0 + kt, tg = rg.tile0 + kt;
      const uint4 wu = __ldg(p.w_frag + tu * 32 + lane), wg = __ldg(p.w_frag + tg * 32 + lane);
      uint32_t ulo, uhi, glo, ghi;
      frag_scales(p.s_frag + tu * 16 * sb, sb, ulo, uhi);
      frag_scales(p.s_frag + tg * 16 * sb, sb, glo, ghi);
      if (p.bf16_words) {
        const Bf16wScales su = frag_scales_bf16w(ulo, uhi), sg = frag_scales_bf16w(glo, ghi);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          uint32_t au[4], ag[4];
          frag_a_bf16w(words_of(wu, t), su, t, au);
          frag_a_bf16w(words_of(wg, t), sg, t, ag);
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int src = (r & 2) | hh;
            vals[t][r] = hmul2_bf16_bits((r & 1) ? ag[src] : au[src], kTwoTo8);
          }
        }
      } else {
        const uint4 cu = standard_words(wu, p.f16_words, false), cg = standard_words(wg, p.f16_words, false);
        const uint32_t sel = hh ? 0x7351u : 0x6240u;
        const uint4 codes = make_uint4(__byte_perm(cu.x, cg.x, sel), __byte_perm(cu.y, cg.y, sel),
                                       __byte_perm(cu.z, cg.z, sel), __byte_perm(cu.w, cg.w, sel));
        lookup_unit(e2m1, codes, hh ? uhi : ulo, hh ? ghi : glo, p.nvfp4, vals);
      }
    } else {
      const dynamic::RowTile rt = dynamic::row_tile<kFc1>(p, TileInfo{y, e, 0, 0}, q);  // rows v0.. of the n-tile
      ok = rt.ok;
      if (ok) {
        const uint64_t ftile = rt.tile0 + kt;
        const uint4 w = __ldg(p.w_frag + ftile * 32 + lane);
        uint32_t slo, shi;
        frag_scales(p.s_frag + ftile * 16 * sb, sb, slo, shi);
        if (p.bf16_words) {
          const Bf16wScales sw = frag_scales_bf16w(slo, shi);
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            uint32_t a[4];
            frag_a_bf16w(words_of(w, t), sw, t, a);
#pragma unroll
            for (int r = 0; r < 4; ++r) vals[t][r] = hmul2_bf16_bits(a[r], kTwoTo8);
          }
        } else {
          lookup_unit(e2m1, standard_words(w, p.f16_words, false), slo, shi, p.nvfp4, vals);
        }
      }
    }
    if (!ok)
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int r = 0; r < 4; ++r) vals[t][r] = 0u;
    unsigned char* dst = reinterpret_cast<unsigned char*>(p.w_bf16 + wtile_offset(slot, y, kt, n_tiles, p.k_pad));
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = g + 8 * (r & 1), k = 16 * t + 8 * (r >> 1) + 2 * cq;  // row within the unit
        *reinterpret_cast<uint32_t*>(st + wgmma::sw128_offset(row, k)) = vals[t][r];
      }
    __syncwarp();
    // The unit's rows v0.. start at byte 128·v0 of the tile (v0 % 8 == 0: whole atoms).
    uint4* const out = reinterpret_cast<uint4*>(dst + 128 * v0);
    const uint4* const in = reinterpret_cast<const uint4*>(st);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[lane + 32 * j] = in[lane + 32 * j];
    __syncwarp();  // the next unit overwrites the staging
  }
}

// ---- the GEMM ---------------------------------------------------------------------------------------
// FC1's staging: h in bf16 for 64 intermediate columns × the tile's 256 routed rows, [routed row][64],
// 128 bytes per row with its 16-byte chunks XOR-swizzled by row (chunk c of row n at c ^ (n & 7)): the
// accumulator threads' stores (8 consecutive columns × 4 rows two apart per instruction) and the
// helpers' 16-byte reads (one chunk of 8 consecutive rows per quarter-warp) are conflict-free without
// padding. A gated tile has 64 columns; a non-gated one (relu2, 128 columns) goes through in two
// halves, one per consumer warpgroup.
inline constexpr int kHCols = BN / 2;
__device__ __forceinline__ int h_offset(int n, int j) {  // element offset of (routed row n, column j)
  return n * kHCols + ((((j >> 3) ^ (n & 7)) << 3) | (j & 7));
}

// Tiles in the 128B-swizzled layout, so each starts 1024-byte aligned: the kernel aligns its dynamic
// shared memory up to 1024 bytes (dynamic::aligned_smem; dynamic::kSmemAlign of slack in the launch's size).
using dynamic::kSmemAlign;
struct alignas(1024) Smem {
  __nv_bfloat16 a[kStages][BM * BK];   // activation tiles (256 rows, 64 k), sw128: 32 KB (tensor copies)
  __nv_bfloat16 w[kStages][BN * BK];   // weight tiles (128 rows, 64 k), sw128: 16 KB (bulk copies)
  uint16_t h[BM * kHCols];             // FC1: 64 columns of h in bf16 (h_offset), 32 KB
  float rw[BM];                        // FC2: the tile's router weights (dynamic::router_weight)
  uint64_t full[kStages];              // 1 producer arrival with both copies' bytes
  uint64_t empty[kStages];             // 256 consumer arrivals
  uint64_t h_full;                     // FC1: 256 consumer arrivals once a unit of h is staged
  uint64_t h_empty;                    // FC1: kHelpers arrivals once it is requantised
  int aborted;                         // watchdog (mbarrier.cuh)
};
// 4 · 48 KB + 32 KB + 1 KB + the barriers, rounded to 1 KB (231424 B), + the alignment slack: the
// whole 227 KB.
static_assert(sizeof(Smem) + kSmemAlign <= 232448, "past the sm_90 opt-in shared memory per CTA (227 KB)");
static_assert(BM == kConsumers * kWarpgroup, "consumer thread ct loads the router weight of routed row ct");

// Work item w of the group → (m-tile, n-tile): bands of kBand m-tiles, the m-tile fastest inside a
// band (the file comment says why); tile_begin / tiles: the group's m-tiles in the routing's list.
__device__ __forceinline__ TileInfo band_item(const MoeGemmParams& p, int w, int n_tiles, int tile_begin, int tiles) {
  const int band0 = w / (kBand * n_tiles) * kBand;
  const int size = min(kBand, tiles - band0);
  const int r = w - band0 * n_tiles;
  return dynamic::tile_at<BM>(p, tile_begin + band0 + r % size, r / size);
}

inline constexpr uint32_t kATileBytes = BM * BK * 2;  // 32 KB: one tensor copy per stage

// The producer is one thread (the others of its warpgroup leave): per stage, once the consumers have
// freed it, the weight tile by bulk copy and the activation tile by tensor copy, both completing
// on "full" with their bytes.
template <bool kFc1>
__device__ __forceinline__ void produce(const MoeGemmParams& p, const CUtensorMap& a_map, Smem& sm, int n_tiles,
                                        int tile_begin, int tiles, const ptx::Watchdog& wd) {
  const int ktiles = p.k_pad / BK, work = tiles * n_tiles;
  uint32_t it = 0;
  for (int w = blockIdx.x; w < work; w += gridDim.x) {
    const TileInfo ti = band_item(p, w, n_tiles, tile_begin, tiles);
    const __nv_bfloat16* wsrc = p.w_bf16 + wtile_offset(ti.e - p.expert_base, ti.y, 0, n_tiles, p.k_pad);
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
      const int s = it % kStages;
      ptx::mbar_wait(&sm.empty[s], ((it / kStages) & 1) ^ 1, wd, dynamic::kWaitEmpty, it);
      ptx::mbar_arrive_expect_tx(&sm.full[s], kWTileBytes + kATileBytes);  // before the copies it announces
      ptx::bulk_copy_g2s(sm.w[s], wsrc + static_cast<int64_t>(kt) * kWTileElems, kWTileBytes, &sm.full[s]);
      ptx::tma_load_2d(sm.a[s], &a_map, kt * BK, ti.row0, &sm.full[s]);
    }
  }
}

// This consumer thread's accumulators of a tile, by weight row: acc[4q + 2·h2 + b] is weight row
// 64c + acc_row(t, 2·h2) of n-tile ti.y (wgmma_layout.h) against routed row acc_col(t, 4q + 2·h2 + b).
// f(i, jj, ok, bias, n): accumulator i, its row jj within the warpgroup's 64, whether the tile's row
// is below `rows`, that row's bias (0 past `rows` or without biases), its routed row n.
template <int kAccN, class F>
__device__ __forceinline__ void for_each_acc(const TileInfo& ti, int c, int t, int rows, const float* be, F&& f) {
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int jj = wgmma::acc_row(t, 2 * h2), row = ti.y * BN + 64 * c + jj;
    const bool ok = row < rows;
    const float bias = ok && be ? be[row] : 0.0f;
#pragma unroll
    for (int q = 0; q < kAccN / 4; ++q)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int i = 4 * q + 2 * h2 + b;
        f(i, jj, ok, bias, wgmma::acc_col(t, i));
      }
  }
}

// The FC1 epilogue, computed where the accumulators are. Thread t of consumer c holds D rows
// 16·warp + g and + 8 (g = lane / 4) of its 64 × 256 block for routed rows acc_col(t, i).
//   Gated: the tile's virtual rows are interleaved by 8 (the pre-pass writes them so), so those two
//   rows are the up and the gate row of one intermediate column jj = 32c + 8·warp + g: the thread
//   applies alpha, the biases and the activation to its 64 (up, gate) pairs in registers, unrolled
//   (GatedActivation: one copy of the code for the three gated activations), and stages h in bf16.
//   The tile is one staging unit.
//   Otherwise (relu2) its two rows are two intermediate columns and the tile is two units of 64
//   columns, warpgroup c's columns in unit c.
// For each unit: wait until the helpers have requantised the previous one out of the staging
// (h_empty), store, arrive on h_full; the helpers requantise it into A2 (fc1_requantise_tiles)
// while the consumers go on. u counts this CTA's units.
template <int kAccN>
__device__ __forceinline__ void fc1_finish(const MoeGemmParams& p, const TileInfo& ti, const float (&acc)[kAccN],
                                           Smem& sm, int c, int t, uint32_t& u, const ptx::Watchdog& wd) {
  const int warp = t >> 5, g = (t & 31) >> 2, l4 = t & 3;
  const float alpha = p.alpha[ti.e];
  const float* be = p.bias ? p.bias + static_cast<int64_t>(ti.e) * p.w_rows : nullptr;
  if (p.gated) {
    const int jj = 32 * c + 8 * warp + g, j = ti.y * kHCols + jj;
    const float bu = be ? be[j] : 0.0f, bg = be ? be[p.i_pad + j] : 0.0f;
    const GatedActivation act(p);
    ptx::mbar_wait(&sm.h_empty, (u & 1) ^ 1, wd, dynamic::kWaitStagingFree, static_cast<int>(u));
#pragma unroll
    for (int idx = 0; idx < kAccN / 2; ++idx) {  // pair (q, b): acc 4q + b (up), 4q + 2 + b (gate), routed row 8q + 2·l4 + b
      const int q = idx >> 1, b = idx & 1, n = 8 * q + 2 * l4 + b;
      const float h = act(alpha * acc[4 * q + 2 + b] + bg, alpha * acc[4 * q + b] + bu);
      sm.h[h_offset(n, jj)] = __bfloat16_as_ushort(__float2bfloat16_rn(h));  // RNE as fmt::bf16_from_f32 (a NaN stays a NaN)
    }
    ptx::mbar_arrive(&sm.h_full);  // release: the helpers' wait sees these stores
    ++u;
  } else {  // relu2, the one activation without a gate
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      ptx::mbar_wait(&sm.h_empty, (u & 1) ^ 1, wd, dynamic::kWaitStagingFree, static_cast<int>(u));
      if (c == half)
        for_each_acc<kAccN>(ti, c, t, p.w_rows, be, [&](int i, int jj, bool ok, float bias, int n) {
          const float x = alpha * acc[i] + bias;
          const float h = apply_activation<float>(Activation::kRelu2, x, 0.0f, p.sw_alpha, p.sw_beta, p.sw_limit);
          sm.h[h_offset(n, jj)] = ok ? __bfloat16_as_ushort(__float2bfloat16_rn(h)) : uint16_t{0};
        });
      ptx::mbar_arrive(&sm.h_full);
      ++u;
    }
  }
}

// The FC2 epilogue straight from the accumulators: Y[row0 + n][y·BN + v] = rw[n] · (alpha · acc + bias)
// for routed rows n < valid and columns < H, the same operations as dynamic::finish_tile then
// fc2_store_rows. Each warp store writes 8 consecutive floats (one 32-byte sector) of 4 rows. No
// staging: that let the ring have 4 stages. The router weights were stored to sm.rw by thread n
// (router_weight) before the first barrier; the second keeps the next tile's stores off them.
template <int kAccN>
__device__ __forceinline__ void fc2_finish(const MoeGemmParams& p, const TileInfo& ti, const float (&acc)[kAccN],
                                           const Smem& sm, int c, int t) {
  ptx::named_barrier_sync(1, kConsumers * kWarpgroup);
  const float alpha = p.alpha[ti.e];
  const float* be = p.bias ? p.bias + static_cast<int64_t>(ti.e) * p.w_rows : nullptr;
  const int col0 = ti.y * BN + 64 * c;
  for_each_acc<kAccN>(ti, c, t, p.hidden, be, [&](int i, int jj, bool ok, float bias, int n) {
    if (ok && n < ti.valid)
      p.y[static_cast<int64_t>(ti.row0 + n) * p.hidden + col0 + jj] = sm.rw[n] * (alpha * acc[i] + bias);
  });
  ptx::named_barrier_sync(1, kConsumers * kWarpgroup);
}

// The helpers: warps 1..3 of the producer warpgroup (warp 0's first thread issues the copies). For
// each staging unit of this CTA's FC1 tiles (fc1_finish), in the consumers' order, once it is
// staged: the routed rows' 64 columns of h in quantisation blocks → Q2 → A2
// (quant_dequant_bf16_run), one block per task, consecutive threads on consecutive rows of one block
// (h_offset's swizzle: conflict-free 16-byte reads; at most 8 values live, for the warpgroup's small
// register budget); then the staging is handed back. The consumers meanwhile run the next MMAs.
inline constexpr int kHelpers = kWarpgroup - 32;
__device__ __forceinline__ void fc1_requantise_tiles(const MoeGemmParams& p, Smem& sm, int n_tiles, int tile_begin,
                                                     int tiles, const ptx::Watchdog& wd) {
  const int tid = threadIdx.x - 32;
  const int work = tiles * n_tiles;
  const int qb = quant_block(p.q2), nb = kHCols / qb;
  const int units = p.gated ? 1 : 2;
  uint32_t u = 0;
  for (int w = blockIdx.x; w < work; w += gridDim.x) {
    const TileInfo ti = band_item(p, w, n_tiles, tile_begin, tiles);
    for (int half = 0; half < units; ++half, ++u) {
      ptx::mbar_wait(&sm.h_full, u & 1, wd, dynamic::kWaitStaged, static_cast<int>(u));
      const int i0 = ti.y * (units * kHCols) + half * kHCols;
      // Blocks past i_pad (the last n-tile of a non-gated FC1 whose I is not a multiple of 128).
      const int blocks = min(nb, (p.i_pad - i0) / qb);
      for (int task = tid; task < ti.valid * blocks; task += kHelpers) {
        const int r = task % ti.valid, b = task / ti.valid;
        __nv_bfloat16* dst = p.a2 + static_cast<int64_t>(ti.row0 + r) * p.i_pad + i0 + b * qb;
        const uint16_t* row = sm.h + r * kHCols;
        if (qb == 16) quant_dequant_bf16_run<16>(p.q2, row, 16 * b, r & 7, p.q2_scale[ti.e], dst);
        else quant_dequant_bf16_run<32>(p.q2, row, 32 * b, r & 7, p.q2_scale[ti.e], dst);
      }
      ptx::mbar_arrive(&sm.h_empty);
    }
  }
}

// Consumer warpgroup c: weight rows [64c, 64c + 64) of the stage's weight tile × its BM = 256
// activation rows, 4 × wgmma m64n256k16 per stage with both operands in shared memory (the sw128
// descriptor's 8-row groups are 1024 bytes apart for any row count, so the 256-row B operand is
// operand_desc_sw128 of row 0 as the 128-row one was).
template <bool kFc1>
__device__ __forceinline__ void consume(const MoeGemmParams& p, Smem& sm, int n_tiles, int tile_begin, int tiles,
                                        const ptx::Watchdog& wd) {
  const int c = threadIdx.x / kWarpgroup - 1;
  const int t = threadIdx.x % kWarpgroup;
  const int ct = threadIdx.x - kWarpgroup;
  const int ktiles = p.k_pad / BK, work = tiles * n_tiles;
  const uint32_t a_base = ptx::smem_addr(sm.a[0]), w_base = ptx::smem_addr(sm.w[0]);
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;  // never read: each tile's first wgmma has scale-d = 0
  uint32_t it = 0, u = 0;
  for (int w = blockIdx.x; w < work; w += gridDim.x) {
    const TileInfo ti = band_item(p, w, n_tiles, tile_begin, tiles);
    const float rw = kFc1 ? 0.0f : dynamic::router_weight(p, ti, ct);
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
      const int s = it % kStages;
      ptx::mbar_wait(&sm.full[s], (it / kStages) & 1, wd, dynamic::kWaitFull, it);
      ptx::fence_operand(acc);
      ptx::wgmma_fence();
      const uint32_t a_tile = a_base + s * wgmma::tile_bytes(BM), w_tile = w_base + s * kWTileBytes;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        ptx::mma_m64n256k16_bf16(acc, wgmma::operand_desc_sw128(w_tile, 64 * c, ks),
                                 wgmma::operand_desc_sw128(a_tile, 0, ks), (kt | ks) != 0);
      ptx::wgmma_commit();
      ptx::fence_operand(acc);
      ptx::wgmma_wait<1>();  // stage it - 1's group is done: its tiles are free
      ptx::fence_operand(acc);
      if (kt > 0) ptx::mbar_arrive(&sm.empty[(it - 1) % kStages]);
    }
    ptx::wgmma_wait<0>();
    ptx::fence_operand(acc);
    ptx::mbar_arrive(&sm.empty[(it - 1) % kStages]);
    if constexpr (kFc1) {
      fc1_finish(p, ti, acc, sm, c, t, u, wd);
    } else {
      sm.rw[ct] = rw;  // read after fc2_finish's first barrier
      fc2_finish(p, ti, acc, sm, c, t);
    }
  }
}

// n_tiles as dynamic's; the group (expert_base, expert_count, w_bf16) in p; a_map: p.a's rows as a
// 2-D tensor (k_pad × a_rows bf16) with boxes of 64 k × BM rows and the 128B swizzle
// (launch_dynamic_bf16.cu); watchdog as dynamic's.
template <bool kFc1>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_kernel(MoeGemmParams p, const __grid_constant__ CUtensorMap a_map, int n_tiles, int* watchdog) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  Smem& sm = dynamic::aligned_smem<Smem>(smem_raw);
  if (threadIdx.x == 0) {
    ptx::mbar_init(&sm.h_full, kConsumers * kWarpgroup);
    ptx::mbar_init(&sm.h_empty, kHelpers);
    dynamic::init_pipeline<kStages>(sm.full, sm.empty, &sm.aborted);
  }
  __syncthreads();
  const ptx::Watchdog wd{&sm.aborted, watchdog};
  const int tile_begin = p.expert_tile_offset[p.expert_base];
  const int tiles = p.expert_tile_offset[p.expert_base + p.expert_count] - tile_begin;
  // The producer thread only computes addresses and the helper warps requantise; the consumers hold
  // 128 accumulators (and little else):
  // 128·48 + 256·224 = 63488 ≤ 65536 (48: the helper warps' requantisation, without spills).
  if (threadIdx.x < kWarpgroup) {
    ptx::setmaxnreg_dec<48>();
    if (threadIdx.x == 0) produce<kFc1>(p, a_map, sm, n_tiles, tile_begin, tiles, wd);
    else if (kFc1 && threadIdx.x >= 32) fc1_requantise_tiles(p, sm, n_tiles, tile_begin, tiles, wd);
  } else {
    ptx::setmaxnreg_inc<224>();
    consume<kFc1>(p, sm, n_tiles, tile_begin, tiles, wd);
  }
}

}  // namespace fp4moe::kernels::dynamic_bf16
