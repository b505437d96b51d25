// Number formats (include/fp4moe/formats.h): E2M1, E4M3, UE8M0, bf16, the NVFP4 / MXFP4 / MXFP8
// block quantisers and nibble packing.
//
// Every expected value here is derived independently of the implementation: from the format
// definitions (OCP Microscaling v1.0, IEEE 754), from brute-force nearest searches over all codes,
// or written out by hand in the comments. The special-value behaviour tested is the one defined in
// the header comment of formats.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "fp4moe/formats.h"

using namespace fp4moe::fmt;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- independent definitions -------------------------------------------------------------------

// E2M1 magnitudes by code 0..7 (OCP MX v1.0 table).
constexpr double kE2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// E4M3 (fn) from the definition: bias 7, subnormals m/8 · 2^-6, S.1111.111 = NaN.
double e4m3_value(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

// Nearest magnitude code among `n` ascending magnitudes `vals` for |x| (saturating at the top),
// ties to the even code. This is the brute-force reference for both E2M1 and E4M3 (whose
// byte / code LSB is the mantissa LSB).
int nearest_code(const double* vals, int n, double a) {
  int best = 0;
  double best_d = std::fabs(a - vals[0]);
  for (int c = 1; c < n; ++c) {
    const double d = std::fabs(a - vals[c]);
    if (d < best_d || (d == best_d && (c & 1) == 0 && (best & 1) == 1)) best = c, best_d = d;
  }
  return best;
}

std::vector<double> e4m3_magnitudes() {  // bytes 0x00..0x7E
  std::vector<double> v;
  for (int b = 0; b <= 0x7E; ++b) v.push_back(e4m3_value(static_cast<uint8_t>(b)));
  return v;
}

uint8_t e4m3_reference(float x) {
  static const std::vector<double> mags = e4m3_magnitudes();
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  return sign | static_cast<uint8_t>(nearest_code(mags.data(), 0x7F, std::fabs(static_cast<double>(x))));
}

uint8_t e2m1_reference(float x) {
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  return sign | static_cast<uint8_t>(nearest_code(kE2M1, 8, std::fabs(static_cast<double>(x))));
}

double e2m1_value(uint8_t c) { return (c & 8) ? -kE2M1[c & 7] : kE2M1[c & 7]; }

// The MX scale exponent rule, exactly: the smallest e in [0, 254] with elem_max · 2^(e-127) >= amax
// (254 if none), i.e. 2^ceil(log2(amax / elem_max)) clamped. Computed with exact double
// comparisons (elem_max · 2^k is exact in double).
int mx_scale_reference(double amax, double elem_max) {
  if (!(amax > 0)) return 0;
  for (int e = 0; e <= 254; ++e)
    if (std::ldexp(elem_max, e - 127) >= amax) return e;
  return 254;
}

}  // namespace

// =================================================================================================
// E2M1
// =================================================================================================

TEST(E2M1, DecodeEveryCode) {
  for (int c = 0; c < 16; ++c) {
    const float v = e2m1_decode(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(v), e2m1_value(static_cast<uint8_t>(c))) << "code " << c;
    EXPECT_EQ(std::signbit(v), c >= 8) << "code " << c;  // code 8 is -0
  }
  // Bits above the nibble are ignored by decode.
  EXPECT_EQ(e2m1_decode(0x17), 6.0f);
}

TEST(E2M1, EveryCodeRoundTrips) {
  for (int c = 0; c < 16; ++c)
    EXPECT_EQ(e2m1_encode(e2m1_decode(static_cast<uint8_t>(c))), c) << "code " << c;
}

TEST(E2M1, TiesGoToTheEvenCode) {
  // Midpoints between neighbours and the code they must round to (even mantissa = even code).
  struct Tie { float x; uint8_t code; };
  const Tie ties[] = {
      {0.25f, 0},  // 0 | 0.5   → 0   (code 0)
      {0.75f, 2},  // 0.5 | 1   → 1   (code 2)
      {1.25f, 2},  // 1 | 1.5   → 1   (code 2)
      {1.75f, 4},  // 1.5 | 2   → 2   (code 4)
      {2.5f, 4},   // 2 | 3     → 2   (code 4)
      {3.5f, 6},   // 3 | 4     → 4   (code 6)
      {5.0f, 6},   // 4 | 6     → 4   (code 6)
  };
  for (const Tie& t : ties) {
    EXPECT_EQ(e2m1_encode(t.x), t.code) << t.x;
    EXPECT_EQ(e2m1_encode(-t.x), t.code | 8) << -t.x;
    // One ulp either side of the tie goes to the nearer neighbour.
    const uint8_t below = e2m1_encode(std::nextafter(t.x, 0.0f));
    const uint8_t above = e2m1_encode(std::nextafter(t.x, kInf));
    EXPECT_LT(e2m1_value(below), t.x) << t.x;
    EXPECT_GT(e2m1_value(above), t.x) << t.x;
    EXPECT_EQ(above, below + 1) << t.x;
  }
}

// Every float across the decision points (0.2 … 5.5, ~40 M values, and their negatives): the code is
// the nearest E2M1 value's, a tie taking the even code (the branch-free encode against the rule).
TEST(E2M1, EncodeIsNearestTiesToEvenOnEveryFloatAcrossTheDecisions) {
  const uint32_t lo = f32_bits(0.2f), hi = f32_bits(5.5f);
  int64_t bad = 0;
  for (uint32_t b = lo; b <= hi; ++b) {
    const float x = from_bits(b);
    int best = 0;
    for (int c = 1; c < 8; ++c) {
      const double d = std::fabs(e2m1_value(static_cast<uint8_t>(c)) - x), db = std::fabs(e2m1_value(static_cast<uint8_t>(best)) - x);
      if (d < db || (d == db && c % 2 == 0)) best = c;
    }
    bad += e2m1_encode(x) != best;
    bad += e2m1_encode(-x) != (best | 8);
  }
  EXPECT_EQ(bad, 0);
}

