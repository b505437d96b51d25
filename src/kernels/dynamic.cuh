// The dynamic (prefill) backend's grouped GEMM on Hopper warpgroup MMA (wgmma). Everything around it
// is the generic path's (routing pre-pass, gather-quantise, combine: generic.cuh, routing.cuh) and
// so are both epilogues (common/moe_gemm.cuh); what changes is the GEMM core:
//
//   CTA = 4 warpgroups (512 threads), persistent over the work list (m-tile × n-tile):
//     warpgroups 0, 1  producers: per pipeline stage, cp.async of the A tile (BM routed rows × 64 k
//                      of A1/A2, bf16, rows past the expert zero-filled; half of its chunks each)
//                      and the weight tile (BN rows × 64 k; producer warpgroup h takes k
//                      [32h, 32h + 32) of every row: FP4 codes + block scales read into registers
//                      two stages ahead, dequantised exactly to bf16 through the byte → bf16x2
//                      table, stored with st.shared); both in the wgmma K-major no-swizzle layout
//                      (common/wgmma_layout.h).
//     warpgroups 2, 3  consumers: rows [0, 64) and [64, 128) of the m-tile; per stage 4 ×
//                      wgmma m64n128k16 (bf16 × bf16 → fp32), then the FC1 or FC2 epilogue of
//                      their 64 rows (staged in shared memory, per-warpgroup named barriers).
//   Stages: a ring of kStages (A, B) buffers with mbarriers "full" (256 producer arrivals) and
//   "empty" (256 consumer arrivals); no __syncthreads after the prologue.
//   Two producer warpgroups, not one: with one, the consumers waited on "full" about two thirds of
//   the time (Nsight Compute pc sampling, mixtral-8x7b T = 16384: 37–43 % of all warp samples on the
//   consumers' full-barrier wait; the producer's own samples spread over its table lookups and the
//   wait for its weight loads). Halving each producer thread's per-stage work is the direct remedy.
//
// Products are exact (bf16 holds E2M1 × E4M3/UE8M0 and every activation value the quantisers
// produce, including e4m3 × UE8M0 of a8), accumulation is fp32: results equal generic's up to
// summation order.
//
// Tile list: the routing pre-pass run with tile_m = BM gives the (expert, row0) m-tiles; work item
// w = m-tile · n_tiles + n-tile, CTA b takes w = b, b + grid, … (the count is read on the device, so
// the launch is graph-safe).
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "kernels/common/dequant.cuh"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/moe_gemm.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/common/wgmma_layout.h"

