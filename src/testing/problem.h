// src/testing — random problems and accuracy checks shared by the tests, `fp4moe check` and
// `fp4moe bench`. Host memory only; no CUDA.
//
// Data follow ../shared/bench-protocol.md: normal activations, softmax-top-k routing (renormalised),
// weights quantised from normal values, NVFP4 input scales calibrated from the data. Never zeros.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fp4moe/config.h"
#include "fp4moe/weights.h"

namespace fp4moe::testkit {

struct ProblemSpec {
  MoeConfig config;
  int64_t tokens = 1;
  uint64_t seed = 1;
  ScaleLayout scale_layout = ScaleLayout::kLinear;   // layout of the checkpoint handed to prepare
  GateUpLayout gate_up = GateUpLayout::kUpGate;      // row order of the checkpoint's W13
  float x_std = 1.0f;                                // activations ~ N(0, x_std²)
  // Routing: ids ~ softmax-top-k over all E experts. Special patterns for edge-case tests:
  enum class Routing { kSoftmaxTopK, kAllToOneExpert, kSomeInvalid } routing = Routing::kSoftmaxTopK;
  int one_expert = 0;                                // kAllToOneExpert: every route goes here
  // How the expert weights are drawn. kSequential: from the one stream that also draws x and the
  // routing (the default; what the tests pin). kPerExpert: each expert from its own stream seeded by
  // (seed, expert), generated and quantised in parallel without a dense copy of the layer — same
  // distributions (N(0, 1) by a ziggurat, testing/normal.h), other values; for large layers
  // (deepseek-v3 is 11 G weights). make_layer's weights (the benches) are drawn this way.
  enum class WeightGen { kSequential, kPerExpert } weight_gen = WeightGen::kSequential;
  // kPerExpert only: experts that no route of the problem reaches get placeholder weights (random
  // codes, constant block scales, zero biases) instead of quantised normals. A correct kernel never
  // reads them; their bytes still exist, so memory footprint and layout are those of the full layer.
  bool touched_experts_only = false;
  int threads = 0;                                   // quantisation threads; 0 = all hardware threads
};

struct Problem {
  MoeConfig config;
  int64_t tokens = 0;
  std::vector<uint16_t> x;             // [T, H] bf16 bits
  std::vector<int32_t> ids;            // [T, K]
  std::vector<float> topk_weights;     // [T, K]
  QuantizedCheckpoint checkpoint;      // in the spec's layouts (what a user would hand us)

  std::vector<int64_t> ids64() const { return {ids.begin(), ids.end()}; }
};

Problem make_problem(const ProblemSpec& spec);

// ---- A layer drawn once, inputs drawn per point (`fp4moe check` and `bench`) -------------------
// Generating and quantising a large layer takes seconds; a run that measures one layer at many token
// counts draws the layer once (make_layer) and fresh inputs for every point (make_inputs).

// Every local expert from its own stream (as WeightGen::kPerExpert with all experts real); for
// nvfp4-a4 the input scales are calibrated once, as a checkpoint's static scales are: FC1 from the
// amax of `calib_tokens` tokens drawn by make_inputs(config, calib_tokens, seed ^ kCalibSalt), FC2 per
// expert from the intermediate of those tokens (experts they do not reach: the largest seen).
// Linear scales, [up; gate] rows.
struct LayerSpec {
  MoeConfig config;
  uint64_t seed = 1;
  int calib_tokens = 64;
  int threads = 0;  // generation threads; 0 = all hardware threads
};
inline constexpr uint64_t kCalibSalt = 0xCA11B0A7ull;
QuantizedCheckpoint make_layer(const LayerSpec& spec);
// make_layer in two steps: the weights, which depend on the shape, format, bias, local range and
// seed but not on the activation mode (so a run over several modes draws them once), then the input
// scales of spec.config's mode set on them (a no-op for modes without input scales, which leaves any
// scales already there: those modes never read them).
QuantizedCheckpoint make_layer_weights(const LayerSpec& spec);
void calibrate_layer(const LayerSpec& spec, QuantizedCheckpoint& weights);

// Inputs of one call: x ~ N(0, x_std²), softmax-top-k routing (renormalised) — the distributions of
// make_problem — token t from its own stream seeded by (seed, t), drawn in parallel.
struct Inputs {
  int64_t tokens = 0;
  std::vector<uint16_t> x;          // [T, H] bf16 bits
  std::vector<int32_t> ids;         // [T, K]
  std::vector<float> topk_weights;  // [T, K]
};
Inputs make_inputs(const MoeConfig& config, int64_t tokens, uint64_t seed, int threads = 0, float x_std = 1.0f);

// The canonical weights of a problem (canonicalize(config, checkpoint.view())).
QuantizedCheckpoint canonical(const Problem& p);

// Accuracy of `out` against the float64 reference result `ref` ([T, H]).
struct Accuracy {
  double rel_l2 = 0;          // ‖out − ref‖ / ‖ref‖ over everything
  double worst_token_rel = 0; // max over tokens of the same per token (‖ref_t‖ floored at 1e-6·rms)
  double max_abs = 0;
  int64_t nonfinite = 0;      // elements where out is not finite but ref is
  int64_t unwritten = 0;      // elements still holding the poison pattern
  bool pass = false;
  std::string summary() const;
};

// The bit pattern outputs are filled with before a run: a NaN no kernel produces.
inline constexpr uint16_t kPoisonBF16 = 0x7FBF;
inline constexpr uint32_t kPoisonF32 = 0x7FBFDEADu;

// out: [T, H] of `dtype`. tol: bound on rel_l2 (and 4·tol on worst_token_rel).
Accuracy compare(const std::vector<double>& ref, const void* out, OutputDType dtype, int64_t tokens, int hidden,
                 double tol);

// The documented tolerance for a config, with its reason (design.md §7):
//   a16 / a8: products are exact and only the fp32 summation order and the bf16 output rounding
//             differ → rel_l2 ≤ 5e-3 (bf16 rounding alone is ≈ 1.1e-3);
//   a4:       as above, plus an FC2-input code may flip where the GPU's fp32 activation rounds h to a
//             neighbouring bf16 → rel_l2 ≤ 1.5e-2.
double default_tolerance(const MoeConfig& config);

// Named model shapes of ../shared/bench-protocol.md.
struct NamedShape {
  const char* name;
  int hidden, intermediate, experts, top_k;
  Activation activation;
  SwigluParams swiglu;
};
const std::vector<NamedShape>& named_shapes();
const NamedShape* find_shape(const std::string& name);  // nullptr if unknown

}  // namespace fp4moe::testkit