TEST(E2M1, Saturation) {
  for (float x : {6.0f, 6.5f, 7.0f, 100.0f, 3.0e38f, kInf}) {
    EXPECT_EQ(e2m1_encode(x), 7) << x;
    EXPECT_EQ(e2m1_encode(-x), 15) << -x;
  }
}

TEST(E2M1, NaNEncodesAsPositiveZero) {
  EXPECT_EQ(e2m1_encode(kNaN), 0);
  EXPECT_EQ(e2m1_encode(-kNaN), 0);
  EXPECT_EQ(e2m1_encode(from_bits(0x7F800001u)), 0);  // signalling NaN
  EXPECT_EQ(e2m1_encode(from_bits(0xFFFFFFFFu)), 0);
}

TEST(E2M1, SignOfZeroIsKept) {
  EXPECT_EQ(e2m1_encode(0.0f), 0);
  EXPECT_EQ(e2m1_encode(-0.0f), 8);
  EXPECT_EQ(e2m1_encode(-0.1f), 8);   // rounds to zero, keeps the sign (formats.h)
  EXPECT_EQ(e2m1_encode(-0.25f), 8);  // tie to zero
  EXPECT_EQ(e2m1_encode(-1e-45f), 8); // fp32 subnormal
}

TEST(E2M1, MatchesBruteForceNearest) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = u(rng);
    ASSERT_EQ(e2m1_encode(x), e2m1_reference(x)) << x;
  }
  // Every multiple of 1/64 in [-8, 8], which includes every tie.
  for (int k = -512; k <= 512; ++k) {
    const float x = k / 64.0f;
    ASSERT_EQ(e2m1_encode(x), e2m1_reference(x)) << x;
  }
}

// A kernel-side rounding (e2m1_round, e4m3_round) equals decode(encode(x)) bit for bit on every float
// whose exponent field is 100..140 (|x| from 2^-27 to below 2^14: every decision point of both formats
// and its neighbours), on every 997th float of the rest, and on the special values. (All 2^32 floats
// were compared once when each was written.)
template <class Round, class RoundTrip>
void expect_round_equals_round_trip(Round round, RoundTrip round_trip) {
  auto check = [&](uint32_t u) {
    const float x = from_bits(u);
    return bits(round_trip(x)) == bits(round(x));
  };
  int64_t bad = 0;
  uint32_t first = 0;
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t u = 100u << 23; u < (141u << 23); ++u)
      if (!check(sign | u) && bad++ == 0) first = sign | u;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 997)
    if (!check(static_cast<uint32_t>(u)) && bad++ == 0) first = static_cast<uint32_t>(u);
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x7F800000u, 0xFF800000u, 0x7F800001u,
                     0x7FC00000u, 0xFFC00000u, 0xFFFFFFFFu, 0x7F7FFFFFu, 0xFF7FFFFFu})
    if (!check(u) && bad++ == 0) first = u;
  EXPECT_EQ(bad, 0) << "first at bits 0x" << std::hex << first << " (" << from_bits(first) << ")";
}

TEST(E2M1, RoundEqualsDecodeOfEncode) {
  expect_round_equals_round_trip(e2m1_round, [](float x) { return e2m1_decode(e2m1_encode(x)); });
}

TEST(E4M3, RoundEqualsDecodeOfEncode) {
  expect_round_equals_round_trip(e4m3_round, [](float x) { return e4m3_decode(e4m3_encode(x)); });
}

// =================================================================================================
// E4M3
// =================================================================================================

TEST(E4M3, DecodeEveryByte) {
  for (int b = 0; b < 256; ++b) {
    const float v = e4m3_decode(static_cast<uint8_t>(b));
    const double want = e4m3_value(static_cast<uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(v)) << "byte " << b;
    } else {
      EXPECT_EQ(static_cast<double>(v), want) << "byte " << b;
      EXPECT_EQ(std::signbit(v), b >= 0x80) << "byte " << b;
    }
  }
  // Anchors from the OCP table.
  EXPECT_EQ(e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(e4m3_decode(0xFE), -448.0f);
  EXPECT_EQ(e4m3_decode(0x38), 1.0f);
  EXPECT_EQ(e4m3_decode(0x08), 0.015625f);          // 2^-6, smallest normal
  EXPECT_EQ(e4m3_decode(0x07), 7.0f / 512.0f);      // largest subnormal
  EXPECT_EQ(e4m3_decode(0x01), 1.0f / 512.0f);      // 2^-9, smallest subnormal
  EXPECT_TRUE(std::isnan(e4m3_decode(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_decode(0xFF)));
}

TEST(E4M3, EveryNonNaNByteRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;
    EXPECT_EQ(e4m3_encode(e4m3_decode(static_cast<uint8_t>(b))), b) << "byte " << b;  // 0x80 is -0
  }
}

