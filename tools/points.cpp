// Points, problems, byte and flop counts. See points.h.
#include "points.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <sstream>

#include "fp4moe/errors.h"

namespace fp4moe::cli {

MoeConfig Point::config() const {
  MoeConfig c;
  c.num_experts = shape.experts;
  c.hidden = shape.hidden;
  c.intermediate = shape.intermediate;
  c.top_k = shape.top_k;
  c.activation = shape.activation;
  c.swiglu = shape.swiglu;
  c.format = format;
  c.mode = mode;
  c.has_bias = bias;
  return c;
}

std::vector<Point> expand_points(const Args& args, const std::vector<int64_t>& tokens) {
  std::vector<Point> points;
  for (const Shape& s : args.shapes)
    for (WeightFormat f : args.formats)
      for (ActMode m : args.modes)
        for (int64_t t : tokens) points.push_back({s, f, m, args.bias, t});
  return points;
}

std::vector<LayerPoints> group_by_layer(const std::vector<Point>& points) {
  std::vector<LayerPoints> layers;
  for (const Point& p : points) {
    const bool same = !layers.empty() && [&] {
      const Point& q = layers.back().points.front();
      return q.shape.name == p.shape.name && q.shape.hidden == p.shape.hidden &&
             q.shape.intermediate == p.shape.intermediate && q.shape.experts == p.shape.experts &&
             q.shape.top_k == p.shape.top_k && q.shape.activation == p.shape.activation && q.format == p.format &&
             q.mode == p.mode && q.bias == p.bias;
    }();
    if (same) layers.back().points.push_back(p);
    else layers.push_back({{p}});
  }
  return layers;
}

namespace {

testkit::LayerSpec layer_spec(const MoeConfig& config, uint64_t seed, int threads) {
  testkit::LayerSpec spec;
  spec.config = config;
  spec.seed = seed;
  spec.threads = threads;
  return spec;
}

// What make_layer_weights depends on: every field of the config but the activation mode (and the
// output type, which the weights never see), and the seed.
std::string layer_weights_key(const MoeConfig& c, uint64_t seed) {
  std::ostringstream k;
  k << c.hidden << ' ' << c.intermediate << ' ' << c.num_experts << ' ' << c.top_k << ' '
    << static_cast<int>(c.activation) << ' ' << c.swiglu.alpha << ' ' << c.swiglu.beta << ' ' << c.swiglu.limit << ' '
    << static_cast<int>(c.format) << ' ' << c.has_bias << ' ' << c.local_expert_first << ' ' << c.local_count()
    << ' ' << seed;
  return k.str();
}

}  // namespace

QuantizedCheckpoint build_layer(const MoeConfig& config, uint64_t seed, int threads) {
  return testkit::make_layer(layer_spec(config, seed, threads));
}

std::string error_status(const std::exception& e) {
  if (dynamic_cast<const fp4moe::Unsupported*>(&e)) return std::string("unsupported: ") + e.what();
  if (dynamic_cast<const std::bad_alloc*>(&e)) return "error: out of host memory";
  return std::string("error: ") + e.what();
}

PreparedWeights prepare_layer(const MoeConfig& config, uint64_t seed, int threads, bool gpu, bool keep_host_copy,
                              std::string& error, LayerCache* cache) {
  error.clear();
  try {
    LayerCache local;
    LayerCache& lc = cache ? *cache : local;
    const testkit::LayerSpec spec = layer_spec(config, seed, threads);
    const std::string key = layer_weights_key(config, seed);
    if (lc.key != key) {
      lc.key.clear();  // stays empty if the draw throws
      lc.weights = testkit::make_layer_weights(spec);
      lc.key = key;
    }
    testkit::calibrate_layer(spec, lc.weights);
    const QuantizedCheckpoint& ck = lc.weights;
    PrepareOptions po;
    po.device = gpu ? 0 : -1;
    po.keep_host_copy = keep_host_copy;
    po.host_threads = threads;
    return prepare_weights(config, ck.view(), po);
  } catch (const std::exception& e) {
    error = error_status(e);
    return {};
  }
}

testkit::Inputs build_inputs(const Point& point, int64_t tokens, uint64_t seed, int threads) {
  const uint64_t s = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(point.tokens) * 0xD1B54A32D192ED03ull + 1;
  return testkit::make_inputs(point.config(), tokens, s, threads);
}

Traffic traffic(const MoeConfig& c, const int32_t* ids, int64_t tokens) {
  std::vector<char> touched(c.num_experts, 0);
  for (int64_t i = 0; i < tokens * c.top_k; ++i)
    if (ids[i] >= c.local_expert_first && ids[i] < c.local_expert_first + c.local_count()) touched[ids[i]] = 1;
  const double H = c.hidden, I = c.intermediate, N1 = c.fc1_rows(), blk = c.weight_block();
  double per_expert = (N1 * H + H * I) / 2      // packed E2M1
                      + (N1 * H + H * I) / blk;  // one scale byte per block
  if (c.format == WeightFormat::kNVFP4) per_expert += 2 * 4;  // fp32 global scale per projection
  if (c.needs_input_scales()) per_expert += 2 * 4;           // fc1/fc2 input scales
  if (c.has_bias) per_expert += (N1 + H) * 4;                // fp32 biases
  Traffic t;
  t.touched_experts = static_cast<int>(std::count(touched.begin(), touched.end(), 1));
  t.bytes = t.touched_experts * per_expert + 2.0 * tokens * H * 2;  // + x in, out (bf16)
  return t;
}

double flops(const MoeConfig& c, int64_t tokens) {
  return 2.0 * tokens * c.top_k * (double(c.hidden) * c.fc1_rows() + double(c.intermediate) * c.hidden);
}

std::vector<int64_t> sample_rows(int64_t tokens, uint64_t seed) {
  std::vector<int64_t> rows(tokens);
  std::iota(rows.begin(), rows.end(), 0);
  if (tokens <= 64) return rows;
  // 64 distinct rows out of the middle [1, T-1) by a partial Fisher–Yates shuffle.
  std::mt19937_64 rng(seed ^ 0x5A3B1E5ull ^ static_cast<uint64_t>(tokens));
  std::vector<int64_t> middle(rows.begin() + 1, rows.end() - 1);
  const size_t pick = std::min<size_t>(64, middle.size());
  for (size_t i = 0; i < pick; ++i) {
    std::uniform_int_distribution<size_t> d(i, middle.size() - 1);
    std::swap(middle[i], middle[d(rng)]);
  }
  std::vector<int64_t> out(middle.begin(), middle.begin() + pick);
  out.push_back(0);
  out.push_back(tokens - 1);
  std::sort(out.begin(), out.end());
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string format_fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string format_sci(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*e", digits, v);
  return buf;
}

}  // namespace fp4moe::cli
