// Weights: quantize_projection (NVFP4 with a per-expert global decode scale, MXFP4), the 128x4
// scale swizzle, canonicalize() of every checkpoint layout, and its rejections.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "cpu/expect_error.h"
#include "fp4moe/fp4moe.h"
#include "reference/reference.h"
#include "testing/problem.h"

using namespace fp4moe;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Decoding written out here, independently of formats.h.
double e2m1_value(int c) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (c & 8) ? -mag[c & 7] : mag[c & 7];
}
double e4m3_value(int b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (b & 0x80) ? -v : v;
}
int nibble(const std::vector<uint8_t>& packed, int64_t i) { return (packed[i / 2] >> (4 * (i % 2))) & 15; }

// Dense value of element (e, r, k) of a linear-layout projection, and the block scale used.
double dequant(const QuantizedProjection& p, int e, int r, int k, double* scale = nullptr) {
  const int64_t sc = p.cols / p.block();
  const int64_t kb = k / p.block();
  const uint8_t sb = p.scale_layout == ScaleLayout::kLinear
                         ? p.scales[(static_cast<int64_t>(e) * p.rows + r) * sc + kb]
                         : p.scales[e * swizzled_scale_bytes(p.rows, sc) + swizzled_scale_offset(r, kb, (sc + 3) / 4)];
  const double s = p.format == WeightFormat::kNVFP4 ? e4m3_value(sb) * p.global_scale[e] : std::ldexp(1.0, sb - 127);
  if (scale) *scale = s;
  return e2m1_value(nibble(p.packed, (static_cast<int64_t>(e) * p.rows + r) * p.cols + k)) * s;
}

std::vector<float> normal_weights(size_t n, float std, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> w(n);
  for (auto& v : w) v = d(rng);
  return w;
}

// Accuracy bound of one element, for both formats. With s the element's effective block scale
// (E4M3·g or 2^e) and x = w/s: E2M1 spacing is 0.5 below 2, 1 in [2,4), 2 in [4,6], so rounding to
// nearest errs by at most 0.25·s below |x| = 1 and by at most |x|/4 (relative 25%) above. NVFP4's
// E4M3 scale may round down by up to 1/16, so |x| can reach 6·17/16 = 6.375 and saturate to 6: error
// 0.375 ≤ |x|/4 still. MXFP4's scale 2^ceil(log2(amax/6)) keeps |x| ≤ 6. Hence
//     |deq − w| ≤ max(|w|, s) / 4.
void check_projection_accuracy(const QuantizedProjection& q, const std::vector<float>& w) {
  double err2 = 0, ref2 = 0;
  for (int e = 0; e < q.experts; ++e)
    for (int r = 0; r < q.rows; ++r)
      for (int k = 0; k < q.cols; ++k) {
        double s;
        const double v = w[(static_cast<size_t>(e) * q.rows + r) * q.cols + k];
        const double d = dequant(q, e, r, k, &s);
        ASSERT_LE(std::fabs(d - v), std::max(std::fabs(v), s) / 4 * (1 + 1e-6))
            << "expert " << e << " row " << r << " col " << k << " w " << v << " deq " << d << " s " << s;
        err2 += (d - v) * (d - v), ref2 += v * v;
      }
  // Normal data: about 0.09 for both formats (E2M1 has one mantissa bit); 0.12 guards regressions.
  if (ref2 > 0) { EXPECT_LT(std::sqrt(err2 / ref2), 0.12); }
}

}  // namespace

// =================================================================================================
// quantize_projection
// =================================================================================================

TEST(QuantizeProjection, Nvfp4GlobalScaleAndAccuracy) {
  const int E = 4, R = 24, C = 64;
  std::vector<float> w(static_cast<size_t>(E) * R * C);
  const float stds[E] = {0.01f, 1.0f, 300.0f, 0.0f};  // expert 3 is all zeros
  for (int e = 0; e < E; ++e) {
    auto we = normal_weights(static_cast<size_t>(R) * C, stds[e], 100 + e);
    std::copy(we.begin(), we.end(), w.begin() + static_cast<size_t>(e) * R * C);
  }
  const QuantizedProjection q = quantize_projection(w.data(), E, R, C, WeightFormat::kNVFP4, ScaleLayout::kLinear);
  ASSERT_EQ(q.packed.size(), static_cast<size_t>(E) * R * C / 2);
  ASSERT_EQ(q.scales.size(), static_cast<size_t>(E) * R * (C / 16));
  ASSERT_EQ(q.global_scale.size(), static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    float amax = 0;
    int64_t arg = 0;
    for (int64_t i = 0; i < R * C; ++i)
      if (std::fabs(w[e * R * C + i]) > amax) amax = std::fabs(w[e * R * C + i]), arg = i;
    if (amax == 0) {
      EXPECT_EQ(q.global_scale[e], 1.0f) << "an all-zero expert gets 1.0";
      for (int r = 0; r < R; ++r)
        for (int k = 0; k < C; ++k) EXPECT_EQ(dequant(q, e, r, k), 0.0);
      continue;
    }
    EXPECT_FLOAT_EQ(q.global_scale[e], amax / (448.0f * 6.0f)) << "expert " << e;
    // The expert's largest element sits at the top of E2M1 × E4M3: scale byte 448, code ±6, and
    // decodes back to itself up to the fp32 rounding of g.
    const int r = static_cast<int>(arg / C), k = static_cast<int>(arg % C);
    EXPECT_EQ(q.scales[(static_cast<int64_t>(e) * R + r) * (C / 16) + k / 16], 0x7E);
    EXPECT_NEAR(std::fabs(dequant(q, e, r, k)), amax, 1e-6 * amax);
  }
  check_projection_accuracy(q, w);
}

