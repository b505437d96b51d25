// Random problems, accuracy comparison and the named shapes. See problem.h.
#include "testing/problem.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

#include "fp4moe/errors.h"
#include "fp4moe/formats.h"
#include "reference/reference.h"

namespace fp4moe::testkit {

const std::vector<NamedShape>& named_shapes() {
  static const std::vector<NamedShape> shapes = {
      {"qwen3-30b-a3b", 2048, 768, 128, 8, Activation::kSilu, {}},
      {"qwen3-235b-a22b", 4096, 1536, 128, 8, Activation::kSilu, {}},
      {"deepseek-v3", 7168, 2048, 256, 8, Activation::kSilu, {}},
      {"gpt-oss-120b", 2880, 2880, 128, 4, Activation::kSwigluOai, {1.702f, 1.0f, 7.0f}},
      {"llama4-scout", 5120, 8192, 16, 1, Activation::kSilu, {}},
      {"mixtral-8x7b", 4096, 14336, 8, 2, Activation::kSilu, {}},
  };
  return shapes;
}

const NamedShape* find_shape(const std::string& name) {
  for (const auto& s : named_shapes())
    if (name == s.name) return &s;
  return nullptr;
}

QuantizedCheckpoint canonical(const Problem& p) { return canonicalize(p.config, p.checkpoint.view()); }

Problem make_problem(const ProblemSpec& spec) {
  const MoeConfig& c = spec.config;
  c.validate();
  FP4MOE_REQUIRE(spec.tokens >= 1, InvalidArgument, "tokens", "must be at least 1, got ", spec.tokens);
  const int E = c.num_experts, EL = c.local_count(), H = c.hidden, I = c.intermediate, K = c.top_k;
  const int N1 = c.fc1_rows();
  const int64_t T = spec.tokens;
  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  Problem p;
  p.config = c;
  p.tokens = T;
  p.x.resize(static_cast<size_t>(T) * H);
  for (auto& v : p.x) v = fmt::bf16_from_f32(spec.x_std * normal(rng));

  // Routing: softmax over E logits, top-k (distinct experts while K <= E), renormalised.
  p.ids.resize(static_cast<size_t>(T) * K);
  p.topk_weights.resize(static_cast<size_t>(T) * K);
  std::vector<float> logits(E);
  std::vector<int> order(E);
  for (int64_t t = 0; t < T; ++t) {
    for (auto& l : logits) l = normal(rng);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + std::min(K, E), order.end(),
                      [&](int a, int b) { return logits[a] > logits[b]; });
    double sum = 0;
    for (int j = 0; j < K; ++j) sum += std::exp(static_cast<double>(logits[order[j % E]]));
    for (int j = 0; j < K; ++j) {
      int id = order[j % E];  // K > E repeats experts: allowed, each route counts
      if (spec.routing == ProblemSpec::Routing::kAllToOneExpert) id = spec.one_expert;
      if (spec.routing == ProblemSpec::Routing::kSomeInvalid && (t + j) % 3 == 0) id = (t % 2) ? -1 : E + 5;
      p.ids[t * K + j] = id;
      p.topk_weights[t * K + j] = static_cast<float>(std::exp(static_cast<double>(logits[order[j % E]])) / sum);
    }
  }

  // Weights ~ N(0, 1/fan_in) so that every stage stays O(1).
  std::vector<float> w13(static_cast<size_t>(EL) * N1 * H), w2(static_cast<size_t>(EL) * H * I);
  const float s13 = 1.0f / std::sqrt(static_cast<float>(H)), s2 = 1.0f / std::sqrt(static_cast<float>(I));
  for (auto& v : w13) v = s13 * normal(rng);
  for (auto& v : w2) v = s2 * normal(rng);
  std::vector<float> b13, b2;
  if (c.has_bias) {
    b13.resize(static_cast<size_t>(EL) * N1);
    b2.resize(static_cast<size_t>(EL) * H);
    for (auto& v : b13) v = 0.1f * normal(rng);
    for (auto& v : b2) v = 0.1f * normal(rng);
  }
  // Quantise in the canonical [up; gate] order, then permute rows into the requested layout (the
  // per-row block scales move with their rows, so every layout holds the same values).
  std::vector<float> fc1_scale, fc2_scale;
  if (c.needs_input_scales()) {
    // FC1 input: calibrated from this batch's amax, decode form (ModelOpt input_scale).
    float amax = 0;
    for (auto v : p.x) amax = std::max(amax, std::fabs(fmt::f32_from_bf16(v)));
    fc1_scale.assign(EL, std::max(amax, 1e-6f) / (448.0f * 6.0f));
    fc2_scale.assign(EL, 1.0f);  // provisional, calibrated below
  }
  QuantizedCheckpoint canon = quantize_checkpoint(c, w13.data(), w2.data(), GateUpLayout::kUpGate,
                                                  ScaleLayout::kLinear, fc1_scale.empty() ? nullptr : fc1_scale.data(),
                                                  fc2_scale.empty() ? nullptr : fc2_scale.data(),
                                                  b13.empty() ? nullptr : b13.data(), b2.empty() ? nullptr : b2.data());
  if (c.needs_input_scales()) {
    // FC2 input: per expert from the intermediate of (up to) the first 64 tokens; experts nobody
    // reached get the largest seen.
    const int64_t calib = std::min<int64_t>(T, 64);
    std::vector<float> amax = reference::intermediate_amax(c, canon, p.x.data(), p.ids.data(), IndexType::kInt32, calib);
    const float top = std::max(1e-6f, *std::max_element(amax.begin(), amax.end()));
    for (int e = 0; e < EL; ++e) canon.fc2_input_scale[e] = (amax[e] > 0 ? amax[e] : top) / (448.0f * 6.0f);
  }

