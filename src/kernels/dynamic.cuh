// The dynamic (prefill) backend's grouped GEMM on Hopper warpgroup MMA (wgmma), with the weights as
// the register operand. Everything around it is the generic path's (routing pre-pass,
// gather-quantise, combine: generic.cuh, routing.cuh), and so are both epilogues
// (common/moe_gemm.cuh). The GEMM computes each tile transposed, Dᵀ = W · Aᵀ:
//
//   CTA = 3 warpgroups (384 threads), persistent over the work list (m-tile × n-tile):
//     warpgroup 0      producer: one thread fills each pipeline stage with tensor copies (TMA) that
//                      complete on the stage's "full" barrier by their bytes (TensorMaps, built by
//                      the host: host/tensor_map.h): the activation tile (BM routed rows × 64 k of
//                      A1/A2, written 128B-swizzled: the wgmma B operand; rows past the expert are
//                      the next expert's, or zeros past the call's rows), and the n-tile's 8 row
//                      tiles of mma-fragment-order codes for the same 64 k (device_weights.h, the
//                      layout direct_micro reads; 512 B each) with their scale bytes (16 rows × 64 /
//                      block), one box of 8 row tiles each (two of 4 for a gated FC1, whose tile
//                      takes its halves from the gate and up rows). Row tiles past w_rows arrive as
//                      the next expert's or as zeros; their output columns are never stored. The
//                      producer's other 127 threads have nothing to do.
//     warpgroups 1, 2  consumers: weight rows [64c, 64c + 64) of the n-tile, warp w the 16 rows
//                      64c + 16w... Once the stage is full each lane reads its 16 bytes of codes (one
//                      LDS.128) and its two scale words; dequantises them to A fragments
//                      (common/frag_dequant.cuh, exact): f16 by bit moves and E4M3 conversions for
//                      NVFP4-a4 (kF16; A1/A2 are then stored as f16), bf16 by bit moves and one
//                      HMUL2 a register for NVFP4's other modes (bf16 words, frag_a_bf16w), bf16
//                      through per-lane tables for MX; and issues 4 × wgmma m64nBMk16 with A from
//                      registers and B = the activation tile.
//   Then the two consumers stage alpha·acc + bias transposed (routed row × weight column) and run
//   the FC1 or FC2 epilogue of the tile together (named barrier over 256 threads); at BM >= 64
//   (kHelpOf) they only stage it, and 8 helper warps (warpgroups 3 and 4) run the epilogue while the
//   consumers multiply the next item (help).
//   Stages: a ring of kStagesOf<BM> (activation tile, weight slice) pairs with mbarriers "full" (one
//   producer arrival with the stage's bytes) and "empty" (256 consumer arrivals); no __syncthreads
//   after the prologue.
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
// as far ahead as the ring allows.
//
// Why one producer thread of tensor copies (sessions 15 and 16): with cp.async, 128 producer threads
// spent ~127 instructions a stage on addresses and zero-fill selects, and each signalled a stage only
// once its copies of it had landed, kLag stages later; at mixtral-8x7b T = 512 (BM = 128) the
// consumers waited on "full" 62 % of their time with the tensor pipe at 50 % (NOTES session 15).
// One warp issuing the weights as 16 bulk copies of their row tiles (one per lane) was slower still,
// 27 % over 28 points (NOTES session 16): a bulk copy's operands must be uniform, so ptxas issued the
// lanes' copies one by one (ELECT, 4 R2UR, UBLKCP: ~80 cycles each), ~1300 cycles a stage, and the
// consumers again waited on "full" 62 %. Three tensor copies a stage (five for a gated FC1) take a
// fraction of that: against cp.async, median 0.790 and faster at 12 of 12 points (mixtral-8x7b a4
// T = 128 -33 %, T = 2048 -28 %; NOTES session 16).
//
// Products are exact (bf16 holds E2M1 × E4M3/UE8M0 and every activation value the quantisers
// produce, including e4m3 × UE8M0 of a8), accumulation is fp32: results equal generic's up to
// summation order.
//
// Tile list: the routing pre-pass run with tile_m = BM gives the (expert, row0) m-tiles; work item
// w = m-tile · n_tiles + n-tile, CTA b takes w = b, b + grid, … (the count is read on the device, so
// the launch is graph-safe).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: the map is built on the host)
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

// Routed rows per m-tile (the wgmma N): BM = 16, 32, 64 or 128, a template parameter of the kernel, chosen
// per call from the routed rows per expert (launch_dynamic.cu dynamic_tile_m). Why: the tensor cores
// multiply the whole tile, so with 8 rows per expert (qwen3-30b-a3b at T = 128) a 128-row tile spends
// 16 times the MACs the rows need (~0.2 ms of MMAs there); at 32 rows the dequantisation is left.
// (Smem, tile_info, finish_tile, produce, consume and gemm_kernel take it as a parameter.)

inline constexpr int BN = 128;              // weight rows per n-tile: 2 consumer warpgroups × 64 (wgmma M)
inline constexpr int BK = wgmma::kTileK;    // 64 k per pipeline stage: 4 wgmma k16 steps
inline constexpr int kConsumers = 2;
inline constexpr int kWarpgroup = 128;
inline constexpr int kThreads = kWarpgroup * (1 + kConsumers);
// Pipeline stages per m-tile width: about as many as shared memory holds beside the staging and the
// tables (each stage: the BM × 64 activation tile and 4.5 KB of packed weights), all of them in
// flight (produce). Why: the weights stream from HBM through the stages alone; HBM needs ~50 KB per
// SM in flight. At BM = 32 both variants instead run two CTAs per SM (kCtasPerSm): the f16 one with 8
// stages each, the bf16 one with 6 (its 40 KB of lookup tables leave room for no more: 2 × ~110 KB).
// At BM = 16 (up to 8 routed rows per expert) a stage is 6.5 KB: 12 of them (f16) or 8
// (bf16, beside its tables) fit each of two CTAs an SM.
template <int BM, bool kF16 = false>
inline constexpr int kStagesOf = BM == 16 ? (kF16 ? 12 : 8) : BM == 32 ? (kF16 ? 8 : 6) : (BM == 64 ? 10 : 5);
// CTAs per SM. Why two at BM = 32: the f16 variant's consumers were issue-idle 59 % of the cycles
// with 2 warps per scheduler, each warp's stage a chain (full wait → codes → ~80 dependent ALU
// instructions → 4 wgmma → wait for the previous group), and the f16 variant's instruction cut barely
// moved the time (NOTES session 11); a second CTA (16 accumulators, ~85 KB of shared memory) took
// −24 to −27 % (session 12). The bf16 variant's stage is the same chain with table loads in it; with
// 6 stages a second CTA fits beside its tables (ptxas: 80 registers, FC1 spills 20 bytes outside the
// hot loop but one reload a stage pair, FC2 none): −14 to −24 % at 11 of 12 a16 points, T = 16…512
// (H100, bench/results/h100-decode-20261205-s18-b2-ab.md; qwen3-30b-a3b T = 512, at 64 rows, ±0).
template <int BM, bool kF16>
inline constexpr int kCtasPerSm = BM <= 32 ? 2 : 1;
// Registers per thread. At launch: what __launch_bounds__ leaves each of kThreads × kCtasPerSm
// threads, in the allocation's units of 8 (168 for one CTA, 80 for two; the host checks ptxas agreed,
// dynamic_gemm_opt_in). Then setmaxnreg moves them within the CTA's pool (SETMAXREG .CTAPOOL): the
// producer (copies only) gives back to 40, the consumers take what that frees, in units of 8.
// Asking for more than the pool holds would make the consumers' increase wait forever.
inline constexpr int kProducerRegs = 40;
template <int BM, bool kF16>
inline constexpr int kLaunchRegs = 65536 / (kThreads * kCtasPerSm<BM, kF16>) / 8 * 8;
template <int BM, bool kF16>
inline constexpr int kConsumerRegs =
    (kLaunchRegs<BM, kF16> * kThreads - kWarpgroup * kProducerRegs) / (kConsumers * kWarpgroup) / 8 * 8;
