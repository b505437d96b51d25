// The dynamic (prefill) backend's grouped GEMM on Hopper warpgroup MMA (wgmma), with the weights as
// the register operand. Everything around it is the generic path's (routing pre-pass,
// gather-quantise, combine: generic.cuh, routing.cuh), and so are both epilogues
// (common/moe_gemm.cuh). The GEMM computes each tile transposed, Dᵀ = W · Aᵀ:
//
//   CTA = 3 warpgroups (384 threads), persistent over the work list (m-tile × n-tile):
//     warpgroup 0      producer: per pipeline stage, cp.async of the activation tile (BM routed
//                      rows × 64 k of A1/A2, bf16, rows past the expert zero-filled) in the wgmma
//                      K-major 128B-swizzled layout (common/wgmma_layout.h): the wgmma B operand; and of
//                      the n-tile's weights for the same 64 k: its 8 row tiles of mma-fragment-order
//                      codes (device_weights.h, the layout direct_micro reads; 8 × 512 B) and their
//                      scale bytes (8 × 16 rows × 64 / block), row tiles past w_rows zero-filled.
//     warpgroups 1, 2  consumers: weight rows [64c, 64c + 64) of the n-tile, warp w the 16 rows
//                      64c + 16w... Once the stage is full each lane reads its 16 bytes of codes (one
//                      LDS.128) and its two scale words; dequantises them to A fragments
//                      (common/frag_dequant.cuh, exact): f16 by bit moves and E4M3 conversions for
//                      NVFP4-a4 (kF16; A1/A2 are then stored as f16), bf16 through per-lane tables
//                      otherwise; and issues 4 × wgmma m64nBMk16 with A from registers and B = the
//                      activation tile.
//   Then the two consumers stage alpha·acc + bias transposed (routed row × weight column) and run
//   the FC1 or FC2 epilogue of the tile together (named barrier over 256 threads).
//   Stages: a ring of kStagesOf<BM> (activation tile, weight slice) pairs with mbarriers "full" (128
//   producer arrivals) and "empty" (256 consumer arrivals); no __syncthreads after the prologue.
//
// Why weights in registers: the previous design dequantised the weights into shared memory, so each
// stage moved the weight tile through shared memory twice (a write, then a wgmma read by each
// consumer), besides the table lookups. Its consumers waited on the producer about two thirds of
// the time (Nsight Compute), and two producers helped only 8 % (bench/results/NOTES.md, session 4).
// Now shared memory carries the activation tile and the packed weights (4.5 KB a stage, not their
// bf16 form), and every consumer warp dequantises its own weights.
//
// Why the weights ride the stages: when each lane loaded its own weights from global memory two
// k-tiles ahead, the consumers stalled on those loads (long scoreboard, 29 % of samples; NOTES.md
// session 5): two k-tiles is less than a loaded DRAM round trip. In the stages they are requested
// up to kStagesOf<BM> - 3 k-tiles ahead by the producer, which has nothing else to wait for.
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
#include <type_traits>

#include "kernels/common/frag_dequant.cuh"
#include "kernels/common/mbarrier.cuh"
#include "kernels/common/moe_gemm.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/common/wgmma_layout.h"

