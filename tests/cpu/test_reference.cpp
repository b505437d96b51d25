// The CPU reference (src/reference) — the oracle every other backend is checked against — is itself
// checked here:
//   1. against an independent, deliberately naive oracle written in this file (per token, per route
//      loops; weights dequantised straight from the canonical checkpoint with fmt::*_decode;
//      activations written out again), over format × mode × activation × bias;
//   2. against closed forms computed by hand (exactly representable weights and inputs);
//   3. local expert range: routes outside it, −1 and ids ≥ E contribute nothing;
//   4. properties: int64 ids, output dtypes, thread count, K > E, all routes to one expert;
//   5. NaN propagation per token;
//   6. the a4 quantisation points (per-expert FC1 input scale, bf16 intermediate);
//   7. a real-shape smoke run through the host MoeRunner (not a timed assertion).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "fp4moe/fp4moe.h"
#include "reference/reference.h"
#include "testing/problem.h"

using namespace fp4moe;

namespace {

// Relative bound (to the largest |output|) between the reference and the oracle: both are float64
// over the same exactly dequantised operands; they differ only in summation order (~H·2^-53).
constexpr double kOracleTol = 1e-12;
// A difference this large means a different computation, not rounding noise.
constexpr double kDiffers = 1e-6;

constexpr float kInf = std::numeric_limits<float>::infinity();

float u32_as_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t f32_as_u32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bf16_bits_to_f32(uint16_t h) { return u32_as_f32(static_cast<uint32_t>(h) << 16); }

// bf16 round-to-nearest-even, written independently of fmt::bf16_from_f32: take the two bf16
// neighbours of f and keep the nearer one, the one with an even last bit on a tie.
float oracle_round_bf16(float f) {
  if (std::isnan(f) || std::isinf(f)) return f;
  const uint32_t trunc = f32_as_u32(f) & 0xFFFF0000u;
  const float toward0 = u32_as_f32(trunc), away = u32_as_f32(trunc + 0x10000u);
  const double d0 = std::fabs(static_cast<double>(f) - toward0), d1 = std::fabs(static_cast<double>(away) - f);
  if (d0 != d1) return d0 < d1 ? toward0 : away;
  return ((trunc >> 16) & 1u) ? away : toward0;
}
uint16_t oracle_bf16_bits(float f) { return static_cast<uint16_t>(f32_as_u32(oracle_round_bf16(f)) >> 16); }

// ------------------------------------------------------------------------------------------------
// The naive oracle.
// ------------------------------------------------------------------------------------------------

// One weight of a canonical projection (linear scales), dequantised straight from its bytes.
double oracle_weight(const QuantizedProjection& p, int e, int row, int k) {
  const int64_t idx = (static_cast<int64_t>(e) * p.rows + row) * p.cols + k;
  const uint8_t byte = p.packed[idx / 2];
  const uint8_t code = (idx % 2) ? (byte >> 4) : (byte & 0xF);
  const double v = fmt::e2m1_decode(code);
  if (p.format == WeightFormat::kNVFP4) {
    const uint8_t sb = p.scales[(static_cast<int64_t>(e) * p.rows + row) * (p.cols / 16) + k / 16];
    return v * static_cast<double>(fmt::e4m3_decode(sb)) * static_cast<double>(p.global_scale[e]);
  }
  const uint8_t sb = p.scales[(static_cast<int64_t>(e) * p.rows + row) * (p.cols / 32) + k / 32];
  return v * static_cast<double>(fmt::ue8m0_decode(sb));
}

// Quantise-dequantise a GEMM input with the fmt:: block quantisers.
std::vector<double> oracle_quant(const MoeConfig& c, const std::vector<float>& v, float g) {
  const size_t n = v.size();
  std::vector<double> out(n);
  uint8_t q[32];
  if (c.mode == ActMode::kA16) {
    for (size_t i = 0; i < n; ++i) out[i] = v[i];
  } else if (c.mode == ActMode::kA8) {
    for (size_t b = 0; b < n; b += 32) {
      const double s = fmt::ue8m0_decode(fmt::mxfp8_quantize_block(&v[b], q));
      for (int i = 0; i < 32; ++i) out[b + i] = static_cast<double>(fmt::e4m3_decode(q[i])) * s;
    }
  } else if (c.format == WeightFormat::kNVFP4) {
    for (size_t b = 0; b < n; b += 16) {
      const double s = fmt::e4m3_decode(fmt::nvfp4_quantize_block(&v[b], g, q));
      for (int i = 0; i < 16; ++i) out[b + i] = static_cast<double>(fmt::e2m1_decode(q[i])) * s * static_cast<double>(g);
    }
  } else {
    for (size_t b = 0; b < n; b += 32) {
      const double s = fmt::ue8m0_decode(fmt::mxfp4_quantize_block(&v[b], q));
      for (int i = 0; i < 32; ++i) out[b + i] = static_cast<double>(fmt::e2m1_decode(q[i])) * s;
    }
  }
  return out;
}

// reference §3, written out again.
double oracle_activation(const MoeConfig& c, double gate, double up) {
  switch (c.activation) {
    case Activation::kSilu:
      return gate / (1.0 + std::exp(-gate)) * up;
    case Activation::kGeluTanh: {
      const double z = std::sqrt(2.0 / M_PI) * (gate + 0.044715 * gate * gate * gate);
      return 0.5 * gate * (1.0 + std::tanh(z)) * up;
    }
    case Activation::kSwigluOai: {
      const double L = c.swiglu.limit;
      const double gc = std::min(gate, L), uc = std::clamp(up, -L, L);
      return gc / (1.0 + std::exp(-static_cast<double>(c.swiglu.alpha) * gc)) * (uc + static_cast<double>(c.swiglu.beta));
    }
    case Activation::kRelu2: {
      const double r = std::max(gate, 0.0);
      return r * r;
    }
  }
  return std::nan("");
}

struct OracleOptions {
  bool round_intermediate_bf16 = true;  // false: a bug model, the fp32 intermediate goes to Q2
  int fc1_scale_of = -1;                // >= 0: a bug model, this local expert's FC1 input scale for all
};

// out[t] = Σ_j w[t,j] · (Q2(bf16(act(Q1(x_t)·W13_eᵀ + b13_e))) · W2_eᵀ + b2_e), straight loops.
std::vector<double> oracle_forward(const MoeConfig& c, const QuantizedCheckpoint& w, const std::vector<uint16_t>& x,
                                   const std::vector<int64_t>& ids, const std::vector<float>& tw, int64_t T,
                                   OracleOptions opt = {}) {
  const int H = c.hidden, I = c.intermediate, K = c.top_k, E = c.num_experts;
  const int first = c.local_expert_first, EL = c.local_expert_count < 0 ? E : c.local_expert_count;
  const int N1 = c.activation == Activation::kRelu2 ? I : 2 * I;
  const bool nv_a4 = c.mode == ActMode::kA4 && c.format == WeightFormat::kNVFP4;
  std::vector<double> out(static_cast<size_t>(T) * H, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < K; ++j) {
      const int64_t id = ids[t * K + j];
      if (id < 0 || id >= E || id < first || id >= first + EL) continue;
      const int e = static_cast<int>(id - first);
      std::vector<float> xf(H);
      for (int k = 0; k < H; ++k) xf[k] = bf16_bits_to_f32(x[t * H + k]);
      const float g1 = nv_a4 ? w.fc1_input_scale[opt.fc1_scale_of >= 0 ? opt.fc1_scale_of : e] : 1.0f;
      const std::vector<double> xq = oracle_quant(c, xf, g1);
      std::vector<double> fc1(N1);
      for (int n = 0; n < N1; ++n) {
        double s = 0;
        for (int k = 0; k < H; ++k) s += xq[k] * oracle_weight(w.w13, e, n, k);
        fc1[n] = s + (c.has_bias ? static_cast<double>(w.b13[static_cast<size_t>(e) * N1 + n]) : 0.0);
      }
      std::vector<float> h(I);
      for (int i = 0; i < I; ++i) {
        const double a = N1 == I ? oracle_activation(c, fc1[i], 0.0) : oracle_activation(c, fc1[I + i], fc1[i]);
        h[i] = opt.round_intermediate_bf16 ? oracle_round_bf16(static_cast<float>(a)) : static_cast<float>(a);
      }
      const float g2 = nv_a4 ? w.fc2_input_scale[e] : 1.0f;
      const std::vector<double> hq = oracle_quant(c, h, g2);
      for (int col = 0; col < H; ++col) {
        double s = 0;
        for (int i = 0; i < I; ++i) s += hq[i] * oracle_weight(w.w2, e, col, i);
        s += c.has_bias ? static_cast<double>(w.b2[static_cast<size_t>(e) * H + col]) : 0.0;
        out[t * H + col] += static_cast<double>(tw[t * K + j]) * s;
      }
    }
  }
  return out;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double d : v) m = std::max(m, std::fabs(d));
  return m;
}