TEST(E4M3, TiesBetweenNeighboursGoToEvenMantissa) {
  for (int b = 0; b < 0x7E; ++b) {
    const double lo = e4m3_value(static_cast<uint8_t>(b)), hi = e4m3_value(static_cast<uint8_t>(b + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // ≤ 5 significant bits: exact in fp32
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const int even = (b % 2 == 0) ? b : b + 1;  // the byte's LSB is the mantissa's LSB
    EXPECT_EQ(e4m3_encode(mid), even) << "tie between bytes " << b << " and " << b + 1 << " at " << mid;
    EXPECT_EQ(e4m3_encode(-mid), even | 0x80) << -mid;
    EXPECT_EQ(e4m3_encode(std::nextafter(mid, 0.0f)), b) << mid;
    EXPECT_EQ(e4m3_encode(std::nextafter(mid, kInf)), b + 1) << mid;
  }
}

TEST(E4M3, SaturatesToMaxFinite) {
  // 448 is the largest finite; 464 is the midpoint to 480 (which is NaN's slot in "fn"): satfinite.
  for (float x : {448.0f, 449.0f, 463.9f, 464.0f, 465.0f, 1000.0f, 1e9f, 3.4e38f, kInf}) {
    EXPECT_EQ(e4m3_encode(x), 0x7E) << x;
    EXPECT_EQ(e4m3_encode(-x), 0xFE) << -x;
  }
  EXPECT_EQ(e4m3_encode(432.0f), 0x7E);  // tie 416 | 448 → 448 (mantissa 6 is even)
  EXPECT_EQ(e4m3_encode(431.9f), 0x7D);  // 416
}

TEST(E4M3, Subnormals) {
  EXPECT_EQ(e4m3_encode(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(e4m3_encode(std::ldexp(3.0f, -9)), 0x03);
  EXPECT_EQ(e4m3_encode(std::ldexp(7.0f, -9)), 0x07);
  EXPECT_EQ(e4m3_encode(std::ldexp(1.0f, -10)), 0x00);   // tie 0 | 2^-9 → 0 (even)
  EXPECT_EQ(e4m3_encode(std::ldexp(3.0f, -10)), 0x02);   // tie 1 | 2 (·2^-9) → 2
  EXPECT_EQ(e4m3_encode(std::ldexp(5.0f, -10)), 0x02);   // tie 2 | 3 → 2
  EXPECT_EQ(e4m3_encode(std::ldexp(15.0f, -10)), 0x08);  // tie 7·2^-9 | 2^-6 → 0x08 (even)
  EXPECT_EQ(e4m3_encode(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(e4m3_encode(std::ldexp(1.0f, -11)), 0x00);
  EXPECT_EQ(e4m3_encode(-std::ldexp(3.0f, -9)), 0x83);
  EXPECT_EQ(e4m3_encode(1e-40f), 0x00);                   // fp32 subnormal input
  EXPECT_EQ(e4m3_encode(-1e-40f), 0x80);
  EXPECT_EQ(e4m3_encode(0.0f), 0x00);
  EXPECT_EQ(e4m3_encode(-0.0f), 0x80);
}

TEST(E4M3, NaNKeepsItsSign) {
  EXPECT_EQ(e4m3_encode(kNaN), 0x7F);
  EXPECT_EQ(e4m3_encode(-kNaN), 0xFF);
  EXPECT_EQ(e4m3_encode(from_bits(0x7F800001u)), 0x7F);
  EXPECT_EQ(e4m3_encode(from_bits(0xFFC00001u)), 0xFF);
}

TEST(E4M3, MatchesBruteForceNearestOnAMillionFloats) {
  std::mt19937_64 rng(20240601);
  std::uniform_real_distribution<float> expo(-14.0f, 10.0f);  // 2^-14 .. 2^10: below subnormals to past max
  std::uniform_real_distribution<float> sub(0.0f, 0.016f);     // the subnormal region, linearly
  std::uniform_int_distribution<int> coin(0, 3);
  int mismatches = 0;
  for (int i = 0; i < 1000000; ++i) {
    float x;
    switch (coin(rng)) {
      case 0: x = sub(rng); break;
      case 1: {  // an exact midpoint between two neighbours, or one ulp off it
        const int b = static_cast<int>(rng() % 0x7E);
        x = static_cast<float>((e4m3_value(b) + e4m3_value(b + 1)) / 2);
        const int d = static_cast<int>(rng() % 3);
        if (d == 1) x = std::nextafter(x, 0.0f);
        if (d == 2) x = std::nextafter(x, kInf);
        break;
      }
      default: x = std::exp2(expo(rng)); break;
    }
    if (rng() & 1) x = -x;
    const uint8_t got = e4m3_encode(x), want = e4m3_reference(x);
    if (got != want && ++mismatches <= 10) ADD_FAILURE() << "x=" << x << " got " << int(got) << " want " << int(want);
  }
  EXPECT_EQ(mismatches, 0);
}

// =================================================================================================
// UE8M0, ceil_log2, mx_scale_byte
// =================================================================================================

TEST(UE8M0, DecodeEveryByte) {
  for (int e = 0; e < 255; ++e) {
    const float v = ue8m0_decode(static_cast<uint8_t>(e));
    EXPECT_EQ(static_cast<double>(v), std::ldexp(1.0, e - 127)) << "byte " << e;
  }
  EXPECT_TRUE(std::isnan(ue8m0_decode(0xFF)));
  EXPECT_EQ(ue8m0_decode(127), 1.0f);
  EXPECT_EQ(ue8m0_decode(0), from_bits(0x00400000u));  // 2^-127 is an fp32 subnormal
  EXPECT_EQ(ue8m0_decode(254), from_bits(0x7F000000u));  // 2^127
}

TEST(CeilLog2, PowersOfTwoAndNeighbours) {
  for (int k = -149; k <= 127; ++k) {
    const float p = std::ldexp(1.0f, k);
    ASSERT_EQ(ceil_log2(p), k) << "2^" << k;
    ASSERT_EQ(ceil_log2(std::nextafter(p, kInf)), k + 1) << "just above 2^" << k;
    // Just below 2^k is in (2^(k-1), 2^k) — except below 2^-148, where the next float down is 2^-149.
    if (k > -148) { ASSERT_EQ(ceil_log2(std::nextafter(p, 0.0f)), k) << "just below 2^" << k; }
  }
  EXPECT_EQ(ceil_log2(3.0f), 2);
  EXPECT_EQ(ceil_log2(0.75f), 0);
  EXPECT_EQ(ceil_log2(from_bits(0x00000003u)), -147);  // 3 · 2^-149
  EXPECT_EQ(ceil_log2(from_bits(0x007FFFFFu)), -126);  // largest subnormal
  EXPECT_EQ(ceil_log2(std::numeric_limits<float>::max()), 128);
}

TEST(CeilLog2, MatchesFrexpOnRandomFloats) {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng() % 0x7F800000u) + 1;  // every positive finite
    const float x = from_bits(u);
    int e;
    const double f = std::frexp(static_cast<double>(x), &e);  // x = f · 2^e, f in [0.5, 1)
    ASSERT_EQ(ceil_log2(x), f == 0.5 ? e - 1 : e) << x;
  }
}

TEST(MxScaleByte, HandValues) {
  EXPECT_EQ(mx_scale_byte(6.0f, 6.0f), 127);                      // 6/6 = 1 = 2^0
  EXPECT_EQ(mx_scale_byte(std::nextafter(6.0f, kInf), 6.0f), 128);
  EXPECT_EQ(mx_scale_byte(12.0f, 6.0f), 128);
  EXPECT_EQ(mx_scale_byte(12.5f, 6.0f), 129);                     // 2.08 → 2^2
  EXPECT_EQ(mx_scale_byte(3.0f, 6.0f), 126);                      // 0.5
  EXPECT_EQ(mx_scale_byte(3.1f, 6.0f), 127);
  EXPECT_EQ(mx_scale_byte(448.0f, 448.0f), 127);
  EXPECT_EQ(mx_scale_byte(1000.0f, 448.0f), 129);                 // 2.23 → 4
  EXPECT_EQ(mx_scale_byte(0.0f, 6.0f), 0);                        // zero → byte 0
  EXPECT_EQ(mx_scale_byte(kInf, 6.0f), 254);                      // Inf → the largest
  EXPECT_EQ(mx_scale_byte(3.4e38f, 6.0f), 253);                   // 5.67e37 lies in (2^125, 2^126]
  EXPECT_EQ(mx_scale_byte(std::numeric_limits<float>::max(), 448.0f), 247);  // 7.6e35 in (2^119, 2^120]
  EXPECT_EQ(mx_scale_byte(kNaN, 6.0f), 0xFF);
  EXPECT_EQ(mx_scale_byte(std::ldexp(6.0f, -127), 6.0f), 0);      // exactly 2^-127
  EXPECT_EQ(mx_scale_byte(std::ldexp(6.0f, -130), 6.0f), 0);      // clamped below
}

// amax so small that amax / elem_max underflows fp32 to zero (amax ≤ 3·2^-149 for E2M1's 6,
// ≤ 224·2^-149 for E4M3's 448) — the scale is byte 0 like any tiny block, and it must return.
TEST(MxScaleByte, TinySubnormalAmax) {
  for (uint32_t m : {1u, 2u, 3u, 4u, 100u, 224u, 225u}) {
    EXPECT_EQ(mx_scale_byte(from_bits(m), 6.0f), 0) << m;
    EXPECT_EQ(mx_scale_byte(from_bits(m), 448.0f), 0) << m;
  }
}

TEST(MxScaleByte, MatchesExactRuleOnRandomAmax) {
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<float> expo(-110.0f, 127.0f);  // t = amax/elem_max stays a normal fp32
  for (int i = 0; i < 100000; ++i) {
    const float amax = std::exp2(expo(rng)) * (1.0f + (rng() % 1000) / 1000.0f);
    if (!std::isfinite(amax)) continue;
    ASSERT_EQ(mx_scale_byte(amax, 6.0f), mx_scale_reference(amax, 6.0)) << amax;
    ASSERT_EQ(mx_scale_byte(amax, 448.0f), mx_scale_reference(amax, 448.0)) << amax;
  }
}

// =================================================================================================
// bf16
// =================================================================================================

TEST(BF16, EveryPatternRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f32_from_bf16(static_cast<uint16_t>(h));
    ASSERT_EQ(bits(f), h << 16);
    if (std::isnan(f)) {
      const uint16_t r = bf16_from_f32(f);
      ASSERT_TRUE(std::isnan(f32_from_bf16(r))) << h;
      ASSERT_EQ(r & 0x8000, h & 0x8000) << h;  // sign kept
    } else {
      ASSERT_EQ(bf16_from_f32(f), h) << h;
    }
  }
}

TEST(BF16, RoundToNearestEven) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const uint16_t h = static_cast<uint16_t>(rng() % 0x7F7F);  // h and h+1 finite and positive
    const uint32_t base = static_cast<uint32_t>(h) << 16;
    // Exact tie: goes to the even one of h, h+1.
    const uint16_t even = (h & 1) ? h + 1 : h;
    ASSERT_EQ(bf16_from_f32(from_bits(base | 0x8000u)), even) << std::hex << h;
    ASSERT_EQ(bf16_from_f32(from_bits(base | 0x7FFFu)), h);
    ASSERT_EQ(bf16_from_f32(from_bits(base | 0x8001u)), h + 1);
    ASSERT_EQ(bf16_from_f32(from_bits((base | 0x8000u) | 0x80000000u)), even | 0x8000);
    // Against a nearest search in double.
    const float x = from_bits(base | static_cast<uint32_t>(rng() & 0xFFFF));
    const double lo = f32_from_bf16(h), hi = f32_from_bf16(h + 1), d = x;
    const uint16_t want = (d - lo < hi - d) ? h : (d - lo > hi - d) ? h + 1 : even;
    ASSERT_EQ(bf16_from_f32(x), want);
  }
  // The tie between the largest finite bf16 (0x7F7F) and +Inf rounds to even: Inf.
  EXPECT_EQ(bf16_from_f32(from_bits(0x7F7F8000u)), 0x7F80);
  EXPECT_EQ(bf16_from_f32(from_bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(bf16_from_f32(kInf), 0x7F80);
  EXPECT_EQ(bf16_from_f32(-kInf), 0xFF80);
  EXPECT_EQ(round_bf16(1.00390625f), 1.0f);      // 1 + 2^-8: tie → 1
  EXPECT_EQ(round_bf16(1.01171875f), 1.015625f); // 1 + 3·2^-8: tie → 1 + 2^-6
}

TEST(BF16, NaNStaysNaN) {
  // A NaN whose payload lives only in the low 16 bits must not become Inf.
  for (uint32_t u : {0x7F800001u, 0x7F80FFFFu, 0xFF800001u, 0x7FC00000u, 0x7FFFFFFFu}) {
    const uint16_t h = bf16_from_f32(from_bits(u));
    EXPECT_TRUE(std::isnan(f32_from_bf16(h))) << std::hex << u;
    EXPECT_EQ(h & 0x8000, (u >> 16) & 0x8000) << std::hex << u;
  }
}

// =================================================================================================
// Packing
// =================================================================================================

// Whether v is exactly an IEEE binary16 value, from the format's definition: |v| ≤ 65504 and v a
// multiple of 2^max(e − 11, −24), where 2^(e−1) ≤ |v| < 2^e (11 significant bits for normals,
// subnormals multiples of 2^-24).
namespace {
bool exact_in_f16(double v) {
  if (v == 0) return true;
  if (!std::isfinite(v) || std::fabs(v) > 65504.0) return false;
  int e = 0;
  std::frexp(v, &e);
  const double m = std::ldexp(v, -std::max(e - 11, -24));
  return m == std::floor(m);
}
}  // namespace

// The f16 paths (the NVFP4-a4 variants of direct_micro and of dynamic's register path: frag_a_f16,
// store_act) rest on this: every NVFP4 activation value (E2M1 code × E4M3 block scale; the global
// scale is in alpha) and every weight value as frag_a_f16 reads it (code × scale × 2^-6) is an f16
// value, so f16 tensor cores multiply the same numbers the bf16 ones would.
TEST(F16, EveryNvfp4ValueIsExactInF16) {
  EXPECT_TRUE(exact_in_f16(65504.0));
  EXPECT_TRUE(exact_in_f16(std::ldexp(1.0, -24)));  // the smallest subnormal
  EXPECT_FALSE(exact_in_f16(65520.0));
  EXPECT_FALSE(exact_in_f16(1.0 + std::ldexp(1.0, -11)));  // 12 significant bits
  EXPECT_FALSE(exact_in_f16(std::ldexp(1.0, -25)));
  EXPECT_FALSE(exact_in_f16(3.0 * std::ldexp(1.0, -25)));
  int checked = 0;
  for (int c = 0; c < 16; ++c)
    for (int s = 0; s < 256; ++s) {
      const float scale = e4m3_decode(static_cast<uint8_t>(s));
      if (std::isnan(scale)) continue;
      const double v = double(e2m1_decode(static_cast<uint8_t>(c))) * double(scale);
      EXPECT_TRUE(exact_in_f16(v)) << "activation: code " << c << " × scale byte " << s << " = " << v;
      EXPECT_TRUE(exact_in_f16(std::ldexp(v, -6))) << "weight: code " << c << " × scale byte " << s << " × 2^-6";
      ++checked;
    }
  EXPECT_EQ(checked, 16 * 254);  // every code with every finite scale byte (0x7F and 0xFF are NaN)
}

TEST(Packing, LowNibbleFirst) {
  for (int lo = 0; lo < 16; ++lo)
    for (int hi = 0; hi < 16; ++hi)
      ASSERT_EQ(pack_e2m1x2(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)), lo + 16 * hi);
  EXPECT_EQ(pack_e2m1x2(0x1F, 0x2E), 0xEF);  // bits above the nibble are dropped
  const uint8_t packed[3] = {0x21, 0x43, 0xF0};
  const uint8_t want[6] = {1, 2, 3, 4, 0, 15};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(unpack_e2m1(packed, i), want[i]) << i;
}

// =================================================================================================
// Block quantisers: hand-computed vectors
// =================================================================================================

namespace {
std::vector<uint8_t> pack(const uint8_t* codes, int n) {
  std::vector<uint8_t> p(n / 2);
  for (int i = 0; i < n; i += 2) p[i / 2] = pack_e2m1x2(codes[i], codes[i + 1]);
  return p;
}
}  // namespace

// The kernels' amax (block_amax_bits) against block_amax on blocks of random bit patterns (every
// class: NaNs of both signs, infinities, zeros, subnormals, normals) and of random finite values:
// the NaN flag always agrees, and amax wherever no element is NaN.
TEST(BlockAmax, BitsFormMatchesFloatForm) {
  std::mt19937_64 rng(34);
  const uint32_t specials[] = {0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7F800000u, 0xFF800000u, 0x00000000u,
                               0x80000000u, 0x00000001u, 0x807FFFFFu, 0x3F800000u, 0xC0C00000u};
  int nan_blocks = 0, clean_blocks = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    float v[32];
    const int n = trial % 2 ? 32 : 16;
    for (int i = 0; i < n; ++i) {
      const uint64_t r = rng();
      if (trial % 3 == 0) v[i] = static_cast<float>(static_cast<int64_t>(r % 2000001) - 1000000) * 1e-3f;
      else if (r % 8 == 0) v[i] = bits_f32(specials[(r >> 8) % (sizeof(specials) / sizeof(specials[0]))]);
      else v[i] = bits_f32(static_cast<uint32_t>(r >> 32));
    }
    bool nan_f, nan_b;
    const float a_f = block_amax(v, n, &nan_f);
    const float a_b = block_amax_bits(v, n, &nan_b);
    ASSERT_EQ(nan_f, nan_b) << "trial " << trial;
    if (!nan_f) {
      ASSERT_EQ(f32_bits(a_f), f32_bits(a_b)) << "trial " << trial;
    }
    (nan_f ? nan_blocks : clean_blocks)++;
  }
  EXPECT_GT(nan_blocks, 1000);  // both cases were exercised
  EXPECT_GT(clean_blocks, 1000);
}

TEST(Nvfp4Block, HandVectorUnitScale) {
  // amax 6, g = 1: sf = 6/(6·1) = 1 → E4M3 0x38 (exponent 7, mantissa 0); codes are the values.
  const float v[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.5f, -1, -1.5f, -2, -3, -4, -6, 0.25f};
  uint8_t codes[16];
  EXPECT_EQ(nvfp4_quantize_block(v, 1.0f, codes), 0x38);
  // 0,1 | 2,3 | 4,5 | 6,7 | 9,A | B,C | D,E | F,0 (0.25 is the tie 0|0.5 → 0), low nibble first:
  const std::vector<uint8_t> want = {0x10, 0x32, 0x54, 0x76, 0xA9, 0xCB, 0xED, 0x0F};
  EXPECT_EQ(pack(codes, 16), want);
}

TEST(Nvfp4Block, HandVectorWithGlobalScale) {
  // Values ×2, g = 0.5, amax 12: sf = 12/(6·0.5) = 4 → E4M3 exponent 9, mantissa 0 → 0x48;
  // 1/(4·0.5) = 0.5, so the codes are those of the previous vector.
  float v[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.5f, -1, -1.5f, -2, -3, -4, -6, 0.25f};
  for (float& x : v) x *= 2;
  uint8_t codes[16];
  EXPECT_EQ(nvfp4_quantize_block(v, 0.5f, codes), 0x48);
  const std::vector<uint8_t> want = {0x10, 0x32, 0x54, 0x76, 0xA9, 0xCB, 0xED, 0x0F};
  EXPECT_EQ(pack(codes, 16), want);
}

TEST(Nvfp4Block, HandVectorRoundedScale) {
  // amax 10, g = 1: sf = 10/6 = 1.667 lies between E4M3 1.625 (m=5) and 1.75 (m=6), nearer 1.625
  // → byte 0x3D (0.0111.101). Elements are divided by 1.625:
  //   10 → 6.15 → 6 (7);  3 → 1.85 → 2 (4);  1 → 0.615 → 0.5 (1);  -2.5 → -1.54 → -1.5 (B);
  //   0.4 → 0.246 → 0 (0);  0.41 → 0.252 → 0.5 (1);  the rest 0.
  float v[16] = {10, 3, 1, -2.5f, 0.4f, 0.41f};
  uint8_t codes[16];
  EXPECT_EQ(nvfp4_quantize_block(v, 1.0f, codes), 0x3D);
  const std::vector<uint8_t> want = {0x47, 0xB1, 0x10, 0, 0, 0, 0, 0};
  EXPECT_EQ(pack(codes, 16), want);
}

TEST(Nvfp4Block, SubnormalBlockScale) {
  // amax = 18·2^-9, g = 1: sf = 3·2^-9, an E4M3 subnormal → byte 0x03. Elements / (3·2^-9):
  //   18·2^-9 → 6 (7);  9·2^-9 → 3 (5);  2^-9 → 0.333 → 0.5 (1);  -2^-10 → -0.167 → -0 (8).
  float v[16] = {18.0f / 512, 9.0f / 512, 1.0f / 512, -1.0f / 1024};
  uint8_t codes[16];
  EXPECT_EQ(nvfp4_quantize_block(v, 1.0f, codes), 0x03);
  EXPECT_EQ(codes[0], 7);
  EXPECT_EQ(codes[1], 5);
  EXPECT_EQ(codes[2], 1);
  EXPECT_EQ(codes[3], 8);
  for (int i = 4; i < 16; ++i) EXPECT_EQ(codes[i], 0);
}

TEST(Nvfp4Block, ScaleUnderflowingToZeroZeroesTheBlock) {
  // sf = amax/6 = 2^-10 is the tie between E4M3 0 and 2^-9 → 0 (even): the block quantises to zero.
  uint8_t codes[16];
  float v[16] = {6.0f / 1024, -3.0f / 1024};
  EXPECT_EQ(nvfp4_quantize_block(v, 1.0f, codes), 0x00);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(codes[i], 0) << i;
  // One ulp more: sf rounds up to 2^-9 (byte 1); 6·2^-10 / 2^-9 = 3.0… → code 5.
  v[0] = std::nextafter(6.0f / 1024, 1.0f);
  EXPECT_EQ(nvfp4_quantize_block(v, 1.0f, codes), 0x01);
  EXPECT_EQ(codes[0], 5);
  EXPECT_EQ(codes[1], 0xB);  // -3·2^-10 / 2^-9 = -1.5
}

TEST(Nvfp4Block, AllZeroBlock) {
  float v[16] = {};
  uint8_t codes[16];
  std::fill(codes, codes + 16, 0xAA);
  EXPECT_EQ(nvfp4_quantize_block(v, 1.0f, codes), 0x00);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(codes[i], 0);
}

TEST(Nvfp4Block, ZeroGlobalScale) {
  const float v[16] = {1, -2, 3, 448, 1e9f};
  uint8_t codes[16];
  for (float g : {0.0f, -0.0f}) {
    std::fill(codes, codes + 16, 0xAA);
    EXPECT_EQ(nvfp4_quantize_block(v, g, codes), 0x00) << g;
    for (int i = 0; i < 16; ++i) EXPECT_EQ(codes[i], 0) << i;
  }
}

TEST(Nvfp4Block, NaNInBlock) {
  float v[16] = {1, 2, 3};
  v[9] = kNaN;
  uint8_t codes[16];
  const uint8_t s = nvfp4_quantize_block(v, 1.0f, codes);
  EXPECT_EQ(s, 0x7F);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(codes[i], 0);
    EXPECT_TRUE(std::isnan(e2m1_decode(codes[i]) * e4m3_decode(s)));  // the whole block decodes to NaN
  }
}