// The epilogue helpers (dynamic's gemm_kernel at BM >= 64: kHelpOf). Why: at prefill every item was
// its MMAs and then a serial epilogue (the FC1 activation, bf16 rounding and requantisation; FC2's
// weighted stores) of about the same length: Nsight Compute of FC1 at qwen3-30b-a3b a4 T = 16384 put
// ~half the stall samples in the epilogue and the stage loop tensor-bound while it ran (session 33,
// bench/results/ncu/dynamic-bm256-s33-qwen3-16384-fc1.txt). So the consumers only stage the tile
// (alpha·acc + bias) and go on to the next item, and kHelpers threads run the epilogue from the
// staging meanwhile: two more warpgroups, 8 warps. Why 8 (session 34, NOTES): the helpers' rate
// went with their warp count. 7 warps (the producer warpgroup's warps 1-3 and one warpgroup) left
// the consumers waiting on c_empty a quarter of their time (FC1 -8.5 % at qwen3-30b-a3b a4
// T = 16384 instead of the -35 % predicted); the same 7 warps with shorter per-thread chains
// (8-column tasks) changed nothing; these 8 took FC1 a further -17 % (1768 -> 1473 us).
// Registers: 640 threads launch with 96 each (61440); the producer warpgroup gives back to
// kProducerRegs (its warps 1-3 return), the helpers to kHelperRegs, the consumers take the rest
// (64 accumulators and two fragment sets at BM = 128).
template <int BM>
inline constexpr bool kHelpOf = BM >= 64;
// The helpers' kernels whose items run narrow MMAs (consume_item's kNarrow; 64-row tiles keep the
// full width, session 35).
template <int BM>
inline constexpr bool kNarrowOf = BM == 128;
inline constexpr int kHelpThreads = kThreads + 2 * kWarpgroup;  // 640
inline constexpr int kHelpers = 2 * kWarpgroup;                 // 256: warpgroups 3 and 4
inline constexpr int kHelpLaunchRegs = 65536 / kHelpThreads / 8 * 8;  // 96
inline constexpr int kHelperRegs = 56;
inline constexpr int kHelpConsumerRegs =
    (kHelpLaunchRegs * kHelpThreads - kWarpgroup * kProducerRegs - kHelpers * kHelperRegs) / (kConsumers * kWarpgroup) /
    8 * 8;  // 160
static_assert(kWarpgroup * kProducerRegs + kHelpers * kHelperRegs + kConsumers * kWarpgroup * kHelpConsumerRegs <=
                  kHelpLaunchRegs * kHelpThreads,
              "the consumers' setmaxnreg.inc would wait forever");
// A register-path GEMM kernel's threads (the host launches with these; without the split).
template <int BM>
inline constexpr int kGemmThreads = kHelpOf<BM> ? kHelpThreads : kThreads;
// Staging row stride in floats: 4 (mod 32) makes both the accumulator stores (8 weight rows × 4
// routed rows per instruction) and the epilogue's float4 reads down 8 rows conflict-free.
inline constexpr int kLdc = BN + 4;
static_assert(BN == 64 * kConsumers, "one m64 wgmma row block of weights per consumer warpgroup");

// Watchdog report: which barrier a thread gave up on (kWaitStaged and kWaitStagingFree: the bf16
// path's FC1 staging, dynamic_bf16.cuh; kWaitSplit: a finishing piece's wait for a later CTA's
// partial sums, whose report's step is that CTA).
enum : int { kWaitEmpty = 1, kWaitFull = 2, kWaitStaged = 3, kWaitStagingFree = 4, kWaitSplit = 5 };

inline constexpr int kRowTiles = BN / 16;   // weight row tiles (16 rows × 64 k) per n-tile
inline constexpr int kMaxScaleBytes = 16 * 4;  // scale bytes per row tile and k-tile: 16 rows × 64 / 16

struct NoTables {};
// The activation tiles are 128B-swizzled (the tensor map's), so each starts 1024-byte aligned: the kernels
// align their dynamic shared memory up to kSmemAlign (aligned_smem), and the launch asks for that much
// more than sizeof(Smem) (smem_bytes).
inline constexpr uint32_t kSmemAlign = wgmma::kSw128Atom;
template <int BM, bool kF16 = false>
struct alignas(1024) Smem {
  static constexpr int kStages = kStagesOf<BM, kF16>;
  static_assert(kStages >= 2, "the consumers release a stage one stage late (wgmma_wait<1>)");
  __nv_bfloat16 a[kStages][BM * BK];  // activation tiles (BM, BK) per stage, K-major, 128B-swizzled
  alignas(128) uint4 w[kStages][kRowTiles][32];  // weight codes per stage: row tile j = 4c + warp, lane's 16 B
  // Their scales: row tile j's 16 · sb bytes ([16 rows][sb = 64 / block]) at j · 16 · sb, packed as
  // the tensor copy writes them (128-byte aligned: a tensor copy's destination).
  alignas(128) uint8_t ws[kStages][kRowTiles * kMaxScaleBytes];
  alignas(16) float c[BM * kLdc];     // epilogue staging: [routed row][tile column], alpha·acc + bias
  float rw[BM];                       // FC2: the tile's router weights (router_weight)
  int tok[BM];                        // FC2's scatter-add (MoeGemmParams::out_acc): each row's token
  std::conditional_t<kF16, NoTables, FragTables> tables;  // E2M1 and scale byte → bf16x2, per lane (bf16 only)
  uint64_t full[kStages];             // producer → consumers: the stage's bytes have landed
  uint64_t empty[kStages];            // consumers → producer: stage read by the tensor cores
  uint64_t c_full;                    // consumers → helpers: the tile is staged in c (and rw), 256 arrivals
  uint64_t c_empty;                   // helpers → consumers: c and rw are free again, kHelpers arrivals
  int aborted;                        // watchdog (mbarrier.cuh)
};
// Dynamic shared memory a register-path kernel launches with: the Smem and the alignment slack.
template <int BM, bool kF16>
inline constexpr size_t smem_bytes = sizeof(Smem<BM, kF16>) + kSmemAlign;
static_assert(smem_bytes<32, false> <= 227 * 1024 && smem_bytes<64, false> <= 227 * 1024 &&
                  smem_bytes<128, false> <= 227 * 1024 && smem_bytes<128, true> <= 227 * 1024,
              "past the sm_90 opt-in shared memory per CTA");
