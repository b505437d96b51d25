// The dynamic (prefill) backend's grouped GEMM on Hopper warpgroup MMA (wgmma). Everything around it
// is the generic path's (routing pre-pass, gather-quantise, combine: generic.cuh, routing.cuh) and
// so are both epilogues (common/moe_gemm.cuh); what changes is the GEMM core:
//
//   CTA = 3 warpgroups (384 threads), persistent over the work list (m-tile × n-tile), one pipeline
//   step per (work item, 64-wide k-tile):
//     warpgroup 0      producer, three streams running at different distances ahead:
//                        raw weights  step it + kRawStages - 1: warp 0 issues bulk copies (TMA
//                                     engine, common/bulk_copy.cuh) of the step's 8 fragment-order
//                                     tiles (16 weight rows × 64 k: 512 B codes + 64/32 B scales,
//                                     device_weights.h) into a raw ring, tracked by mbarrier
//                                     transaction counts;
//                        A tile       step it + kAhead: cp.async of BM routed rows × 64 k (rows past
//                                     the expert zero-filled), one commit group per step;
//                        dequantise   step it: raw ring → exact bf16 in the wgmma K-major layout
//                                     (NVFP4: table-free bit trick, dequant_bits.h; MXFP4: byte table),
//                                     then wait for step it's A group, fence, signal "full".
//     warpgroups 1, 2  consumers: rows [0, 64) and [64, 128) of the m-tile; per stage 4 ×
//                      wgmma m64n128k16 (bf16 × bf16 → fp32), then the FC1 or FC2 epilogue of
//                      their 64 rows (staged in shared memory, per-warpgroup named barriers).
//   Rings: kStages (A, B) bf16 buffers with mbarriers "full" (128 producer arrivals) and "empty" (256
//   consumer arrivals); kRawStages raw weight buffers with "raw_full" (warp 0's expect_tx arrival +
//   the copies' bytes) and "raw_empty" (128 producer arrivals). No __syncthreads after the prologue.
//   Why the streams: v1 loaded a stage's weights into registers one step ahead, so every step paid
//   about one global-memory latency (~1 µs) against ~0.35 µs of MMAs. Now weight bytes are in flight
//   kRawStages - 1 steps ahead without costing registers, and A (mostly L2 hits: every n-tile of an
//   m-tile rereads it) kAhead steps ahead.
//
// Products are exact (bf16 holds E2M1 × E4M3/UE8M0 and every activation value the quantisers
// produce, including e4m3 × UE8M0 of a8), accumulation is fp32: results equal generic's up to
// summation order. NVFP4 weights enter the MMAs as code × scale × 2^-7 (dequant_bits.h); the epilogue's
// alpha carries the 2^7.
//
// Tile list: the routing pre-pass run with tile_m = BM gives the (expert, row0) m-tiles; work item
// w = m-tile · n_tiles + n-tile, CTA b takes w = b, b + grid, … (the count is read on the device, so
// the launch is graph-safe). Every item has k_pad / 64 steps, so step it of a CTA is item
// b + (it / ktiles) · grid, k-tile it % ktiles: the three producer streams walk the same sequence.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/dequant.cuh"
#include "kernels/common/dequant_bits.h"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/moe_gemm.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/common/wgmma_layout.h"

