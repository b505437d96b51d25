// Random problems, accuracy comparison and the named shapes. See problem.h.
#include "testing/problem.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

#include "common/parallel_for.h"
#include "fp4moe/errors.h"
#include "fp4moe/formats.h"
#include "reference/reference.h"
#include "testing/normal.h"

namespace fp4moe::testkit {

namespace {

// An empty canonical projection of `experts` × [rows, cols], linear scales.
QuantizedProjection empty_projection(int experts, int rows, int cols, WeightFormat format) {
  QuantizedProjection q;
  q.experts = experts, q.rows = rows, q.cols = cols, q.format = format, q.scale_layout = ScaleLayout::kLinear;
  q.packed.assign(static_cast<size_t>(experts) * rows * cols / 2, 0);
  q.scales.assign(static_cast<size_t>(experts) * rows * (cols / q.block()), 0);
  if (format == WeightFormat::kNVFP4) q.global_scale.assign(experts, 1.0f);
  return q;
}

// Quantise expert e's dense [rows, cols] weights into slot e of `dst`. quantize_projection treats
// every expert independently (its NVFP4 global scale is per expert), so quantising one expert at a
// time gives the same bytes as quantising the whole array at once.
void quantize_expert_into(const float* w, int e, QuantizedProjection& dst) {
  const QuantizedProjection one = quantize_projection(w, 1, dst.rows, dst.cols, dst.format, ScaleLayout::kLinear);
  std::memcpy(dst.packed.data() + static_cast<size_t>(e) * one.packed.size(), one.packed.data(), one.packed.size());
  std::memcpy(dst.scales.data() + static_cast<size_t>(e) * one.scales.size(), one.scales.data(), one.scales.size());
  if (!dst.global_scale.empty()) dst.global_scale[e] = one.global_scale[0];
}

// The default: everything from the problem's one stream, in the order the tests pin; only the
// quantisation runs in parallel (per expert, byte-identical to quantize_checkpoint).
QuantizedCheckpoint sequential_weights(const MoeConfig& c, std::mt19937_64& rng,
                                       std::normal_distribution<float>& normal, int threads) {
  const int EL = c.local_count(), H = c.hidden, I = c.intermediate, N1 = c.fc1_rows();
  std::vector<float> w13(static_cast<size_t>(EL) * N1 * H), w2(static_cast<size_t>(EL) * H * I);
  const float s13 = 1.0f / std::sqrt(static_cast<float>(H)), s2 = 1.0f / std::sqrt(static_cast<float>(I));
  for (auto& v : w13) v = s13 * normal(rng);
  for (auto& v : w2) v = s2 * normal(rng);
  QuantizedCheckpoint q;
  if (c.has_bias) {
    q.b13.resize(static_cast<size_t>(EL) * N1);
    q.b2.resize(static_cast<size_t>(EL) * H);
    for (auto& v : q.b13) v = 0.1f * normal(rng);
    for (auto& v : q.b2) v = 0.1f * normal(rng);
  }
  q.w13 = empty_projection(EL, N1, H, c.format);
  q.w2 = empty_projection(EL, H, I, c.format);
  parallel_for(2 * static_cast<int64_t>(EL), threads, [&](int64_t task) {
    const int e = static_cast<int>(task / 2);
    if (task % 2 == 0) quantize_expert_into(w13.data() + static_cast<size_t>(e) * N1 * H, e, q.w13);
    else quantize_expert_into(w2.data() + static_cast<size_t>(e) * H * I, e, q.w2);
  });
  return q;
}

// Which local experts the routing reaches.
std::vector<char> touched_experts(const MoeConfig& c, const std::vector<int32_t>& ids) {
  std::vector<char> touched(c.local_count(), 0);
  for (int32_t id : ids) {
    const int64_t e = static_cast<int64_t>(id) - c.local_expert_first;
    if (e >= 0 && e < c.local_count()) touched[e] = 1;
  }
  return touched;
}

uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Placeholder codes and scales for an expert nobody reads: random nibbles, a constant block scale of
// about 1/sqrt(cols) per unit code (so the values look like the real ones), no NaN or overflow.
void placeholder_expert(int e, uint64_t seed, QuantizedProjection& dst) {
  const size_t pb = static_cast<size_t>(dst.rows) * dst.cols / 2, sb = static_cast<size_t>(dst.rows) * (dst.cols / dst.block());
  uint64_t s = splitmix64(seed);
  uint8_t* packed = dst.packed.data() + static_cast<size_t>(e) * pb;
  for (size_t i = 0; i < pb; i += 8) {
    s = splitmix64(s);
    std::memcpy(packed + i, &s, std::min<size_t>(8, pb - i));
  }
  const float unit = 1.0f / std::sqrt(static_cast<float>(dst.cols));
  uint8_t scale;
  if (dst.format == WeightFormat::kNVFP4) {
    scale = fmt::e4m3_encode(64.0f);
    dst.global_scale[e] = unit / 64.0f;
  } else {
    scale = static_cast<uint8_t>(127 + static_cast<int>(std::lround(std::log2(unit))));
  }
  std::memset(dst.scales.data() + static_cast<size_t>(e) * sb, scale, sb);
}

// kPerExpert: expert e from its own stream; generated and quantised in parallel, one expert's dense
// copy per thread at a time.
// touched: nullptr means every expert is real.
QuantizedCheckpoint per_expert_weights(const MoeConfig& c, uint64_t seed, const std::vector<char>* touched,
                                       int threads) {
  const int EL = c.local_count(), H = c.hidden, I = c.intermediate, N1 = c.fc1_rows();
  QuantizedCheckpoint q;
  q.w13 = empty_projection(EL, N1, H, c.format);
  q.w2 = empty_projection(EL, H, I, c.format);
  if (c.has_bias) {
    q.b13.assign(static_cast<size_t>(EL) * N1, 0.0f);
    q.b2.assign(static_cast<size_t>(EL) * H, 0.0f);
  }
  const float s13 = 1.0f / std::sqrt(static_cast<float>(H)), s2 = 1.0f / std::sqrt(static_cast<float>(I));
  parallel_for(EL, threads, [&](int64_t e64) {
    const int e = static_cast<int>(e64);
    const uint64_t expert_seed = splitmix64(seed ^ splitmix64(0xE0000000ull + static_cast<uint64_t>(e)));
    if (touched && !(*touched)[e]) {
      placeholder_expert(e, expert_seed, q.w13);
      placeholder_expert(e, expert_seed + 1, q.w2);
      return;
    }
    ZigguratNormal normal(expert_seed);  // normal.h: 4.7 ns a sample against std::normal_distribution's 23
    std::vector<float> w(static_cast<size_t>(std::max(N1, H)) * std::max(H, I));
    for (size_t i = 0; i < static_cast<size_t>(N1) * H; ++i) w[i] = s13 * normal();
    quantize_expert_into(w.data(), e, q.w13);
    for (size_t i = 0; i < static_cast<size_t>(H) * I; ++i) w[i] = s2 * normal();
    quantize_expert_into(w.data(), e, q.w2);
    if (c.has_bias) {
      for (int n = 0; n < N1; ++n) q.b13[static_cast<size_t>(e) * N1 + n] = 0.1f * normal();
      for (int n = 0; n < H; ++n) q.b2[static_cast<size_t>(e) * H + n] = 0.1f * normal();
    }
  });
  return q;
}

// One token's routing: softmax over E logits drawn from `rng`, top-k (distinct experts while K <= E),
// renormalised; the edge-case patterns of ProblemSpec::Routing applied on top.
void route_token(const MoeConfig& c, int64_t t, std::mt19937_64& rng, std::normal_distribution<float>& normal,
                 std::vector<float>& logits, std::vector<int>& order, ProblemSpec::Routing routing, int one_expert,
                 int32_t* ids, float* weights) {
  const int E = c.num_experts, K = c.top_k;
  for (auto& l : logits) l = normal(rng);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + std::min(K, E), order.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  double sum = 0;
  for (int j = 0; j < K; ++j) sum += std::exp(static_cast<double>(logits[order[j % E]]));
  for (int j = 0; j < K; ++j) {
    int id = order[j % E];  // K > E repeats experts: allowed, each route counts
    if (routing == ProblemSpec::Routing::kAllToOneExpert) id = one_expert;
    if (routing == ProblemSpec::Routing::kSomeInvalid && (t + j) % 3 == 0) id = (t % 2) ? -1 : E + 5;
    ids[j] = id;
    weights[j] = static_cast<float>(std::exp(static_cast<double>(logits[order[j % E]])) / sum);
  }
}

// nvfp4-a4 input scales (decode form, ModelOpt input_scale): FC1 from the amax of x [T, H], FC2 per
// expert from the intermediate of the first `calib` tokens; experts nobody reached get the largest
// seen. No-op for other modes.
void calibrate_input_scales(const MoeConfig& c, QuantizedCheckpoint& canon, const std::vector<uint16_t>& x,
                            const std::vector<int32_t>& ids, int64_t calib) {
  if (!c.needs_input_scales()) return;
  const int EL = c.local_count();
  float amax = 0;
  for (auto v : x) amax = std::max(amax, std::fabs(fmt::f32_from_bf16(v)));
  canon.fc1_input_scale.assign(EL, std::max(amax, 1e-6f) / (448.0f * 6.0f));
  canon.fc2_input_scale.assign(EL, 1.0f);  // provisional, calibrated below
  std::vector<float> inter = reference::intermediate_amax(c, canon, x.data(), ids.data(), IndexType::kInt32, calib);
  const float top = std::max(1e-6f, *std::max_element(inter.begin(), inter.end()));
  for (int e = 0; e < EL; ++e) canon.fc2_input_scale[e] = (inter[e] > 0 ? inter[e] : top) / (448.0f * 6.0f);
}

}  // namespace

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
  for (int64_t t = 0; t < T; ++t)
    route_token(c, t, rng, normal, logits, order, spec.routing, spec.one_expert, &p.ids[t * K], &p.topk_weights[t * K]);