// max |a − b| / max |b|; infinity where NaN-ness differs.
double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return kInf;
    if (!std::isnan(a[i])) d = std::max(d, std::fabs(a[i] - b[i]));
  }
  const double s = max_abs(b);
  return s > 0 ? d / s : d;
}

bool bit_identical(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

MoeConfig small_config(WeightFormat f, ActMode m, Activation a, bool bias) {
  MoeConfig c;
  c.num_experts = 6, c.hidden = 64, c.intermediate = 64, c.top_k = 3;
  c.format = f, c.mode = m, c.activation = a, c.has_bias = bias;
  return c;
}

std::vector<double> run_ref(const MoeConfig& c, const QuantizedCheckpoint& w, const testkit::Problem& p,
                            int threads = 2) {
  return reference::moe_forward_f64(c, w, p.x.data(), p.ids.data(), IndexType::kInt32, p.topk_weights.data(),
                                    p.tokens, threads);
}

// ------------------------------------------------------------------------------------------------
// 1. The full matrix against the oracle.
// ------------------------------------------------------------------------------------------------
struct ActCase {
  Activation act;
  float limit;
  const char* name;
};
const ActCase kActCases[] = {
    {Activation::kSilu, kInf, "silu"},
    {Activation::kGeluTanh, kInf, "gelu_tanh"},
    {Activation::kSwigluOai, 7.0f, "swiglu_oai_limit7"},
    {Activation::kSwigluOai, kInf, "swiglu_oai_nolimit"},
    {Activation::kRelu2, kInf, "relu2"},
};

using MatrixParam = std::tuple<WeightFormat, ActMode, int, bool>;

class ReferenceOracle : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(ReferenceOracle, MatchesNaiveOracle) {
  const auto [format, mode, act_index, bias] = GetParam();
  const ActCase& ac = kActCases[act_index];
  MoeConfig c = small_config(format, mode, ac.act, bias);
  c.swiglu = {1.702f, 1.0f, ac.limit};
  // A distinct seed per case.
  const uint64_t seed = 1000 + static_cast<uint64_t>(format) * 100 + static_cast<uint64_t>(mode) * 20 +
                        static_cast<uint64_t>(act_index) * 2 + (bias ? 1 : 0);
  testkit::ProblemSpec spec{c, 5, seed};
  spec.x_std = ac.act == Activation::kSwigluOai ? 4.0f : 1.5f;  // large enough that limit 7 clamps
  const testkit::Problem p = testkit::make_problem(spec);
  const QuantizedCheckpoint w = testkit::canonical(p);

  const std::vector<double> ref = run_ref(c, w, p);
  const std::vector<double> want = oracle_forward(c, w, p.x, p.ids64(), p.topk_weights, p.tokens);
  ASSERT_GT(max_abs(want), 1e-3) << "degenerate problem";
  EXPECT_LE(max_rel_diff(ref, want), kOracleTol) << c.to_string();

  if (ac.act == Activation::kSwigluOai && std::isfinite(ac.limit)) {
    // The clamp is live in this data: without it the answer differs.
    MoeConfig unclamped = c;
    unclamped.swiglu.limit = kInf;
    const auto no_clamp = oracle_forward(unclamped, w, p.x, p.ids64(), p.topk_weights, p.tokens);
    EXPECT_GT(max_rel_diff(ref, no_clamp), kDiffers) << "limit 7 never clamped: the case tests nothing";
  }
  if (bias) {
    QuantizedCheckpoint nb = w;
    std::fill(nb.b13.begin(), nb.b13.end(), 0.0f);
    std::fill(nb.b2.begin(), nb.b2.end(), 0.0f);
    EXPECT_GT(max_rel_diff(ref, oracle_forward(c, nb, p.x, p.ids64(), p.topk_weights, p.tokens)), kDiffers);
  }
}

std::string matrix_name(const ::testing::TestParamInfo<MatrixParam>& info) {
  const auto [format, mode, act_index, bias] = info.param;
  return std::string(to_string(format)) + "_" + std::string(to_string(mode)) + "_" + kActCases[act_index].name +
         (bias ? "_bias" : "_nobias");
}

INSTANTIATE_TEST_SUITE_P(Reference, ReferenceOracle,
                         ::testing::Combine(::testing::Values(WeightFormat::kNVFP4, WeightFormat::kMXFP4),
                                            ::testing::Values(ActMode::kA4, ActMode::kA16, ActMode::kA8),
                                            ::testing::Range(0, 5), ::testing::Bool()),
                         matrix_name);

// Scale layouts and gate/up orders of the checkpoint do not change the answer (canonicalize maps them).
TEST(ReferenceOracle, CheckpointLayoutsGiveTheSameAnswer) {
  const MoeConfig c = small_config(WeightFormat::kNVFP4, ActMode::kA4, Activation::kSilu, true);
  std::vector<double> first;
  for (auto layout : {ScaleLayout::kLinear, ScaleLayout::kSwizzled128x4})
    for (auto gu : {GateUpLayout::kUpGate, GateUpLayout::kGateUp, GateUpLayout::kInterleaved}) {
      testkit::ProblemSpec spec{c, 4, 77};
      spec.scale_layout = layout, spec.gate_up = gu;
      const testkit::Problem p = testkit::make_problem(spec);
      const QuantizedCheckpoint w = testkit::canonical(p);
      const auto ref = run_ref(c, w, p);
      EXPECT_LE(max_rel_diff(ref, oracle_forward(c, w, p.x, p.ids64(), p.topk_weights, p.tokens)), kOracleTol);
      if (first.empty()) first = ref;
      else EXPECT_TRUE(bit_identical(ref, first));
    }
}

// dequant_row (what the reference's GEMMs read) equals the oracle's per-element decode, for both
// formats and both scale layouts.
TEST(ReferenceOracle, DequantRowMatchesOracleInBothLayouts) {
  std::mt19937_64 rng(40);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int E = 2, rows = 130, cols = 96;  // rows past one 128-row swizzle tile
  std::vector<float> dense(static_cast<size_t>(E) * rows * cols);
  for (auto& v : dense) v = normal(rng) * 0.3f;
  for (auto f : {WeightFormat::kNVFP4, WeightFormat::kMXFP4}) {
    const QuantizedProjection lin = quantize_projection(dense.data(), E, rows, cols, f, ScaleLayout::kLinear);
    const QuantizedProjection swz = quantize_projection(dense.data(), E, rows, cols, f, ScaleLayout::kSwizzled128x4);
    std::vector<double> a(cols), b(cols);
    double amax = 0;
    for (int e = 0; e < E; ++e)
      for (int r = 0; r < rows; ++r) {
        reference::dequant_row(lin, e, r, a.data());
        reference::dequant_row(swz, e, r, b.data());
        for (int k = 0; k < cols; ++k) {
          const double want = oracle_weight(lin, e, r, k);
          ASSERT_EQ(a[k], want) << to_string(f) << " e" << e << " r" << r << " k" << k;
          ASSERT_EQ(b[k], want) << to_string(f) << " swizzled e" << e << " r" << r << " k" << k;
          amax = std::max(amax, std::fabs(want));
        }
      }
    EXPECT_GT(amax, 0.1);
  }
}

// ------------------------------------------------------------------------------------------------
// 2. Computed by hand.
// ------------------------------------------------------------------------------------------------

// E2M1 code of a value, by table (no library encoder).
uint8_t code_of(double v) {
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (uint8_t m = 0; m < 8; ++m)
    if (mags[m] == std::fabs(v)) return static_cast<uint8_t>(m | (v < 0 ? 8 : 0));
  ADD_FAILURE() << v << " is not an E2M1 value";
  return 0;
}
double value_of(uint8_t code) {
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -mags[code & 7] : mags[code & 7];
}

// A projection whose element (e, row, *) is the E2M1 code code(e, row) with block scale 2^pow2(e),
// bytes written by hand: E4M3 2^s = (7 + s) << 3, UE8M0 2^s = 127 + s.
QuantizedProjection hand_projection(WeightFormat f, int experts, int rows, int cols, const auto& code,
                                    const auto& pow2) {
  QuantizedProjection p;
  p.experts = experts, p.rows = rows, p.cols = cols, p.format = f, p.scale_layout = ScaleLayout::kLinear;
  const int bs = f == WeightFormat::kNVFP4 ? 16 : 32;
  for (int e = 0; e < experts; ++e)
    for (int r = 0; r < rows; ++r) {
      const uint8_t q = code(e, r);
      for (int k = 0; k < cols / 2; ++k) p.packed.push_back(static_cast<uint8_t>(q | (q << 4)));
      const uint8_t sb = f == WeightFormat::kNVFP4 ? static_cast<uint8_t>((7 + pow2(e)) << 3)
                                                   : static_cast<uint8_t>(127 + pow2(e));
      for (int k = 0; k < cols / bs; ++k) p.scales.push_back(sb);
    }
  if (f == WeightFormat::kNVFP4) p.global_scale.assign(experts, 1.0f);
  return p;
}

// H = I = 32, E = K = 2, T = 2, a16. Expert 0: up = 1, gate = 0.5 (scale 1); expert 1: up = −4·½,
// gate = −3·½ (scale ½). W2 row c: expert 0 e2m1(c mod 16), expert 1 e2m1((3c+1) mod 16)·½.
// x_0 = (−⅛, ¼, −⅛, ¼, …) sums to 2; x_1[k] = −(k+1)/32 sums to −16.5.
// Every FC1 output is then (coefficient · Σx), every intermediate the same h_e per token, and
// out[t][c] = Σ_j w[t,j] · 32 · h_{e_j} · v_{e_j}(c).
void hand_case(WeightFormat f, Activation act) {
  constexpr int H = 32, I = 32;
  MoeConfig c;
  c.num_experts = 2, c.hidden = H, c.intermediate = I, c.top_k = 2;
  c.format = f, c.mode = ActMode::kA16, c.activation = act, c.output_dtype = OutputDType::kFP32;
  const bool gated = act != Activation::kRelu2;
  const int N1 = gated ? 2 * I : I;
  const double up_coef[2] = {1.0, -2.0}, gate_coef[2] = {0.5, -1.5};
  auto w13_code = [&](int e, int r) {
    const double scale = e == 0 ? 1.0 : 0.5;
    const bool is_gate = !gated || r >= I;
    return code_of((is_gate ? gate_coef[e] : up_coef[e]) / scale);
  };
  auto w2_code = [](int e, int r) { return static_cast<uint8_t>(e == 0 ? r % 16 : (3 * r + 1) % 16); };
  auto pow2 = [](int e) { return e == 0 ? 0 : -1; };
  QuantizedCheckpoint ck;
  ck.w13 = hand_projection(f, 2, N1, H, w13_code, pow2);
  ck.w2 = hand_projection(f, 2, H, I, w2_code, pow2);
  auto v2 = [&](int e, int col) { return value_of(w2_code(e, col)) * (e == 0 ? 1.0 : 0.5); };

  std::vector<uint16_t> x(2 * H);
  for (int k = 0; k < H; ++k) {
    x[k] = static_cast<uint16_t>(f32_as_u32(k % 2 ? 0.25f : -0.125f) >> 16);
    x[H + k] = static_cast<uint16_t>(f32_as_u32(-static_cast<float>(k + 1) / 32.0f) >> 16);
  }
  const double xsum[2] = {2.0, -16.5};
  const std::vector<int32_t> ids = {0, 1, 1, 0};
  const std::vector<float> tw = {0.75f, 0.25f, 0.625f, 0.375f};

  std::vector<double> want(2 * H);
  if (act == Activation::kRelu2) {
    // Token 0: gate 0.5·2 = 1 → h = 1 (expert 0); −1.5·2 = −3 → 0 (expert 1).
    // Token 1: 0.5·−16.5 < 0 → 0 (expert 0); −1.5·−16.5 = 24.75 → 612.5625 → bf16 612 (expert 1).
    for (int col = 0; col < H; ++col) {
      want[col] = 0.75 * 32 * 1.0 * v2(0, col);         // = 24 · v0(c)
      want[H + col] = 0.625 * 32 * 612.0 * v2(1, col);  // = 12240 · v1(c)
    }
  } else {
    double h[2][2];  // [token][expert]
    for (int t = 0; t < 2; ++t)
      for (int e = 0; e < 2; ++e) {
        const double g = gate_coef[e] * xsum[t], u = up_coef[e] * xsum[t];
        h[t][e] = oracle_round_bf16(static_cast<float>(g / (1.0 + std::exp(-g)) * u));
      }
    for (int t = 0; t < 2; ++t)
      for (int col = 0; col < H; ++col)
        for (int j = 0; j < 2; ++j) {
          const int e = ids[t * 2 + j];
          want[t * H + col] += static_cast<double>(tw[t * 2 + j]) * (32.0 * h[t][e] * v2(e, col));
        }
  }
  ASSERT_GT(max_abs(want), 1.0);

  const auto ref = reference::moe_forward_f64(c, ck, x.data(), ids.data(), IndexType::kInt32, tw.data(), 2, 1);
  EXPECT_LE(max_rel_diff(ref, want), 1e-14) << c.to_string();

  // The same through the public API (prepare on the host, MoeRunner, fp32 output).
  PreparedWeights pw = prepare_weights(c, ck.view());
  MoeRunner runner(c, pw, {.max_tokens = 2, .cpu_threads = 2});
  alignas(16) float out[2 * H];
  std::fill(out, out + 2 * H, u32_as_f32(testkit::kPoisonF32));
  runner.run(x.data(), ids.data(), IndexType::kInt32, tw.data(), out, 2);
  for (int i = 0; i < 2 * H; ++i) EXPECT_EQ(out[i], static_cast<float>(want[i])) << "element " << i;
}

TEST(ReferenceHand, SiluNvfp4) { hand_case(WeightFormat::kNVFP4, Activation::kSilu); }
TEST(ReferenceHand, SiluMxfp4) { hand_case(WeightFormat::kMXFP4, Activation::kSilu); }
TEST(ReferenceHand, Relu2Nvfp4) { hand_case(WeightFormat::kNVFP4, Activation::kRelu2); }
TEST(ReferenceHand, Relu2Mxfp4) { hand_case(WeightFormat::kMXFP4, Activation::kRelu2); }

// ------------------------------------------------------------------------------------------------
// 3. Local expert range.
// ------------------------------------------------------------------------------------------------

// `base` (all E experts) with experts [first, first + local.experts) replaced by `local`'s.
QuantizedCheckpoint splice(const QuantizedCheckpoint& base, const QuantizedCheckpoint& local, int first) {
  QuantizedCheckpoint out = base;
  const int EL = local.w13.experts;
  for (auto [dst, src] : {std::pair{&out.w13, &local.w13}, std::pair{&out.w2, &local.w2}}) {
    const size_t pk = src->packed.size() / EL, sc = src->scales.size() / EL;
    std::copy(src->packed.begin(), src->packed.end(), dst->packed.begin() + first * pk);
    std::copy(src->scales.begin(), src->scales.end(), dst->scales.begin() + first * sc);
    std::copy(src->global_scale.begin(), src->global_scale.end(), dst->global_scale.begin() + first);
  }
  auto per_expert = [&](std::vector<float>& dst, const std::vector<float>& src) {
    if (src.empty()) return;
    const size_t n = src.size() / EL;
    std::copy(src.begin(), src.end(), dst.begin() + first * n);
  };
  per_expert(out.fc1_input_scale, local.fc1_input_scale);
  per_expert(out.fc2_input_scale, local.fc2_input_scale);
  per_expert(out.b13, local.b13);
  per_expert(out.b2, local.b2);
  return out;
}

TEST(ReferenceLocalRange, RoutesOutsideContributeNothing) {
  MoeConfig lc;
  lc.num_experts = 8, lc.local_expert_first = 2, lc.local_expert_count = 3;
  lc.hidden = 64, lc.intermediate = 64, lc.top_k = 4;
  lc.format = WeightFormat::kNVFP4, lc.mode = ActMode::kA4, lc.activation = Activation::kSilu, lc.has_bias = true;
  testkit::Problem p = testkit::make_problem({lc, 6, 4242});
  QuantizedCheckpoint wl = testkit::canonical(p);
  ASSERT_EQ(wl.w13.experts, 3);
  // Distinct FC1 input scales per local expert, so indexing them by global id would show.
  wl.fc1_input_scale[1] *= 4.0f;
  wl.fc1_input_scale[2] *= 0.25f;
  const std::vector<int32_t> forced = {2, 3, 4, -1,    // local, local, local, none
                                       -1, 8, 100, 0,  // nothing valid: output exactly 0
                                       7, 3, 1, 5,     // one local
                                       4, 4, 2, 6,     // repeated local expert
                                       0, 1, 5, 7};    // nothing local: output exactly 0
  std::copy(forced.begin(), forced.end(), p.ids.begin());  // token 5 keeps the softmax routing
  const std::vector<int> no_route_tokens = {1, 4};

  const auto local = run_ref(lc, wl, p);
  const auto want = oracle_forward(lc, wl, p.x, p.ids64(), p.topk_weights, p.tokens);
  ASSERT_GT(max_abs(want), 1e-3);
  EXPECT_LE(max_rel_diff(local, want), kOracleTol);

  for (int t : no_route_tokens)
    for (int col = 0; col < lc.hidden; ++col) {
      const double v = local[t * lc.hidden + col];
      EXPECT_TRUE(v == 0.0 && !std::signbit(v)) << "token " << t << " col " << col << " = " << v;
    }
  std::vector<uint16_t> out_bf16(p.x.size(), testkit::kPoisonBF16);
  reference::moe_forward(lc, wl, p.x.data(), p.ids.data(), IndexType::kInt32, p.topk_weights.data(), p.tokens,
                         out_bf16.data(), 2);
  for (int t : no_route_tokens)
    for (int col = 0; col < lc.hidden; ++col) EXPECT_EQ(out_bf16[t * lc.hidden + col], 0x0000);

  // The same layer held whole: the local experts at 2..4 among 6 others; routes the local run
  // drops go to a non-local expert with router weight 0 instead.
  MoeConfig fc = lc;
  fc.local_expert_first = 0, fc.local_expert_count = -1;
  const testkit::Problem other = testkit::make_problem({fc, 1, 4343});
  const QuantizedCheckpoint wf = splice(testkit::canonical(other), wl, 2);
  std::vector<int32_t> ids_full(p.ids.size());
  std::vector<float> tw_full(p.ids.size()), tw_live(p.ids.size());
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const bool local_route = p.ids[i] >= 2 && p.ids[i] < 5;
    ids_full[i] = local_route ? p.ids[i] : static_cast<int32_t>(i % 2 ? 0 : 7);
    tw_full[i] = local_route ? p.topk_weights[i] : 0.0f;
    tw_live[i] = p.topk_weights[i];
  }
  const auto full = reference::moe_forward_f64(fc, wf, p.x.data(), ids_full.data(), IndexType::kInt32,
                                               tw_full.data(), p.tokens, 2);
  EXPECT_TRUE(bit_identical(local, full)) << "max rel diff " << max_rel_diff(local, full);
  // Non-vacuous: with their router weights kept, the non-local experts do change the answer.
  const auto live = reference::moe_forward_f64(fc, wf, p.x.data(), ids_full.data(), IndexType::kInt32,
                                               tw_live.data(), p.tokens, 2);
  EXPECT_GT(max_rel_diff(live, local), kDiffers);
}