TEST(QuantizeProjection, Mxfp4Accuracy) {
  const int E = 3, R = 16, C = 96;
  std::vector<float> w(static_cast<size_t>(E) * R * C);
  const float stds[E] = {1e-3f, 1.0f, 1e4f};
  for (int e = 0; e < E; ++e) {
    auto we = normal_weights(static_cast<size_t>(R) * C, stds[e], 200 + e);
    std::copy(we.begin(), we.end(), w.begin() + static_cast<size_t>(e) * R * C);
  }
  const QuantizedProjection q = quantize_projection(w.data(), E, R, C, WeightFormat::kMXFP4, ScaleLayout::kLinear);
  EXPECT_TRUE(q.global_scale.empty());
  ASSERT_EQ(q.scales.size(), static_cast<size_t>(E) * R * (C / 32));
  // Each scale is 2^ceil(log2(amax_block/6)): amax/6 ≤ 2^(b-127) < amax/3.
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < R; ++r)
      for (int kb = 0; kb < C / 32; ++kb) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(w[(static_cast<size_t>(e) * R + r) * C + kb * 32 + i]));
        const double s = std::ldexp(1.0, q.scales[(static_cast<size_t>(e) * R + r) * (C / 32) + kb] - 127);
        EXPECT_GE(s * 6, amax);
        EXPECT_LT(s * 3, amax);
      }
  check_projection_accuracy(q, w);
}

TEST(QuantizeProjection, SwizzledLayoutHoldsTheSameScales) {
  // 130 rows (not a multiple of 128) and 6 scale columns (not a multiple of 4).
  const int E = 2, R = 130, C = 96;
  const auto w = normal_weights(static_cast<size_t>(E) * R * C, 1.0f, 7);
  for (WeightFormat f : {WeightFormat::kNVFP4, WeightFormat::kMXFP4}) {
    const auto lin = quantize_projection(w.data(), E, R, C, f, ScaleLayout::kLinear);
    const auto sw = quantize_projection(w.data(), E, R, C, f, ScaleLayout::kSwizzled128x4);
    EXPECT_EQ(sw.scale_layout, ScaleLayout::kSwizzled128x4);
    EXPECT_EQ(sw.packed, lin.packed);
    EXPECT_EQ(sw.global_scale, lin.global_scale);
    const int sc = C / lin.block();
    // 2 m-tiles × ceil(sc/4) k-tiles × 512 bytes per expert.
    ASSERT_EQ(sw.scales.size(), static_cast<size_t>(E) * 2 * ((sc + 3) / 4) * 512);
    EXPECT_EQ(sw.scale_bytes_per_expert(), 2 * ((sc + 3) / 4) * 512);
    for (int e = 0; e < E; ++e)
      for (int r = 0; r < R; ++r)
        for (int kb = 0; kb < sc; ++kb) {
          ASSERT_EQ(sw.scale_at(e, r, kb), lin.scales[(static_cast<size_t>(e) * R + r) * sc + kb]);
          ASSERT_EQ(lin.scale_at(e, r, kb), lin.scales[(static_cast<size_t>(e) * R + r) * sc + kb]);
          for (int k = kb * lin.block(); k < (kb + 1) * lin.block(); ++k) ASSERT_EQ(dequant(sw, e, r, k), dequant(lin, e, r, k));
        }
  }
}

TEST(QuantizeProjection, RejectsBadShapes) {
  const std::vector<float> w(64 * 48, 1.0f);
  EXPECT_ERROR(InvalidArgument, quantize_projection(w.data(), 1, 64, 40, WeightFormat::kNVFP4, ScaleLayout::kLinear),
               "cols", "16", "40");
  EXPECT_ERROR(InvalidArgument, quantize_projection(w.data(), 1, 32, 48, WeightFormat::kMXFP4, ScaleLayout::kLinear),
               "cols", "32", "48");
  EXPECT_ERROR(InvalidArgument, quantize_projection(nullptr, 1, 4, 16, WeightFormat::kNVFP4, ScaleLayout::kLinear),
               "w", "null");
  EXPECT_ERROR(InvalidArgument, quantize_projection(w.data(), 0, 4, 16, WeightFormat::kNVFP4, ScaleLayout::kLinear),
               "shape", "0x4x16");
}