namespace fp4moe::kernels::dynamic {

// Routed rows per m-tile (the wgmma N): BM = 32, 64 or 128, a template parameter of the kernel, chosen
// per call from the routed rows per expert (launch_dynamic.cu dynamic_tile_m). Why: the tensor cores
// multiply the whole tile, so with 8 rows per expert (qwen3-30b-a3b at T = 128) a 128-row tile spends
// 16 times the MACs the rows need (~0.2 ms of MMAs there); at 32 rows the dequantisation is left.
// (Smem, copy_a, tile_info, finish_tile, produce, consume and gemm_kernel take it as a parameter.)

inline constexpr int BN = 128;              // weight rows per n-tile: 2 consumer warpgroups × 64 (wgmma M)
inline constexpr int BK = wgmma::kTileK;    // 64 k per pipeline stage: 4 wgmma k16 steps
inline constexpr int kConsumers = 2;
inline constexpr int kWarpgroup = 128;
inline constexpr int kThreads = kWarpgroup * (1 + kConsumers);
// Pipeline stages per m-tile width: about as many as shared memory holds beside the staging and the
// tables (each stage: the BM × 64 activation tile and 4.5 KB of packed weights), and the producer
// keeps all but three of them in flight (hand_over's lag, produce). Why: the weights stream from HBM
// through the stages alone. With 4 stages and the hand-over one step late, each producer thread had
// at most 2 stages of copies outstanding, ~9 KB of weights per SM, which at a loaded DRAM latency of
// ~1.5 µs moves under 1 TB/s over 132 SMs; HBM needs ~50 KB per SM in flight. At few rows per expert the
// register path streams every touched expert's weights once, so this, not the tensor cores, likely
// set its pace (qwen3-30b-a3b T = 128: 302 MB of weights, 381 µs for the call; derived, not measured).
// The f16 variant at BM = 32 instead runs two CTAs per SM (kCtasPerSm), each with 8 stages.
template <int BM, bool kF16 = false>
inline constexpr int kStagesOf = BM == 32 ? (kF16 ? 8 : 16) : (BM == 64 ? 10 : 5);
// CTAs per SM. Why two for the f16 variant at BM = 32: its consumers were issue-idle 59 % of the
// cycles with 2 warps per scheduler, each warp's stage a chain (full wait → codes → ~80 dependent ALU
// instructions → 4 wgmma → wait for the previous group), and the f16 variant's instruction cut barely
// moved the time (NOTES session 11). It needs no lookup tables and 16 accumulators, so a second CTA
// fits: ~85 KB of shared memory and 104 registers per consumer thread.
template <int BM, bool kF16>
inline constexpr int kCtasPerSm = kF16 && BM == 32 ? 2 : 1;
// Registers per thread. At launch: what __launch_bounds__ leaves each of kThreads × kCtasPerSm
// threads, in the allocation's units of 8 (168 for one CTA, 80 for two; the host checks ptxas agreed,
// dynamic_gemm_opt_in). Then setmaxnreg moves them within the CTA's pool (SETMAXREG .CTAPOOL): the
// producer (cp.async only) gives back to 40, the consumers take what that frees, in units of 8.
// Asking for more than the pool holds would make the consumers' increase wait forever.
inline constexpr int kProducerRegs = 40;
template <int BM, bool kF16>
inline constexpr int kLaunchRegs = 65536 / (kThreads * kCtasPerSm<BM, kF16>) / 8 * 8;
template <int BM, bool kF16>
inline constexpr int kConsumerRegs =
    (kLaunchRegs<BM, kF16> * kThreads - kWarpgroup * kProducerRegs) / (kConsumers * kWarpgroup) / 8 * 8;
// Staging row stride in floats: 4 (mod 32) makes both the accumulator stores (8 weight rows × 4
// routed rows per instruction) and the epilogue's float4 reads down 8 rows conflict-free.
inline constexpr int kLdc = BN + 4;
static_assert(BN == 64 * kConsumers, "one m64 wgmma row block of weights per consumer warpgroup");

// Watchdog report: which barrier a thread gave up on (the last two: the bf16 path's FC1 staging,
// dynamic_bf16.cuh).
enum : int { kWaitEmpty = 1, kWaitFull = 2, kWaitStaged = 3, kWaitStagingFree = 4 };

inline constexpr int kRowTiles = BN / 16;   // weight row tiles (16 rows × 64 k) per n-tile
inline constexpr int kMaxScaleBytes = 16 * 4;  // scale bytes per row tile and k-tile: 16 rows × 64 / 16

struct NoTables {};
// The activation tiles are 128B-swizzled (copy_a), so each starts 1024-byte aligned: the kernels
// align their dynamic shared memory up to kSmemAlign (aligned_smem), and the launch asks for that much
// more than sizeof(Smem) (smem_bytes).
inline constexpr uint32_t kSmemAlign = wgmma::kSw128Atom;
template <int BM, bool kF16 = false>
struct alignas(1024) Smem {
  static constexpr int kStages = kStagesOf<BM, kF16>;
  static_assert(kStages >= 3, "the producer signals a stage after starting later ones (hand_over)");
  __nv_bfloat16 a[kStages][BM * BK];  // activation tiles (BM, BK) per stage, K-major, 128B-swizzled
  uint4 w[kStages][kRowTiles][32];    // weight codes per stage: row tile j = 4c + warp, lane's 16 B
  alignas(16) uint8_t ws[kStages][kRowTiles][kMaxScaleBytes];  // their scales: [16 rows][64 / block]
  alignas(16) float c[BM * kLdc];     // epilogue staging: [routed row][tile column], alpha·acc + bias
  float rw[BM];                       // FC2: the tile's router weights (router_weight)
  std::conditional_t<kF16, NoTables, FragTables> tables;  // E2M1 and scale byte → bf16x2, per lane (bf16 only)
  uint64_t full[kStages];             // producer → consumers: stage written (and fenced for the async proxy)
  uint64_t empty[kStages];            // consumers → producer: stage read by the tensor cores
  int aborted;                        // watchdog (mbarrier.cuh)
};
// Dynamic shared memory a register-path kernel launches with: the Smem and the alignment slack.
template <int BM, bool kF16>
inline constexpr size_t smem_bytes = sizeof(Smem<BM, kF16>) + kSmemAlign;
static_assert(smem_bytes<32, false> <= 227 * 1024 && smem_bytes<64, false> <= 227 * 1024 &&
                  smem_bytes<128, false> <= 227 * 1024 && smem_bytes<128, true> <= 227 * 1024,
              "past the sm_90 opt-in shared memory per CTA");
// sm_90: 228 KB of shared memory per SM, of which the hardware reserves 1 KB per CTA.
static_assert(kCtasPerSm<32, true> * (smem_bytes<32, true> + 1024) <= 228 * 1024,
              "the f16 variant's two CTAs per SM no longer fit the shared memory");
// A kernel's shared-memory struct in its dynamic shared memory, aligned up to kSmemAlign (the
// register path's Smem here, the bf16 path's in dynamic_bf16.cuh; each launch asks for kSmemAlign more).
template <class SmemT>
__device__ __forceinline__ SmemT& aligned_smem(unsigned char* raw) {
  const uint32_t pad = (kSmemAlign - (ptx::smem_addr(raw) & (kSmemAlign - 1))) & (kSmemAlign - 1);
  return *reinterpret_cast<SmemT*>(raw + pad);
}

// cp.async of the stage's activation tile: rows row0 + m (m < valid; the rest zero-filled),
// k = kt·64 ..., in the 128B-swizzled K-major layout (wgmma_layout.h sw128_offset), BM / 16 copies
// of 16 bytes per producer thread t: copy i moves chunk t % 8 of row 16·i + t / 8
// (wgmma::a_copy_chunk), so each quarter-warp reads one row's 128 contiguous global bytes and writes
// them to the 8 bank groups of one 128-byte shared row. Why: with the no-swizzle layout a row's 8
// chunks lie a core-matrix column apart in shared memory (BM·16 bytes, the same banks), and a
// quarter-warp copied 8 rows' chunk kc instead: Nsight Compute counted 28.6 shared wavefronts per
// copy instruction against an ideal 4.2, and twice the ideal global sectors, at mixtral-8x7b T = 512
// (BM = 128): ~900 cycles a stage of the shared-memory pipe against 512 of MMAs (NOTES session 15).
template <int BM>
__device__ __forceinline__ void copy_a(const MoeGemmParams& p, __nv_bfloat16* tile, int row0, int valid, int kt, int t) {
  constexpr int kCopies = BM / 16;
  unsigned char* base = reinterpret_cast<unsigned char*>(tile);
  const wgmma::ChunkCoord c0 = wgmma::a_copy_chunk(t, 0);
  // Row m + 16 lies two 1024-byte atoms past row m, with the same swizzle (it depends on m % 8).
  const uint32_t dst0 = wgmma::sw128_offset(c0.m, 8 * c0.kc);
  const __nv_bfloat16* src0 = p.a + static_cast<int64_t>(row0) * p.k_pad + kt * BK + c0.kc * 8;
  // One running source pointer, 16 rows a copy (rows past `valid` copy 0 bytes from row 0): the
  // producer's 40 registers do not hold a precomputed offset per copy (ptxas spilled at BM = 128).
  const int64_t step = static_cast<int64_t>(16) * p.k_pad;
  const __nv_bfloat16* src = src0 + static_cast<int64_t>(c0.m) * p.k_pad;
#pragma unroll
  for (int i = 0; i < kCopies; ++i, src += step) {
    const bool ok = c0.m + 16 * i < valid;
    ptx::cp_async_16(base + dst0 + i * 2 * wgmma::kSw128Atom, ok ? src : src0, ok ? 16 : 0);
  }
}

struct TileInfo {
  int y, e, row0, valid;
};
// n-tile y of m-tile `tile` of the routing's list, built with tile_m = kRows.
template <int kRows>
__device__ __forceinline__ TileInfo tile_at(const MoeGemmParams& p, int tile, int y) {
  TileInfo ti;
  ti.y = y;
  ti.e = p.tile_expert[tile];
  ti.row0 = p.tile_row0[tile];
  ti.valid = min(kRows, p.expert_offset[ti.e + 1] - ti.row0);
  return ti;
}
template <int BM>
__device__ __forceinline__ TileInfo tile_info(const MoeGemmParams& p, int w, int n_tiles) {
  return tile_at<BM>(p, w / n_tiles, w % n_tiles);
}

// The end of a tile: consumer warpgroup c's accumulators (weight rows [64c, 64c + 64) × BM routed
// rows, BM / 2 floats per thread) → alpha·acc + bias staged transposed in `stage` (routed row × tile
// column, kLdc floats per row) → the FC1 or FC2 epilogue over both consumers (named barrier 1 over
// their 256 threads; t: this thread in its warpgroup, ct: among both).
// rws (FC2): the tile's router weights in shared memory, written before this call (fc2_store_rows).
// kF16: the weights were read as code × scale × 2^-6 (frag_a_f16), so alpha is taken × 2^6 (exact).
template <bool kFc1, int BM, bool kF16>
__device__ __forceinline__ void finish_tile(const MoeGemmParams& p, const TileInfo& ti, const float (&acc)[BM / 2],
                                            float* stage, int c, int t, int ct, const float* rws) {
  // acc element i is D[weight row 64c + acc_row(t, i)][routed row acc_col(t, i)] (wgmma_layout.h).
  const float alpha = p.alpha[ti.e] * (kF16 ? 64.0f : 1.0f);
  float bias[2] = {0.0f, 0.0f};  // this thread's two weight rows: acc_row(t, i) for (i / 2) % 2 = 0, 1
  if (p.bias) {
    const float* be = p.bias + static_cast<int64_t>(ti.e) * p.w_rows;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int v = 64 * c + wgmma::acc_row(t, 2 * h);
      if (weight_row_valid<BN>(p, kFc1, ti.y, v)) bias[h] = be[weight_row<BN>(p, kFc1, ti.y, v)];
    }
  }
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) {
    const int v = 64 * c + wgmma::acc_row(t, i), n = wgmma::acc_col(t, i);
    stage[n * kLdc + v] = alpha * acc[i] + bias[(i >> 1) & 1];
  }
  ptx::named_barrier_sync(1, kConsumers * kWarpgroup);
  const int rows = min(BM, ti.valid);
  if constexpr (kFc1) fc1_store_rows<BN>(p, stage, kLdc, rows, ti.row0, ti.e, ti.y, ct, kConsumers * kWarpgroup);
  else fc2_store_rows<BN>(p, stage, kLdc, rows, ti.row0, ti.y, ct, kConsumers * kWarpgroup, rws);
  ptx::named_barrier_sync(1, kConsumers * kWarpgroup);  // staging is reused by the next tile
}