// make_problem's kSomeInvalid routing (−1 and E + 5 mixed in) against the oracle.
TEST(ReferenceLocalRange, SomeInvalidIdsMatchOracle) {
  for (auto mode : {ActMode::kA4, ActMode::kA8}) {
    const MoeConfig c = small_config(WeightFormat::kMXFP4, mode, Activation::kGeluTanh, false);
    testkit::ProblemSpec spec{c, 7, 515};
    spec.routing = testkit::ProblemSpec::Routing::kSomeInvalid;
    const testkit::Problem p = testkit::make_problem(spec);
    int invalid = 0;
    for (int32_t id : p.ids) invalid += id < 0 || id >= c.num_experts;
    ASSERT_GT(invalid, 0);
    const QuantizedCheckpoint w = testkit::canonical(p);
    EXPECT_LE(max_rel_diff(run_ref(c, w, p), oracle_forward(c, w, p.x, p.ids64(), p.topk_weights, p.tokens)),
              kOracleTol);
  }
}

// ------------------------------------------------------------------------------------------------
// 4. Properties.
// ------------------------------------------------------------------------------------------------

TEST(ReferenceProperties, Int64IdsEqualInt32) {
  const MoeConfig c = small_config(WeightFormat::kNVFP4, ActMode::kA4, Activation::kSwigluOai, true);
  const testkit::Problem p = testkit::make_problem({c, 6, 31});
  const QuantizedCheckpoint w = testkit::canonical(p);
  const auto ids64 = p.ids64();
  const auto a = run_ref(c, w, p);
  const auto b = reference::moe_forward_f64(c, w, p.x.data(), ids64.data(), IndexType::kInt64,
                                            p.topk_weights.data(), p.tokens, 2);
  ASSERT_GT(max_abs(a), 0.0);
  EXPECT_TRUE(bit_identical(a, b));
}