  // Weights ~ N(0, 1/fan_in) so that every stage stays O(1). Quantised in the canonical [up; gate]
  // order, then permuted into the requested layout below (the per-row block scales move with their
  // rows, so every layout holds the same values).
  const std::vector<char> touched = touched_experts(c, p.ids);
  QuantizedCheckpoint canon =
      spec.weight_gen == ProblemSpec::WeightGen::kSequential
          ? sequential_weights(c, rng, normal, spec.threads)
          : per_expert_weights(c, spec.seed, spec.touched_experts_only ? &touched : nullptr, spec.threads);
  canon.gate_up = GateUpLayout::kUpGate;
  // Input scales: FC1 from this batch's amax, FC2 from the intermediate of (up to) its first 64 tokens.
  calibrate_input_scales(c, canon, p.x, p.ids, std::min<int64_t>(T, 64));

  // Re-express in the requested checkpoint layout (moved, not copied, where nothing is permuted:
  // a large layer is gigabytes).
  const bool permute = c.gated() && spec.gate_up != GateUpLayout::kUpGate;
  if (permute) p.checkpoint = canon;
  else p.checkpoint = std::move(canon);
  if (permute) {
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

Inputs make_inputs(const MoeConfig& c, int64_t tokens, uint64_t seed, int threads, float x_std) {
  c.validate();
  FP4MOE_REQUIRE(tokens >= 1, InvalidArgument, "tokens", "must be at least 1, got ", tokens);
  const int H = c.hidden, K = c.top_k;
  Inputs in;
  in.tokens = tokens;
  in.x.resize(static_cast<size_t>(tokens) * H);
  in.ids.resize(static_cast<size_t>(tokens) * K);
  in.topk_weights.resize(static_cast<size_t>(tokens) * K);
  constexpr int64_t kChunk = 64;  // tokens per task
  parallel_for((tokens + kChunk - 1) / kChunk, threads, [&](int64_t chunk) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> logits(c.num_experts);
    std::vector<int> order(c.num_experts);
    for (int64_t t = chunk * kChunk; t < std::min(tokens, (chunk + 1) * kChunk); ++t) {
      std::mt19937_64 rng(splitmix64(seed ^ splitmix64(0x70000000000ull + static_cast<uint64_t>(t))));
      for (int h = 0; h < H; ++h) in.x[static_cast<size_t>(t) * H + h] = fmt::bf16_from_f32(x_std * normal(rng));
      route_token(c, t, rng, normal, logits, order, ProblemSpec::Routing::kSoftmaxTopK, 0, &in.ids[t * K],
                  &in.topk_weights[t * K]);
    }
  });
  return in;
}

QuantizedCheckpoint make_layer_weights(const LayerSpec& spec) {
  const MoeConfig& c = spec.config;
  c.validate();
  QuantizedCheckpoint canon = per_expert_weights(c, spec.seed, nullptr, spec.threads);
  canon.gate_up = GateUpLayout::kUpGate;
  return canon;
}

void calibrate_layer(const LayerSpec& spec, QuantizedCheckpoint& weights) {
  const MoeConfig& c = spec.config;
  c.validate();
  FP4MOE_REQUIRE(spec.calib_tokens >= 1, InvalidArgument, "calib_tokens", "must be at least 1, got ",
                 spec.calib_tokens);
  if (!c.needs_input_scales()) return;
  const Inputs calib = make_inputs(c, spec.calib_tokens, spec.seed ^ kCalibSalt, spec.threads);
  calibrate_input_scales(c, weights, calib.x, calib.ids, spec.calib_tokens);
}

QuantizedCheckpoint make_layer(const LayerSpec& spec) {
  QuantizedCheckpoint canon = make_layer_weights(spec);
  calibrate_layer(spec, canon);
  return canon;
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