// FC2: the router weight of routed row r of the tile (0 past its valid rows), loaded by consumer
// thread r when the tile starts, so that the two dependent global loads complete behind the main
// loop; the thread stores it to shared memory before the epilogue's first barrier.
__device__ __forceinline__ float router_weight(const MoeGemmParams& p, const TileInfo& ti, int r) {
  return r < ti.valid ? p.topk_weights[p.row_route[ti.row0 + r]] : 0.0f;
}

// Thread 0, before the CTA's first __syncthreads: the stages' barriers ("full" completes a phase
// after full_arrivals arrivals, "empty" after both consumers'), the watchdog flag, and a fence that
// makes the initialisations visible to the async proxy (bulk copies completing on "full").
// kRing: the ring's stages (the bf16 path has its own count).
template <int kRing>
__device__ __forceinline__ void init_pipeline(uint64_t* full, uint64_t* empty, unsigned full_arrivals, int* aborted) {
  static_assert(kRing >= 3, "the producer signals stage s one step late (after starting s + 1)");
  for (int s = 0; s < kRing; ++s) {
    ptx::mbar_init(&full[s], full_arrivals);
    ptx::mbar_init(&empty[s], kWarpgroup * kConsumers);
  }
  *aborted = 0;
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The producer's hand-over, kLag steps late: once stage it's copies are issued, this thread's
// copies of stage it - kLag have landed (at most kLag later groups pending) → fenced for the async
// proxy → "full". So each producer thread keeps kLag stages of copies in flight. kLag ≤ kRing - 2:
// the producer issues stage j + kLag (which signals j) only after the consumers have released
// stage j + kLag - kRing, which they do while working on stage j + kLag - kRing + 1 ≤ j - 1.
// The last kLag stages after the loop (hand_over_last; `it`: the stages issued). `n`: how many of
// the stages before `it` this run of the producer issued (the static backend runs it once per GEMM
// on one ring, static_moe.cuh; its first stage is it - n): only those are handed over here.
template <int kRing, int kLag>
__device__ __forceinline__ void hand_over(uint64_t* full, uint32_t it, uint32_t n) {
  static_assert(kLag >= 1 && kLag <= kRing - 2, "the consumers must be able to release what the producer waits for");
  if (n < kLag) return;
  ptx::cp_async_wait<kLag>();     // this thread's copies of stage it - kLag have landed
  ptx::fence_proxy_async_smem();  // its generic-proxy writes → visible to wgmma (async proxy)
  ptx::mbar_arrive(&full[(it - kLag) % kRing]);
}
template <int kRing, int kLag>
__device__ __forceinline__ void hand_over_last(uint64_t* full, uint32_t it, uint32_t n) {
  ptx::cp_async_wait<0>();
  ptx::fence_proxy_async_smem();
  for (uint32_t j = it - min(n, static_cast<uint32_t>(kLag)); j < it; ++j) ptx::mbar_arrive(&full[j % kRing]);
}

// Row tile j (weight rows 16j.. of the n-tile) of the work item: whether it is inside w_rows
// (w_rows % 16 == 0: all 16 rows or none) and its first fragment tile (k-tile 0), the expert's
// first one when it is not. Tile indices fit 32 bits (2^32 tiles would be 2 TB of codes); 32-bit
// indices keep the producer inside its 40 registers.
struct RowTile {
  uint32_t tile0;
  bool ok;
};
template <bool kFc1>
__device__ __forceinline__ RowTile row_tile(const MoeGemmParams& p, const TileInfo& ti, int j) {
  const bool ok = weight_row_valid<BN>(p, kFc1, ti.y, 16 * j);
  const int rt = ok ? weight_row<BN>(p, kFc1, ti.y, 16 * j) / 16 : 0;
  return {static_cast<uint32_t>(ti.e * (p.w_rows / 16) + rt) * static_cast<uint32_t>(p.k_pad / BK), ok};
}

// This producer thread's share of one work item's weight copies, per k-tile: the codes of row tiles
// warp and warp + 4 (lane's 16 B of each: a warp moves 512 contiguous bytes), and for t < 8·sb one
// 16-byte chunk of scales (row tile t / sb, chunk t % sb). Invalid row tiles copy 0 bytes (zeros).
struct WeightCopies {
  uint32_t code_tile[2], scale_tile;  // first fragment tiles (k-tile 0) of those row tiles
  int code_bytes[2], scale_bytes;     // 16, or 0 past w_rows
};
template <bool kFc1>
__device__ __forceinline__ WeightCopies weight_copies(const MoeGemmParams& p, const TileInfo& ti, int t, int sb) {
  const int warp = t >> 5;
  WeightCopies wc;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const RowTile rt = row_tile<kFc1>(p, ti, warp + 4 * h);
    wc.code_tile[h] = rt.tile0;
    wc.code_bytes[h] = rt.ok ? 16 : 0;
  }
  const RowTile rs = row_tile<kFc1>(p, ti, min(t / sb, kRowTiles - 1));
  wc.scale_tile = rs.tile0;
  wc.scale_bytes = rs.ok && t < kRowTiles * sb ? 16 : 0;
  return wc;
}
template <class SmemT>
__device__ __forceinline__ void copy_w(const MoeGemmParams& p, SmemT& sm, const WeightCopies& wc, int s, int kt, int t,
                                       int sb) {
  const int warp = t >> 5, lane = t & 31;
#pragma unroll
  for (int h = 0; h < 2; ++h)
    ptx::cp_async_16(&sm.w[s][warp + 4 * h][lane], p.w_frag + static_cast<uint64_t>(wc.code_tile[h] + kt) * 32 + lane,
                     wc.code_bytes[h]);
  if (t < kRowTiles * sb)
    ptx::cp_async_16(&sm.ws[s][t / sb][(t % sb) * 16],
                     p.s_frag + static_cast<uint64_t>(wc.scale_tile + kt) * 16 * sb + (t % sb) * 16, wc.scale_bytes);
}