// =================================================================================================
// The 128x4 swizzle (reference §1.4)
// =================================================================================================

TEST(Swizzle, OffsetsComputedByHand) {
  // ((m/128)·ktiles + kb/4)·512 + (m%32)·16 + ((m%128)/32)·4 + kb%4
  struct Case { int64_t m, kb, ktiles, offset; };
  const Case cases[] = {
      {0, 0, 1, 0},
      {0, 1, 1, 1},
      {0, 3, 1, 3},
      {1, 0, 1, 16},                  // (1)·16
      {31, 0, 1, 496},                // 31·16
      {32, 0, 1, 4},                  // second 32-row group: +4
      {33, 1, 1, 21},                 // 16 + 4 + 1
      {64, 2, 1, 10},                 // 2·4 + 2
      {96, 3, 1, 15},                 // 3·4 + 3
      {127, 3, 1, 511},               // 31·16 + 3·4 + 3: the last byte of the atom
      {0, 4, 2, 512},                 // the second k-tile
      {100, 6, 2, 590},               // 512 + 4·16 + 3·4 + 2
      {128, 0, 2, 1024},              // second m-tile, after 2 k-tiles
      {129, 5, 2, 1553},              // (1·2 + 1)·512 + 1·16 + 0 + 1
      {130, 5, 2, 1569},              // (1·2 + 1)·512 + 2·16 + 0 + 1
      {255, 7, 2, 2047},              // (2 + 1)·512 + 31·16 + 3·4 + 3: the last byte of 2×2 atoms
  };
  for (const Case& c : cases) {
    EXPECT_EQ(swizzled_scale_offset(c.m, c.kb, c.ktiles), c.offset) << "m " << c.m << " kb " << c.kb;
  }
  // m = 300: m/128 = 2, m%32 = 12, (m%128)/32 = 44/32 = 1; kb = 9: kb/4 = 2, kb%4 = 1; ktiles 3:
  // (2·3 + 2)·512 + 12·16 + 1·4 + 1 = 4096 + 192 + 4 + 1 = 4293.
  EXPECT_EQ(swizzled_scale_offset(300, 9, 3), 4293);
  EXPECT_EQ(swizzled_scale_bytes(130, 6), 2048);  // 2 m-tiles × 2 k-tiles × 512
  EXPECT_EQ(swizzled_scale_bytes(128, 4), 512);
  EXPECT_EQ(swizzled_scale_bytes(1, 1), 512);
  EXPECT_EQ(swizzled_scale_bytes(129, 5), 2048);
}

TEST(Swizzle, OffsetIsABijectionOntoThePaddedSlab) {
  for (auto [rows, sc] : {std::pair<int64_t, int64_t>{130, 6}, {256, 8}, {1, 1}, {200, 90}}) {
    const int64_t mt = (rows + 127) / 128, kt = (sc + 3) / 4, bytes = swizzled_scale_bytes(rows, sc);
    ASSERT_EQ(bytes, mt * kt * 512);
    std::vector<int> hits(bytes, 0);
    for (int64_t m = 0; m < mt * 128; ++m)
      for (int64_t kb = 0; kb < kt * 4; ++kb) {
        const int64_t o = swizzled_scale_offset(m, kb, kt);
        ASSERT_GE(o, 0);
        ASSERT_LT(o, bytes);
        ++hits[o];
      }
    for (int64_t o = 0; o < bytes; ++o) ASSERT_EQ(hits[o], 1) << "offset " << o;
  }
}

TEST(Swizzle, RoundTripAndZeroPadding) {
  std::mt19937_64 rng(17);
  for (auto [rows, sc] : {std::pair<int64_t, int64_t>{130, 6}, {1, 1}, {127, 3}, {257, 9}}) {
    std::vector<uint8_t> lin(rows * sc);
    for (auto& b : lin) b = static_cast<uint8_t>(1 + rng() % 255);  // never 0, so padding is visible
    const auto sw = swizzle_scales(lin.data(), rows, sc);
    ASSERT_EQ(static_cast<int64_t>(sw.size()), swizzled_scale_bytes(rows, sc));
    EXPECT_EQ(unswizzle_scales(sw.data(), rows, sc), lin);
    // Exactly rows·sc bytes are data, placed where the formula says; the padding is zero.
    const int64_t kt = (sc + 3) / 4;
    std::vector<bool> used(sw.size(), false);
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t kb = 0; kb < sc; ++kb) {
        const int64_t o = swizzled_scale_offset(m, kb, kt);
        EXPECT_EQ(sw[o], lin[m * sc + kb]);
        used[o] = true;
      }
    for (size_t o = 0; o < sw.size(); ++o)
      if (!used[o]) { ASSERT_EQ(sw[o], 0) << "padding byte " << o; }
  }
}

