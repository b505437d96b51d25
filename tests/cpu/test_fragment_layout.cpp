// The decode kernel's data layouts, checked on the host against the PTX definition of the
// mma.m16n8k16 operand fragments (written out again here, independently of fragment_layout.h):
//   A (16 × 16, row-major), lane l = 4g + c:  a0 = A[g][2c, 2c+1]      a1 = A[g+8][2c, 2c+1]
//                                             a2 = A[g][2c+8, 2c+9]    a3 = A[g+8][2c+8, 2c+9]
//   B (16 × 8):                               b0 = B[2c, 2c+1][g]      b1 = B[2c+8, 2c+9][g]
// and the k-chunking that splits decode reductions.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "fp4moe/formats.h"
#include "host/device_weights.h"
#include "kernels/common/fragment_layout.h"

namespace fp4moe {
namespace {

// Weights repacked by the host into fragment order give, lane by lane and step by step, exactly the
// A fragments the PTX definition asks for; the block scales land where the kernel reads them.
TEST(FragmentLayout, RepackedWeightsAreTheMmaAFragments) {
  const int experts = 2, rows = 48, k = 192;  // 3 row tiles × 3 k-tiles per expert
  for (int bs : {16, 32}) {
    std::mt19937 rng(bs);
    std::vector<uint8_t> codes(static_cast<size_t>(experts) * rows * k / 2), scales(experts * rows * (k / bs));
    for (auto& b : codes) b = static_cast<uint8_t>(rng());
    for (auto& b : scales) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> fc, fs;
    gpu::to_fragment_order(codes, scales, experts, rows, k, bs, fc, fs);
    ASSERT_EQ(fc.size(), codes.size());
    ASSERT_EQ(fs.size(), scales.size());
    auto code = [&](int e, int r, int kk) {  // E2M1 code of W_e[r][kk]
      return (codes[(static_cast<size_t>(e) * rows + r) * (k / 2) + kk / 2] >> ((kk & 1) * 4)) & 0xF;
    };
    const int RT = rows / 16, KT = k / 64, sb = 64 / bs;
    for (int e = 0; e < experts; ++e)
      for (int rt = 0; rt < RT; ++rt)
        for (int kt = 0; kt < KT; ++kt) {
          const size_t tile = (static_cast<size_t>(e) * RT + rt) * KT + kt;
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane / 4, c = lane % 4;
            for (int t = 0; t < 4; ++t) {
              const uint8_t* reg = &fc[tile * 512 + lane * 16 + t * 4];  // a0..a3, one byte = two codes
              const int r0 = rt * 16 + g, k0 = kt * 64 + 16 * t + 2 * c;
              const int want_row[4] = {r0, r0 + 8, r0, r0 + 8}, want_k[4] = {k0, k0, k0 + 8, k0 + 8};
              for (int b = 0; b < 4; ++b) {
                EXPECT_EQ(reg[b] & 0xF, code(e, want_row[b], want_k[b])) << "e" << e << " lane " << lane << " t" << t << " a" << b;
                EXPECT_EQ(reg[b] >> 4, code(e, want_row[b], want_k[b] + 1)) << "e" << e << " lane " << lane;
              }
            }
          }
          // Scales: [16 rows][64 / bs] per tile; the kernel reads row g at g·sb, block t (NVFP4) or t/2 (MX).
          for (int r = 0; r < 16; ++r)
            for (int j = 0; j < sb; ++j)
              EXPECT_EQ(fs[tile * 16 * sb + r * sb + j],
                        scales[(static_cast<size_t>(e) * rows + rt * 16 + r) * (k / bs) + kt * sb + j]);
        }
  }
}

// The permuted activation chunk: lane (g, c) reads positions c·16 .. c·16 + 15 of its row; words
// 2t and 2t + 1 of those must be the B fragments b0, b1 of k16 step t.
TEST(FragmentLayout, PermutedActivationsAreTheMmaBFragments) {
  std::set<int> seen;
  for (int w = 0; w < 64; ++w) {
    const int p = kernels::permuted(w);
    ASSERT_GE(p, 0);
    ASSERT_LT(p, 64);
    seen.insert(p);
  }
  EXPECT_EQ(seen.size(), 64u) << "a bijection of the chunk";
  std::vector<int> at(64);  // position → logical k
  for (int w = 0; w < 64; ++w) at[kernels::permuted(w)] = w;
  for (int c = 0; c < 4; ++c)
    for (int t = 0; t < 4; ++t) {
      const int base = c * 16 + 4 * t;
      EXPECT_EQ(at[base + 0], 16 * t + 2 * c);      // b0, low half
      EXPECT_EQ(at[base + 1], 16 * t + 2 * c + 1);  // b0, high half
      EXPECT_EQ(at[base + 2], 16 * t + 8 + 2 * c);  // b1
      EXPECT_EQ(at[base + 3], 16 * t + 9 + 2 * c);
    }
  for (int col : {0, 63, 64, 130, 1000})
    EXPECT_EQ(kernels::permuted_col(col), (col / 64) * 64 + kernels::permuted(col % 64));
}

// Every chunk of a split reduction is non-empty and the chunks cover all KT tiles (an empty chunk
// was once summed without being written).
TEST(FragmentLayout, KChunksAreNonEmptyAndCoverTheReduction) {
  for (int KT = 1; KT <= 300; ++KT)
    for (int tiles : {1, 2, 7, 48, 384, 5000})
      for (int target : {1, 1056, 4224})
        for (int max_chunks : {1, 8}) {
          const int n = kernels::k_chunk_count(tiles, KT, target, max_chunks);
          ASSERT_GE(n, 1);
          ASSERT_LE(n, max_chunks);
          ASSERT_LE(n, KT);
          const int per = (KT + n - 1) / n;  // the kernels' chunk length
          int covered = 0;
          for (int kc = 0; kc < n; ++kc) {
            const int len = std::min(KT, kc * per + per) - kc * per;
            ASSERT_GT(len, 0) << "KT " << KT << " tiles " << tiles << " chunk " << kc << " of " << n;
            covered += len;
          }
          ASSERT_EQ(covered, KT);
        }
}

// The f16 decode path reads each E2M1 nibble as an E4M3 byte worth code × 2^-6: check every byte of
// every position, both nibbles, against the E2M1 decoder.
TEST(FragmentLayout, E2m1NibblesReadAsE4m3AreTheCodeTimes2ToTheMinus6) {
  for (uint32_t v = 0; v < 256; ++v)
    for (int pos = 0; pos < 4; ++pos) {
      const uint32_t w = (v << (8 * pos)) | (0xA5u << (8 * ((pos + 1) % 4)));  // a neighbour byte must not leak in
      const uint8_t lo = static_cast<uint8_t>(kernels::e2m1_lo_as_e4m3(w) >> (8 * pos));
      const uint8_t hi = static_cast<uint8_t>(kernels::e2m1_hi_as_e4m3(w) >> (8 * pos));
      EXPECT_EQ(fmt::e4m3_decode(lo) * 64.0f, fmt::e2m1_decode(static_cast<uint8_t>(v & 0xF))) << v << " " << pos;
      EXPECT_EQ(fmt::e4m3_decode(hi) * 64.0f, fmt::e2m1_decode(static_cast<uint8_t>(v >> 4))) << v << " " << pos;
    }
}

}  // namespace
}  // namespace fp4moe