// Producer warpgroup. Stage `it` is signalled "full" kLag steps late, after the copies of stage
// it + kLag are issued (hand_over), so kLag stages of copies are in flight per thread.
// it: the ring's stages this thread has used so far (0 for the dynamic backend's one GEMM; the static
// backend runs FC1 and then FC2 on one ring), advanced past this GEMM's; consume takes the same.
template <bool kFc1, int BM, bool kF16>
__device__ __forceinline__ void produce(const MoeGemmParams& p, Smem<BM, kF16>& sm, int n_tiles, int work,
                                        const ptx::Watchdog& wd, uint32_t& it) {
  const int t = threadIdx.x;  // 0..127
  const int ktiles = p.k_pad / BK, sb = 64 / p.block;
  // The lag leaves the consumers two stages of slack: stage j is signalled once the consumers have
  // released stage j - 3 (kLag = kRing - 3), i.e. while they work on stage j - 2, so the producer's
  // reaction (its wait, a stage of copies) is off their path unless it takes longer than two stages.
  constexpr int kRing = Smem<BM, kF16>::kStages, kLag = kRing - 3;
  const uint32_t it0 = it;
  for (int w = blockIdx.x; w < work; w += gridDim.x) {
    const TileInfo ti = tile_info<BM>(p, w, n_tiles);
    const WeightCopies wc = weight_copies<kFc1>(p, ti, t, sb);
    for (int kt = 0; kt < ktiles; ++kt, ++it) {
      const int s = it % kRing;
      ptx::mbar_wait(&sm.empty[s], ((it / kRing) & 1) ^ 1, wd, kWaitEmpty, it);
      copy_a<BM>(p, sm.a[s], ti.row0, ti.valid, kt, t);
      copy_w(p, sm, wc, s, kt, t, sb);
      ptx::cp_async_commit();  // one group per stage
      hand_over<kRing, kLag>(sm.full, it, it - it0);
    }
  }
  hand_over_last<kRing, kLag>(sm.full, it, it - it0);
}