TEST(ReferenceProperties, OutputDtypes) {
  MoeConfig c = small_config(WeightFormat::kMXFP4, ActMode::kA8, Activation::kSilu, true);
  const testkit::Problem p = testkit::make_problem({c, 6, 32});
  const QuantizedCheckpoint w = testkit::canonical(p);
  const auto f64 = run_ref(c, w, p);
  ASSERT_GT(max_abs(f64), 0.0);
  const size_t n = f64.size();
  std::vector<float> out32(n, u32_as_f32(testkit::kPoisonF32));
  std::vector<uint16_t> out16(n, testkit::kPoisonBF16);
  c.output_dtype = OutputDType::kFP32;
  reference::moe_forward(c, w, p.x.data(), p.ids.data(), IndexType::kInt32, p.topk_weights.data(), p.tokens,
                         out32.data(), 2);
  c.output_dtype = OutputDType::kBF16;
  reference::moe_forward(c, w, p.x.data(), p.ids.data(), IndexType::kInt32, p.topk_weights.data(), p.tokens,
                         out16.data(), 2);
  int rounded_away = 0;  // how often bf16 RNE is not plain truncation (non-vacuous rounding check)
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(f32_as_u32(out32[i]), f32_as_u32(static_cast<float>(f64[i]))) << i;
    EXPECT_EQ(out16[i], oracle_bf16_bits(out32[i])) << i << ": " << out32[i];
    rounded_away += out16[i] != static_cast<uint16_t>(f32_as_u32(out32[i]) >> 16);
  }
  EXPECT_GT(rounded_away, 0);
}