TEST(Nvfp4Block, InfInBlock) {
  // amax = Inf → sf clamps to 448 (0x7E); ±Inf → ±6 (codes 7 / F); 1/448 and 300/448 = 0.67 → 0 / 0.5.
  float v[16] = {kInf, -kInf, 1.0f, 300.0f};
  uint8_t codes[16];
  EXPECT_EQ(nvfp4_quantize_block(v, 1.0f, codes), 0x7E);
  EXPECT_EQ(codes[0], 7);
  EXPECT_EQ(codes[1], 15);
  EXPECT_EQ(codes[2], 0);
  EXPECT_EQ(codes[3], 1);
}

TEST(Nvfp4Block, ScaleClampsAt448) {
  // amax 6000, g = 1: sf = 1000 > 448 → 448 (0x7E); 6000/448 = 13.4 → saturates to 6.
  float v[16] = {6000.0f, 448.0f, -896.0f};
  uint8_t codes[16];
  EXPECT_EQ(nvfp4_quantize_block(v, 1.0f, codes), 0x7E);
  EXPECT_EQ(codes[0], 7);
  EXPECT_EQ(codes[1], 2);     // 1
  EXPECT_EQ(codes[2], 0xC);   // -2
}

TEST(Mxfp4Block, HandVector) {
  // amax 12: 12/6 = 2 = 2^1 → byte 128, elements / 2:
  //   12 → 6 (7); -12 → -6 (F); 3 → 1.5 (3); 1 → 0.5 (1); 0.5 → 0.25 → 0 (tie, 0);
  //   5 → 2.5 → 2 (tie, 4); 7 → 3.5 → 4 (tie, 6); -0.75 → -0.375 → -0.5 (9); rest 0.
  float v[32] = {12, -12, 3, 1, 0.5f, 5, 7, -0.75f};
  uint8_t codes[32];
  EXPECT_EQ(mxfp4_quantize_block(v, codes), 128);
  const std::vector<uint8_t> want = {0xF7, 0x13, 0x40, 0x96, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(pack(codes, 32), want);
}

TEST(Mxfp4Block, ScaleBoundary) {
  uint8_t codes[32];
  float v[32] = {6.0f};
  EXPECT_EQ(mxfp4_quantize_block(v, codes), 127);  // 6/6 = 2^0
  EXPECT_EQ(codes[0], 7);
  v[0] = 6.5f;  // 1.083 → 2^1: 6.5/2 = 3.25 → 3 (5)
  EXPECT_EQ(mxfp4_quantize_block(v, codes), 128);
  EXPECT_EQ(codes[0], 5);
  v[0] = 0.1f;  // 0.0167 → 2^-5 = 0.03125 → byte 122; 0.1/0.03125 = 3.2 → 3 (5)
  EXPECT_EQ(mxfp4_quantize_block(v, codes), 122);
  EXPECT_EQ(codes[0], 5);
}

TEST(Mxfp4Block, AllZeroTinyNaNInf) {
  uint8_t codes[32];
  float v[32] = {};
  std::fill(codes, codes + 32, 0xAA);
  EXPECT_EQ(mxfp4_quantize_block(v, codes), 0);  // 2^-127
  for (int i = 0; i < 32; ++i) EXPECT_EQ(codes[i], 0);

  v[5] = from_bits(1);  // 2^-149: the scale clamps to 2^-127; 2^-149 · 2^127 = 2^-22 → 0
  EXPECT_EQ(mxfp4_quantize_block(v, codes), 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(codes[i], 0);

  v[5] = 1.0f;
  v[31] = kNaN;
  EXPECT_EQ(mxfp4_quantize_block(v, codes), 0xFF);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(codes[i], 0);

  float w[32] = {kInf, -kInf, 1.0f, -3.0e38f};
  EXPECT_EQ(mxfp4_quantize_block(w, codes), 254);  // the largest the rule allows
  EXPECT_EQ(codes[0], 7);
  EXPECT_EQ(codes[1], 15);
  EXPECT_EQ(codes[2], 0);
  EXPECT_EQ(codes[3], 0xC);  // -3e38 · 2^-127 = -1.763, past the midpoint 1.75 → -2
}

// Zero blocks made of -0.0: MX codes keep the sign of zero (they still decode to zero); NVFP4's zero
// block scale zeroes every code (formats.h, "A block of zeros").
TEST(BlockQuantisers, NegativeZeroBlocks) {
  float v[32];
  std::fill(v, v + 32, -0.0f);
  uint8_t codes[32];
  EXPECT_EQ(nvfp4_quantize_block(v, 1.0f, codes), 0x00);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(codes[i], 0);
  EXPECT_EQ(mxfp4_quantize_block(v, codes), 0);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(codes[i], 8);
    EXPECT_EQ(e2m1_decode(codes[i]) * ue8m0_decode(0), 0.0f);
  }
  EXPECT_EQ(mxfp8_quantize_block(v, codes), 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(codes[i], 0x80);
}

TEST(Mxfp8Block, HandVector) {
  // amax 448 → 448/448 = 2^0 → byte 127. 448 → 0x7E; 1 → 0x38; -0.5 → 0xB0 (1.0110.000);
  // 3·2^-9 → 0x03 (subnormal); 240 → 0x77 (2^7·1.875); 0.3 → 0.3125 → 0x2A? see below.
  // 0.3 = 2^-2 · 1.2 → mantissa 1.2·8 = 9.6-8 = 1.6 → 2 → 2^-2 · 1.25 = 0.3125: exponent 5, m 2 → 0x2A.
  float v[32] = {448.0f, 1.0f, -0.5f, 3.0f / 512, 240.0f, 0.3f};
  uint8_t q[32];
  EXPECT_EQ(mxfp8_quantize_block(v, q), 127);
  const uint8_t want[6] = {0x7E, 0x38, 0xB0, 0x03, 0x77, 0x2A};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(q[i], want[i]) << i;
  for (int i = 6; i < 32; ++i) EXPECT_EQ(q[i], 0) << i;

  // amax 1000: 1000/448 = 2.23 → 2^2 → byte 129; 1000/4 = 250 = 2^7 · 1.953 → mantissa rounds up to
  // 2 → 2^8 → 0x78 (0.1111.000 = 256).
  float w[32] = {1000.0f};
  EXPECT_EQ(mxfp8_quantize_block(w, q), 129);
  EXPECT_EQ(q[0], 0x78);
}

TEST(Mxfp8Block, AllZeroNaNInf) {
  uint8_t q[32];
  float v[32] = {};
  EXPECT_EQ(mxfp8_quantize_block(v, q), 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q[i], 0);
  v[3] = -kNaN;
  v[4] = 2.0f;
  EXPECT_EQ(mxfp8_quantize_block(v, q), 0xFF);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q[i], 0);
  float w[32] = {-kInf, kInf, 5.0f};
  EXPECT_EQ(mxfp8_quantize_block(w, q), 254);
  EXPECT_EQ(q[0], 0xFE);
  EXPECT_EQ(q[1], 0x7E);
  EXPECT_EQ(q[2], 0x00);  // 5 · 2^-127 underflows E4M3
}

// =================================================================================================
// Block quantisers: properties on random blocks
// =================================================================================================

namespace {

// A random block: magnitudes spread over `decades` powers of two below a random amax, some zeros,
// random signs.
void random_block(std::mt19937_64& rng, float* v, int n, float amax_log2_lo, float amax_log2_hi) {
  std::uniform_real_distribution<float> top(amax_log2_lo, amax_log2_hi), u(0.0f, 1.0f);
  const float amax = std::exp2(top(rng));
  for (int i = 0; i < n; ++i) {
    const float r = u(rng);
    v[i] = r < 0.05f ? 0.0f : amax * (r < 0.5f ? u(rng) : std::exp2(-12.0f * u(rng)));
    if (rng() & 1) v[i] = -v[i];
  }
  v[rng() % n] = (rng() & 1) ? amax : -amax;
}

// Checks that `code` is the E2M1 code nearest to x (ties to even, saturating), allowing either
// neighbour when x lies within rel·|x| of a decision point (the quantiser multiplies by a rounded
// reciprocal, so it may land on the other side of a midpoint by an ulp).
::testing::AssertionResult e2m1_nearest(uint8_t code, double x, double rel) {
  const uint8_t want = e2m1_reference(static_cast<float>(x));
  if (code == want) return ::testing::AssertionSuccess();
  const double a = std::fabs(x);
  for (int c = 0; c < 7; ++c) {
    const double mid = (kE2M1[c] + kE2M1[c + 1]) / 2;
    if (std::fabs(a - mid) <= rel * a && ((code & 7) == c || (code & 7) == c + 1) && (code & 8) == (want & 8))
      return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "x=" << x << " code " << int(code) << " nearest " << int(want);
}

}  // namespace

TEST(Nvfp4Block, PropertyNearestGivenScale) {
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<float> glog(-12.0f, 4.0f);
  float v[16];
  uint8_t codes[16];
  int subnormal_scales = 0, clamped = 0;
  for (int it = 0; it < 20000; ++it) {
    const float g = std::exp2(glog(rng));
    // amax/(6g) from 2^-12 (sf underflows / is subnormal) to 2^10 (clamped at 448).
    const float lo = std::log2(6.0f * g) - 12.0f, hi = std::log2(6.0f * g) + 10.0f;
    random_block(rng, v, 16, lo, hi);
    const uint8_t s = nvfp4_quantize_block(v, g, codes);
    // The scale is the rule's: e4m3(min(amax / (6·g), 448)) with IEEE fp32 division.
    float amax = 0;
    for (float x : v) amax = std::max(amax, std::fabs(x));
    const float sf = std::min(amax / (6.0f * g), 448.0f);
    ASSERT_EQ(s, e4m3_reference(sf)) << "amax " << amax << " g " << g;
    const double qs = e4m3_value(s);
    if (s > 0 && s < 8) ++subnormal_scales;
    if (s == 0x7E && amax / (6.0f * g) > 448.0f) ++clamped;
    for (int i = 0; i < 16; ++i) {
      if (qs == 0) {
        ASSERT_EQ(codes[i], 0);
        continue;
      }
      const double x = static_cast<double>(v[i]) / (qs * g);
      ASSERT_TRUE(e2m1_nearest(codes[i], x, 1e-6)) << "element " << i << " g " << g << " sf " << qs;
      // Hence the dequantised error is at most half a code step (or the saturation error).
      const double d = e2m1_value(codes[i]) * qs * g, step = std::fabs(x) < 2 ? 0.5 : (std::fabs(x) < 4 ? 1 : 2);
      if (std::fabs(x) <= 6) {
        ASSERT_LE(std::fabs(d - v[i]), (step / 2) * qs * g * (1 + 3e-5));
      }
    }
  }
  EXPECT_GT(subnormal_scales, 100);  // the property covered E4M3 subnormal scales
  EXPECT_GT(clamped, 100);           // and the clamp at 448
}

TEST(Mxfp4Block, PropertyNearestGivenScale) {
  std::mt19937_64 rng(777);
  float v[32];
  uint8_t codes[32];
  for (int it = 0; it < 20000; ++it) {
    random_block(rng, v, 32, -100.0f, 100.0f);
    const uint8_t e = mxfp4_quantize_block(v, codes);
    float amax = 0;
    for (float x : v) amax = std::max(amax, std::fabs(x));
    ASSERT_EQ(e, mx_scale_reference(amax, 6.0));
    for (int i = 0; i < 32; ++i) {
      const double x = std::ldexp(static_cast<double>(v[i]), 127 - e);  // exact
      ASSERT_LE(std::fabs(x), 6.0);                                    // the rule never saturates
      ASSERT_EQ(codes[i], e2m1_reference(static_cast<float>(x))) << "x=" << x;  // power-of-two scale: exact
    }
  }
}

TEST(Mxfp8Block, PropertyNearestGivenScale) {
  std::mt19937_64 rng(4242);
  float v[32];
  uint8_t q[32];
  for (int it = 0; it < 20000; ++it) {
    random_block(rng, v, 32, -100.0f, 100.0f);
    const uint8_t e = mxfp8_quantize_block(v, q);
    float amax = 0;
    for (float x : v) amax = std::max(amax, std::fabs(x));
    ASSERT_EQ(e, mx_scale_reference(amax, 448.0));
    for (int i = 0; i < 32; ++i) {
      const double x = std::ldexp(static_cast<double>(v[i]), 127 - e);
      ASSERT_LE(std::fabs(x), 448.0);
      ASSERT_EQ(q[i], e4m3_reference(static_cast<float>(x))) << "x=" << x;
    }
  }
}
