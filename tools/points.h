// tools/points.h — what check and bench share: the points of a run, the problem built for each,
// the per-point byte and flop counts, and small host utilities.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "cli_args.h"
#include "fp4moe/config.h"
#include "fp4moe/weights.h"
#include "testing/problem.h"

namespace fp4moe::cli {

// One measured point: a layer shape in one format and mode, at one token count.
struct Point {
  Shape shape;
  WeightFormat format = WeightFormat::kNVFP4;
  ActMode mode = ActMode::kA4;
  bool bias = false;
  int64_t tokens = 1;

  MoeConfig config() const;
};

// Points in the order shape × format × mode × tokens.
std::vector<Point> expand_points(const Args& args, const std::vector<int64_t>& tokens);

// The points that share one layer's weights (shape, format, mode, bias), in run order; check and
// bench draw and prepare a layer's weights once and reuse them for every token count.
struct LayerPoints {
  std::vector<Point> points;
  MoeConfig config() const { return points.front().config(); }
};
std::vector<LayerPoints> group_by_layer(const std::vector<Point>& points);

// The layer's random weights (testkit::make_layer: every expert real, nvfp4-a4 input scales
// calibrated once), seeded by `seed`.
QuantizedCheckpoint build_layer(const MoeConfig& config, uint64_t seed, int threads);

// A point's status for an exception: "unsupported: …" for fp4moe::Unsupported, else "error: …".
std::string error_status(const std::exception& e);

// The last layer's drawn weights (testkit::make_layer_weights), for the next layer that differs from
// it only in the activation mode: the modes of a shape and format share their weights (only the
// input scales differ), and drawing them is most of a layer's preparation (make_layer of
// qwen3-30b-a3b: ~9 s on 2 cores).
struct LayerCache {
  std::string key;  // layer_weights_key of the weights held, empty when none
  QuantizedCheckpoint weights;
};

// The layer's weights drawn (build_layer, or the cache's weights when they match, recalibrated for
// the config's mode) and prepared on GPU 0 or the host (keeping the canonical host form when asked).
// A failure comes back as error_status in `error`, not as an exception, so the caller can report
// every point of the layer. cache: optional; holds the drawn weights afterwards.
PreparedWeights prepare_layer(const MoeConfig& config, uint64_t seed, int threads, bool gpu, bool keep_host_copy,
                              std::string& error, LayerCache* cache = nullptr);

// Fresh random inputs for one point: `tokens` rows (a multiple of point.tokens when several input
// sets share one call), seeded by (seed, point.tokens) — the same inputs for every format and mode
// of a shape at one token count, other inputs at every other token count.
testkit::Inputs build_inputs(const Point& point, int64_t tokens, uint64_t seed, int threads);

// Bytes a call must move for rows [t0, t0 + T) of a problem (bench-protocol.md): packed weights,
// block scales and global scales of the experts those rows reach, their biases, x in and out.
struct Traffic {
  int touched_experts = 0;
  double bytes = 0;
};
Traffic traffic(const MoeConfig& c, const int32_t* ids, int64_t tokens);
double flops(const MoeConfig& c, int64_t tokens);  // 2·T·K·(H·N1 + I·H)

// The token rows check compares against the reference: all when T ≤ 64, else the first, the last
// and 64 others drawn at random; sorted.
std::vector<int64_t> sample_rows(int64_t tokens, uint64_t seed);

// Rows [rows] of a [T, width] row-major array.
template <typename T>
std::vector<T> gather_rows(const std::vector<T>& a, int64_t width, const std::vector<int64_t>& rows) {
  std::vector<T> out;
  out.reserve(rows.size() * width);
  for (int64_t r : rows) out.insert(out.end(), a.begin() + r * width, a.begin() + (r + 1) * width);
  return out;
}

double median(std::vector<double> v);
std::string format_fixed(double v, int digits);
std::string format_sci(double v, int digits);

}  // namespace fp4moe::cli
