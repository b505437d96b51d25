// The decode kernel's data layouts, checked on the host against the PTX definition of the
// mma.m16n8k16 operand fragments (written out again here, independently of fragment_layout.h):
//   A (16 × 16, row-major), lane l = 4g + c:  a0 = A[g][2c, 2c+1]      a1 = A[g+8][2c, 2c+1]
//                                             a2 = A[g][2c+8, 2c+9]    a3 = A[g+8][2c+8, 2c+9]
//   B (16 × 8):                               b0 = B[2c, 2c+1][g]      b1 = B[2c+8, 2c+9][g]
// and the k-chunking that splits decode reductions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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
    std::vector<uint8_t> fc, fs, fc16, fs16, fcb, fsb;
    gpu::to_fragment_order(codes, scales, experts, rows, k, bs, fc, fs);
    gpu::to_fragment_order(codes, scales, experts, rows, k, bs, fc16, fs16, kernels::WordLayout::kF16);
    gpu::to_fragment_order(codes, scales, experts, rows, k, bs, fcb, fsb, kernels::WordLayout::kBf16);
    ASSERT_EQ(fs16, fs);  // f16 and bf16 words change the codes only
    ASSERT_EQ(fsb, fs);
    ASSERT_EQ(fc16.size(), fc.size());
    ASSERT_EQ(fcb.size(), fc.size());
    for (size_t i = 0; i < fc.size(); i += 4) {  // each f16 or bf16 word is its standard word, repacked
      uint32_t w = 0, w16 = 0, wb = 0;
      std::memcpy(&w, &fc[i], 4);
      std::memcpy(&w16, &fc16[i], 4);
      std::memcpy(&wb, &fcb[i], 4);
      ASSERT_EQ(w16, kernels::f16_word_from_standard(w)) << "word " << i / 4;
      ASSERT_EQ(wb, kernels::bf16_word_from_standard(w)) << "word " << i / 4;
    }
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
      for (int warps : {1, 8, 1056})
        for (int max_chunks : {1, 8}) {
          const int n = kernels::k_chunk_count(tiles, KT, warps, max_chunks);
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

// The chunk count balances the units over the warps: direct_micro's FC2 at mixtral-8x7b (KT = 224)
// cuts 8 chunks for 3, 5 and 7 touched experts and 4 for 6 (every warp the same share, where the
// old ceil(8 / tiles) gave two warps twice the share of the rest at 5 and 6), and stays at 2 for 4
// and 1 for 8 and 16; no count up to the cap loads the busiest warp less.
TEST(FragmentLayout, KChunksBalanceTheWarps) {
  const int KT = 224;
  const std::pair<int, int> want[] = {{1, 8}, {2, 4}, {3, 8}, {4, 2}, {5, 8}, {6, 4}, {7, 8}, {8, 1}, {16, 1}};
  for (const auto& [tiles, n] : want) EXPECT_EQ(kernels::k_chunk_count(tiles, KT, 8, 8), n) << tiles << " tiles";
  for (int kt : {1, 3, 12, 56, 224})
    for (int tiles = 1; tiles <= 40; ++tiles) {
      auto load = [&](int n) {
        const int per = (kt + n - 1) / n;
        return static_cast<long long>((tiles * n + 7) / 8) * (per + 1);
      };
      const int n = kernels::k_chunk_count(tiles, kt, 8, 8);
      for (int m = 1; m <= std::min(8, kt); ++m) {
        const int per = (kt + m - 1) / m;
        if ((kt + per - 1) / per != m) continue;  // not a count of non-empty chunks
        EXPECT_LE(load(n), load(m)) << "KT " << kt << " tiles " << tiles << ": " << n << " chunks, " << m << " better";
      }
    }
}

// The f16 word layout (fragment_layout.h): the E4M3 bytes the f16 kernels take from a word are the
// codes of the standard word, nibbles 0..3 then 4..7, each worth code × 2^-6; and the repack and its
// inverse are exact. Every code at every nibble, against neighbours of all-zero, all-one and random
// bits, then random words.
TEST(FragmentLayout, F16WordsGiveEachCodeAsE4m3WorthTheCodeTimes2ToTheMinus6) {
  std::mt19937 rng(7);
  auto check = [](uint32_t w) {
    const uint32_t f = kernels::f16_word_from_standard(w);
    ASSERT_EQ(kernels::standard_word_from_f16(f), w) << std::hex << w;
    const uint32_t x01 = kernels::f16w_x01(f), x23 = kernels::f16w_x23(f);
    for (int j = 0; j < 4; ++j) {
      const uint8_t lo_code = (w >> (4 * j)) & 0xF, hi_code = (w >> (4 * j + 16)) & 0xF;
      const uint8_t b01 = static_cast<uint8_t>(x01 >> (8 * j)), b23 = static_cast<uint8_t>(x23 >> (8 * j));
      // The E4M3 byte of code n is s 0 0 e1 e0 m 0 0 (written out again here).
      ASSERT_EQ(b01, ((lo_code & 7) << 2) | ((lo_code & 8) << 4)) << std::hex << w << " byte " << j;
      ASSERT_EQ(b23, ((hi_code & 7) << 2) | ((hi_code & 8) << 4)) << std::hex << w << " byte " << j;
      ASSERT_EQ(fmt::e4m3_decode(b01) * 64.0f, fmt::e2m1_decode(lo_code));
      ASSERT_EQ(fmt::e4m3_decode(b23) * 64.0f, fmt::e2m1_decode(hi_code));
    }
  };
  for (int pos = 0; pos < 8; ++pos)
    for (uint32_t v = 0; v < 16; ++v)
      for (uint32_t around : {0u, 0xFFFFFFFFu, static_cast<uint32_t>(rng())}) {
        const uint32_t w = (around & ~(0xFu << (4 * pos))) | (v << (4 * pos));
        check(w);
      }
  for (int i = 0; i < 200000; ++i) check(static_cast<uint32_t>(rng()));
}

// The bf16 word layout (fragment_layout.h): the four registers' bits come from disjoint storage
// bits (the repack is a permutation of the word's bits), each register holds its two codes as bf16
// bits worth code × 2^-126 (exact, E2M1's 0.5 as bf16's subnormal 2^-127), times the scale × 2^118
// exactly code × scale × 2^-8 for every positive E4M3 scale, and the repack and its inverse are exact.
TEST(FragmentLayout, Bf16WordsGiveEachCodeAsBf16WorthTheCodeTimes2ToTheMinus126) {
  uint32_t covered = 0;
  for (int b = 0; b < 4; ++b)
    for (int t = 0; t < 32; ++t)
      if ((kernels::kBf16wMask >> t) & 1u) {
        const uint32_t bit = 1u << ((t + kernels::bf16w_rotation(b, t)) & 31);
        ASSERT_EQ(covered & bit, 0u) << "register " << b << " bit " << t;
        covered |= bit;
      }
  ASSERT_EQ(covered, 0xFFFFFFFFu);
  auto bf16_value = [](uint32_t bits) { return static_cast<double>(fmt::f32_from_bf16(static_cast<uint16_t>(bits))); };
  for (uint32_t n = 0; n < 16; ++n) {
    const double code = fmt::e2m1_decode(static_cast<uint8_t>(n));
    for (int h = 0; h < 2; ++h)
      ASSERT_EQ(std::ldexp(bf16_value(kernels::e2m1_in_bf16_bits(n, h) >> (16 * h)), 126), code) << n;
    for (int s = 1; s < 0x7F; ++s) {  // every positive finite E4M3 scale: the product is a bf16
      const double scale = fmt::e4m3_decode(static_cast<uint8_t>(s));
      const double p = code * std::ldexp(scale, -8);
      ASSERT_EQ(static_cast<double>(fmt::round_bf16(static_cast<float>(p))), p) << n << " " << s;
      ASSERT_GE(std::fabs(p), code == 0 ? 0.0 : std::ldexp(1.0, -126)) << "a normal bf16";
    }
  }
  std::mt19937 rng(11);
  auto check = [](uint32_t w) {
    const uint32_t f = kernels::bf16_word_from_standard(w);
    ASSERT_EQ(kernels::standard_word_from_bf16(f), w) << std::hex << w;
    for (int b = 0; b < 4; ++b) {
      const uint32_t reg = kernels::bf16w_register(f, b);
      ASSERT_EQ(reg & ~kernels::kBf16wMask, 0u) << std::hex << w << " register " << b;
      for (int h = 0; h < 2; ++h)
        ASSERT_EQ(kernels::e2m1_from_bf16_bits(reg, h), (w >> (8 * b + 4 * h)) & 0xFu) << std::hex << w;
    }
  };
  for (int pos = 0; pos < 8; ++pos)
    for (uint32_t v = 0; v < 16; ++v)
      for (uint32_t around : {0u, 0xFFFFFFFFu, static_cast<uint32_t>(rng())})
        check((around & ~(0xFu << (4 * pos))) | (v << (4 * pos)));
  for (int i = 0; i < 200000; ++i) check(static_cast<uint32_t>(rng()));
}

// fold_scale_signs (the bf16 words' repack): every E2M1 code × E4M3 scale keeps its value (zeros may
// change sign), every NaN-free scale ends ≥ +0, a zero scale's block holds +0 codes only, and a block
// with a positive scale is left as it was.
TEST(FragmentLayout, FoldScaleSignsKeepsEveryProduct) {
  const int rows = 37, k = 128, bs = 16, sb = k / bs;
  std::mt19937 rng(5);
  std::vector<uint8_t> codes(rows * k / 2), scales(rows * sb);
  for (auto& b : codes) b = static_cast<uint8_t>(rng());
  for (auto& s : scales) {
    do s = static_cast<uint8_t>(rng());
    while ((s & 0x7F) == 0x7F);  // NaN scales are rejected before the repack (canonicalize)
  }
  for (int i = 0; i < 8; ++i) scales[rng() % scales.size()] = (i & 1) ? 0x80 : 0x00;  // ±0 scales
  std::vector<uint8_t> c2 = codes, s2 = scales;
  gpu::fold_scale_signs(c2.data(), s2.data(), rows, k, bs);
  int negative = 0, zero = 0;
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < sb; ++j) {
      const uint8_t s = scales[r * sb + j], t = s2[r * sb + j];
      ASSERT_EQ(t & 0x80, 0) << "row " << r << " block " << j;
      negative += (s & 0x80) && (s & 0x7F);
      zero += (s & 0x7F) == 0;
      for (int kk = j * bs; kk < (j + 1) * bs; ++kk) {
        const int sh = (kk & 1) * 4;
        const uint8_t n = (codes[(r * k + kk) / 2] >> sh) & 0xF, m = (c2[(r * k + kk) / 2] >> sh) & 0xF;
        const double before = fmt::e2m1_decode(n) * double(fmt::e4m3_decode(s));
        const double after = fmt::e2m1_decode(m) * double(fmt::e4m3_decode(t));
        ASSERT_EQ(after, before) << "row " << r << " k " << kk;
        if ((s & 0x7F) == 0) {
          ASSERT_EQ(m, 0) << "row " << r << " k " << kk;
        } else if (!(s & 0x80)) {
          ASSERT_EQ(m, n) << "row " << r << " k " << kk;
        }
      }
    }
  EXPECT_GT(negative, 0);
  EXPECT_GT(zero, 0);
}

}  // namespace
}  // namespace fp4moe