TEST(ReferenceProperties, ThreadCountDoesNotChangeResult) {
  MoeConfig c;
  c.num_experts = 8, c.hidden = 256, c.intermediate = 192, c.top_k = 3;
  c.format = WeightFormat::kNVFP4, c.mode = ActMode::kA4, c.activation = Activation::kGeluTanh, c.has_bias = true;
  const testkit::Problem p = testkit::make_problem({c, 12, 33});
  const QuantizedCheckpoint w = testkit::canonical(p);
  const auto t1 = run_ref(c, w, p, 1);
  ASSERT_GT(max_abs(t1), 0.0);
  std::vector<uint16_t> o1(p.x.size()), o2(p.x.size());
  reference::moe_forward(c, w, p.x.data(), p.ids.data(), IndexType::kInt32, p.topk_weights.data(), p.tokens,
                         o1.data(), 1);
  for (int threads : {2, 7, 0}) {
    EXPECT_TRUE(bit_identical(t1, run_ref(c, w, p, threads))) << threads << " threads";
    reference::moe_forward(c, w, p.x.data(), p.ids.data(), IndexType::kInt32, p.topk_weights.data(), p.tokens,
                           o2.data(), threads);
    EXPECT_EQ(o1, o2) << threads << " threads";
  }
}

TEST(ReferenceProperties, TopKLargerThanExperts) {
  MoeConfig c = small_config(WeightFormat::kNVFP4, ActMode::kA16, Activation::kSilu, true);
  c.num_experts = 2, c.top_k = 5;
  const testkit::Problem p = testkit::make_problem({c, 4, 34});
  int repeats = 0;
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int j = 1; j < c.top_k; ++j) repeats += p.ids[t * c.top_k + j] == p.ids[t * c.top_k];
  ASSERT_GT(repeats, 0);
  const QuantizedCheckpoint w = testkit::canonical(p);
  const auto ref = run_ref(c, w, p);
  ASSERT_GT(max_abs(ref), 0.0);
  EXPECT_LE(max_rel_diff(ref, oracle_forward(c, w, p.x, p.ids64(), p.topk_weights, p.tokens)), kOracleTol);
}