namespace fp4moe::kernels::dynamic {

inline constexpr int BM = 128;              // routed rows per m-tile: 2 consumer warpgroups × 64
inline constexpr int BN = 128;              // weight rows per n-tile: the wgmma N
inline constexpr int BK = wgmma::kTileK;    // 64 k per pipeline stage: 4 wgmma k16 steps
inline constexpr int kStages = 4;
inline constexpr int kProducers = 2;
inline constexpr int kConsumers = 2;
inline constexpr int kWarpgroup = 128;
inline constexpr int kThreads = kWarpgroup * (kProducers + kConsumers);
inline constexpr int kProducerRegs = 96, kConsumerRegs = 160;
static_assert(kWarpgroup * (kProducers * kProducerRegs + kConsumers * kConsumerRegs) <= 65536,
              "register reallocation within the SM's register file");
inline constexpr int kLdc = BN + 8;         // staging row stride in floats: a half-warp's float2 stores hit distinct banks
static_assert(BM == 64 * kConsumers, "one m64 wgmma row block per consumer warpgroup");
static_assert(BN == kWarpgroup, "a producer warpgroup dequantises one weight row per thread");
static_assert(kProducers == 2, "producer warpgroup h dequantises k [32h, 32h + 32) of each stage");
static_assert(kStages >= 3, "the producer signals stage s one step late (after starting s + 1)");

enum : int { kWaitEmpty = 1, kWaitFull = 2 };  // watchdog report: which barrier a thread gave up on

struct Smem {
  __nv_bfloat16 a[kStages][BM * BK];   // sA: (BM, BK) per stage, K-major, no swizzle (wgmma_layout.h)
  __nv_bfloat16 b[kStages][BN * BK];   // sB: (BN, BK) per stage, dequantised weights, same layout
  float c[kConsumers][64 * kLdc];      // epilogue staging: alpha·acc + bias, one per consumer warpgroup
  E2m1x2Table lut;
  uint64_t full[kStages];              // producers → consumers: stage written (and fenced for the async proxy)
  uint64_t empty[kStages];             // consumers → producer: stage read by the tensor cores
  int aborted;                         // watchdog (mbarrier.cuh)
};

// One producer thread's slice of one weight row for one stage: the 32 codes (16 bytes) of k
// [32h, 32h + 32) and their block scales (2 E4M3 bytes for NVFP4, 1 UE8M0 byte for MXFP4),
// little-endian in `scales`.
struct WeightSlice {
  uint4 c;
  uint32_t scales;
};

__device__ __forceinline__ WeightSlice load_slice(const uint8_t* codes, const uint8_t* scales, int kt, int h,
                                                  bool nvfp4) {
  WeightSlice s;
  s.c = __ldg(reinterpret_cast<const uint4*>(codes + kt * (BK / 2) + 16 * h));
  s.scales = nvfp4 ? static_cast<uint32_t>(__ldg(reinterpret_cast<const uint16_t*>(scales + kt * (BK / 16) + 2 * h)))
                   : static_cast<uint32_t>(__ldg(scales + kt * (BK / 32) + h));
  return s;
}

// Dequantise this thread's half of its weight row (tile row t, k [32h, 32h + 32)) into the stage's B
// tile: 2 groups of 16 k, each two 16-byte chunks (a warp stores 32 consecutive rows of one chunk:
// 512 contiguous bytes). Rows past the weight matrix (last n-tile of a non-gated FC1 or of FC2) are
// zeros.
__device__ __forceinline__ void write_b(const E2m1x2Table& lut, __nv_bfloat16* tile, const WeightSlice& s, bool row_ok,
                                        bool nvfp4, int t, int h) {
  unsigned char* base = reinterpret_cast<unsigned char*>(tile);
  const uint32_t words[4] = {s.c.x, s.c.y, s.c.z, s.c.w};
#pragma unroll
  for (int gl = 0; gl < 2; ++gl) {
    const int g = 2 * h + gl;  // 16-k group within the stage
    uint4 deq[2];
    if (row_ok) {
      const int sb = nvfp4 ? (s.scales >> (8 * gl)) & 0xFF : s.scales & 0xFF;
      dequant16(lut, make_uint2(words[2 * gl], words[2 * gl + 1]), scale_bf16x2(static_cast<uint8_t>(sb), nvfp4), deq);
    } else {
      deq[0] = deq[1] = make_uint4(0, 0, 0, 0);
    }
    *reinterpret_cast<uint4*>(base + wgmma::kmajor_offset(BN, t, 16 * g)) = deq[0];
    *reinterpret_cast<uint4*>(base + wgmma::kmajor_offset(BN, t, 16 * g + 8)) = deq[1];
  }
}

// cp.async of producer warpgroup h's half of the stage's A tile: rows row0 + m (m < valid; the rest
// zero-filled), k = kt·64 ... One commit group per stage.
__device__ __forceinline__ void copy_a(const MoeGemmParams& p, __nv_bfloat16* tile, int row0, int valid, int kt, int t,
                                       int h) {
  unsigned char* base = reinterpret_cast<unsigned char*>(tile);
  constexpr int kPer = BM * (BK / 8) / (kWarpgroup * kProducers);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const wgmma::ChunkCoord cc = wgmma::a_copy_chunk(BM, t, kPer * h + i);
    const bool ok = cc.m < valid;
    const __nv_bfloat16* src = p.a + static_cast<int64_t>(row0 + (ok ? cc.m : 0)) * p.k_pad + kt * BK + cc.kc * 8;
    ptx::cp_async_16(base + wgmma::kmajor_offset(BM, cc.m, 8 * cc.kc), src, ok ? 16 : 0);
  }
  ptx::cp_async_commit();
}

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