// Consumer warpgroup c (0 or 1): weight rows [64c, 64c + 64) of each n-tile against all BM routed
// rows of the m-tile. Every warp takes part in every wgmma (sync.aligned); a warp whose 16 weight rows
// are past w_rows (last n-tile of a non-gated FC1 or of FC2) dequantises the zeros the producer
// filled in for them.
// kF16 (NVFP4 weights, NVFP4-a4 activations stored as f16): the weights become f16 A fragments by
// bit moves and E4M3 conversions (frag_a_f16, ~18 instructions per k16 step and lane, no shared
// loads) instead of the per-lane tables (frag_a_bf16: 6 LDS, their address IMADs and PRMTs; the
// profile counted 68 instructions per HGMMA in all, NOTES session 11), and the wgmma reads f16.
template <bool kFc1, int BM, bool kF16>
__device__ __forceinline__ void consume(const MoeGemmParams& p, Smem<BM, kF16>& sm, int n_tiles, int work,
                                        const ptx::Watchdog& wd, uint32_t& it) {
  const int c = threadIdx.x / kWarpgroup - 1;
  const int t = threadIdx.x % kWarpgroup, warp = t >> 5, lane = t & 31;
  const int ct = threadIdx.x - kWarpgroup;  // 0..255: this thread among both consumers (epilogue)
  const int ktiles = p.k_pad / BK, sb = kF16 ? 4 : 64 / p.block, j = 4 * c + warp;  // j: this warp's row tile
  const uint32_t a_base = ptx::smem_addr(sm.a[0]);
  FragLut lut{};  // the bf16 variant's tables (the f16 one has none)
  if constexpr (!kF16) lut = frag_lut(sm.tables);
  constexpr int kRing = Smem<BM, kF16>::kStages;
  // Stage s's operands lie constant strides past stage 0's: this lane's codes, its row tile's scale
  // bytes, the activation tile's descriptor (its address field counts 16-byte units; shared
  // addresses stay below 2^18, so nothing carries out of it). Taken once here, so a stage adds
  // s · stride instead of converting generic pointers and rebuilding the descriptor (~20 of a BM = 32
  // stage's ~150 instructions, NOTES session 12).
  const uint32_t w_addr0 = ptx::smem_addr(&sm.w[0][j][lane]), ws_addr0 = ptx::smem_addr(&sm.ws[0][j][0]);
  constexpr uint32_t kWStride = sizeof(sm.w[0]), kWsStride = sizeof(sm.ws[0]);
  const uint64_t desc_base = wgmma::operand_desc_sw128(a_base, 0, 0);
  const uint64_t kDescStride = wgmma::tile_bytes(BM) >> 4;
  float acc[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) acc[i] = 0.0f;  // never read: each tile's first wgmma has scale-d = 0
  for (int w = blockIdx.x; w < work; w += gridDim.x) {
    const TileInfo ti = tile_info<BM>(p, w, n_tiles);
    const float rw = kFc1 ? 0.0f : router_weight(p, ti, ct);
    // Two sets of A fragments: while stage kt - 1's MMAs run, the warpgroup dequantises stage kt into
    // the other set; wgmma_wait<1> then frees stage kt - 1's set and its stage (tile and weights).
    uint32_t a0[4][4], a1[4][4];
    auto stage = [&](int kt, uint32_t (&a)[4][4]) {
      const int s = it % kRing;
      ptx::mbar_wait(&sm.full[s], (it / kRing) & 1, wd, kWaitFull, it);
      // A row tile past w_rows (w_rows % 16 == 0: all 16 rows or none) takes no branch: the producer
      // zero-filled its codes and scales (weight_copies), which dequantise to zeros on both variants.
      // With a branch, ptxas zeroed the 16 fragment registers before it on every stage (8 CS2R and
      // the branch's BSSY/BSYNC/BRA: ~11 of a BM = 32 stage's ~160 instructions).
      const uint4 codes = ptx::ld_shared_v4(w_addr0 + s * kWStride);  // one LDS.128
      uint32_t slo, shi;
      frag_scales_smem(ws_addr0 + s * kWsStride, sb, slo, shi);
      const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
      if constexpr (kF16) {
        const F16Scales f16s = frag_scales_f16(slo, shi);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) frag_a_f16(words[ks], f16s, ks, a[ks]);
      } else {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) frag_a_bf16(lut, words[ks], slo, shi, ks, a[ks]);
      }
      // No proxy fence here: the tile's writers (the producer's cp.async) completed them, fenced them
      // for the async proxy and then arrived on "full" (hand_over), and this thread's wait on "full"
      // acquires that; a fence by the reader orders only its own accesses. (It was here until session
      // 13 as "belt and braces": MEMBAR.ALL.CTA, FENCE.VIEW.ASYNC and 4 LDS a stage.)
      ptx::fence_operand(acc);
      ptx::wgmma_fence();
      // The stage's k16 steps lie 32 bytes apart in the swizzled rows (operand_desc_sw128): added to
      // the descriptor's address field (16-byte units; shared addresses stay below 2^18, so nothing
      // carries out of it) instead of building each descriptor (~5 uniform instructions per wgmma).
      const uint64_t desc0 = desc_base + s * kDescStride;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) ptx::mma_m64nNk16_rs<BM, kF16>(acc, a[ks], desc0 + 2 * ks, (kt | ks) != 0);
      ptx::wgmma_commit();
      ptx::fence_operand(acc);
      ptx::wgmma_wait<1>();  // stage kt - 1's group is done: its A set and tile are free
      ptx::fence_operand(acc);
      if (kt > 0) ptx::mbar_arrive(&sm.empty[(it - 1) % kRing]);
      ++it;
    };
    // Pairs of stages, then an odd last one, so that every path writes a set only after the wait
    // that retired its previous wgmma group. With the second stage of the pair conditional instead,
    // ptxas saw a path (skip it, loop) on which a0 is rewritten while its group may run, and
    // serialised every wgmma of the kernel (warning C7513; a wait after each HGMMA, the four k16
    // steps' conversions interleaved between them in the same four registers). It did so in every
    // register-path kernel without the row-tile branch above (NOTES session 12).
    int kt = 0;
    for (; kt + 1 < ktiles; kt += 2) {
      stage(kt, a0);
      stage(kt + 1, a1);
    }
    if (kt < ktiles) stage(kt, a0);
    ptx::wgmma_wait<0>();
    ptx::fence_operand(acc);
    ptx::mbar_arrive(&sm.empty[(it - 1) % kRing]);

    if (!kFc1 && ct < BM) sm.rw[ct] = rw;  // read after finish_tile's first barrier
    finish_tile<kFc1, BM, kF16>(p, ti, acc, sm.c, c, t, ct, sm.rw);
  }
}