// =================================================================================================
// canonicalize: every layout gives the same canonical weights
// =================================================================================================

namespace {

struct Dense {
  MoeConfig c;
  std::vector<float> w13, w2, b13, b2, fc1, fc2;  // w13 and b13 in canonical [up; gate] order
};

Dense make_dense(const MoeConfig& c, uint64_t seed) {
  Dense d{c, {}, {}, {}, {}, {}, {}};
  const int EL = c.local_count(), N1 = c.fc1_rows(), H = c.hidden, I = c.intermediate;
  d.w13 = normal_weights(static_cast<size_t>(EL) * N1 * H, 1.0f / std::sqrt(float(H)), seed);
  d.w2 = normal_weights(static_cast<size_t>(EL) * H * I, 1.0f / std::sqrt(float(I)), seed + 1);
  if (c.has_bias) {
    d.b13 = normal_weights(static_cast<size_t>(EL) * N1, 0.1f, seed + 2);
    d.b2 = normal_weights(static_cast<size_t>(EL) * H, 0.1f, seed + 3);
  }
  if (c.needs_input_scales()) {
    for (int e = 0; e < EL; ++e) d.fc1.push_back(0.002f * (e + 1)), d.fc2.push_back(0.001f * (e + 2));
  }
  return d;
}

// Row of the checkpoint (in layout `gu`) that holds canonical row n — written from the layout
// definitions in weights.h, by hand: [up; gate], [gate; up], or gate/up interleaved gate first.
int stored_row(GateUpLayout gu, int n, int I) {
  const bool gate = n >= I;
  const int i = gate ? n - I : n;
  if (gu == GateUpLayout::kUpGate) return n;
  if (gu == GateUpLayout::kGateUp) return gate ? i : I + i;
  return gate ? 2 * i : 2 * i + 1;
}

QuantizedCheckpoint checkpoint_in(const Dense& d, GateUpLayout gu, ScaleLayout sl) {
  const MoeConfig& c = d.c;
  const int EL = c.local_count(), N1 = c.fc1_rows(), H = c.hidden, I = c.intermediate;
  std::vector<float> w13(d.w13.size()), b13(d.b13.size());
  for (int e = 0; e < EL; ++e)
    for (int n = 0; n < N1; ++n) {
      const int s = c.gated() ? stored_row(gu, n, I) : n;
      std::memcpy(&w13[(static_cast<size_t>(e) * N1 + s) * H], &d.w13[(static_cast<size_t>(e) * N1 + n) * H], H * 4);
      if (!b13.empty()) b13[static_cast<size_t>(e) * N1 + s] = d.b13[static_cast<size_t>(e) * N1 + n];
    }
  return quantize_checkpoint(c, w13.data(), d.w2.data(), gu, sl, d.fc1.empty() ? nullptr : d.fc1.data(),
                             d.fc2.empty() ? nullptr : d.fc2.data(), b13.empty() ? nullptr : b13.data(),
                             d.b2.empty() ? nullptr : d.b2.data());
}

void expect_same_projection(const QuantizedProjection& a, const QuantizedProjection& b) {
  EXPECT_EQ(a.experts, b.experts);
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.cols, b.cols);
  EXPECT_EQ(a.format, b.format);
  EXPECT_EQ(a.scale_layout, ScaleLayout::kLinear);
  EXPECT_EQ(b.scale_layout, ScaleLayout::kLinear);
  EXPECT_TRUE(a.packed == b.packed);
  EXPECT_TRUE(a.scales == b.scales);
  EXPECT_EQ(a.global_scale, b.global_scale);
}

void expect_same_canonical(const QuantizedCheckpoint& a, const QuantizedCheckpoint& b) {
  expect_same_projection(a.w13, b.w13);
  expect_same_projection(a.w2, b.w2);
  EXPECT_EQ(a.gate_up, GateUpLayout::kUpGate);
  EXPECT_EQ(b.gate_up, GateUpLayout::kUpGate);
  EXPECT_EQ(a.fc1_input_scale, b.fc1_input_scale);
  EXPECT_EQ(a.fc2_input_scale, b.fc2_input_scale);
  EXPECT_EQ(a.b13, b.b13);
  EXPECT_EQ(a.b2, b.b2);
}

struct Tokens {
  std::vector<uint16_t> x;
  std::vector<int32_t> ids;
  std::vector<float> w;
  int64_t T;
};

Tokens make_tokens(const MoeConfig& c, int64_t T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Tokens t{{}, {}, {}, T};
  for (int64_t i = 0; i < T * c.hidden; ++i) t.x.push_back(fmt::bf16_from_f32(n(rng)));
  for (int64_t i = 0; i < T * c.top_k; ++i) {
    t.ids.push_back(static_cast<int32_t>(rng() % c.num_experts));
    t.w.push_back(1.0f / c.top_k);
  }
  return t;
}

}  // namespace

