// tools/points.h — what check and bench share: the points of a run, the problem built for each,
// the per-point byte and flop counts, and small host utilities.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli_args.h"
#include "fp4moe/config.h"
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

// A random problem of `tokens` rows for the point (tokens may be a multiple of point.tokens when
// several input sets share one layer). Per-expert weight streams, placeholders for experts the
// routing never reaches: fast for any layer size, and the reached experts are real random weights.
testkit::Problem build_problem(const Point& point, int64_t tokens, uint64_t seed, int threads);

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