// Producer warpgroup h (0 or 1): half of every stage (see the file comment). Stage `it` is signalled
// "full" one step late, after the A copies of stage it + 1 are issued, so a stage's A copies overlap
// the next stage's dequantisation; the weight slices are loaded two stages ahead.
template <bool kFc1>
__device__ __forceinline__ void produce(const MoeGemmParams& p, Smem& sm, int n_tiles, int work,
                                        const ptx::Watchdog& wd) {
  const int t = threadIdx.x % kWarpgroup, h = threadIdx.x / kWarpgroup;
  const int ktiles = p.k_pad / BK;
  uint32_t it = 0;
  for (int w = blockIdx.x; w < work; w += gridDim.x) {
    const TileInfo ti = tile_info(p, w, n_tiles);
    const bool row_ok = weight_row_valid<BN>(p, kFc1, ti.y, t);
    const int64_t wrow = static_cast<int64_t>(ti.e) * p.w_rows + (row_ok ? weight_row<BN>(p, kFc1, ti.y, t) : 0);
    const uint8_t* codes = p.w_packed + wrow * (p.k_pad / 2);
    const uint8_t* scales = p.w_scales + wrow * (p.k_pad / p.block);
    WeightSlice next{}, after{};
    if (row_ok) {
      next = load_slice(codes, scales, 0, h, p.nvfp4);
      if (ktiles > 1) after = load_slice(codes, scales, 1, h, p.nvfp4);
    }
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
      const WeightSlice cur = next;
      next = after;
      if (row_ok && kt + 2 < ktiles) after = load_slice(codes, scales, kt + 2, h, p.nvfp4);  // prefetch
      const int s = it % kStages;
      ptx::mbar_wait(&sm.empty[s], ((it / kStages) & 1) ^ 1, wd, kWaitEmpty, it);
      copy_a(p, sm.a[s], ti.row0, ti.valid, kt, t, h);
      write_b(sm.lut, sm.b[s], cur, row_ok, p.nvfp4, t, h);
      if (it > 0) {
        ptx::cp_async_wait<1>();        // this thread's copies of stage it - 1 have landed
        ptx::fence_proxy_async_smem();  // its generic-proxy writes → visible to wgmma (async proxy)
        ptx::mbar_arrive(&sm.full[(it - 1) % kStages]);
      }
    }
  }
  if (it > 0) {
    ptx::cp_async_wait<0>();
    ptx::fence_proxy_async_smem();
    ptx::mbar_arrive(&sm.full[(it - 1) % kStages]);
  }
}

// Consumer warpgroup c (0 or 1): tile rows [64c, 64c + 64). A warpgroup without valid rows in the
// m-tile skips its MMAs and epilogue but still takes part in every stage's full/empty handshake.
template <bool kFc1>
__device__ __forceinline__ void consume(const MoeGemmParams& p, Smem& sm, int n_tiles, int work,
                                        const ptx::Watchdog& wd) {
  const int c = threadIdx.x / kWarpgroup - kProducers;
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
    const float alpha = p.alpha[ti.e];
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
      ptx::mbar_init(&sm.full[s], kWarpgroup * kProducers);
      ptx::mbar_init(&sm.empty[s], kWarpgroup * kConsumers);
    }
    sm.aborted = 0;
  }
  fill_e2m1x2_table(sm.lut);
  __syncthreads();
  const ptx::Watchdog wd{&sm.aborted, watchdog};
  const int work = *p.num_tiles * n_tiles;
  // 512 threads leave 128 registers each; the consumers (64 accumulators, the FC1 activation
  // epilogue) take 160 and the producers keep 96: 2·128·96 + 2·128·160 = 65536.
  if (threadIdx.x < kWarpgroup * kProducers) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    produce<kFc1>(p, sm, n_tiles, work, wd);
  } else {
    ptx::setmaxnreg_inc<kConsumerRegs>();
    consume<kFc1>(p, sm, n_tiles, work, wd);
  }
}

}  // namespace fp4moe::kernels::dynamic