class CanonicalizeLayouts : public ::testing::TestWithParam<int> {};

TEST_P(CanonicalizeLayouts, AllLayoutsGiveIdenticalCanonicalWeightsAndOutput) {
  MoeConfig c;
  c.num_experts = 4, c.hidden = 64, c.intermediate = 32, c.top_k = 2;
  switch (GetParam()) {
    case 0: c.format = WeightFormat::kNVFP4, c.mode = ActMode::kA4, c.activation = Activation::kSilu, c.has_bias = true; break;
    case 1: c.format = WeightFormat::kMXFP4, c.mode = ActMode::kA16, c.activation = Activation::kSwigluOai,
            c.swiglu.limit = 7.0f, c.has_bias = true; break;
    case 2: c.format = WeightFormat::kNVFP4, c.mode = ActMode::kA8, c.activation = Activation::kGeluTanh; break;
    case 3: c.format = WeightFormat::kMXFP4, c.mode = ActMode::kA4, c.activation = Activation::kRelu2; break;
  }
  const Dense d = make_dense(c, 31 + GetParam());
  const QuantizedCheckpoint base = canonicalize(c, checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear).view());
  const Tokens t = make_tokens(c, 6, 5);
  const auto base_out = reference::moe_forward_f64(c, base, t.x.data(), t.ids.data(), IndexType::kInt32, t.w.data(), t.T, 1);
  double norm = 0;
  for (double v : base_out) norm += v * v;
  EXPECT_GT(norm, 0.0);
  std::vector<GateUpLayout> gus = {GateUpLayout::kUpGate};
  if (c.gated()) gus = {GateUpLayout::kUpGate, GateUpLayout::kGateUp, GateUpLayout::kInterleaved};
  for (GateUpLayout gu : gus)
    for (ScaleLayout sl : {ScaleLayout::kLinear, ScaleLayout::kSwizzled128x4}) {
      SCOPED_TRACE(::testing::Message() << "gate_up " << int(gu) << " scales " << int(sl));
      const QuantizedCheckpoint ck = checkpoint_in(d, gu, sl);
      const QuantizedCheckpoint canon = canonicalize(c, ck.view());
      expect_same_canonical(canon, base);
      const auto out = reference::moe_forward_f64(c, canon, t.x.data(), t.ids.data(), IndexType::kInt32, t.w.data(), t.T, 1);
      EXPECT_TRUE(out == base_out);
      // And through the public path.
      const PreparedWeights pw = prepare_weights(c, ck.view());
      expect_same_canonical(pw.host(), base);
    }
}

INSTANTIATE_TEST_SUITE_P(Configs, CanonicalizeLayouts, ::testing::Values(0, 1, 2, 3));

// The canonical order means something: rows [0, I) are up, [I, 2I) gate.
TEST(Canonicalize, InterleavedRowsLandInUpGateOrder) {
  MoeConfig c;
  c.num_experts = 1, c.hidden = 32, c.intermediate = 16, c.top_k = 1, c.mode = ActMode::kA16;
  const int I = 16, H = 32;
  // gpt-oss interleaving: row 2i gate (value -2 + tiny row tag), row 2i+1 up (value +1).
  std::vector<float> w13(2 * I * H), w2(H * I, 0.5f), b13(2 * I), b2(H, 0.0f);
  for (int r = 0; r < 2 * I; ++r) {
    for (int k = 0; k < H; ++k) w13[r * H + k] = (r % 2 == 0) ? -2.0f : 1.0f;
    b13[r] = (r % 2 == 0) ? -100.0f - r / 2 : 100.0f + r / 2;
  }
  c.has_bias = true;
  const auto ck = quantize_checkpoint(c, w13.data(), w2.data(), GateUpLayout::kInterleaved, ScaleLayout::kLinear,
                                      nullptr, nullptr, b13.data(), b2.data());
  const auto canon = canonicalize(c, ck.view());
  for (int n = 0; n < 2 * I; ++n) {
    const double want = n < I ? 1.0 : -2.0;
    for (int k = 0; k < H; ++k) ASSERT_NEAR(dequant(canon.w13, 0, n, k), want, 1e-6) << "row " << n;
    EXPECT_EQ(canon.b13[n], n < I ? 100.0f + n : -100.0f - (n - I)) << "row " << n;
  }
}