namespace fp4moe::kernels::dynamic {

inline constexpr int BM = 128;              // routed rows per m-tile: 2 consumer warpgroups × 64
inline constexpr int BN = 128;              // weight rows per n-tile: the wgmma N
inline constexpr int BK = wgmma::kTileK;    // 64 k per pipeline stage: 4 wgmma k16 steps
inline constexpr int kStages = 4;           // (A, B) bf16 stages, what the tensor cores read
inline constexpr int kRawStages = 6;        // raw weight stages (4.5 KB each): bulk copies run 5 steps ahead
inline constexpr int kAhead = 2;            // A copies run this many steps ahead of the dequantisation
inline constexpr int kConsumers = 2;
inline constexpr int kWarpgroup = 128;
inline constexpr int kThreads = kWarpgroup * (1 + kConsumers);
inline constexpr int kLdc = BN + 8;         // staging row stride in floats: a half-warp's float2 stores hit distinct banks
inline constexpr int kRowTiles = BN / 16;   // fragment-order weight tiles (16 rows × 64 k) per stage
inline constexpr int kTileCodeBytes = 512;
inline constexpr int kTileScaleBytesMax = 16 * BK / 16;  // NVFP4: 16 rows × 4 E4M3 bytes (MXFP4: 16 × 2)
static_assert(BM == 64 * kConsumers, "one m64 wgmma row block per consumer warpgroup");
static_assert(kRowTiles == 2 * (kWarpgroup / 32), "each producer warp dequantises two fragment tiles per stage");
static_assert(2 * kRowTiles <= 32, "one lane of warp 0 per bulk copy (codes and scales of each tile)");
// The producer waits "empty" for step it + kAhead before it signals step it "full"; consumers free a
// stage one step late (after issuing the next one's MMAs), so kAhead + 2 <= kStages avoids a deadlock.
static_assert(kAhead >= 1 && kAhead + 2 <= kStages, "A copies must stay inside the ring");
static_assert(kRawStages >= 2, "the raw ring refills the slot the previous step freed");

enum : int { kWaitEmpty = 1, kWaitFull = 2, kWaitRawEmpty = 3, kWaitRawFull = 4 };  // watchdog report: which barrier

// One raw weight stage: 8 fragment tiles as bulk-copied. codes[q][l] = lane l's 16 bytes of tile q
// (four words, one per k16 step; dequant_bits.h has the byte order); scales[q] = [16 rows][64 / block].
struct RawStage {
  uint4 codes[kRowTiles][32];
  uint8_t scales[kRowTiles][kTileScaleBytesMax];
};
static_assert(sizeof(uint4) * 32 == kTileCodeBytes && kTileScaleBytesMax % 16 == 0, "bulk copies need 16-byte ends");

struct Smem {
  __nv_bfloat16 a[kStages][BM * BK];   // sA: (BM, BK) per stage, K-major, no swizzle (wgmma_layout.h)
  __nv_bfloat16 b[kStages][BN * BK];   // sB: (BN, BK) per stage, dequantised weights, same layout
  float c[kConsumers][64 * kLdc];      // epilogue staging: alpha·acc + bias, one per consumer warpgroup
  RawStage raw[kRawStages];            // bulk-copy targets (16-byte aligned: every member above is)
  E2m1x2Table lut;                     // MXFP4 only: byte → two plain codes as bf16x2
  uint32_t scale_x2[256];              // scale byte → bf16x2 multiplier (NVFP4: × 2^119, dequant_bits.h)
  uint64_t full[kStages];              // producer → consumers: stage written (and fenced for the async proxy)
  uint64_t empty[kStages];             // consumers → producer: stage read by the tensor cores
  uint64_t raw_full[kRawStages];       // bulk copies → producer: raw stage landed
  uint64_t raw_empty[kRawStages];      // producer → warp 0: raw stage read
  int aborted;                         // watchdog (mbarrier.cuh)
};

struct TileInfo {
  int y, e, row0, valid;
};
__device__ __forceinline__ TileInfo tile_info(const MoeGemmParams& p, int w, int n_tiles) {
  const int tile = w / n_tiles;
  TileInfo ti;
  ti.y = w % n_tiles;
  ti.e = p.tile_expert[tile];
  ti.row0 = p.tile_row0[tile];
  ti.valid = min(BM, p.expert_offset[ti.e + 1] - ti.row0);
  return ti;
}

// A position in this CTA's step sequence: work item w, k-tile kt (see the file comment).
struct Cursor {
  int w, kt;
  TileInfo ti;
};
__device__ __forceinline__ Cursor cursor_start(const MoeGemmParams& p, int n_tiles) {
  return {static_cast<int>(blockIdx.x), 0, tile_info(p, blockIdx.x, n_tiles)};  // the launch has grid <= work
}
__device__ __forceinline__ void advance(Cursor& c, const MoeGemmParams& p, int n_tiles, int ktiles, int work) {
  if (++c.kt < ktiles) return;
  c.kt = 0;
  c.w += gridDim.x;
  if (c.w < work) c.ti = tile_info(p, c.w, n_tiles);
}

// Warp 0: bulk copies of one step's weight tiles into raw stage `st`, completing on `bar`. Lane q
// (q < 8) copies tile q's codes, lane 8 + q its scales; tile q = virtual rows [16q, 16q + 16) of
// n-tile ti.y (weight_row: for a gated FC1, tiles 0–3 are up rows and 4–7 gate rows). Tiles past
// w_rows (last n-tile of FC2 or a non-gated FC1) are not copied: dequant_stage writes zeros there.
template <bool kFc1>
__device__ __forceinline__ void load_raw(const MoeGemmParams& p, RawStage& st, uint64_t* bar, const TileInfo& ti,
                                         int kt, int lane) {
  const int q = lane % kRowTiles;
  const int row = weight_row<BN>(p, kFc1, ti.y, 16 * q);  // w_rows % 16 == 0: a tile is all valid or all not
  const bool ok = row < p.w_rows;
  const uint32_t valid_tiles = __ballot_sync(0xFFFFFFFFu, ok && lane < kRowTiles);
  const uint32_t scale_bytes = 16 * BK / p.block;
  if (lane == 0) ptx::mbar_arrive_expect_tx(bar, __popc(valid_tiles) * (kTileCodeBytes + scale_bytes));
  __syncwarp();  // the expected bytes are announced before any copy can complete
  if (ok && lane < 2 * kRowTiles) {
    const int64_t tile = (static_cast<int64_t>(ti.e) * (p.w_rows / 16) + row / 16) * (p.k_pad / BK) + kt;
    if (lane < kRowTiles) ptx::bulk_copy_g2s(st.codes[q], p.w_frag + tile * kTileCodeBytes, kTileCodeBytes, bar);
    else ptx::bulk_copy_g2s(st.scales[q], p.w_frag_scales + tile * scale_bytes, scale_bytes, bar);
  }
}

// cp.async of the stage's A tile: rows row0 + m (m < valid; the rest zero-filled), k = kt·64 ...
// The caller commits (one group per step).
__device__ __forceinline__ void copy_a(const MoeGemmParams& p, __nv_bfloat16* tile, int row0, int valid, int kt, int t) {
  unsigned char* base = reinterpret_cast<unsigned char*>(tile);
#pragma unroll
  for (int i = 0; i < BM * (BK / 8) / kWarpgroup; ++i) {
    const wgmma::ChunkCoord cc = wgmma::a_copy_chunk(BM, t, i);
    const bool ok = cc.m < valid;
    const __nv_bfloat16* src = p.a + static_cast<int64_t>(row0 + (ok ? cc.m : 0)) * p.k_pad + kt * BK + cc.kc * 8;
    ptx::cp_async_16(base + wgmma::kmajor_offset(BM, cc.m, 8 * cc.kc), src, ok ? 16 : 0);
  }
}

// Producer thread t (warp w, lane l = 4g + c) dequantises fragment tiles q = 2w, 2w + 1 of raw stage
// `st` into the B tile: word kk of lane l's 16 bytes holds rows 16q + g, 16q + g + 8 at k = 16kk + 2c
// (+1, +8, +9). Each bf16x2 lands where wgmma::fragment_pair says; a warp's store of one (kk, byte)
// fills one 128-byte core matrix, so the stores are free of bank conflicts (tests/cpu/test_wgmma_layout).
template <bool kFc1, bool kNvfp4>
__device__ __forceinline__ void dequant_stage(const MoeGemmParams& p, const Smem& sm, const RawStage& st,
                                              __nv_bfloat16* tile, int y, int t) {
  const int warp = t >> 5, lane = t & 31, g = lane >> 2;
  unsigned char* base = reinterpret_cast<unsigned char*>(tile);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int q = 2 * warp + h;
    const bool ok = weight_row_valid<BN>(p, kFc1, y, 16 * q);  // warp-uniform
    uint4 v = make_uint4(0, 0, 0, 0);
    uint32_t sc_g = 0, sc_g8 = 0;  // this lane's two rows' scale bytes, one per k group
    if (ok) {
      v = st.codes[q][lane];
      if constexpr (kNvfp4) {
        sc_g = *reinterpret_cast<const uint32_t*>(&st.scales[q][4 * g]);
        sc_g8 = *reinterpret_cast<const uint32_t*>(&st.scales[q][4 * (g + 8)]);
      } else {
        sc_g = *reinterpret_cast<const uint16_t*>(&st.scales[q][2 * g]);
        sc_g8 = *reinterpret_cast<const uint16_t*>(&st.scales[q][2 * (g + 8)]);
      }
    }
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t out[4] = {0, 0, 0, 0};
      if (ok) {
        const int shift = kNvfp4 ? 8 * kk : 8 * (kk >> 1);  // block 16: group kk; block 32: kk / 2
        const uint32_t s_g = sm.scale_x2[(sc_g >> shift) & 0xFF], s_g8 = sm.scale_x2[(sc_g8 >> shift) & 0xFF];
        if constexpr (kNvfp4) dequant_word_nvfp4(words[kk], s_g, s_g8, out);
        else dequant_word_table(sm.lut, words[kk], s_g, s_g8, out);
      }
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const wgmma::PairCoord pc = wgmma::fragment_pair(q, lane, kk, b);
        *reinterpret_cast<uint32_t*>(base + wgmma::kmajor_offset(BN, pc.row, pc.k)) = out[b];
      }
    }
  }
}

