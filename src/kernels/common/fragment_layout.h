// Index math of the mma-fragment layouts, shared by the host repack (device_weights.cpp), the decode
// kernel (direct_micro.cuh) and the CPU tests (tests/cpu/test_fragment_layout.cpp). Plain integer
// functions, callable on host and device.
//
// mma.m16n8k16 (bf16) operands, lane l = 4g + c (g = l / 4, c = l % 4):
//   A (16 × 16, row-major): a0 = (row g, k 2c..2c+1), a1 = (row g+8, k 2c..), a2 = (row g, k 2c+8..),
//                           a3 = (row g+8, k 2c+8..)
//   B (16 × 8, "col"):      b0 = (k 2c..2c+1, column g), b1 = (k 2c+8..2c+9, column g)
#pragma once

#include <cstdint>

#include "fp4moe/formats.h"  // FP4MOE_HD

namespace fp4moe::kernels {

// Weights, 16 rows × 64 k per tile, 512 bytes: lane l's 16 bytes at l·16; byte 4t + b of a lane is
// the A operand register b of k16 step t — two E2M1 codes, k and k + 1 (low nibble = k).
struct FragmentSource {
  int row;  // within the tile, 0..15
  int k;    // within the tile, even, 0..62
};
FP4MOE_HD FragmentSource weight_fragment_source(int lane, int t, int b) {
  const int g = lane >> 2, c = lane & 3;
  return {g + (b & 1) * 8, 16 * t + (b >> 1) * 8 + 2 * c};
}

// Activations, per 64-column chunk: logical column w → position, so that lane (g, c) finds the B
// operands of k16 steps t = 0..3 at positions c·16 + 4t + {0,1} (b0) and + {2,3} (b1): two 16-byte
// loads per lane per chunk.
FP4MOE_HD int permuted(int w) {
  const int t = w >> 4, r = w & 15, half = r >> 3, c = (r & 7) >> 1, e = r & 1;
  return c * 16 + t * 4 + half * 2 + e;
}
FP4MOE_HD long long permuted_col(int col) { return (col & ~63) + permuted(col & 63); }

// The f16 decode path (NVFP4 weights, a4): each E2M1 nibble (s e1 e0 m) of a word becomes the E4M3
// byte (s 0 0 e1 e0 m 0 0), whose value is exactly the code × 2^-6 (E4M3 bias 7, E2M1 bias 1, and
// E2M1's subnormal 0.5 lands on E4M3's subnormal 2^-7). Byte i of the result holds the low (lo) or the
// high (hi) nibble of byte i of w.
FP4MOE_HD uint32_t e2m1_lo_as_e4m3(uint32_t w) { return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u); }
FP4MOE_HD uint32_t e2m1_hi_as_e4m3(uint32_t w) { return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u); }

// How many chunks to cut KT k-tiles into for `tiles` independent row tiles to give about `target`
// items, at most max_chunks; the result makes every chunk non-empty (chunks of ceil(KT / n) tiles).
FP4MOE_HD int k_chunk_count(int tiles, int KT, int target, int max_chunks) {
  int kc = (target + (tiles > 1 ? tiles : 1) - 1) / (tiles > 1 ? tiles : 1);
  kc = kc < KT ? kc : KT;
  kc = kc < max_chunks ? kc : max_chunks;
  kc = kc > 1 ? kc : 1;
  const int per = (KT + kc - 1) / kc;
  return (KT + per - 1) / per;
}

}  // namespace fp4moe::kernels