// sm_90: 228 KB of shared memory per SM, of which the hardware reserves 1 KB per CTA.
static_assert(kCtasPerSm<32, true> * (smem_bytes<32, true> + 1024) <= 228 * 1024 &&
                  kCtasPerSm<32, false> * (smem_bytes<32, false> + 1024) <= 228 * 1024 &&
                  kCtasPerSm<16, true> * (smem_bytes<16, true> + 1024) <= 228 * 1024 &&
                  kCtasPerSm<16, false> * (smem_bytes<16, false> + 1024) <= 228 * 1024,
              "the two CTAs per SM at BM = 16 and 32 no longer fit the shared memory");
// A kernel's shared-memory struct in its dynamic shared memory, aligned up to kSmemAlign (the
// register path's Smem here, the bf16 path's in dynamic_bf16.cuh; each launch asks for kSmemAlign more).
template <class SmemT>
__device__ __forceinline__ SmemT& aligned_smem(unsigned char* raw) {
  const uint32_t pad = (kSmemAlign - (ptx::smem_addr(raw) & (kSmemAlign - 1))) & (kSmemAlign - 1);
  return *reinterpret_cast<SmemT*>(raw + pad);
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

// The last wave's split (dynamic's gemm_kernel only; static runs whole items). With W work items
// over G persistent CTAs, the W mod G items past the last full wave would run on as many CTAs while
// the rest of the grid idles: at decode (items of 16-32 k-stages, a few waves) that tail is up to a
// fifth of a GEMM (session 24's profiles: SM active 86 % of elapsed in FC1 and FC2 at qwen3-30b-a3b
// T = 16). Instead those items' k-stages are dealt evenly, in order, to `ctas` CTAs (at most G, each at
// least kSplitMinStages): CTA b takes the rest's stages [first(b), first(b + 1)), as pieces of items.
//   whole piece (k-stages 0..ktiles):       as before, its own epilogue;
//   hand-off piece (starts past k-stage 0): stores its fp32 accumulators in slot b of `partials` and
//                                           raises flag b (release): only a CTA's first piece can be one;
//   finishing piece (k-stages 0..k1 < ktiles): the item's first stages, so its CTA runs it last; it then
//                                           adds the later CTAs' slots in k order (acquire, then reset
//                                           each flag to 0 for the next launch) and runs the epilogue.
// The sum's order depends only on W, G and ktiles, so a call's result is deterministic. The waits go
// from a CTA to later CTAs' first pieces, which wait for nothing, and the grid is no larger than the
// CTAs resident at once (launch_dynamic_gemm_bm), so every wait ends. Where fewer are resident (the
// GPU shared with other work), the CTAs start in index order as others exit, as stream-K GEMMs
// assume: a waiting CTA's target is later, started or next to start, and the CTAs before it finish.
// Only the kernels of kSplitTileM-row m-tiles split, and only a rest of at most half the grid
// (split_plan). Session 29 (H100, bench/results/NOTES.md): split wherever the rest allowed, dynamic
// at T = 1-2 on few experts ran 30-47 % faster (llama4-scout T = 1 94.0 -> 49.9 us, mixtral-8x7b
// T = 2 202.6 -> 148.8), but every call with full waves ~10 % slower: the pieces' code after the
// stage loop took ptxas's uniform registers, so each stage's descriptors moved through vector
// registers (R2UR; the BM = 32 stage pair 380 -> 405 instructions, issue-bound). So the whole items
// run in a loop of their own, as before the split, with only the plan's `whole` live across it, and
// the plan is rebuilt for the pieces after it (produce, consume); and only the 16-row kernels' kSplit
// instances (kAuto's decode tile) have the pieces' code at all. A rest past half the grid gains little
// (its CTAs already draw most of the bandwidth, NOTES session 27's stage model) and pays the hand-offs.
// Session 31 (H100, bench/results/h100-decode-20261207-s31-ab.md) measured this split with pieces of at
// least 4 stages, every resident CTA launched and one instance: −20 to −46 % where items are long
// (llama4-scout, mixtral-8x7b T = 1–2: 64–224 stages an item; gpt-oss-120b a16 T = 1–4: 45), but
// +9 / +15 % (a16 / a4) at qwen3-30b-a3b T = 1 (items of 32 and 12 stages cut into pieces of 6–12: the
// hand-offs cost more than the shorter pieces save) and +2 to +8 % where nothing split and the grid
// had grown to every resident CTA (qwen3-30b-a3b T = 2, qwen3-235b-a22b and deepseek-v3 T = 1,
// llama4-scout a4 T = 4; that the grid is the cause is not yet measured). So items shorter than
// kSplitMinItemStages never split, a piece is at least kSplitMinStages long, and the host launches the
// kSplit instance and the whole resident grid only where a split can follow (launch_dynamic_gemm_bm).
inline constexpr int kSplitTileM = 16;
// Fewest k-stages an item must have to be split, and fewest a CTA takes of the rest: a hand-off costs
// its partial sums' store (BN × BM floats), a flag's release and acquire and the finisher's read on
// the finisher's path (session 31: with pieces of 6–12 stages qwen3-30b-a3b T = 1 lost ~2 µs a GEMM).
inline constexpr int kSplitMinItemStages = 40;
inline constexpr int kSplitMinStages = 16;
struct Split {
  float* partials;   // [G][BM / 2][256]: a slot per CTA of the consumers' accumulators, or null: no split
  unsigned* flags;   // [G], 0 between launches
};
// 32-bit throughout (a 64-bit division is a subroutine call, and a call anywhere in the kernel makes
// ptxas serialise its wgmma): the host enables the split only where stages · G < 2^31.
struct SplitPlan {
  int whole;   // items [0, whole) run whole: CTA b takes b, b + G, ...
  int ctas;    // CTAs sharing the rest (0: no split; the rest then runs whole too)
  int stages;  // the rest's k-stages, (work − whole) · ktiles
  __host__ __device__ __forceinline__ int first(int b) const {
    return static_cast<int>(static_cast<unsigned>(stages) * static_cast<unsigned>(b) / static_cast<unsigned>(ctas));
  }
};
// The plan of `work` items of ktiles k-stages over `grid` CTAs (host and device: DynamicSplit in
// tests/gpu/test_gpu_dynamic.cu checks it on the host).
__host__ __device__ __forceinline__ SplitPlan split_plan(bool on, int work, int grid, int ktiles) {
  SplitPlan pl{work, 0, 0};
  const int rest = work % grid;
  if (!on || ktiles < kSplitMinItemStages || rest == 0 || 2 * rest > grid) return pl;
  const int stages = rest * ktiles;
  const int ctas = min(grid, stages / kSplitMinStages);
  if (ctas <= rest) return pl;  // no item would be shared
  pl.whole = work - rest;
  pl.ctas = ctas;
  pl.stages = stages;
  return pl;
}
enum class Piece : int { kWhole, kHandOff, kFinish };
struct ItemPiece {
  int w, k0, k1;  // work item, its k-stages [k0, k1)
  Piece kind;
};
// CTA b's pieces of the rest in order, one a call of next(), after its whole items b, b + G, ... below
// pl.whole (a loop of their own: a loop over both kept the plan live across every stage loop, see
// kSplitTileM).
struct PieceCursor {
  int g, g1;  // the next stage of the rest and the end of this CTA's
  __host__ __device__ __forceinline__ PieceCursor(const SplitPlan& pl, int b)
      : g(b < pl.ctas ? pl.first(b) : 0), g1(b < pl.ctas ? pl.first(b + 1) : 0) {}
  __host__ __device__ __forceinline__ bool next(const SplitPlan& pl, int ktiles, ItemPiece& pc) {
    if (g >= g1) return false;
    const int r = g / ktiles, k0 = g - r * ktiles, k1 = min(ktiles, k0 + (g1 - g));
    pc = {pl.whole + r, k0, k1, k0 > 0 ? Piece::kHandOff : k1 < ktiles ? Piece::kFinish : Piece::kWhole};
    g += k1 - k0;
    return true;
  }
};
// The CTAs whose slots a finishing piece of item w on CTA b adds: [b + 1, finish_end).
__host__ __device__ __forceinline__ int finish_end(const SplitPlan& pl, int b, int w, int ktiles) {
  const int end = (w - pl.whole + 1) * ktiles;  // the item's stages end here in the rest's count
  int e = b + 1;
  while (e < pl.ctas && pl.first(e) < end) ++e;
  return e;
}
// gemm_kernel's plan, from its parameters (the routing's m-tile count is written before the launch).
__device__ __forceinline__ SplitPlan gemm_split_plan(const MoeGemmParams& p, int n_tiles, const Split& split) {
  return split_plan(split.partials != nullptr, *p.num_tiles * n_tiles, static_cast<int>(gridDim.x), p.k_pad / BK);
}

// Expert e's alpha as the register path applies it: × 2^6 for kF16, whose weights frag_a_f16 reads as
// code × scale × 2^-6, and × 2^8 for the bf16 variant on bf16 words (frag_a_bf16w: code × scale ×
// 2^-8); both exact, so the results equal the tables' bit for bit.
template <bool kF16>
__device__ __forceinline__ float expert_alpha(const MoeGemmParams& p, int e) {
  return p.alpha[e] * (kF16 ? 64.0f : (p.bf16_words ? 256.0f : 1.0f));
}

// The end of a tile: consumer warpgroup c's accumulators (weight rows [64c, 64c + 64) × BM routed
// rows, BM / 2 floats per thread) → alpha·acc + bias staged transposed in `stage` (routed row × tile
// column, kLdc floats per row) → the FC1 or FC2 epilogue over both consumers (named barrier 1 over
// their 256 threads; t: this thread in its warpgroup, ct: among both).
// alpha: expert_alpha of the tile's expert. rws (FC2): the tile's router weights in shared memory,
// written before this call (fc2_store_rows).
template <bool kFc1, int BM>
__device__ __forceinline__ void stage_acc(const MoeGemmParams& p, const TileInfo& ti, float alpha,
                                          const float (&acc)[BM / 2], float* stage, int c, int t) {
  // acc element i is D[weight row 64c + acc_row(t, i)][routed row acc_col(t, i)] (wgmma_layout.h).
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
}
// The FC1 or FC2 epilogue of the staged tile ti over `nthreads` threads (this one `tid`): the
// consumers' (finish_tile) or the helpers' (help). rws, toks: FC2's router weights and (for the
// scatter-add) tokens in shared memory; kScatter: the instance with the scatter-add's code.
template <bool kFc1, int BM, bool kScatter = false>
__device__ __forceinline__ void store_tile(const MoeGemmParams& p, const TileInfo& ti, float* stage, const float* rws,
                                           const int* toks, int tid, int nthreads) {
  const int rows = min(BM, ti.valid);
  if constexpr (kFc1) fc1_store_rows<BN, BM <= 32>(p, stage, kLdc, rows, ti.row0, ti.e, ti.y, tid, nthreads);
  else fc2_store_rows<BN, kScatter>(p, stage, kLdc, rows, ti.row0, ti.y, tid, nthreads, rws, toks);
}
// finish_tile: stage_acc, then the epilogue over both consumers (the kernels without helpers).
template <bool kFc1, int BM, bool kF16, bool kScatter = false>
__device__ __forceinline__ void finish_tile(const MoeGemmParams& p, const TileInfo& ti, float alpha,
                                            const float (&acc)[BM / 2], float* stage, int c, int t, int ct,
                                            const float* rws, const int* toks) {
  stage_acc<kFc1, BM>(p, ti, alpha, acc, stage, c, t);
  ptx::named_barrier_sync(1, kConsumers * kWarpgroup);
  store_tile<kFc1, BM, kScatter>(p, ti, stage, rws, toks, ct, kConsumers * kWarpgroup);
  ptx::named_barrier_sync(1, kConsumers * kWarpgroup);  // staging is reused by the next tile
}

// FC2: the router weight of routed row r < 256 of the tile (kRowWeightPad: past its valid rows,
// another row's or 0, never stored), loaded by consumer thread r when the tile starts, so that the
// load completes behind the main loop; the thread stores it to shared memory before the epilogue's
// first barrier. One load whose address needs only the tile's first row: through the row's route
// and behind the valid-row test it was a chain of four dependent loads at every tile's start (7.4 %
// of FC2's stall samples at qwen3-30b-a3b a4 T = 16, NOTES session 23).
__device__ __forceinline__ float router_weight(const MoeGemmParams& p, const TileInfo& ti, int r) {
  return p.row_weight[ti.row0 + r];
}

// Thread 0, before the CTA's first __syncthreads: the stages' barriers ("full" completes a phase
// after the producer's one arrival and the bytes it announced, "empty" after both consumers'), the
// watchdog flag, and a fence that makes the initialisations visible to the async proxy (the tensor
// and bulk copies completing on "full"). kRing: the ring's stages (the bf16 path has its own count).
template <int kRing>
__device__ __forceinline__ void init_pipeline(uint64_t* full, uint64_t* empty, int* aborted) {
  static_assert(kRing >= 2, "the consumers release a stage one stage late (wgmma_wait<1>)");
  for (int s = 0; s < kRing; ++s) {
    ptx::mbar_init(&full[s], 1);
    ptx::mbar_init(&empty[s], kWarpgroup * kConsumers);
  }
  *aborted = 0;
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Row tile j (weight rows 16j.. of the n-tile) of the work item: whether it is inside w_rows
// (w_rows % 16 == 0: all 16 rows or none) and its first fragment tile (k-tile 0), the expert's
// first one when it is not (the bf16 path's dequantiser, dynamic_bf16.cuh). Tile indices fit 32 bits
// (2^32 tiles would be 2 TB of codes).
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

// The register path's tensor maps (built on the host, host/tensor_map.h register_path_maps), passed
// to the kernel as one __grid_constant__ parameter:
//   a       p.a, k_pad × a_rows 16-bit values, boxes of 64 k × BM rows, 128B-swizzled;
//   codes   p.w_frag as (128 words of a 512-byte tile) × (k_pad / 64 k-tiles) × (w_experts · w_rows / 16
//           row tiles), boxes of one k-tile of kBoxTiles row tiles (4 for a gated FC1, 8 otherwise);
//   scales  p.s_frag alike, 16 · 64 / block bytes per tile.
// Row tiles past the last expert's arrive as zeros.
struct TensorMaps {
  CUtensorMap a, codes, scales;
};

// Row tile j of the n-tile (weight rows 16j..) as the maps count it: the expert's first row tile plus
// weight_row / 16. Past w_rows (the last n-tile of a non-gated FC1 or of FC2) it names the next
// expert's rows or rows past the tensor (zeros); their output columns are never stored (consume).
template <bool kFc1>
__device__ __forceinline__ int map_row_tile(const MoeGemmParams& p, const TileInfo& ti, int j) {
  return ti.e * (p.w_rows / 16) + weight_row<BN>(p, kFc1, ti.y, 16 * j) / 16;
}

// The producer, thread 0 of its warpgroup (the other 127 return from produce): per stage of work item
// w (produce_item), once the consumers have freed it, it announces the stage's bytes on "full"
// (constant: the activation box and 8 row tiles of codes and scales, zeros included) and issues the
// tensor copies of the activation tile (rows row0.., k = kt·64..) and of the n-tile's codes and
// scales (one box of 8 row tiles, or for a gated FC1 two boxes of 4: the gate rows' and the up
// rows'). Everything completes on "full" with its bytes, so the producer runs ahead as far as the
// ring allows.
// it: the ring's stages this thread has used so far (0 for the dynamic backend's one GEMM; the static
// backend runs FC1's and FC2's items on one ring), advanced past the item's; the consumers count alike.
// produce: CTA b's items b, b + G, ... below `whole`, then its pieces of the rest (PieceCursor) of one
// GEMM (dynamic; static_moe.cuh runs FC1's and then FC2's items whole).
// ready (static's FC2, else null): before an item's first copy, wait until ready[its m-tile] reaches
// `need` (FC1's items of that m-tile have all stored their A2 rows: consume's `done`), then fence
// for the tensor copies that read them. started (static's trace, else null): the time past that wait.
// k0, k1: the item's k-stages [k0, k1) (a piece of the last wave's split; k1 = -1: to the end).
template <bool kFc1, int BM, bool kF16>
__device__ __forceinline__ void produce_item(const MoeGemmParams& p, const TensorMaps* maps, Smem<BM, kF16>& sm,
                                             int n_tiles, int w, const ptx::Watchdog& wd, uint32_t& it,
                                             const unsigned* ready = nullptr, unsigned need = 0,
                                             unsigned long long* started = nullptr, int k0 = 0, int k1 = -1) {
  const int kend = k1 < 0 ? p.k_pad / BK : k1;
  const int scale_bytes = 16 * (64 / p.block);
  constexpr int kRing = Smem<BM, kF16>::kStages;
  constexpr uint32_t kCodeBytes = 32 * sizeof(uint4), kTileBytes = BM * BK * 2;
  const uint32_t stage_bytes = kTileBytes + kRowTiles * (kCodeBytes + static_cast<uint32_t>(scale_bytes));
  const bool halves = kFc1 && p.gated;  // two boxes of kRowTiles / 2 row tiles
  const TileInfo ti = tile_info<BM>(p, w, n_tiles);
  const int tile0 = map_row_tile<kFc1>(p, ti, 0), tile1 = map_row_tile<kFc1>(p, ti, kRowTiles / 2);
  if (ready) {
    while (ptx::ld_acquire_gpu(ready + w / n_tiles) < need) __nanosleep(32);
    ptx::fence_proxy_async_global();  // the writers' A2 (generic proxy) → this CTA's tensor copies
  }
  if (started) *started = ptx::globaltimer_ns();  // diagnostics (static's trace)
  for (int kt = k0; kt < kend; ++kt, ++it) {
    const int s = it % kRing;
    ptx::mbar_wait(&sm.empty[s], ((it / kRing) & 1) ^ 1, wd, kWaitEmpty, it);
    ptx::mbar_arrive_expect_tx(&sm.full[s], stage_bytes);  // before the copies it announces
    ptx::tma_load_2d(sm.a[s], &maps->a, kt * BK, ti.row0, &sm.full[s]);
    ptx::tma_load_3d(sm.w[s][0], &maps->codes, 0, kt, tile0, &sm.full[s]);
    ptx::tma_load_3d(&sm.ws[s][0], &maps->scales, 0, kt, tile0, &sm.full[s]);
    if (halves) {
      ptx::tma_load_3d(sm.w[s][kRowTiles / 2], &maps->codes, 0, kt, tile1, &sm.full[s]);
      ptx::tma_load_3d(&sm.ws[s][kRowTiles / 2 * scale_bytes], &maps->scales, 0, kt, tile1, &sm.full[s]);
    }
  }
}
template <bool kFc1, int BM, bool kF16, bool kSplit = false>
__device__ __forceinline__ void produce(const MoeGemmParams& p, const TensorMaps* maps, Smem<BM, kF16>& sm, int n_tiles,
                                        const Split& split, int whole, const ptx::Watchdog& wd, uint32_t& it) {
  if (threadIdx.x != 0) return;
  for (int w = blockIdx.x; w < whole; w += gridDim.x) produce_item<kFc1, BM, kF16>(p, maps, sm, n_tiles, w, wd, it);
  if constexpr (kSplit) {
    const SplitPlan pl = gemm_split_plan(p, n_tiles, split);
    ItemPiece pc;
    for (PieceCursor cur(pl, blockIdx.x); cur.next(pl, p.k_pad / BK, pc);)
      produce_item<kFc1, BM, kF16>(p, maps, sm, n_tiles, pc.w, wd, it, nullptr, 0, nullptr, pc.k0, pc.k1);
  }
}

// The last wave's split (SplitPlan), consumer threads ct = 0..255 of a CTA's two warpgroups. A hand-off
// piece: the accumulators into this CTA's slot (element i of thread ct at [i][ct]: each store a
// warp's 128 contiguous bytes), then, once every thread has stored (named barrier 1), flag b raised
// with release semantics at GPU scope.
template <int BM>
__device__ __forceinline__ void hand_off(const Split& sp, const float (&acc)[BM / 2], int ct) {
  constexpr int kN = kConsumers * kWarpgroup;
  float* slot = sp.partials + static_cast<size_t>(blockIdx.x) * (BM / 2) * kN;
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) __stcg(slot + i * kN + ct, acc[i]);
  ptx::named_barrier_sync(1, kN);
  if (ct == 0) ptx::st_release_gpu(sp.flags + blockIdx.x, 1u);
}
// A finishing piece of item w: adds, in k order, the slots of the CTAs b + 1, b + 2, ... whose ranges
// start inside the item (each waits for its flag with acquire semantics, every thread for itself),
// then resets their flags for the next launch once every thread has read (named barrier 1).
template <int BM>
__device__ __forceinline__ void add_partials(const Split& sp, const SplitPlan& pl, int w, int ktiles,
                                             float (&acc)[BM / 2], int ct, const ptx::Watchdog& wd) {
  constexpr int kN = kConsumers * kWarpgroup;
  const int e = finish_end(pl, static_cast<int>(blockIdx.x), w, ktiles);
  for (int b = static_cast<int>(blockIdx.x) + 1; b < e; ++b) {
    ptx::flag_wait(sp.flags + b, wd, kWaitSplit, b);
    const float* slot = sp.partials + static_cast<size_t>(b) * (BM / 2) * kN;
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) acc[i] += __ldcg(slot + i * kN + ct);
  }
  ptx::named_barrier_sync(1, kN);
  if (ct == 0)
    for (int b = static_cast<int>(blockIdx.x) + 1; b < e; ++b) sp.flags[b] = 0;
}