// Producer warpgroup: the three streams of the file comment, in one loop over this CTA's steps.
template <bool kFc1>
__device__ __forceinline__ void produce(const MoeGemmParams& p, Smem& sm, int n_tiles, int work,
                                        const ptx::Watchdog& wd) {
  const int t = threadIdx.x;  // 0..127
  const int lane = t & 31;
  const bool loader = t < 32;  // warp 0 also feeds the raw ring
  const int ktiles = p.k_pad / BK;
  const int grid = static_cast<int>(gridDim.x), items = (work - static_cast<int>(blockIdx.x) + grid - 1) / grid;
  const uint32_t steps = static_cast<uint32_t>(items) * static_cast<uint32_t>(ktiles);
  Cursor raw = cursor_start(p, n_tiles), a = raw, d = raw;

  if (loader)
    for (uint32_t j = 0; j < kRawStages - 1 && j < steps; ++j, advance(raw, p, n_tiles, ktiles, work))
      load_raw<kFc1>(p, sm.raw[j], &sm.raw_full[j], raw.ti, raw.kt, lane);
  for (uint32_t j = 0; j < kAhead; ++j) {  // stages 0 .. kAhead - 1 are free: no empty wait
    if (j < steps) {
      copy_a(p, sm.a[j], a.ti.row0, a.ti.valid, a.kt, t);
      advance(a, p, n_tiles, ktiles, work);
    }
    ptx::cp_async_commit();
  }

  for (uint32_t it = 0; it < steps; ++it) {
    // Raw weights of step it + kRawStages - 1, into the slot that step it - 1 has just released.
    const uint32_t jr = it + kRawStages - 1;
    if (loader && jr < steps) {
      ptx::mbar_wait(&sm.raw_empty[jr % kRawStages], ((jr / kRawStages) & 1) ^ 1, wd, kWaitRawEmpty, jr);
      load_raw<kFc1>(p, sm.raw[jr % kRawStages], &sm.raw_full[jr % kRawStages], raw.ti, raw.kt, lane);
      advance(raw, p, n_tiles, ktiles, work);
    }
    // A of step it + kAhead. Its stage is also where step it + kAhead's B goes: the wait covers both.
    const uint32_t ja = it + kAhead;
    if (ja < steps) {
      ptx::mbar_wait(&sm.empty[ja % kStages], ((ja / kStages) & 1) ^ 1, wd, kWaitEmpty, ja);
      copy_a(p, sm.a[ja % kStages], a.ti.row0, a.ti.valid, a.kt, t);
      advance(a, p, n_tiles, ktiles, work);
    }
    ptx::cp_async_commit();  // one group per step (empty past the end), so wait<kAhead> below means "step it"

    // Dequantise step it.
    const int s = it % kStages, r = it % kRawStages;
    ptx::mbar_wait(&sm.raw_full[r], (it / kRawStages) & 1, wd, kWaitRawFull, it);
    if (p.nvfp4) dequant_stage<kFc1, true>(p, sm, sm.raw[r], sm.b[s], d.ti.y, t);
    else dequant_stage<kFc1, false>(p, sm, sm.raw[r], sm.b[s], d.ti.y, t);
    ptx::mbar_arrive(&sm.raw_empty[r]);
    advance(d, p, n_tiles, ktiles, work);
    ptx::cp_async_wait<kAhead>();   // this thread's A copies of step it have landed
    ptx::fence_proxy_async_smem();  // its generic-proxy writes (cp.async, st.shared) → visible to wgmma
    ptx::mbar_arrive(&sm.full[s]);
  }
}