// The same equivalence through the test kit's own layout conversion.
TEST(Canonicalize, TestkitProblemsInEveryLayoutAgree) {
  MoeConfig c;
  c.num_experts = 6, c.hidden = 128, c.intermediate = 48, c.top_k = 2, c.has_bias = true;
  testkit::ProblemSpec spec{c, 3, 99};
  const auto base = testkit::canonical(testkit::make_problem(spec));
  for (GateUpLayout gu : {GateUpLayout::kUpGate, GateUpLayout::kGateUp, GateUpLayout::kInterleaved})
    for (ScaleLayout sl : {ScaleLayout::kLinear, ScaleLayout::kSwizzled128x4}) {
      SCOPED_TRACE(::testing::Message() << "gate_up " << int(gu) << " scales " << int(sl));
      spec.gate_up = gu, spec.scale_layout = sl;
      const testkit::Problem p = testkit::make_problem(spec);
      EXPECT_EQ(p.checkpoint.gate_up, gu);
      EXPECT_EQ(p.checkpoint.w13.scale_layout, sl);
      expect_same_canonical(testkit::canonical(p), base);
    }
}

// =================================================================================================
// canonicalize: rejections
// =================================================================================================

namespace {
MoeConfig small_config(WeightFormat f, ActMode m = ActMode::kA4) {
  MoeConfig c;
  c.num_experts = 2, c.hidden = 64, c.intermediate = 32, c.top_k = 2, c.format = f, c.mode = m;
  return c;
}
}  // namespace

TEST(CanonicalizeRejects, NaNE4M3BlockScale) {
  const MoeConfig c = small_config(WeightFormat::kNVFP4);
  const Dense d = make_dense(c, 1);
  for (uint8_t nan : {uint8_t{0x7F}, uint8_t{0xFF}}) {
    auto ck = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear);
    ck.w13.scales[(1 * 64 + 5) * 4 + 2] = nan;  // expert 1, row 5, block 2
    EXPECT_ERROR(InvalidArgument, canonicalize(c, ck.view()), "w13.scales", "NaN", "expert 1", "row 5", "block 2");
    auto ck2 = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear);
    ck2.w2.scales[3] = nan;  // expert 0, row 1, block 1 (I/16 = 2 blocks per row)
    EXPECT_ERROR(InvalidArgument, canonicalize(c, ck2.view()), "w2.scales", "NaN", "row 1", "block 1");
    // In the swizzled layout, at the swizzled place.
    auto ck3 = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kSwizzled128x4);
    ck3.w13.scales[512 + swizzled_scale_offset(40, 3, 1)] = nan;  // expert 1 (one 512-byte atom each)
    EXPECT_ERROR(InvalidArgument, canonicalize(c, ck3.view()), "w13.scales", "NaN", "expert 1", "row 40", "block 3");
  }
  // 0x7E (448) and 0xFE (-448, sign set but not NaN) are not NaN.
  auto ck = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear);
  ck.w13.scales[0] = 0x7E;
  EXPECT_NO_THROW(canonicalize(c, ck.view()));
}

// On several threads (one expert a task) the error is still the lowest expert's first: NaN scales in
// experts 1 and 0 report expert 0's, whatever the thread count; a negative count is refused by name.
TEST(CanonicalizeRejects, LowestExpertsErrorOnAnyThreadCount) {
  const MoeConfig c = small_config(WeightFormat::kNVFP4);
  const Dense d = make_dense(c, 1);
  auto ck = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear);
  ck.w13.scales[(1 * 64 + 5) * 4 + 2] = 0x7F;  // expert 1, row 5, block 2
  ck.w13.scales[(0 * 64 + 9) * 4 + 1] = 0x7F;  // expert 0, row 9, block 1
  for (int threads : {1, 2, 8, 0})
    EXPECT_ERROR(InvalidArgument, canonicalize(c, ck.view(), threads), "w13.scales", "NaN", "expert 0", "row 9",
                 "block 1");
  const auto ok = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear);
  EXPECT_ERROR(InvalidArgument, canonicalize(c, ok.view(), -1), "threads", "-1");
  const QuantizedCheckpoint one = canonicalize(c, ok.view(), 1), many = canonicalize(c, ok.view(), 8);
  EXPECT_EQ(one.w13.packed, many.w13.packed);
  EXPECT_EQ(one.w13.scales, many.w13.scales);
  EXPECT_EQ(one.w2.packed, many.w2.packed);
  EXPECT_EQ(one.w2.scales, many.w2.scales);
}

TEST(CanonicalizeRejects, NaNUE8M0BlockScale) {
  const MoeConfig c = small_config(WeightFormat::kMXFP4);
  const Dense d = make_dense(c, 2);
  auto ck = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear);
  ck.w13.scales[(0 * 64 + 63) * 2 + 1] = 0xFF;
  EXPECT_ERROR(InvalidArgument, canonicalize(c, ck.view()), "w13.scales", "NaN", "row 63", "block 1");
  auto ck2 = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear);
  ck2.w2.scales[64 + 7] = 0xFF;  // expert 1, row 7 (one block per row: I = 32)
  EXPECT_ERROR(InvalidArgument, canonicalize(c, ck2.view()), "w2.scales", "NaN", "expert 1", "row 7");
}