// Consumer warpgroup c (0 or 1): weight rows [64c, 64c + 64) of each n-tile against all BM routed
// rows of the m-tile. Every warp takes part in every wgmma (sync.aligned); a warp whose 16 weight rows
// are past w_rows (last n-tile of a non-gated FC1 or of FC2) dequantises what the tensor copy put in
// its slots (the next expert's rows, or zeros past the last expert): finite values whose output
// columns the epilogues never store (FC2 stops at H, FC1 at i_pad, in whole quantisation blocks).
// kF16 (NVFP4 weights, NVFP4-a4 activations stored as f16): the weights become f16 A fragments by
// bit moves and E4M3 conversions (frag_a_f16, ~18 instructions per k16 step and lane, no shared
// loads) instead of the per-lane tables (frag_a_bf16: 6 LDS, their address IMADs and PRMTs; the
// profile counted 68 instructions per HGMMA in all, NOTES session 11), and the wgmma reads f16.
// The bf16 variant on bf16 words (MoeGemmParams::bf16_words: NVFP4-a16 and -a8) likewise has no table
// loads (frag_a_bf16w, 13 instructions a step); its tables serve MX weights. Why: at decode the
// tables' LDS made a16 issue-bound (deepseek-v3 T = 64 FC1 on the H100: 960 M instructions against
// a4's 666 M, 226 M shared wavefronts against 63 M, issue slots 72 %, NOTES session 42).
// done (static's FC1, else null): after an item's epilogue has stored its A2 rows, every consumer
// thread fences them for the async proxy, and once both consumers have (named barrier 1) one thread
// adds 1 to done[its m-tile] with release semantics (produce's `ready`).
// k0, k1, kind, split, plan (dynamic's last-wave split, SplitPlan; k1 = -1: to the end): the item's
// k-stages [k0, k1), and after them a hand-off piece stores its accumulators in this CTA's slot and
// returns without an epilogue, a finishing piece adds the slots of the CTAs that took its later
// stages before the epilogue (add_partials).
// kParts (diagnostics: GpuDiagnostics.DISABLED_RegisterPathStagePerCta; the kernels use the default,
// kAllParts): which parts of a stage run — kDequant (the fragments from the stage's codes and
// scales; without it the raw code words stand in) and kMma (the wgmma group; without it the
// fragments are folded into one accumulator) — and only with both the epilogue.
// kScatter: FC2's scatter-add (MoeGemmParams::out_acc) compiled in; only dynamic's non-split FC2
// kernels have it (with it static's and the split's item loops grew 80 instructions and the split's
// f16 stage loop 12, session 33), and the host gives out_acc to no other.
enum : int { kDequant = 1, kMma = 2, kAllParts = 3 };
// kHelp (dynamic's gemm_kernel at BM >= 64, kHelpOf): the epilogue goes to the helpers (help): the
// consumers wait until the staging is free (c_empty), stage the tile and its router weights, arrive
// on c_full and return to the next item.
// kHelp at BM = 128 (kNarrow): the MMAs are only as wide as the item's valid rows need, in quarters of
// BM (an expert's last m-tile holds its rows mod BM, and part of a stage's time goes with the width;
// session 35: at 64-row tiles the narrow widths gained nothing at a4 and lost at a16): one stage loop whose
// MMA block picks the width (one uniform branch a stage), all widths accumulating into the first
// columns of the same acc. Why one loop: a copy of the stage loop per width, inlined side by side,
// made ptxas serialise every wgmma of the kernel (C7512, insufficient registers at the 96-register
// launch bound, even for two copies of one width; session 35). Why narrow: the m-tile rule
// (launch_dynamic.cu dynamic_tile_m) gives a tile twice the average rows per expert, so at 64 routed
// rows per expert (deepseek-v3 T = 2048, qwen3-30b-a3b T = 1024) 128-row tiles multiplied about
// twice the rows they hold. known: the item's TileInfo, already loaded (consume loads the next
// item's behind the current one: the width is needed at the first stage's MMAs).
template <bool kFc1, int BM, bool kF16, int kParts = kAllParts, bool kHelp = false, bool kScatter = false>
__device__ __forceinline__ void consume_item(const MoeGemmParams& p, Smem<BM, kF16>& sm, int n_tiles, int w,
                                             const ptx::Watchdog& wd, uint32_t& it, unsigned* done = nullptr,
                                             int k0 = 0, int k1 = -1, Piece kind = Piece::kWhole,
                                             const Split* split = nullptr, const SplitPlan* plan = nullptr,
                                             const TileInfo* known = nullptr) {
  const int c = threadIdx.x / kWarpgroup - 1;
  const int t = threadIdx.x % kWarpgroup, warp = t >> 5, lane = t & 31;
  const int ct = threadIdx.x - kWarpgroup;  // 0..255: this thread among both consumers (epilogue)
  const int ktiles = (k1 < 0 ? p.k_pad / BK : k1) - k0;  // this piece's k-stages
  const int sb = kF16 ? 4 : 64 / p.block, j = 4 * c + warp;  // j: this warp's row tile
  const uint32_t a_base = ptx::smem_addr(sm.a[0]);
  FragLut lut{};  // the bf16 variant's tables (the f16 one has none)
  if constexpr (!kF16) {
    lut = frag_lut(sm.tables);
    if constexpr (kHelp) asm volatile("" : "+r"(lut.e2m1), "+r"(lut.scale));  // as w_addr0 below
  }
  constexpr int kRing = Smem<BM, kF16>::kStages;
  // Stage s's operands lie constant strides past stage 0's: this lane's codes, its row tile's scale
  // bytes, the activation tile's descriptor (its address field counts 16-byte units; shared
  // addresses stay below 2^18, so nothing carries out of it). Taken once an item, so a stage adds
  // s · stride instead of converting generic pointers and rebuilding the descriptor (~20 of a BM = 32
  // stage's ~150 instructions, NOTES session 12).
  uint32_t w_addr0 = ptx::smem_addr(&sm.w[0][j][lane]), ws_addr0 = ptx::smem_addr(&sm.ws[0][j * 16 * sb]);
  if constexpr (kHelp) {
    // ptxas weighs the helpers' kernels' register pressure at their launch count (96 for 640
    // threads), not the consumers' after setmaxnreg, and re-derived these addresses (with the scale
    // bytes' lane offset, and the bf16 tables' lut) from threadIdx in every stage (+49 instructions
    // a stage pair at BM = 128). Opaque, they stay in registers.
    ws_addr0 += (lane >> 2) * (sb == 4 ? 4 : 2);  // frag_scales_smem<true>
    asm volatile("" : "+r"(w_addr0), "+r"(ws_addr0));
  }
  constexpr uint32_t kWStride = sizeof(sm.w[0]), kWsStride = sizeof(sm.ws[0]);
  const uint64_t desc_base = wgmma::operand_desc_sw128(a_base, 0, 0);
  const uint64_t kDescStride = wgmma::tile_bytes(BM) >> 4;
  float acc[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) acc[i] = 0.0f;  // never read: each tile's first wgmma has scale-d = 0
  const TileInfo ti = known ? *known : tile_info<BM>(p, w, n_tiles);
  // kNarrow: the MMAs' width in quarters of BM, 1..4.
  constexpr bool kNarrow = kHelp && kNarrowOf<BM>;
  const int quarters = kNarrow ? min(4, (ti.valid + BM / 4 - 1) / (BM / 4)) : 4;
  const float rw = kFc1 || ct >= BM ? 0.0f : router_weight(p, ti, ct);
  // The scatter-add's token of row ct, loaded beside the router weight (the epilogue's loop then
  // reads shared memory only); rows past the tile's valid ones are never stored.
  const int tok = kScatter && p.out_acc && ct < ti.valid ? p.row_route[ti.row0 + ct] / p.top_k : 0;
  // FC2's alpha here, with the router weight (FC1's in the epilogue: its consumers have no load at the
  // tile's start to share the wait for the tile's expert with); 3.6 % of FC2's stall samples were on
  // it in the epilogue (NOTES session 23).
  const float alpha = kFc1 ? 0.0f : expert_alpha<kF16>(p, ti.e);
  // Two sets of A fragments: while stage kt - 1's MMAs run, the warpgroup dequantises stage kt into
  // the other set; wgmma_wait<1> then frees stage kt - 1's set and its stage (tile and weights).
  uint32_t a0[4][4], a1[4][4];
  auto stage = [&](int kt, uint32_t (&a)[4][4]) {
    const int s = it % kRing;
    ptx::mbar_wait(&sm.full[s], (it / kRing) & 1, wd, kWaitFull, it);
    // A row tile past w_rows takes no branch: with one, ptxas zeroed the 16 fragment registers
    // before it on every stage (8 CS2R and the branch's BSSY/BSYNC/BRA: ~11 of a BM = 32 stage's
    // ~160 instructions, NOTES session 12); with a select of a zeroed block and a stride of 0, the
    // runtime strides cost ~15 a stage (session 16).
    const uint4 codes = ptx::ld_shared_v4(w_addr0 + s * kWStride);  // one LDS.128
    uint32_t slo, shi;
    frag_scales_smem<kHelp>(ws_addr0 + s * kWsStride, sb, slo, shi);
    const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
    if constexpr (!(kParts & kDequant)) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int r = 0; r < 4; ++r) a[ks][r] = words[(ks + r) & 3] ^ (r & 1 ? shi : slo);
    } else if constexpr (kF16) {
      const F16Scales f16s = frag_scales_f16(slo, shi);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) frag_a_f16(words[ks], f16s, ks, a[ks]);
    } else if (p.bf16_words) {  // NVFP4 with bf16 operands: no table loads (one uniform branch a stage)
      const Bf16wScales bws = frag_scales_bf16w(slo, shi);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) frag_a_bf16w(words[ks], bws, ks, a[ks]);
    } else {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) frag_a_bf16(lut, words[ks], slo, shi, ks, a[ks]);
    }
    if constexpr (!(kParts & kMma)) {
      uint32_t x = 0;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int r = 0; r < 4; ++r) x ^= a[ks][r];
      acc[0] += __uint_as_float(x & 0x3FFFFFFFu);  // keeps the fragments alive
      if (kt > 0) ptx::mbar_arrive(&sm.empty[(it - 1) % kRing]);
      ++it;
      return;
    }
    // No proxy fence here: the stage was written by the async proxy (tensor and bulk copies) and
    // completed "full", whose wait makes it visible to this thread and to its wgmma.
    ptx::fence_operand(acc);
    // The stage's k16 steps lie 32 bytes apart in the swizzled rows (operand_desc_sw128): added to
    // the descriptor's address field (16-byte units; shared addresses stay below 2^18, so nothing
    // carries out of it) instead of building each descriptor (~5 uniform instructions per wgmma).
    const uint64_t desc0 = desc_base + s * kDescStride;
    // The stage's 4 k16 steps at N = width, as one group. Fence and commit inside each width's branch:
    // with the commit after the branches joined, ptxas closed the group with an empty HGMMA there, so
    // wgmma_wait<1> waited for this stage's own MMAs.
    auto mmas = [&](auto width) {
      constexpr int N = decltype(width)::value;
      float(&d)[N / 2] = *reinterpret_cast<float(*)[N / 2]>(&acc[0]);
      ptx::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) ptx::mma_m64nNk16_rs<N, kF16>(d, a[ks], desc0 + 2 * ks, (kt | ks) != 0);
      ptx::wgmma_commit();
    };
    if constexpr (kNarrow) {
      if (quarters == 4) mmas(std::integral_constant<int, BM>{});
      else if (quarters == 3) mmas(std::integral_constant<int, 3 * BM / 4>{});
      else if (quarters == 2) mmas(std::integral_constant<int, BM / 2>{});
      else mmas(std::integral_constant<int, BM / 4>{});
    } else {
      mmas(std::integral_constant<int, BM>{});
    }
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
  if constexpr (kParts & kMma) {
    ptx::wgmma_wait<0>();
    ptx::fence_operand(acc);
  }
  ptx::mbar_arrive(&sm.empty[(it - 1) % kRing]);
  if constexpr (kParts != kAllParts) {
    if (acc[0] == 1.2345e-30f) p.y[0] = acc[1];  // keeps the stages' work; practically never taken
    return;
  }
  if (kind == Piece::kHandOff) {
    hand_off<BM>(*split, acc, ct);
    return;
  }
  if (kind == Piece::kFinish) add_partials<BM>(*split, *plan, w, p.k_pad / BK, acc, ct, wd);

  if constexpr (kHelp) {
    static_assert(BM <= 128 && kParts == kAllParts, "the helpers' staging holds the whole tile");
    const int u = (w - static_cast<int>(blockIdx.x)) / static_cast<int>(gridDim.x);  // this CTA's item count
    ptx::mbar_wait(&sm.c_empty, (u & 1) ^ 1, wd, kWaitStagingFree, u);
    if (!kFc1 && ct < BM) sm.rw[ct] = rw;
    if (kScatter && ct < BM) sm.tok[ct] = tok;
    stage_acc<kFc1, BM>(p, ti, kFc1 ? expert_alpha<kF16>(p, ti.e) : alpha, acc, sm.c, c, t);
    ptx::mbar_arrive(&sm.c_full);  // release: the helpers' wait sees the staging
    return;
  }
  if (!kFc1 && ct < BM) sm.rw[ct] = rw;  // read after finish_tile's first barrier
  if (kScatter && ct < BM) sm.tok[ct] = tok;
  finish_tile<kFc1, BM, kF16, kScatter>(p, ti, kFc1 ? expert_alpha<kF16>(p, ti.e) : alpha, acc, sm.c, c, t, ct,
                                        sm.rw, sm.tok);
  if (done) {
    ptx::fence_proxy_async_global();
    ptx::named_barrier_sync(1, kConsumers * kWarpgroup);
    if (ct == 0) ptx::red_release_gpu_add(done + w / n_tiles, 1);
  }
}
// CTA b's items b, b + G, ... below `whole`, then its pieces of the rest (PieceCursor) of one GEMM
// (dynamic; static_moe.cuh runs FC1's and then FC2's items whole).
// kHelp at BM = 128: each item's TileInfo is loaded behind the item before it (consume_item's
// narrow MMAs need its valid rows at the first stage).
template <bool kFc1, int BM, bool kF16, bool kSplit = false, bool kHelp = false>
__device__ __forceinline__ void consume(const MoeGemmParams& p, Smem<BM, kF16>& sm, int n_tiles, const Split& split,
                                        int whole, const ptx::Watchdog& wd, uint32_t& it) {
  // The scatter-add's code only where the host can ask for it (launch_dynamic_gemm_bm).
  constexpr bool kScatter = !kFc1 && !kSplit;
  if constexpr (kHelp && kNarrowOf<BM>) {
    static_assert(!kSplit, "the helpers' kernels run whole items");
    const int grid = static_cast<int>(gridDim.x);
    TileInfo ti = static_cast<int>(blockIdx.x) < whole ? tile_info<BM>(p, blockIdx.x, n_tiles) : TileInfo{};
    for (int w = blockIdx.x; w < whole; w += grid) {
      const TileInfo next = w + grid < whole ? tile_info<BM>(p, w + grid, n_tiles) : ti;
      consume_item<kFc1, BM, kF16, kAllParts, true, kScatter>(p, sm, n_tiles, w, wd, it, nullptr, 0, -1, Piece::kWhole,
                                                              nullptr, nullptr, &ti);
      ti = next;
    }
  } else {
    for (int w = blockIdx.x; w < whole; w += gridDim.x)
      consume_item<kFc1, BM, kF16, kAllParts, kHelp, kScatter>(p, sm, n_tiles, w, wd, it);
  }
  if constexpr (kSplit) {
    const SplitPlan pl = gemm_split_plan(p, n_tiles, split);
    ItemPiece pc;
    for (PieceCursor cur(pl, blockIdx.x); cur.next(pl, p.k_pad / BK, pc);)
      consume_item<kFc1, BM, kF16>(p, sm, n_tiles, pc.w, wd, it, nullptr, pc.k0, pc.k1, pc.kind, &split, &pl);
  }
}