  // Re-express in the requested checkpoint layout.
  p.checkpoint = canon;
  if (c.gated() && spec.gate_up != GateUpLayout::kUpGate) {
    auto dest_row = [&](int n) {  // canonical row n → row in the target layout
      const bool gate = n >= I;
      const int i = gate ? n - I : n;
      return spec.gate_up == GateUpLayout::kGateUp ? (gate ? i : I + i) : 2 * i + (gate ? 0 : 1);
    };
    QuantizedProjection& q = p.checkpoint.w13;
    const int64_t rb = H / 2, sc = H / q.block();
    std::vector<uint8_t> packed(q.packed.size()), scales(q.scales.size());
    std::vector<float> bias(canon.b13.size());
    for (int e = 0; e < EL; ++e)
      for (int n = 0; n < N1; ++n) {
        const int64_t d = static_cast<int64_t>(e) * N1 + dest_row(n), s = static_cast<int64_t>(e) * N1 + n;
        std::memcpy(&packed[d * rb], &canon.w13.packed[s * rb], rb);
        std::memcpy(&scales[d * sc], &canon.w13.scales[s * sc], sc);
        if (!bias.empty()) bias[d] = canon.b13[s];
      }
    q.packed = std::move(packed);
    q.scales = std::move(scales);
    p.checkpoint.b13 = std::move(bias);
    p.checkpoint.gate_up = spec.gate_up;
  }
  if (spec.scale_layout == ScaleLayout::kSwizzled128x4) {
    for (QuantizedProjection* q : {&p.checkpoint.w13, &p.checkpoint.w2}) {
      const int64_t sc = q->cols / q->block(), slab = static_cast<int64_t>(q->rows) * sc;
      std::vector<uint8_t> sw;
      for (int e = 0; e < q->experts; ++e) {
        auto s = swizzle_scales(q->scales.data() + e * slab, q->rows, sc);
        sw.insert(sw.end(), s.begin(), s.end());
      }
      q->scales = std::move(sw);
      q->scale_layout = ScaleLayout::kSwizzled128x4;
    }
  }
  return p;
}

double default_tolerance(const MoeConfig& config) { return config.mode == ActMode::kA4 ? 1.5e-2 : 5e-3; }

Accuracy compare(const std::vector<double>& ref, const void* out, OutputDType dtype, int64_t T, int H, double tol) {
  Accuracy a;
  double num = 0, den = 0;
  for (double r : ref) den += r * r;
  const double rms = std::sqrt(den / std::max<double>(1.0, static_cast<double>(ref.size())));
  for (int64_t t = 0; t < T; ++t) {
    double tn = 0, td = 0;
    for (int c = 0; c < H; ++c) {
      const size_t i = static_cast<size_t>(t) * H + c;
      double o;
      if (dtype == OutputDType::kBF16) {
        const uint16_t b = static_cast<const uint16_t*>(out)[i];
        if (b == kPoisonBF16) ++a.unwritten;
        o = fmt::f32_from_bf16(b);
      } else {
        const float f = static_cast<const float*>(out)[i];
        if (fmt::f32_bits(f) == kPoisonF32) ++a.unwritten;
        o = f;
      }
      const double r = ref[i];
      if (!std::isfinite(o) || !std::isfinite(r)) {
        // Non-finite must match non-finite (NaN for NaN, Inf of the same sign).
        const bool same = (std::isnan(o) && std::isnan(r)) || (std::isinf(o) && o == r);
        if (!same) ++a.nonfinite;
        continue;
      }
      const double d = o - r;
      num += d * d;
      tn += d * d;
      td += r * r;
      a.max_abs = std::max(a.max_abs, std::fabs(d));
    }
    const double floor = 1e-6 * rms * rms * H;
    a.worst_token_rel = std::max(a.worst_token_rel, std::sqrt(tn / std::max(td, floor)));
  }
  a.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  a.pass = a.unwritten == 0 && a.nonfinite == 0 && a.rel_l2 <= tol && a.worst_token_rel <= 4 * tol;
  return a;
}

std::string Accuracy::summary() const {
  std::ostringstream os;
  os << (pass ? "PASS" : "FAIL") << " rel_l2=" << rel_l2 << " worst_token_rel=" << worst_token_rel
     << " max_abs=" << max_abs << " nonfinite=" << nonfinite << " unwritten=" << unwritten;
  return os.str();
}

}  // namespace fp4moe::testkit