TEST(ReferenceProperties, AllRoutesToOneExpert) {
  for (auto mode : {ActMode::kA4, ActMode::kA16}) {
    const MoeConfig c = small_config(WeightFormat::kNVFP4, mode, Activation::kRelu2, false);
    testkit::ProblemSpec spec{c, 6, 35};
    spec.routing = testkit::ProblemSpec::Routing::kAllToOneExpert;
    spec.one_expert = 4;
    const testkit::Problem p = testkit::make_problem(spec);
    for (int32_t id : p.ids) ASSERT_EQ(id, 4);
    const QuantizedCheckpoint w = testkit::canonical(p);
    const auto ref = run_ref(c, w, p);
    ASSERT_GT(max_abs(ref), 0.0);
    EXPECT_LE(max_rel_diff(ref, oracle_forward(c, w, p.x, p.ids64(), p.topk_weights, p.tokens)), kOracleTol);
    // Each token's K routes see the same expert output y: out = Σ_j w_j·y, so out/Σw is one y
    // per token, the same as a single route of weight 1.
    std::vector<int32_t> one_ids(p.tokens, 4);
    std::vector<float> one_w(p.tokens, 1.0f);
    MoeConfig c1 = c;
    c1.top_k = 1;
    const auto y = reference::moe_forward_f64(c1, w, p.x.data(), one_ids.data(), IndexType::kInt32, one_w.data(),
                                              p.tokens, 2);
    for (int64_t t = 0; t < p.tokens; ++t) {
      double wsum = 0;
      for (int j = 0; j < c.top_k; ++j) wsum += p.topk_weights[t * c.top_k + j];
      for (int col = 0; col < c.hidden; ++col)
        EXPECT_NEAR(ref[t * c.hidden + col], wsum * y[t * c.hidden + col], 1e-12 * max_abs(y));
    }
  }
}