// The helpers (kHelp): helper h of kHelpers runs the epilogue of each of this CTA's items, in the
// consumers' order, once they have staged it (c_full), then hands the staging back (c_empty).
template <bool kFc1, int BM, bool kF16>
__device__ __forceinline__ void help(const MoeGemmParams& p, Smem<BM, kF16>& sm, int n_tiles, int whole, int h,
                                     const ptx::Watchdog& wd) {
  int u = 0;
  for (int w = blockIdx.x; w < whole; w += gridDim.x, ++u) {
    const TileInfo ti = tile_info<BM>(p, w, n_tiles);
    ptx::mbar_wait(&sm.c_full, u & 1, wd, kWaitStaged, u);
    store_tile<kFc1, BM, !kFc1>(p, ti, sm.c, sm.rw, sm.tok, h, kHelpers);
    ptx::mbar_arrive(&sm.c_empty);  // release: this thread's reads of the staging come before
  }
}

// A register-path CTA's start (dynamic's gemm_kernel, static's static_kernel), all threads: the
// ring's barriers (thread 0; "full" takes the producer's one arrival with the stage's bytes), the
// bf16 variant's lookup tables (not on bf16 words, whose dequantisation reads none), then a
// __syncthreads.
template <int BM, bool kF16>
__device__ __forceinline__ void start_cta(Smem<BM, kF16>& sm, bool nvfp4, bool bf16_words) {
  if (threadIdx.x == 0) {
    init_pipeline<Smem<BM, kF16>::kStages>(sm.full, sm.empty, &sm.aborted);
    ptx::mbar_init(&sm.c_full, kConsumers * kWarpgroup);  // the helpers' (kHelp; unused otherwise)
    ptx::mbar_init(&sm.c_empty, kHelpers);
  }
  if constexpr (!kF16)
    if (!bf16_words) fill_frag_tables(sm.tables, nvfp4, threadIdx.x, blockDim.x);  // 384 or 640 threads
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
// kSplit, split: the last wave's split (Split, SplitPlan; only BM = kSplitTileM has the instance, and
// the host launches it only where the items are long enough to split, kSplitMinItemStages: every
// other call runs the kSplit = false instance, whose stage loops are main's, 402 / 274 / 369 / 274
// instructions at BM = 16 for FC2 bf16 / f16, FC1 bf16 / f16; the pieces' code after the whole items'
// loop costs the f16 FC1 loop 7 (281: threadIdx re-read twice a stage), the FC2 loops none).
// maps: the activation, code and scale tensor maps (TensorMaps; host/tensor_map.h register_path_maps).
// watchdog: optional global int[ptx::kWatchdogReportInts], zeroed, that a pipeline wait past
// ptx::kWatchdogNs fills (tests); null in production, where waits have no time limit.
// kF16 = p.f16 (the host launches the matching instance): consume's f16 variant, no tables to fill.
// kHelp (kHelpOf<BM>, never with the split): kHelpThreads threads, the epilogue on the helpers (help).
template <bool kFc1, int BM, bool kF16, bool kSplit = false>
__global__ void __launch_bounds__(kSplit ? kThreads : kGemmThreads<BM>, kCtasPerSm<BM, kF16>)
    gemm_kernel(MoeGemmParams p, const __grid_constant__ TensorMaps maps, int n_tiles, Split split, int* watchdog) {
  static_assert(!kSplit || BM == kSplitTileM, "the split's instances are the 16-row kernels'");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  Smem<BM, kF16>& sm = aligned_smem<Smem<BM, kF16>>(smem_raw);
  // Launched as a programmatic dependent (launch_dynamic.cu): the CTA's set-up (barriers, the bf16
  // variant's tables) overlaps the tail of the kernel before; everything after the wait reads its
  // output. The kernel after this one may launch now: it waits for this one to complete.
  ptx::launch_dependents();
  start_cta(sm, p.nvfp4, p.bf16_words);
  ptx::wait_prior_grids();
  const ptx::Watchdog wd{&sm.aborted, watchdog};
  const int whole = kSplit ? gemm_split_plan(p, n_tiles, split).whole : *p.num_tiles * n_tiles;
  uint32_t it = 0;
  constexpr bool kHelp = kHelpOf<BM> && !kSplit;
  if constexpr (kHelp) {
    // Warpgroup 0 gives registers back to kProducerRegs (thread 0 produces, warps 1-3 return), the
    // helpers (3, 4) to kHelperRegs; the consumers (1, 2) take what that frees (kHelpConsumerRegs).
    const int wg = threadIdx.x / kWarpgroup;
    if (wg == 0) {
      ptx::setmaxnreg_dec<kProducerRegs>();
      if (threadIdx.x == 0) produce<kFc1, BM, kF16>(p, &maps, sm, n_tiles, split, whole, wd, it);
    } else if (wg > kConsumers) {
      ptx::setmaxnreg_dec<kHelperRegs>();
      help<kFc1, BM, kF16>(p, sm, n_tiles, whole, threadIdx.x - kThreads, wd);
    } else {
      ptx::setmaxnreg_inc<kHelpConsumerRegs>();
      consume<kFc1, BM, kF16, false, true>(p, sm, n_tiles, split, whole, wd, it);
    }
  } else if (take_role<BM, kF16>()) {
    produce<kFc1, BM, kF16, kSplit>(p, &maps, sm, n_tiles, split, whole, wd, it);
  } else {
    consume<kFc1, BM, kF16, kSplit>(p, sm, n_tiles, split, whole, wd, it);
  }
}

}  // namespace fp4moe::kernels::dynamic
