// DeviceWeights: the expert weights in the one layout every GPU kernel reads (generic, direct_micro,
// dynamic), so a prepared layer holds its weights once. Internal.
//
// Rows and k: W13 rows = [up (I rows, padded to i_pad); gate (padded to i_pad)] (relu2: i_pad rows),
// k = H padded to h_pad; W2 rows = H padded to h_pad, k = I padded to i_pad. Padding is zero codes
// and zero scales, so padded rows and columns contribute exactly 0. The layout is the mma-fragment
// order below, built from the row-major packed form ([E][rows][k/2] codes, element 2j in the low
// nibble; [E][rows][k/block] scales) by to_fragment_order.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "fp4moe/config.h"
#include "host/cuda_check.h"
#include "kernels/common/fragment_layout.h"

namespace fp4moe::gpu {

struct DeviceWeights {
  MoeConfig config;
  int device = 0;
  int h_pad = 0, i_pad = 0, n1_pad = 0;  // n1_pad = 2·i_pad (gated) or i_pad
  // Per local expert: the factor applied to each GEMM's fp32 accumulator (product of the weight's
  // global scale and, for nvfp4-a4, the input's decode scale), and the input decode scales the
  // quantisers use.
  DeviceBuffer alpha1, alpha2, fc1_input_scale, fc2_input_scale;  // float [E_local]
  DeviceBuffer b13, b2;  // float [E_local][n1_pad], [E_local][h_pad] (has_bias), padded with 0
  // The weights in mma-fragment order: tiles of 16 rows × 64 k, 512 bytes each, tile (e, rt, kt) at ((e·RT + rt)·KT + kt)·512, lane l's 16 bytes
  // at l·16; 32-bit word t of a lane holds the A operand of k16 step t of m16n8k16:
  //   byte 0: row g,   k = 16t + 2c, +1      byte 2: row g,   k = 16t + 8 + 2c, +1
  //   byte 1: row g+8, k = 16t + 2c, +1      byte 3: row g+8, k = 16t + 8 + 2c, +1
  // (g = l / 4, c = l % 4; low nibble = the lower k, as in the checkpoint). Block scales per tile:
  // [16 rows][64 / block] bytes at tile · (16·64 / block).
  DeviceBuffer w13_frag, w13_frag_scales, w2_frag, w2_frag_scales;
  // Each word of the codes rearranged as kernels::f16_word_from_standard (fragment_layout.h) says, so
  // the f16 kernels read it in fewer instructions: set for the configs that run on f16 tensor cores
  // (f16_operands: NVFP4-a4). Kernels that read bytes (generic, the bf16 copy's pre-pass) convert
  // the words back (MoeGemmParams::f16_words).
  bool f16_words = false;
  // Each word as kernels::bf16_word_from_standard (the codes straight in bf16 bits, frag_a_bf16w): set
  // for NVFP4 weights with bf16 operands (bf16_word_operands: a16, a8), whose block scales are then
  // stored ≥ +0 (a negative scale's sign folded into its block's codes, a zero scale's codes zeroed:
  // the same code × scale products for every reader), as frag_scales_bf16w needs.
  bool bf16_words = false;
  size_t bytes = 0;      // total device bytes
};

// Host bytes whose resize leaves new elements uninitialised (default-initialised uint8_t): the
// staging buffers of upload_weights, which the parallel repacking writes in full, so their pages
// are first touched by the repacking's threads instead of zero-filled on one (a DeepSeek-V3 layer's
// two 3.8 GB staging buffers took seconds that way; 0.8 s/GB on session 17's build machine).
// Only construction without arguments is overridden; std::allocator_traits constructs from
// arguments (copies, fills) with std::construct_at and rebinds the template itself.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  using std::allocator<T>::allocator;
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
};
using StagingBytes = std::vector<uint8_t, DefaultInitAllocator<uint8_t>>;

// [E][rows][k/2] codes + [E][rows][k/bs] scales (rows % 16 == 0, k % 64 == 0) → the fragment order
// above (fcodes, fscales); words: each code word as kernels::word_from_standard. Runs on up
// to `threads` host threads (0: all), one (expert, row tile) at a time: a DeepSeek-V3 layer's 5.6 GB
// of codes took ~21 s on one thread (260 MB/s, session 16).
void to_fragment_order(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales, int experts, int rows,
                       int k, int bs, std::vector<uint8_t>& fcodes, std::vector<uint8_t>& fscales,
                       kernels::WordLayout words = kernels::WordLayout::kStandard, int threads = 0);
// The same from and into staging buffers (upload_weights): every output byte is written once.
void to_fragment_order(const StagingBytes& codes, const StagingBytes& scales, int experts, int rows, int k, int bs,
                       StagingBytes& fcodes, StagingBytes& fscales,
                       kernels::WordLayout words = kernels::WordLayout::kStandard, int threads = 0);

// NVFP4 weights on bf16 words (DeviceWeights::bf16_words): `rows` rows of k codes (k / 2 bytes) and
// k / bs E4M3 scale bytes each, in place: a block with a negative scale takes the sign into its codes
// (each E2M1 sign bit flipped, the scale stored as |scale|) and a zero scale's codes become +0, so
// every product code × scale stays what it was (up to the sign of a zero) and every scale is ≥ +0,
// as frag_scales_bf16w needs.
void fold_scale_signs(uint8_t* codes, uint8_t* scales, int64_t rows, int k, int bs);

// Padding granularity of H and I in the device layouts (the generic GEMM's tile sizes).
inline constexpr int kPadH = 64;
inline constexpr int kPadI = 64;

// The padded dimensions of the layout above (DeviceWeights::h_pad, i_pad, n1_pad), from the config.
struct PaddedDims {
  int h_pad, i_pad, n1_pad;
};
inline PaddedDims padded_dims(const MoeConfig& c) {
  const int h_pad = (c.hidden + kPadH - 1) / kPadH * kPadH, i_pad = (c.intermediate + kPadI - 1) / kPadI * kPadI;
  return {h_pad, i_pad, c.gated() ? 2 * i_pad : i_pad};
}

}  // namespace fp4moe::gpu