// ------------------------------------------------------------------------------------------------
// 5. NaN propagation.
// ------------------------------------------------------------------------------------------------

TEST(ReferenceNaN, NaNInOneTokenStaysInThatToken) {
  for (auto format : {WeightFormat::kNVFP4, WeightFormat::kMXFP4})
    for (auto mode : {ActMode::kA4, ActMode::kA16, ActMode::kA8})
      for (auto act : {Activation::kSilu, Activation::kRelu2}) {
        MoeConfig c = small_config(format, mode, act, true);
        testkit::Problem p = testkit::make_problem({c, 4, 36});
        const QuantizedCheckpoint w = testkit::canonical(p);
        const auto clean = run_ref(c, w, p);
        constexpr int bad = 2;
        p.x[bad * c.hidden + 37] = 0x7FC0;  // bf16 quiet NaN
        const auto dirty = run_ref(c, w, p);
        std::vector<uint16_t> out(p.x.size(), testkit::kPoisonBF16);
        reference::moe_forward(c, w, p.x.data(), p.ids.data(), IndexType::kInt32, p.topk_weights.data(), p.tokens,
                               out.data(), 2);
        for (int64_t t = 0; t < p.tokens; ++t)
          for (int col = 0; col < c.hidden; ++col) {
            const size_t i = t * c.hidden + col;
            if (t == bad) {
              EXPECT_TRUE(std::isnan(dirty[i])) << c.to_string() << " col " << col;
              EXPECT_TRUE(std::isnan(bf16_bits_to_f32(out[i])) && out[i] != testkit::kPoisonBF16) << c.to_string();
            } else {
              EXPECT_EQ(f32_as_u32(static_cast<float>(dirty[i])), f32_as_u32(static_cast<float>(clean[i])))
                  << c.to_string() << " token " << t;
              EXPECT_FALSE(std::isnan(bf16_bits_to_f32(out[i])));
            }
          }
      }
}

// ------------------------------------------------------------------------------------------------
// 6. The a4 quantisation points.
// ------------------------------------------------------------------------------------------------

// x is quantised per (token, expert) with that expert's own FC1 input scale.
TEST(ReferenceA4Points, Fc1InputScaleIsPerExpert) {
  MoeConfig c;
  c.num_experts = 2, c.hidden = 128, c.intermediate = 64, c.top_k = 2;
  c.format = WeightFormat::kNVFP4, c.mode = ActMode::kA4, c.activation = Activation::kSilu;
  const testkit::Problem p = testkit::make_problem({c, 8, 37});
  QuantizedCheckpoint w = testkit::canonical(p);
  // Expert 1's scale 300× coarser (not a power of two, which would only shift the E4M3 block
  // scales and leave sf·g unchanged): its block scales round differently, many into E4M3 subnormals.
  w.fc1_input_scale[1] = w.fc1_input_scale[0] * 300.0f;
  const auto ref = run_ref(c, w, p);
  const auto ids = p.ids64();
  EXPECT_LE(max_rel_diff(ref, oracle_forward(c, w, p.x, ids, p.topk_weights, p.tokens)), kOracleTol);
  for (int shared : {0, 1})
    EXPECT_GT(max_rel_diff(ref, oracle_forward(c, w, p.x, ids, p.topk_weights, p.tokens, {.fc1_scale_of = shared})),
              kDiffers)
        << "indistinguishable from using expert " << shared << "'s scale for both";

  // A scale so large that x quantises to zero for expert 1 (every block scale underflows E4M3):
  // with no bias expert 1 then contributes exactly nothing, as if its routes were dropped.
  w.fc1_input_scale[1] = 1e30f;
  const auto zeroed = run_ref(c, w, p);
  std::vector<int32_t> only0 = p.ids;
  for (auto& id : only0) id = id == 1 ? -1 : id;
  const auto dropped = reference::moe_forward_f64(c, w, p.x.data(), only0.data(), IndexType::kInt32,
                                                  p.topk_weights.data(), p.tokens, 2);
  ASSERT_GT(max_abs(dropped), 0.0);
  EXPECT_TRUE(bit_identical(zeroed, dropped));
}

// The intermediate is rounded to bf16 after the activation and before the FC2-input quantiser.
TEST(ReferenceA4Points, IntermediateRoundedToBf16BeforeQ2) {
  for (auto [format, mode] : {std::pair{WeightFormat::kNVFP4, ActMode::kA4}, std::pair{WeightFormat::kMXFP4, ActMode::kA4},
                              std::pair{WeightFormat::kNVFP4, ActMode::kA8}, std::pair{WeightFormat::kNVFP4, ActMode::kA16}}) {
    const MoeConfig c = small_config(format, mode, Activation::kSilu, false);
    const testkit::Problem p = testkit::make_problem({c, 16, 38});
    const QuantizedCheckpoint w = testkit::canonical(p);
    const auto ref = run_ref(c, w, p);
    const auto ids = p.ids64();
    EXPECT_LE(max_rel_diff(ref, oracle_forward(c, w, p.x, ids, p.topk_weights, p.tokens)), kOracleTol)
        << c.to_string();
    const auto unrounded =
        oracle_forward(c, w, p.x, ids, p.topk_weights, p.tokens, {.round_intermediate_bf16 = false});
    EXPECT_GT(max_rel_diff(ref, unrounded), kDiffers) << c.to_string() << ": matches an fp32 intermediate";
  }
}

// ------------------------------------------------------------------------------------------------
// 7. Real shapes through the host runner (a smoke check; times are printed, not asserted).
// ------------------------------------------------------------------------------------------------