TEST(CanonicalizeRejects, Mxfp4OverflowAtTheBoundary) {
  // UE8M0 254 = 2^127: |value| 1.5 (code 3) gives 1.5·2^127 < FLT_MAX, 2 (code 4) gives 2^128 = inf.
  // UE8M0 253 = 2^126: 3 (code 5) fits, 4 (code 6) gives 2^128. 252: even 6 fits (1.5·2^127).
  const MoeConfig c = small_config(WeightFormat::kMXFP4);
  const Dense d = make_dense(c, 3);
  const int row = 9, kb = 1, sc = 2, H = 64;
  struct Case { uint8_t scale; uint8_t code; bool ok; };
  const Case cases[] = {
      {254, 3, true}, {254, 0xB, true}, {254, 4, false}, {254, 0xC, false}, {254, 7, false},
      {253, 5, true}, {253, 0xD, true}, {253, 6, false}, {253, 0xE, false},
      {252, 7, true}, {252, 0xF, true},
  };
  for (const Case& t : cases) {
    SCOPED_TRACE(::testing::Message() << "scale " << int(t.scale) << " code " << int(t.code));
    auto ck = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear);
    ck.w13.scales[row * sc + kb] = t.scale;
    // The block: every code 1 (0.5), one element (the 7th) set to the code under test.
    uint8_t* rowp = ck.w13.packed.data() + static_cast<size_t>(row) * H / 2;
    for (int i = kb * 32; i < kb * 32 + 32; i += 2) rowp[i / 2] = 0x11;
    const int at = kb * 32 + 7;
    rowp[at / 2] = static_cast<uint8_t>((rowp[at / 2] & 0x0F) | (t.code << 4));
    if (t.ok) {
      EXPECT_NO_THROW(canonicalize(c, ck.view()));
    } else {
      EXPECT_ERROR(InvalidArgument, canonicalize(c, ck.view()), "w13.scales", "row 9", "block 1",
                   "2^" + std::to_string(t.scale - 127));
    }
  }
  // A large code in the *neighbouring* block of a 2^127 block is fine.
  auto ck = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear);
  ck.w13.scales[row * sc + kb] = 254;
  uint8_t* rowp = ck.w13.packed.data() + static_cast<size_t>(row) * H / 2;
  for (int i = 0; i < 64; i += 2) rowp[i / 2] = (i < 32) ? 0x77 : 0x11;
  EXPECT_NO_THROW(canonicalize(c, ck.view()));
  // And on W2.
  auto ck2 = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear);
  ck2.w2.scales[0] = 254;
  ck2.w2.packed[0] = 0x44;
  EXPECT_ERROR(InvalidArgument, canonicalize(c, ck2.view()), "w2.scales", "2^127");
}

TEST(CanonicalizeRejects, GlobalAndInputScalesThatAreNotFinitePositive) {
  const MoeConfig c = small_config(WeightFormat::kNVFP4);
  const Dense d = make_dense(c, 4);
  struct Bad { float v; const char* text; };
  const Bad bads[] = {{0.0f, "got 0 "}, {-0.0f, "got -0 "}, {-1.5f, "got -1.5 "}, {kNaN, "nan"}, {kInf, "got inf"},
                      {-kInf, "got -inf"}};
  for (const Bad& b : bads) {
    SCOPED_TRACE(b.text);
    const auto ck = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear);
    {
      auto v = ck.view();
      const float gs[2] = {1.0f, b.v};
      v.w13.global_scale = gs;
      EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "w13.global_scale", b.text, "local expert 1");
      v = ck.view();
      v.w2.global_scale = gs;
      EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "w2.global_scale", b.text, "local expert 1");
    }
    {
      auto v = ck.view();
      const float s[2] = {b.v, 1.0f};
      v.fc1_input_scale = s;
      EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "fc1_input_scale", b.text, "local expert 0");
      v = ck.view();
      v.fc2_input_scale = s;
      EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "fc2_input_scale", b.text, "local expert 0");
    }
  }
  // A tiny positive subnormal is a valid scale.
  auto ck = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear);
  ck.fc1_input_scale[0] = 1e-40f;
  EXPECT_NO_THROW(canonicalize(c, ck.view()));
}

TEST(CanonicalizeRejects, MissingInputScalesForNvfp4A4) {
  const MoeConfig c = small_config(WeightFormat::kNVFP4, ActMode::kA4);
  const Dense d = make_dense(c, 5);
  const auto ck = checkpoint_in(d, GateUpLayout::kUpGate, ScaleLayout::kLinear);
  auto v = ck.view();
  v.fc1_input_scale = nullptr;
  EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "fc1_input_scale", "required", "nvfp4");
  v = ck.view();
  v.fc2_input_scale = nullptr;
  EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "fc2_input_scale", "required", "nvfp4");
  // Other modes need none.
  for (auto [f, m] : {std::pair{WeightFormat::kNVFP4, ActMode::kA16}, {WeightFormat::kNVFP4, ActMode::kA8},
                      {WeightFormat::kMXFP4, ActMode::kA4}}) {
    const MoeConfig c2 = small_config(f, m);
    const auto ck2 = checkpoint_in(make_dense(c2, 6), GateUpLayout::kUpGate, ScaleLayout::kLinear);
    EXPECT_EQ(ck2.view().fc1_input_scale, nullptr);
    EXPECT_NO_THROW(canonicalize(c2, ck2.view())) << c2.to_string();
  }
}

