// The grouped GEMMs' problem description and epilogues, shared by the generic (mma.sync) and dynamic
// (wgmma) backends. The GEMM core differs per backend; what happens to a finished tile does not:
//
//   FC1:  alpha·acc + bias → activation → bf16 → Q2 (quantise-dequantise) → A2[row]   (bf16)
//   FC2:  alpha·acc + bias → · router weight → Y[row]                                 (fp32)
//
// A backend stages `alpha·acc + bias` of its tile in shared memory, row-major, `ldc` floats per row,
// BN virtual columns (see weight_row), then calls fc1_store_rows / fc2_store_rows.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "fp4moe/activation.h"
#include "kernels/common/quantize.cuh"
#include "kernels/common/routing.cuh"  // kRowWeightPad

namespace fp4moe::kernels {

struct MoeGemmParams {
  const __nv_bfloat16* a;       // [rows][k_pad] activations (A1 or A2)
  int a_rows;                   // rows of `a` this call wrote (the bf16 path's tensor map spans them)
  const uint4* w_frag;          // [E_local][w_rows / 16][k_pad / 64] tiles in mma-fragment order (device_weights.h)
  const uint8_t* s_frag;        // their block scales, 16 · 64 / block bytes per tile
  int w_rows, k_pad;
  int w_experts;                // experts w_frag holds (E_local): the register path's weight tensor maps span them
  bool nvfp4;                   // weight scale type: E4M3 (true) or UE8M0
  bool f16_words;               // code words stored as f16 words (DeviceWeights::f16_words, fragment_layout.h)
  bool bf16_words;              // code words stored as bf16 words (DeviceWeights::bf16_words): the register
                                // path's bf16 variant reads them with frag_a_bf16w, alpha taken × 2^8
  int block;                    // weight scale block: 16 or 32
  const int* tile_expert;       // routing schedule
  const int* tile_row0;
  const int* num_tiles;
  const int* expert_offset;
  // dynamic's bf16 path (dynamic_bf16.cuh) runs one group of experts [expert_base, expert_base +
  // expert_count) at a time, their weights dequantised into w_bf16; the group's m-tiles are
  // [expert_tile_offset[expert_base], expert_tile_offset[expert_base + expert_count]) of the list.
  const int* expert_tile_offset;
  int expert_base, expert_count;
  __nv_bfloat16* w_bf16;
  const float* alpha;           // [E_local]
  const float* bias;            // [E_local][w_rows] or null
  // The register path's NVFP4-a4 variant (dynamic.cuh, kF16): `a` and `a2` hold f16 instead of bf16
  // (store_act), the weights are read as f16 code × scale × 2^-6 and alpha is taken × 2^6.
  bool f16;
  // FC1 epilogue
  bool gated;
  int i_pad;
  Activation activation;
  float sw_alpha, sw_beta, sw_limit;
  QuantKind q2;                 // how the intermediate is quantised
  const float* q2_scale;        // [E_local] NVFP4 decode scale of the FC2 input
  __nv_bfloat16* a2;            // [rows][i_pad]
  // FC2 epilogue
  int hidden;
  int top_k;
  const float* row_weight;      // [rows + kRowWeightPad] router weight of each routed row (routing.cuh)
  float* y;                     // [rows][hidden]
  // The scatter-add instead of Y (dynamic's register path, RunnerOptions::deterministic false): each
  // routed row's weighted values are added to out_acc[token][·] (fp32, zeroed before the call) by
  // vector reductions, token = row_route[row] / top_k; the top-k sum then needs no Y and no combine.
  float* out_acc;               // [tokens][hidden] or null (Y)
  const int* row_route;         // [rows] the route of each routed row (routing.cuh)
};

// Weight row (within the expert) feeding virtual column v of n-tile y, for a tile of BN columns. For
// a gated FC1 the tile holds BN/2 up rows then the BN/2 gate rows of the same intermediate columns,
// so the epilogue sees both halves of its activation (i_pad is a multiple of BN/2). Otherwise the
// rows are y·BN + v, which can pass w_rows in the last n-tile when w_rows is not a multiple of BN:
// such columns must be masked (weight_row_valid).
template <int BN>
__device__ __forceinline__ int weight_row(const MoeGemmParams& p, bool fc1, int y, int v) {
  if (fc1 && p.gated) return v < BN / 2 ? y * (BN / 2) + v : p.i_pad + y * (BN / 2) + (v - BN / 2);
  return y * BN + v;
}
template <int BN>
__device__ __forceinline__ bool weight_row_valid(const MoeGemmParams& p, bool fc1, int y, int v) {
  return weight_row<BN>(p, fc1, y, v) < p.w_rows;
}

// The gated activations (silu, gelu_tanh, swiglu_oai) in one branch-free form, the same operations
// in the same order as apply_activation<float> for each:
//   g' = min(g, limit), u' = clamp(u, ±limit) (+ β for swiglu_oai), y = g' (+ 0.044715·g'³ for
//   gelu_tanh), x = s2·(s1·y), h = g'·σ(x)·u'
// with limit = +inf except for swiglu_oai, (s1, s2) = (1, 1) for silu, (√(2/π), 2) for gelu_tanh
// (its σ(2z)), (α, 1) for swiglu_oai; the multiplications by 1 and 2 are exact. Why: a loop over
// pairs can then be unrolled for latency without one copy of the code per activation (a runtime
// switch inside an unrolled loop made an FC1 kernel 28.8 K instructions, NOTES session 7).
struct GatedActivation {
  float limit, beta, s1, s2;
  bool cube, add_beta;
  __device__ explicit GatedActivation(const MoeGemmParams& p)
      : limit(p.activation == Activation::kSwigluOai ? p.sw_limit : __builtin_huge_valf()),
        beta(p.sw_beta),
        s1(p.activation == Activation::kGeluTanh ? 0.7978845608028654f
                                                  : (p.activation == Activation::kSwigluOai ? p.sw_alpha : 1.0f)),
        s2(p.activation == Activation::kGeluTanh ? 2.0f : 1.0f),
        cube(p.activation == Activation::kGeluTanh),
        add_beta(p.activation == Activation::kSwigluOai) {}
  __device__ __forceinline__ float operator()(float g, float u) const {
    g = g > limit ? limit : g;  // NaN stays NaN, as in apply_activation
    u = u < -limit ? -limit : (u > limit ? limit : u);
    u = add_beta ? u + beta : u;
    const float y = cube ? g + 0.044715f * g * g * g : g;
    return g * sigmoid(s2 * (s1 * y)) * u;
  }
};

// One quantisation block of the FC1 epilogue: kBlock intermediate columns col0.. of one staged row
// (crow 16-byte aligned: the staging row strides are multiples of 4 floats). The activation runs
// in a rolled loop over groups of 4 columns and writes h back over the up (or input) columns, which
// only this task reads; then the block is requantised from there. Why rolled: unrolled over the
// block with every activation's code, dynamic's FC1 kernels were 12–23 K instructions and their
// epilogues ran from instruction-cache misses (NOTES session 7). The activation is chosen once a
// block (kAct, a compile-time constant in each of the four copies of the rolled loop): chosen a value
// inside the loop, each value paid a jump-table load, an indirect branch and the branch back (~7
// instructions, and no overlap of the four values' exp and reciprocal chains; session 40's SASS).
template <int BN, int kBlock, Activation kAct>
__device__ __forceinline__ void fc1_activate_block(const MoeGemmParams& p, float* crow, int col0) {
#pragma unroll 1
  for (int i = 0; i < kBlock; i += 4) {
    float4* const first = reinterpret_cast<float4*>(crow + col0 + i);  // up (gated) or the input
    const float4 f = *first;
    const float4 gate = p.gated ? *reinterpret_cast<const float4*>(crow + BN / 2 + col0 + i) : f;
    const float gs[4] = {gate.x, gate.y, gate.z, gate.w}, us[4] = {f.x, f.y, f.z, f.w};
    float h[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float u = p.gated ? us[j] : 0.0f;
      h[j] = apply_activation<float>(kAct, gs[j], u, p.sw_alpha, p.sw_beta, p.sw_limit);
    }
    // Round to bf16 after the activation, before requantisation (reference §2.4).
    fmt::round_bf16x2(h[0], h[1]);
    fmt::round_bf16x2(h[2], h[3]);
    *first = make_float4(h[0], h[1], h[2], h[3]);
  }
}
template <int BN, int kBlock>
__device__ __forceinline__ void fc1_epilogue_block(const MoeGemmParams& p, float* crow, int col0, int e,
                                                   __nv_bfloat16* dst) {
  switch (p.activation) {
    case Activation::kSilu: fc1_activate_block<BN, kBlock, Activation::kSilu>(p, crow, col0); break;
    case Activation::kGeluTanh: fc1_activate_block<BN, kBlock, Activation::kGeluTanh>(p, crow, col0); break;
    case Activation::kSwigluOai: fc1_activate_block<BN, kBlock, Activation::kSwigluOai>(p, crow, col0); break;
    case Activation::kRelu2: fc1_activate_block<BN, kBlock, Activation::kRelu2>(p, crow, col0); break;
  }
  float h[kBlock];
#pragma unroll
  for (int i = 0; i < kBlock; i += 4) {
    const float4 v = *reinterpret_cast<const float4*>(crow + col0 + i);
    h[i] = v.x, h[i + 1] = v.y, h[i + 2] = v.z, h[i + 3] = v.w;
  }
  __nv_bfloat16 q[kBlock];
  quant_dequant_block(p.q2, h, p.q2_scale[e], q);
#pragma unroll
  for (int i = 0; i < kBlock; i += 8) store_act<8>(dst + i, q + i, p.f16);
}

// The FC1 epilogue of a tile with few rows: a task is four consecutive intermediate columns of one
// row (a float4 of the staging, and of the gate half for a gated FC1); consecutive lanes take
// consecutive tasks, so a quantisation block is kBlock / 4 consecutive lanes (quant_dequant_lanes)
// and a warp's float4 reads cover one or two staging rows without bank conflicts. Every lane of
// the calling warps runs every step (the loop's bound is the warp's: the block's shuffles need them
// all); lanes past the last task read row 0 and store nothing. The activation is GatedActivation's
// form (the same operations as apply_activation, one copy of the code for the three gated ones) or
// relu2, the one without a gate.
template <int BN>
__device__ __forceinline__ void fc1_spread_rows(const MoeGemmParams& p, const float* c, int ldc, int rows, int grow0,
                                                int e, int y, int tid, int nthreads) {
  const int cols = p.gated ? BN / 2 : BN, groups = cols / 4;
  const int i0 = y * cols, total = rows * groups;
  const bool mx = quant_block(p.q2) == fmt::kMxBlock;
  const float g2 = p.q2_scale[e];
  const GatedActivation act(p);
  const int lane = tid & 31;
  for (int base = tid - lane; base < total; base += nthreads) {
    const int task = base + lane;
    const bool live = task < total;
    const int r = live ? task / groups : 0, col = (task % groups) * 4;
    const float* crow = c + r * ldc;
    const float4 f = *reinterpret_cast<const float4*>(crow + col);  // up (gated) or the input
    const float4 gate = p.gated ? *reinterpret_cast<const float4*>(crow + BN / 2 + col) : f;
    const float gs[4] = {gate.x, gate.y, gate.z, gate.w}, us[4] = {f.x, f.y, f.z, f.w};
    float h[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      h[j] = p.gated ? act(gs[j], us[j])
                     : apply_activation<float>(Activation::kRelu2, gs[j], 0.0f, p.sw_alpha, p.sw_beta, p.sw_limit);
    }
    fmt::round_bf16x2(h[0], h[1]);  // bf16 before requantisation (§2.4)
    fmt::round_bf16x2(h[2], h[3]);
    __nv_bfloat16 q[4];
    if (mx) quant_dequant_lanes<fmt::kMxBlock, 4>(p.q2, h, g2, q);
    else quant_dequant_lanes<fmt::kNvfp4Block, 4>(p.q2, h, g2, q);
    if (live && i0 + col < p.i_pad) store_act<4>(p.a2 + static_cast<int64_t>(grow0 + r) * p.i_pad + i0 + col, q, p.f16);
  }
}

// FC1: staged rows [0, rows) of n-tile y → activation → bf16 → Q2 → A2[grow0 + r], over `nthreads`
// threads (this thread is `tid`; nthreads a multiple of 32, all of them calling). Blocks past i_pad
// (a partial last tile of a non-gated FC1) are skipped.
// kSpread: the blocks spread over lanes (fc1_spread_rows), for tiles of few rows (the register
// path's 32-row m-tiles, chosen at ≤ 16 routed rows per expert). Otherwise a task is one block
// (fc1_epilogue_block); consecutive threads take consecutive rows of one block: with a row stride
// of 4 (mod 32) floats, 8 threads' float4 reads then cover the 32 banks once (dynamic's kLdc);
// taking a row's blocks side by side instead was an 8-way bank conflict on every read (Nsight
// Compute, NOTES session 7). Why both, by the m-tile (NOTES session 23): with a block a thread, a
// tile of ~2 rows gave 4–8 threads of 256 a serial chain of 16 activations and a quantisation while
// the rest waited at the epilogue's barrier, 30 % of the consumers' time in dynamic's FC1 at
// qwen3-30b-a3b T = 16 (spread: a4 T = 16 −12 %); spread, full 128-row prefill tiles ran up to 10 %
// slower (each lane of a block repeats its scale's computation); and both forms in one kernel, chosen
// per tile, kept only about half of the decode gain (the 32-row kernels' code and spills grew).
template <int BN, bool kSpread>
__device__ __forceinline__ void fc1_store_rows(const MoeGemmParams& p, float* c, int ldc, int rows, int grow0,
                                               int e, int y, int tid, int nthreads) {
  if constexpr (kSpread) {
    fc1_spread_rows<BN>(p, c, ldc, rows, grow0, e, y, tid, nthreads);
  } else {
    const int cols = p.gated ? BN / 2 : BN;
    const int i0 = y * cols;
    const int qb = quant_block(p.q2);
    const int nb = cols / qb;
    for (int task = tid; task < rows * nb; task += nthreads) {
      const int r = task % rows, b = task / rows;
      if (i0 + b * qb >= p.i_pad) continue;
      __nv_bfloat16* dst = p.a2 + static_cast<int64_t>(grow0 + r) * p.i_pad + i0 + b * qb;
      if (qb == 16) fc1_epilogue_block<BN, 16>(p, c + r * ldc, b * 16, e, dst);
      else fc1_epilogue_block<BN, 32>(p, c + r * ldc, b * 32, e, dst);
    }
  }
}

// FC2: staged rows [0, rows) of n-tile y → · router weight → Y[grow0 + r], float4 stores; columns
// past H are skipped. rws: the rows' router weights, already in shared memory (the dynamic kernels
// load them before the tile's main loop, so the loads hide behind the MMAs: when they were two
// dependent loads a row, through the row's route, loading them here took over half of qwen3-30b-a3b's
// FC2 at T = 16384, whose k loop is 12 steps, NOTES session 8), or null to load them here.
// kScatter (dynamic's FC2 kernels): with p.out_acc set, each row is added into its token's sum
// instead; toks: the rows' tokens, staged in shared memory by the consumers (required then).
template <int BN, bool kScatter = false>
__device__ __forceinline__ void fc2_store_rows(const MoeGemmParams& p, const float* c, int ldc, int rows, int grow0,
                                               int y, int tid, int nthreads, const float* rws = nullptr,
                                               const int* toks = nullptr) {
  for (int task = tid; task < rows * (BN / 4); task += nthreads) {
    const int r = task / (BN / 4), c4 = (task % (BN / 4)) * 4;
    const int col = y * BN + c4;
    if (col >= p.hidden) continue;
    const float rw = rws ? rws[r] : p.row_weight[grow0 + r];
    const float* cr = c + r * ldc + c4;
    const float4 v = make_float4(rw * cr[0], rw * cr[1], rw * cr[2], rw * cr[3]);
    if (kScatter && p.out_acc) {
      float* dst = p.out_acc + static_cast<int64_t>(toks[r]) * p.hidden + col;
      // No "memory" clobber: nothing in the kernel reads out_acc, and a clobber would order each
      // task's loads behind the previous task's reduction.
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w));
    } else {
      *reinterpret_cast<float4*>(p.y + static_cast<int64_t>(grow0 + r) * p.hidden + col) = v;
    }
  }
}

}  // namespace fp4moe::kernels