// Consumer warpgroup c (0 or 1): tile rows [64c, 64c + 64). A warpgroup without valid rows in the
// m-tile skips its MMAs and epilogue but still takes part in every stage's full/empty handshake.
template <bool kFc1>
__device__ __forceinline__ void consume(const MoeGemmParams& p, Smem& sm, int n_tiles, int work,
                                        const ptx::Watchdog& wd) {
  const int c = threadIdx.x / kWarpgroup - 1;
  const int t = threadIdx.x % kWarpgroup;
  const int ktiles = p.k_pad / BK;
  const uint32_t a_base = ptx::smem_addr(sm.a[0]), b_base = ptx::smem_addr(sm.b[0]);
  float* stage_c = sm.c[c];
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;  // never read: each tile's first wgmma has scale-d = 0
  uint32_t it = 0;
  for (int w = blockIdx.x; w < work; w += gridDim.x) {
    const TileInfo ti = tile_info(p, w, n_tiles);
    const bool active = 64 * c < ti.valid;  // uniform over the warpgroup
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
      const int s = it % kStages;
      ptx::mbar_wait(&sm.full[s], (it / kStages) & 1, wd, kWaitFull, it);
      if (active) {
        ptx::fence_proxy_async_smem();  // the writers fenced; this one is belt and braces
        ptx::fence_operand(acc);
        ptx::wgmma_fence();
        const uint32_t a_tile = a_base + s * wgmma::tile_bytes(BM), b_tile = b_base + s * wgmma::tile_bytes(BN);
#pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks)
          ptx::mma_m64n128k16_bf16(acc, wgmma::operand_desc(a_tile, BM, 64 * c, ks),
                                   wgmma::operand_desc(b_tile, BN, 0, ks), (kt | ks) != 0);
        ptx::wgmma_commit();
        ptx::fence_operand(acc);
      }
      ptx::wgmma_wait<1>();  // the previous stage's MMAs are done: release it
      if (kt > 0) ptx::mbar_arrive(&sm.empty[(it - 1) % kStages]);
    }
    ptx::wgmma_wait<0>();
    ptx::fence_operand(acc);
    ptx::mbar_arrive(&sm.empty[(it - 1) % kStages]);
    if (!active) continue;

    // Stage alpha·acc + bias (accumulator fragment: wgmma_layout.h acc_row / acc_col).
    const float alpha = p.nvfp4 ? p.alpha[ti.e] * fmt::pow2f(kNvfp4UnscaleLog2) : p.alpha[ti.e];  // dequant_bits.h
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int col = wgmma::acc_col(t, 4 * j);
      float b0 = 0.0f, b1 = 0.0f;
      if (p.bias) {
        const float* be = p.bias + static_cast<int64_t>(ti.e) * p.w_rows;
        if (weight_row_valid<BN>(p, kFc1, ti.y, col)) b0 = be[weight_row<BN>(p, kFc1, ti.y, col)];
        if (weight_row_valid<BN>(p, kFc1, ti.y, col + 1)) b1 = be[weight_row<BN>(p, kFc1, ti.y, col + 1)];
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 4 * j + 2 * h;
        *reinterpret_cast<float2*>(stage_c + wgmma::acc_row(t, i) * kLdc + col) =
            make_float2(alpha * acc[i] + b0, alpha * acc[i + 1] + b1);
      }
    }
    ptx::named_barrier_sync(1 + c, kWarpgroup);
    const int rows = min(64, ti.valid - 64 * c);
    if constexpr (kFc1) fc1_store_rows<BN>(p, stage_c, kLdc, rows, ti.row0 + 64 * c, ti.e, ti.y, t, kWarpgroup);
    else fc2_store_rows<BN>(p, stage_c, kLdc, rows, ti.row0 + 64 * c, ti.y, t, kWarpgroup);
    ptx::named_barrier_sync(1 + c, kWarpgroup);  // staging is reused by the next tile
  }
}