// A register-path CTA's start (dynamic's gemm_kernel, static's static_kernel), all threads: the
// ring's barriers (thread 0), the bf16 variant's lookup tables, then a __syncthreads.
template <int BM, bool kF16>
__device__ __forceinline__ void start_cta(Smem<BM, kF16>& sm, bool nvfp4) {
  if (threadIdx.x == 0) init_pipeline<Smem<BM, kF16>::kStages>(sm.full, sm.empty, kWarpgroup, &sm.aborted);
  if constexpr (!kF16) fill_frag_tables(sm.tables, nvfp4, threadIdx.x >> 5, kThreads / 32);
  __syncthreads();
}

// The roles: the producer warpgroup gives registers back to kProducerRegs, the consumers take what
// that frees. One CTA per SM: 384 threads start with 168 registers each, then 40 and 232 (up to 64
// accumulators, two A fragment sets): 128·40 + 256·232 = 64512. Two (the f16 variant at BM = 32):
// 80 each at the start (30720 a CTA), then 40 and 96. Returns whether this thread produces.
template <int BM, bool kF16>
__device__ __forceinline__ bool take_role() {
  static_assert(kWarpgroup * kProducerRegs + kConsumers * kWarpgroup * kConsumerRegs<BM, kF16> <=
                    kLaunchRegs<BM, kF16> * kThreads,
                "the consumers' setmaxnreg.inc would wait forever for registers the CTA's pool lacks");
  if (threadIdx.x < kWarpgroup) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    return true;
  }
  ptx::setmaxnreg_inc<kConsumerRegs<BM, kF16>>();
  return false;
}

// n_tiles: weight n-tiles per m-tile (FC1 gated: i_pad / 64; otherwise ceil(w_rows / 128)).
// watchdog: optional global int[ptx::kWatchdogReportInts], zeroed, that a pipeline wait past
// ptx::kWatchdogNs fills (tests); null in production, where waits have no time limit.
// kF16 = p.f16 (the host launches the matching instance): consume's f16 variant, no tables to fill.
template <bool kFc1, int BM, bool kF16>
__global__ void __launch_bounds__(kThreads, kCtasPerSm<BM, kF16>) gemm_kernel(MoeGemmParams p, int n_tiles, int* watchdog) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  Smem<BM, kF16>& sm = aligned_smem<Smem<BM, kF16>>(smem_raw);
  start_cta(sm, p.nvfp4);
  const ptx::Watchdog wd{&sm.aborted, watchdog};
  const int work = *p.num_tiles * n_tiles;
  uint32_t it = 0;
  if (take_role<BM, kF16>()) produce<kFc1, BM, kF16>(p, sm, n_tiles, work, wd, it);
  else consume<kFc1, BM, kF16>(p, sm, n_tiles, work, wd, it);
}

}  // namespace fp4moe::kernels::dynamic
