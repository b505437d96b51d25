// The dynamic producer's table-free NVFP4 dequantisation (kernels/common/dequant_bits.h), checked on
// the host against fmt:: decoding: every E2M1 code in every nibble position, every E4M3 scale byte,
// and the word-level routine against the fragment byte order.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "fp4moe/formats.h"
#include "kernels/common/dequant_bits.h"

namespace fp4moe {
namespace {

using kernels::kNvfp4UnscaleLog2;

float lo_half(uint32_t v) { return fmt::f32_from_bf16(static_cast<uint16_t>(v)); }
float hi_half(uint32_t v) { return fmt::f32_from_bf16(static_cast<uint16_t>(v >> 16)); }
bool same(float a, float b) { return fmt::f32_bits(a) == fmt::f32_bits(b) || (fmt::is_nan(a) && fmt::is_nan(b)); }

// Nibble i and i + 4 of a word become exactly code × 2^-126, whatever the other nibbles hold.
TEST(DequantBits, NibblesAreCodesTimesTwoToTheMinus126) {
  std::mt19937 rng(7);
  for (int i = 0; i < 4; ++i)
    for (uint32_t lo = 0; lo < 16; ++lo)
      for (uint32_t hi = 0; hi < 16; ++hi)
        for (int rep = 0; rep < 4; ++rep) {
          const uint32_t noise = rng() & ~((0xFu << (4 * i)) | (0xFu << (4 * i + 16)));
          const uint32_t w = noise | (lo << (4 * i)) | (hi << (4 * i + 16));
          const uint32_t v = kernels::e2m1_nibbles_as_bf16x2(w, i);
          const float want_lo = fmt::e2m1_decode(static_cast<uint8_t>(lo)) * fmt::pow2f(-126);
          const float want_hi = fmt::e2m1_decode(static_cast<uint8_t>(hi)) * fmt::pow2f(-126);
          ASSERT_TRUE(same(lo_half(v), want_lo)) << "i " << i << " code " << lo << " word " << std::hex << w;
          ASSERT_TRUE(same(hi_half(v), want_hi)) << "i " << i << " code " << hi << " word " << std::hex << w;
        }
}

// All 16 codes × all 256 E4M3 bytes: one bf16 multiply by the pre-scaled scale gives
// code × scale × 2^-7 with nothing rounded (NaN scales give NaN, zero gives zero of the right sign).
TEST(DequantBits, Nvfp4ProductsAreExactForEveryCodeAndScale) {
  for (int s = 0; s < 256; ++s) {
    const uint32_t sx2 = kernels::e4m3_prescaled_bf16x2(static_cast<uint8_t>(s));
    const float scale = fmt::e4m3_decode(static_cast<uint8_t>(s));
    ASSERT_EQ(sx2 >> 16, sx2 & 0xFFFFu);
    if (!fmt::is_nan(scale)) {
      ASSERT_EQ(lo_half(sx2), scale * fmt::pow2f(kernels::kE4m3PreScaleLog2)) << "scale byte " << s;
      ASSERT_LT(fmt::abs_f(lo_half(sx2)), fmt::pow2f(127) * 2.0f) << "scale byte " << s;  // finite
    }
    for (uint32_t code = 0; code < 16; ++code) {
      const uint32_t w = code | (code << 16);  // nibble 0 and nibble 4
      const uint32_t prod = kernels::bf16x2_mul(kernels::e2m1_nibbles_as_bf16x2(w, 0), sx2);
      // The product in fp32 is exact (at most 6 significant bits, far inside fp32's range).
      const float want = fmt::e2m1_decode(static_cast<uint8_t>(code)) * scale * fmt::pow2f(-kNvfp4UnscaleLog2);
      ASSERT_TRUE(same(lo_half(prod), want)) << "code " << code << " scale byte " << s << ": " << lo_half(prod)
                                             << " vs " << want;
      ASSERT_TRUE(same(hi_half(prod), want)) << "code " << code << " scale byte " << s;
      // Undoing the 2^-7 (what the epilogue's alpha does) gives the plain dequantised value.
      if (!fmt::is_nan(want)) {
        ASSERT_EQ(lo_half(prod) * fmt::pow2f(kNvfp4UnscaleLog2), fmt::e2m1_decode(static_cast<uint8_t>(code)) * scale);
      }
    }
  }
}

// UE8M0 scales as bf16x2 (the MXFP4 table path): exact for every byte, 2^-127 a bf16 subnormal.
TEST(DequantBits, Ue8m0ScalesAreExact) {
  for (int e = 0; e < 256; ++e) {
    const uint32_t v = kernels::ue8m0_bf16x2(static_cast<uint8_t>(e));
    ASSERT_TRUE(same(lo_half(v), fmt::ue8m0_decode(static_cast<uint8_t>(e)))) << "byte " << e;
    ASSERT_EQ(v >> 16, v & 0xFFFFu);
  }
  for (int b = 0; b < 256; ++b) {
    const uint32_t v = kernels::e2m1x2_bf16x2(static_cast<uint8_t>(b));
    ASSERT_EQ(lo_half(v), fmt::e2m1_decode(static_cast<uint8_t>(b & 0xF)));
    ASSERT_EQ(hi_half(v), fmt::e2m1_decode(static_cast<uint8_t>(b >> 4)));
  }
}

// A whole fragment word: out[b] holds byte b's two codes (low nibble first) times the scale of row g
// (bytes 0, 2) or row g + 8 (bytes 1, 3), each × 2^-7.
TEST(DequantBits, WordFollowsTheFragmentByteOrder) {
  std::mt19937 rng(11);
  for (int rep = 0; rep < 20000; ++rep) {
    const uint32_t w = rng();
    const uint8_t sg = static_cast<uint8_t>(rng()), sg8 = static_cast<uint8_t>(rng());
    uint32_t out[4];
    kernels::dequant_word_nvfp4(w, kernels::e4m3_prescaled_bf16x2(sg), kernels::e4m3_prescaled_bf16x2(sg8), out);
    for (int b = 0; b < 4; ++b) {
      const uint8_t byte = static_cast<uint8_t>(w >> (8 * b));
      const float scale = fmt::e4m3_decode((b & 1) ? sg8 : sg) * fmt::pow2f(-kNvfp4UnscaleLog2);
      ASSERT_TRUE(same(lo_half(out[b]), fmt::e2m1_decode(byte & 0xF) * scale)) << "word " << std::hex << w << " byte " << b;
      ASSERT_TRUE(same(hi_half(out[b]), fmt::e2m1_decode(byte >> 4) * scale)) << "word " << std::hex << w << " byte " << b;
    }
  }
}

}  // namespace
}  // namespace fp4moe