TEST(CanonicalizeRejects, BiasesAndHasBiasDisagree) {
  MoeConfig c = small_config(WeightFormat::kMXFP4);
  const std::vector<float> b13(2 * 64, 0.5f), b2(2 * 64, 0.25f);
  const auto ck = checkpoint_in(make_dense(c, 7), GateUpLayout::kUpGate, ScaleLayout::kLinear);
  // Given without has_bias.
  auto v = ck.view();
  v.b13 = b13.data();
  EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "b13", "has_bias");
  v = ck.view();
  v.b2 = b2.data();
  EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "b2", "has_bias");
  // Missing with has_bias.
  c.has_bias = true;
  v = ck.view();
  v.b2 = b2.data();
  EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "b13", "has_bias", "[2, 64]");
  v = ck.view();
  v.b13 = b13.data();
  EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "b2", "has_bias", "[2, 64]");
  v.b2 = b2.data();
  EXPECT_NO_THROW(canonicalize(c, v));
}

TEST(CanonicalizeRejects, GlobalScaleForMxfp4) {
  const MoeConfig c = small_config(WeightFormat::kMXFP4);
  const auto ck = checkpoint_in(make_dense(c, 8), GateUpLayout::kUpGate, ScaleLayout::kLinear);
  const float gs[2] = {1.0f, 1.0f};
  auto v = ck.view();
  v.w13.global_scale = gs;
  EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "w13.global_scale", "MXFP4");
  v = ck.view();
  v.w2.global_scale = gs;
  EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "w2.global_scale", "MXFP4");
}

TEST(CanonicalizeRejects, NullPointersAndRelu2Layout) {
  const MoeConfig c = small_config(WeightFormat::kNVFP4);
  const auto ck = checkpoint_in(make_dense(c, 9), GateUpLayout::kUpGate, ScaleLayout::kLinear);
  auto v = ck.view();
  v.w13.packed = nullptr;
  EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "w13.packed", "null");
  v = ck.view();
  v.w13.scales = nullptr;
  EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "w13.scales", "null");
  v = ck.view();
  v.w2.packed = nullptr;
  EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "w2.packed", "null");
  v = ck.view();
  v.w2.scales = nullptr;
  EXPECT_ERROR(InvalidArgument, canonicalize(c, v), "w2.scales", "null");

  MoeConfig r = small_config(WeightFormat::kMXFP4);
  r.activation = Activation::kRelu2;
  const auto ckr = checkpoint_in(make_dense(r, 10), GateUpLayout::kUpGate, ScaleLayout::kLinear);
  for (GateUpLayout gu : {GateUpLayout::kGateUp, GateUpLayout::kInterleaved}) {
    v = ckr.view();
    v.gate_up = gu;
    EXPECT_ERROR(InvalidArgument, canonicalize(r, v), "gate_up", "relu2");
  }
}

namespace fp4moe {
namespace {

// The bench draws a layer's weights once for all its activation modes: the two-step form equals
// make_layer whatever mode's calibration ran on the weights before.
TEST(TestkitLayer, TwoStepsEqualMakeLayerInEveryModeOrder) {
  MoeConfig c;
  c.num_experts = 4, c.hidden = 128, c.intermediate = 64, c.top_k = 2;
  testkit::LayerSpec spec{c, 7, 8, 2};
  QuantizedCheckpoint w = testkit::make_layer_weights(spec);
  for (ActMode m : {ActMode::kA16, ActMode::kA4, ActMode::kA8, ActMode::kA4}) {
    spec.config.mode = m;
    testkit::calibrate_layer(spec, w);
    const QuantizedCheckpoint want = testkit::make_layer(spec);
    EXPECT_EQ(w.w13.packed, want.w13.packed);
    EXPECT_EQ(w.w13.scales, want.w13.scales);
    EXPECT_EQ(w.w2.packed, want.w2.packed);
    EXPECT_EQ(w.w2.scales, want.w2.scales);
    if (spec.config.needs_input_scales()) {  // the modes without input scales never read them
      EXPECT_EQ(w.fc1_input_scale, want.fc1_input_scale) << to_string(m);
      EXPECT_EQ(w.fc2_input_scale, want.fc2_input_scale) << to_string(m);
      EXPECT_FALSE(w.fc1_input_scale.empty());
    }
  }
}

}  // namespace
}  // namespace fp4moe