// Random NVFP4 weights written directly as bytes (quantising ~10^8 floats would dominate the run):
// codes uniform, block scales in [0.5, 1], global scales giving weights of std ≈ 1/sqrt(fan_in).
QuantizedCheckpoint random_nvfp4_checkpoint(const MoeConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto projection = [&](int rows, int cols) {
    QuantizedProjection q;
    q.experts = c.local_count(), q.rows = rows, q.cols = cols, q.format = WeightFormat::kNVFP4;
    q.packed.resize(static_cast<size_t>(q.experts) * rows * cols / 2);
    for (size_t i = 0; i < q.packed.size(); i += 8) {
      const uint64_t r = rng();
      std::memcpy(&q.packed[i], &r, std::min<size_t>(8, q.packed.size() - i));
    }
    q.scales.resize(static_cast<size_t>(q.experts) * rows * (cols / 16));
    for (auto& s : q.scales) s = static_cast<uint8_t>(0x30 + rng() % 9);  // E4M3 0.5 … 1.0
    // E2M1 codes uniform: rms ≈ 2.93; block scale ≈ 0.75.
    q.global_scale.assign(q.experts, static_cast<float>(1.0 / std::sqrt(double(cols)) / (2.93 * 0.75)));
    return q;
  };
  QuantizedCheckpoint ck;
  ck.w13 = projection(c.fc1_rows(), c.hidden);
  ck.w2 = projection(c.hidden, c.intermediate);
  ck.fc1_input_scale.assign(c.local_count(), 5.0f / (448.0f * 6.0f));
  ck.fc2_input_scale.assign(c.local_count(), 8.0f / (448.0f * 6.0f));
  return ck;
}

struct RealRun {
  double prepare_s = 0, run_s = 0;
  std::vector<uint16_t> out;
};

// Route token t to `K` distinct experts among [lo, lo + span).
RealRun run_real_shape(const MoeConfig& c, int64_t T, int lo, int span, int threads) {
  RealRun r;
  const int K = c.top_k, H = c.hidden;
  std::mt19937_64 rng(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(T) * H);
  for (auto& v : x) v = oracle_bf16_bits(normal(rng));
  std::vector<int32_t> ids(static_cast<size_t>(T) * K);
  std::vector<float> tw;
  tw.assign(ids.size(), 1.0f / static_cast<float>(K));
  std::vector<int> pick(span);
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < span; ++i) pick[i] = lo + i;
    std::shuffle(pick.begin(), pick.end(), rng);
    for (int j = 0; j < K; ++j) ids[t * K + j] = pick[j];
  }
  auto t0 = std::chrono::steady_clock::now();
  PreparedWeights pw;
  {
    const QuantizedCheckpoint ck = random_nvfp4_checkpoint(c, 7);
    pw = prepare_weights(c, ck.view());
  }
  auto t1 = std::chrono::steady_clock::now();
  MoeRunner runner(c, pw, {.max_tokens = T, .cpu_threads = threads});
  r.out.assign(x.size(), testkit::kPoisonBF16);
  runner.run(x.data(), ids.data(), IndexType::kInt32, tw.data(), r.out.data(), T);
  auto t2 = std::chrono::steady_clock::now();
  r.prepare_s = std::chrono::duration<double>(t1 - t0).count();
  r.run_s = std::chrono::duration<double>(t2 - t1).count();
  return r;
}

void expect_finite_nonzero(const std::vector<uint16_t>& out) {
  int64_t bad = 0, nonzero = 0;
  for (uint16_t b : out) {
    const float f = bf16_bits_to_f32(b);
    bad += !std::isfinite(f);
    nonzero += f != 0.0f;
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(nonzero, static_cast<int64_t>(out.size()) / 2);
}

// deepseek-v3 (H 7168, I 2048, E 256, K 8), T = 1, nvfp4-a4 silu: the full 256-expert layer is
// ≈ 5.6 GB packed, so this instance holds the 16 experts [96, 112) and the token routes there.
TEST(ReferenceSmoke, DeepseekV3ShapeOneTokenOnHostRunner) {
  const testkit::NamedShape* s = testkit::find_shape("deepseek-v3");
  ASSERT_NE(s, nullptr);
  MoeConfig c;
  c.num_experts = s->experts, c.hidden = s->hidden, c.intermediate = s->intermediate, c.top_k = s->top_k;
  c.activation = s->activation;
  c.local_expert_first = 96, c.local_expert_count = 16;
  const RealRun r = run_real_shape(c, 1, 96, 16, 2);
  expect_finite_nonzero(r.out);
  std::printf("[ timing   ] deepseek-v3 local 16/256 experts, T=1, 2 threads: prepare %.2f s, run %.2f s\n",
              r.prepare_s, r.run_s);
}

// Timings for the record (run with --gtest_also_run_disabled_tests); nothing is asserted on time.
TEST(ReferenceSmoke, DISABLED_Timings) {
  {
    const testkit::NamedShape* s = testkit::find_shape("deepseek-v3");
    MoeConfig c;
    c.num_experts = s->experts, c.hidden = s->hidden, c.intermediate = s->intermediate, c.top_k = s->top_k;
    c.local_expert_first = 0, c.local_expert_count = 64;
    for (int64_t T : {1, 8}) {
      const RealRun r = run_real_shape(c, T, 0, 64, 2);
      expect_finite_nonzero(r.out);
      std::printf("[ timing   ] deepseek-v3 local 64/256, T=%lld, 2 threads: prepare %.2f s, run %.3f s\n",
                  static_cast<long long>(T), r.prepare_s, r.run_s);
    }
  }
  {
    const testkit::NamedShape* s = testkit::find_shape("qwen3-30b-a3b");
    MoeConfig c;
    c.num_experts = s->experts, c.hidden = s->hidden, c.intermediate = s->intermediate, c.top_k = s->top_k;
    const RealRun r = run_real_shape(c, 64, 0, c.num_experts, 2);
    expect_finite_nonzero(r.out);
    std::printf("[ timing   ] qwen3-30b-a3b all 128 experts, T=64, 2 threads: prepare %.2f s, run %.3f s\n",
                r.prepare_s, r.run_s);
  }
}

}  // namespace