// n_tiles: weight n-tiles per m-tile (FC1 gated: i_pad / 64; otherwise ceil(w_rows / 128)).
// watchdog: optional global int[ptx::kWatchdogReportInts], zeroed, that a timed-out pipeline wait
// fills (tests); null in production.
template <bool kFc1>
__global__ void __launch_bounds__(kThreads, 1) gemm_kernel(MoeGemmParams p, int n_tiles, int* watchdog) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&sm.full[s], kWarpgroup);
      ptx::mbar_init(&sm.empty[s], kWarpgroup * kConsumers);
    }
    for (int s = 0; s < kRawStages; ++s) {
      ptx::mbar_init(&sm.raw_full[s], 1);  // warp 0's arrive.expect_tx; the bytes complete the phase
      ptx::mbar_init(&sm.raw_empty[s], kWarpgroup);
    }
    sm.aborted = 0;
    ptx::fence_mbarrier_init();  // the initialised barriers → visible to the bulk copies' complete_tx
  }
  if (!p.nvfp4) fill_e2m1x2_table(sm.lut);
  for (int b = threadIdx.x; b < 256; b += blockDim.x)
    sm.scale_x2[b] = p.nvfp4 ? e4m3_prescaled_bf16x2(static_cast<uint8_t>(b)) : ue8m0_bf16x2(static_cast<uint8_t>(b));
  __syncthreads();
  const ptx::Watchdog wd{&sm.aborted, watchdog};
  const int work = *p.num_tiles * n_tiles;
  if (threadIdx.x < kWarpgroup) produce<kFc1>(p, sm, n_tiles, work, wd);
  else consume<kFc1>(p, sm, n_tiles, work, wd);
}

}  // namespace fp4moe::kernels::dynamic
