// The whole fused MoE on the GPU against the CPU reference (src/reference), on fresh random inputs,
// with the output poisoned before every run and every element checked to have been written.
//
// Tolerances: testkit::default_tolerance (problem.h says why: a16/a8 5e-3, a4 1.5e-2 in relative L2,
// 4× that per token).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>

#include "cpu/expect_error.h"
#include "fp4moe/fp4moe.h"
#include "gpu/gpu_util.h"
#include "host/launch.h"
#include "reference/reference.h"
#include "testing/problem.h"

namespace fp4moe {
namespace {

using testgpu::DeviceArray;
using testgpu::device_is_sm90;
using testkit::Problem;
using testkit::ProblemSpec;

MoeConfig make_config(int E, int H, int I, int K, WeightFormat f = WeightFormat::kNVFP4, ActMode m = ActMode::kA4,
                      Activation a = Activation::kSilu, bool bias = false) {
  MoeConfig c;
  c.num_experts = E, c.hidden = H, c.intermediate = I, c.top_k = K;
  c.format = f, c.mode = m, c.activation = a, c.has_bias = bias;
  if (a == Activation::kSwigluOai) c.swiglu = {1.702f, 1.0f, 7.0f};
  return c;
}

// T·K that forced direct_micro takes, as its documentation states it (direct_micro.cuh
// kMaxRoutesF16 / kMaxRoutesBf16): 1024 routes on the f16 variant (NVFP4 weights, a4 activations),
// 512 on the bf16 one. Written out here rather than read from the library, so a changed capacity fails
// the tests that pin it.
int64_t direct_micro_capacity(const MoeConfig& c) {
  return c.format == WeightFormat::kNVFP4 && c.mode == ActMode::kA4 ? 1024 : 512;
}

// T·K that forced static takes (launch.h kStaticMaxRoutes), on sm_90.
constexpr int64_t kStaticCapacity = 4096;

// Inputs of a problem on the device.
struct DeviceInputs {
  DeviceArray<uint16_t> x;
  DeviceArray<int32_t> ids;
  DeviceArray<int64_t> ids64;
  DeviceArray<float> w;
  explicit DeviceInputs(const Problem& p) : x(p.x), ids(p.ids), ids64(p.ids64()), w(p.topk_weights) {}
};

// The reference on a sample of tokens (all of them when T <= 128), compared against `out`; every
// element of `out` is checked for the poison pattern.
testkit::Accuracy check_against_reference(const Problem& p, const void* out_host, double tol) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens;
  const int H = c.hidden, K = c.top_k;
  const size_t esz = c.output_dtype == OutputDType::kBF16 ? 2 : 4;
  std::vector<int64_t> sample(T);
  std::iota(sample.begin(), sample.end(), 0);
  if (T > 128) {
    std::mt19937_64 rng(T * 7919);
    std::shuffle(sample.begin() + 1, sample.end() - 1, rng);
    sample.resize(96);
    sample.push_back(T - 1);
  }
  const int64_t S = static_cast<int64_t>(sample.size());
  std::vector<uint16_t> xs(S * H);
  std::vector<int32_t> ids(S * K);
  std::vector<float> ws(S * K);
  std::vector<unsigned char> outs(S * H * esz);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t t = sample[i];
    std::copy_n(&p.x[t * H], H, &xs[i * H]);
    std::copy_n(&p.ids[t * K], K, &ids[i * K]);
    std::copy_n(&p.topk_weights[t * K], K, &ws[i * K]);
    std::memcpy(&outs[i * H * esz], static_cast<const unsigned char*>(out_host) + t * H * esz, H * esz);
  }
  const QuantizedCheckpoint canon = testkit::canonical(p);
  const auto ref = reference::moe_forward_f64(c, canon, xs.data(), ids.data(), IndexType::kInt32, ws.data(), S);
  testkit::Accuracy a = testkit::compare(ref, outs.data(), c.output_dtype, S, H, tol);
  // Unwritten elements anywhere in the output, not only in the sample.
  int64_t unwritten = 0;
  for (int64_t i = 0; i < T * H; ++i) {
    if (esz == 2) unwritten += static_cast<const uint16_t*>(out_host)[i] == testkit::kPoisonBF16;
    else unwritten += reinterpret_cast<const uint32_t*>(out_host)[i] == testkit::kPoisonF32;
  }
  a.unwritten = unwritten;
  a.pass = a.pass && unwritten == 0;
  return a;
}

// Prepare, poison, run once on the GPU, download.
std::vector<unsigned char> run_on_gpu(const Problem& p, RunnerOptions o = {}, IndexType it = IndexType::kInt32,
                                      cudaStream_t stream = nullptr) {
  const MoeConfig& c = p.config;
  PreparedWeights w = prepare_weights(c, p.checkpoint.view(), {.device = 0});
  o.max_tokens = std::max(o.max_tokens, p.tokens);
  MoeRunner r(c, w, o);
  EXPECT_EQ(r.plan_bf16_copy(p.tokens), o.prefill_bf16_bytes > 0 && o.backend == Backend::kDynamic)
      << "the call was meant to take the bf16 copy exactly when the test gives it one";
  DeviceInputs in(p);
  const size_t esz = c.output_dtype == OutputDType::kBF16 ? 2 : 4;
  DeviceArray<unsigned char> out(p.tokens * c.hidden * esz);
  if (esz == 2) out.fill_bytes(&testkit::kPoisonBF16, 2);
  else out.fill_bytes(&testkit::kPoisonF32, 4);
  r.run(in.x.get(), it == IndexType::kInt32 ? static_cast<const void*>(in.ids.get()) : in.ids64.get(), it, in.w.get(),
        out.get(), p.tokens, stream);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return out.download();
}

// A budget that holds every local expert's bf16 copy, taken from one routed row per expert on: the
// bf16 path on every call that reaches the line.
RunnerOptions with_bf16_copy(RunnerOptions o) {
  o.prefill_bf16_bytes = int64_t{1} << 40;
  o.prefill_bf16_min_rows = 1;
  return o;
}

// Runs the problem on every GPU backend that can take it (and on kAuto), each against the reference;
// dynamic also on its bf16 path (once per call dequantisation) when T·K reaches one row per expert.
void expect_matches_reference(const ProblemSpec& spec, RunnerOptions o = {}, IndexType it = IndexType::kInt32) {
  const Problem p = testkit::make_problem(spec);
  const bool bf16_reachable = spec.tokens * spec.config.top_k >= spec.config.num_experts && device_is_sm90();
  for (int variant = 0; variant < 6; ++variant) {
    const Backend b = variant < 5 ? std::array{Backend::kAuto, Backend::kGeneric, Backend::kDirectMicro,
                                               Backend::kStatic, Backend::kDynamic}[variant]
                                  : Backend::kDynamic;
    if (b == Backend::kDirectMicro && spec.tokens * spec.config.top_k > direct_micro_capacity(spec.config))
      continue;
    if (b == Backend::kStatic && (!device_is_sm90() || spec.tokens * spec.config.top_k > kStaticCapacity)) continue;
    if (variant == 5 && !bf16_reachable) continue;
    RunnerOptions ob = variant == 5 ? with_bf16_copy(o) : o;
    ob.backend = b;
    const auto out = run_on_gpu(p, ob, it);
    const auto acc = check_against_reference(p, out.data(), testkit::default_tolerance(spec.config));
    EXPECT_TRUE(acc.pass) << spec.config.to_string() << " T=" << spec.tokens << " backend " << to_string(b)
                          << (variant == 5 ? " (bf16 copy)" : "") << ": " << acc.summary();
  }
}

// One run of r on p's inputs into a poisoned bf16 output, checked against the reference.
void expect_run_matches_reference(MoeRunner& r, const Problem& p) {
  DeviceInputs in(p);
  DeviceArray<uint16_t> out(p.tokens * p.config.hidden);
  out.fill_bytes(&testkit::kPoisonBF16, 2);
  r.run(in.x.get(), in.ids.get(), IndexType::kInt32, in.w.get(), out.get(), p.tokens);
  GPU_CHECK(cudaDeviceSynchronize());
  const auto o = out.download();
  const auto acc = check_against_reference(p, o.data(), testkit::default_tolerance(p.config));
  EXPECT_TRUE(acc.pass) << p.config.to_string() << " T=" << p.tokens << " " << to_string(r.plan(p.tokens)) << ": "
                        << acc.summary();
}

// r.run on p's inputs captured in a CUDA graph and replayed `replays` times into a poisoned bf16
// output: the first replay matches the reference, every later one is bit-identical to it.
void expect_graph_replays_deterministic(const Problem& p, MoeRunner& r, int replays) {
  const int64_t T = p.tokens;
  DeviceInputs in(p);
  DeviceArray<uint16_t> out(T * p.config.hidden);
  testgpu::CapturedGraph graph([&](cudaStream_t s) {
    r.run(in.x.get(), in.ids.get(), IndexType::kInt32, in.w.get(), out.get(), T, s);
  });
  std::vector<uint16_t> first;
  for (int i = 0; i < replays; ++i) {
    out.fill_bytes(&testkit::kPoisonBF16, 2);
    graph.launch();
    const auto o = out.download();
    if (i == 0) {
      first = o;
      const auto acc = check_against_reference(p, o.data(), testkit::default_tolerance(p.config));
      EXPECT_TRUE(acc.pass) << acc.summary();
    } else {
      ASSERT_EQ(0, std::memcmp(o.data(), first.data(), o.size() * 2)) << "replay " << i << " differs";
    }
  }
}

// ---- the feature matrix: format × mode × activation × bias -------------------------------------
struct MatrixCase {
  WeightFormat format;
  ActMode mode;
  Activation act;
  bool bias;
};

class GpuMatrix : public ::testing::TestWithParam<MatrixCase> {};

TEST_P(GpuMatrix, MatchesReference) {
  REQUIRE_GPU();
  const MatrixCase m = GetParam();
  // I = 160: not a multiple of 64 or 128, so the intermediate is padded internally.
  const MoeConfig c = make_config(16, 256, 160, 4, m.format, m.mode, m.act, m.bias);
  for (int64_t T : {1, 37, 128, 300}) expect_matches_reference({c, T, static_cast<uint64_t>(T * 31 + 5)});
}

std::vector<MatrixCase> all_matrix_cases() {
  std::vector<MatrixCase> v;
  for (auto f : {WeightFormat::kNVFP4, WeightFormat::kMXFP4})
    for (auto m : {ActMode::kA4, ActMode::kA16, ActMode::kA8})
      for (auto a : {Activation::kSilu, Activation::kGeluTanh, Activation::kSwigluOai, Activation::kRelu2})
        for (bool b : {false, true}) v.push_back({f, m, a, b});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, GpuMatrix, ::testing::ValuesIn(all_matrix_cases()), [](const auto& info) {
  const MatrixCase& m = info.param;
  std::string s = std::string(to_string(m.format)) + "_" + std::string(to_string(m.mode)) + "_" +
                  std::string(to_string(m.act)) + (m.bias ? "_bias" : "");
  return s;
});

// ---- named edge cases -----------------------------------------------------------------------------
TEST(GpuEdge, GptOssHidden2880WithSwigluLimitAndBias) {
  REQUIRE_GPU();
  MoeConfig c = make_config(8, 2880, 256, 4, WeightFormat::kMXFP4, ActMode::kA16, Activation::kSwigluOai, true);
  ProblemSpec s{c, 19, 3};
  s.gate_up = GateUpLayout::kInterleaved;  // gpt-oss checkpoints interleave gate/up
  expect_matches_reference(s);
}

TEST(GpuEdge, IntermediateNotMultipleOf128) {
  REQUIRE_GPU();
  for (ActMode m : {ActMode::kA4, ActMode::kA8})
    expect_matches_reference({make_config(8, 512, 704, 2, WeightFormat::kNVFP4, m), 33, 4});
}

TEST(GpuEdge, Experts512TopK10) {
  REQUIRE_GPU();
  expect_matches_reference({make_config(512, 256, 128, 10), 64, 5});
}

TEST(GpuEdge, SingleTokenTopK1And8And10) {
  REQUIRE_GPU();
  for (int K : {1, 8, 10}) expect_matches_reference({make_config(64, 512, 256, K), 1, static_cast<uint64_t>(K)});
}

// The second case runs on direct_micro too: it takes one route group of 8 per weight pass when the
// mean touched expert has at most 8 routes (E = 512, T·K = 512), so the one expert that gets all 512
// routes takes 64 passes.
TEST(GpuEdge, EveryRouteToOneExpert) {
  REQUIRE_GPU();
  for (ProblemSpec s : {ProblemSpec{make_config(32, 256, 128, 4), 300, 6},
                        ProblemSpec{make_config(512, 256, 128, 8), 64, 9}}) {
    s.routing = ProblemSpec::Routing::kAllToOneExpert;
    s.one_expert = 17;
    expect_matches_reference(s);
  }
}

TEST(GpuEdge, InvalidIdsContributeNothing) {
  REQUIRE_GPU();
  ProblemSpec s{make_config(16, 256, 128, 4), 40, 7};
  s.routing = ProblemSpec::Routing::kSomeInvalid;  // −1 and ids ≥ E mixed in
  expect_matches_reference(s);
}

TEST(GpuEdge, LocalExpertRange) {
  REQUIRE_GPU();
  MoeConfig c = make_config(32, 256, 128, 6);
  c.local_expert_first = 8, c.local_expert_count = 12;  // routes to the other 20 experts add nothing
  expect_matches_reference({c, 50, 8});
}

TEST(GpuEdge, Int64IdsAndFp32Output) {
  REQUIRE_GPU();
  MoeConfig c = make_config(16, 256, 128, 3, WeightFormat::kNVFP4, ActMode::kA16);
  c.output_dtype = OutputDType::kFP32;
  expect_matches_reference({c, 21, 9}, {}, IndexType::kInt64);
}

TEST(GpuEdge, SwizzledScalesAndGateUpOrder) {
  REQUIRE_GPU();
  ProblemSpec s{make_config(8, 256, 128, 2), 16, 10};
  s.scale_layout = ScaleLayout::kSwizzled128x4;
  s.gate_up = GateUpLayout::kGateUp;
  expect_matches_reference(s);
}

TEST(GpuEdge, ManyTokens) {
  REQUIRE_GPU();
  for (int64_t T : {1000, 4096}) expect_matches_reference({make_config(128, 512, 256, 8), T, static_cast<uint64_t>(T)});
  expect_matches_reference({make_config(64, 256, 128, 8, WeightFormat::kMXFP4, ActMode::kA8), 16384, 11});
}

TEST(GpuEdge, NanInOneTokenStaysInThatToken) {
  REQUIRE_GPU();
  Problem p = testkit::make_problem({make_config(8, 256, 128, 2, WeightFormat::kNVFP4, ActMode::kA4), 6, 12});
  p.x[2 * 256 + 17] = 0x7FC0;  // NaN in token 2
  const auto out = run_on_gpu(p);
  const uint16_t* o = reinterpret_cast<const uint16_t*>(out.data());
  for (int64_t t = 0; t < p.tokens; ++t) {
    bool any_nan = false;
    for (int c = 0; c < 256; ++c) any_nan |= std::isnan(fmt::f32_from_bf16(o[t * 256 + c]));
    EXPECT_EQ(any_nan, t == 2) << "token " << t;
  }
}

// direct_micro's FC2 plan (no GPU needed): the item width and split follow the routes alone, so
// (T, K) and the expert-parallel path's (T·K, 1) over the same routes get the same plan; fewer than
// 16 routes keep the T = 1 path (16 columns, unsplit); 32 columns up to the variant's
// kFc2WideRoutes (f16 512, bf16 256) when the kernel runs one route group (≤ 8 routes per expert).
TEST(DirectMicroFc2Plan, FollowsTheRoutes) {
  struct Want {
    bool f16;
    int64_t routes, experts;
    bool wide;
    int parts;
  };
  constexpr int p16 = 2, p32 = 4;  // e.g. qwen3-30b-a3b's workspace: H = 2048 over 264 CTAs
  for (const Want& w : {Want{true, 7, 128, false, 1},      // under 8 routes: unsplit
                        Want{true, 8, 128, true, p32},     // qwen3-30b-a3b T = 1 (K = 8)
                        Want{false, 15, 128, true, p32},
                        Want{true, 16, 128, true, p32},    // qwen3 T = 2
                        Want{true, 512, 128, true, p32},   // qwen3 T = 64: the f16 variant's last wide call
                        Want{true, 513, 128, false, p16},  // past it: 16 columns
                        Want{false, 256, 128, true, p32},  // the bf16 variant's last wide call
                        Want{false, 257, 128, false, p16},
                        Want{true, 64, 8, true, p32},      // 8 routes per expert: one route group, wide...
                        Want{true, 72, 8, false, p16}}) {  // ...9: two route groups, 16 columns
    const gpu::DirectMicroFc2Plan got = gpu::direct_micro_fc2_plan(w.f16, w.routes, w.experts, p16, p32);
    EXPECT_EQ(got.wide, w.wide) << w.routes << " routes over " << w.experts;
    EXPECT_EQ(got.parts, w.parts) << w.routes << " routes over " << w.experts;
  }
}

// Forced direct_micro at exactly each variant's route capacity, against the reference (poisoned
// output, every element written), and one route past it raising Unsupported that names
// options.backend, T·K and the capacity. K = 8 over E = 128 takes one route group per weight pass
// (8 routes per expert on average); K = 1 over E = 64 takes two (16); with every route on one expert
// that expert takes up to 64 passes, and at half the capacity its FC2 sums hold two k-chunks per route
// (KC · routes = the variant's FC2 slots). H = 512: 32 FC2 items, split over CTAs.
TEST(GpuEdge, DirectMicroAtItsRouteCapacity) {
  REQUIRE_GPU();
  struct Variant {
    WeightFormat format;
    ActMode mode;
    Activation act;
  };
  for (const Variant& v : {Variant{WeightFormat::kNVFP4, ActMode::kA4, Activation::kSilu},         // f16, 1024
                           Variant{WeightFormat::kNVFP4, ActMode::kA16, Activation::kGeluTanh},    // bf16, 512
                           Variant{WeightFormat::kMXFP4, ActMode::kA8, Activation::kSwigluOai}}) {  // bf16, 512
    const int64_t cap = direct_micro_capacity(make_config(8, 512, 256, 8, v.format, v.mode));
    struct Case {
      int experts, top_k;
      int64_t routes;
      bool one_expert;
    };
    // cap / 2 routes spread over 128 experts: the most that FC2's 32-column items take (kFc2WideRoutes).
    for (const Case& k : {Case{128, 8, cap, false}, Case{64, 1, cap, false}, Case{64, 4, cap, true},
                          Case{64, 4, cap / 2, true}, Case{128, 8, cap / 2, false}}) {
      const MoeConfig c = make_config(k.experts, 512, 256, k.top_k, v.format, v.mode, v.act, true);
      const int64_t T = k.routes / k.top_k;
      ProblemSpec s{c, T, static_cast<uint64_t>(900 + cap + k.experts + k.top_k + k.one_expert)};
      if (k.one_expert) s.routing = ProblemSpec::Routing::kAllToOneExpert, s.one_expert = 40;
      const Problem p = testkit::make_problem(s);
      PreparedWeights w = prepare_weights(c, p.checkpoint.view(), {.device = 0});
      MoeRunner r(c, w, {.max_tokens = T + 1, .backend = Backend::kDirectMicro});
      ASSERT_EQ(r.plan(T), Backend::kDirectMicro) << c.to_string() << " T=" << T;
      expect_run_matches_reference(r, p);
      if (k.top_k == 1) {  // T + 1 tokens: exactly one route past the capacity
        const testkit::Inputs more = testkit::make_inputs(c, T + 1, 901);
        DeviceArray<uint16_t> x(more.x), out((T + 1) * c.hidden);
        DeviceArray<int32_t> ids(more.ids);
        DeviceArray<float> tw(more.topk_weights);
        EXPECT_ERROR(Unsupported, r.run(x.get(), ids.get(), IndexType::kInt32, tw.get(), out.get(), T + 1),
                     "options.backend", "T·K = " + std::to_string(T + 1) + "·1 = " + std::to_string(cap + 1),
                     "past the " + std::to_string(cap));
      }
    }
  }
}

// Model-scale decode on one runner reused across token counts, as `fp4moe check` does: a layer drawn
// once (make_layer), fresh inputs per call (make_inputs), every backend that can take the call.
TEST(GpuEdge, DecodeAtModelScaleOnOneRunner) {
  REQUIRE_GPU();
  for (const MoeConfig& c : {make_config(64, 2048, 1024, 4, WeightFormat::kNVFP4, ActMode::kA4, Activation::kGeluTanh),
                             make_config(128, 2048, 768, 8, WeightFormat::kMXFP4, ActMode::kA16)}) {
    const QuantizedCheckpoint layer = testkit::make_layer({c, 91});
    PreparedWeights w = prepare_weights(c, layer.view(), {.device = 0});
    for (Backend b : {Backend::kAuto, Backend::kGeneric}) {
      MoeRunner r(c, w, {.max_tokens = 4096, .backend = b});
      for (int64_t T : {1, 7, 64, 1, 64}) {
        const testkit::Inputs in = testkit::make_inputs(c, T, 1000 + T);
        Problem p;
        p.config = c, p.tokens = T, p.x = in.x, p.ids = in.ids, p.topk_weights = in.topk_weights, p.checkpoint = layer;
        expect_run_matches_reference(r, p);
      }
    }
  }
}

// ---- dynamic (prefill, wgmma): the edge cases of issue #5 ----------------------------------------
// Every test above already forces kDynamic through expect_matches_reference; these add the shapes
// that stress its tiles (m-tiles of 128 routed rows, n-tiles of 128 weight rows, 64-k stages).
TEST(GpuDynamic, ZeroRowExpertsAndOneExpertWithEveryToken) {
  REQUIRE_GPU();
  for (Activation a : {Activation::kSilu, Activation::kRelu2}) {
    ProblemSpec s{make_config(32, 256, 160, 4, WeightFormat::kNVFP4, ActMode::kA4, a, true), 333, 60};
    s.routing = ProblemSpec::Routing::kAllToOneExpert;  // 1332 rows on expert 5, none on the other 31
    s.one_expert = 5;
    expect_matches_reference(s);
  }
}

TEST(GpuDynamic, TokensNotAMultipleOfAnyTile) {
  REQUIRE_GPU();
  const MoeConfig c = make_config(4, 256, 128, 2, WeightFormat::kMXFP4, ActMode::kA8);
  for (int64_t T : {1, 63, 65, 127, 129, 191, 257}) expect_matches_reference({c, T, static_cast<uint64_t>(T + 600)});
}

TEST(GpuDynamic, Hidden2880) {
  REQUIRE_GPU();  // FC2 has 22.5 n-tiles of 128; FC1 has K = 2880 = 45 stages
  for (ActMode m : {ActMode::kA4, ActMode::kA16})
    expect_matches_reference({make_config(8, 2880, 256, 4, WeightFormat::kMXFP4, m, Activation::kSwigluOai, true), 300, 61});
}

TEST(GpuDynamic, IntermediateNotMultipleOf128) {
  REQUIRE_GPU();  // relu2: FC1 has a partial last n-tile (i_pad = 704 → 5.5 tiles; 192 → 1.5)
  for (int I : {704, 160})
    for (Activation a : {Activation::kRelu2, Activation::kGeluTanh})
      expect_matches_reference({make_config(8, 512, I, 2, WeightFormat::kNVFP4, ActMode::kA4, a, true), 150, 62});
}

TEST(GpuDynamic, Experts512TopK10) {
  REQUIRE_GPU();
  expect_matches_reference({make_config(512, 256, 128, 10, WeightFormat::kNVFP4, ActMode::kA16), 700, 63});
}

// RunnerOptions::dynamic_tile_m forces the register path's m-tile: every tile on calls whose own
// choice differs (T = 600 over 8 experts, K = 2: 150 rows per expert, chosen 128; T = 5: chosen 32
// or 16), on the f16 variant (NVFP4-a4) and the bf16-table one (MXFP4-a16); 16 rows at T = 600 is
// 10 m-tiles an expert.
TEST(GpuDynamic, ForcedTileM) {
  REQUIRE_GPU();
  for (const auto& [f, m] : {std::pair{WeightFormat::kNVFP4, ActMode::kA4}, std::pair{WeightFormat::kMXFP4, ActMode::kA16}}) {
    const MoeConfig c = make_config(8, 512, 256, 2, f, m, Activation::kSilu, true);
    for (const int64_t T : {600, 5}) {
      const Problem p = testkit::make_problem({c, T, static_cast<uint64_t>(70 + T)});
      for (const int tile : {16, 32, 64, 128}) {
        RunnerOptions o{.backend = Backend::kDynamic, .dynamic_tile_m = tile};
        const auto out = run_on_gpu(p, o, IndexType::kInt32);
        const auto acc = check_against_reference(p, out.data(), testkit::default_tolerance(c));
        EXPECT_TRUE(acc.pass) << c.to_string() << " T=" << T << " m-tile " << tile << ": " << acc.summary();
      }
    }
  }
}

// The last wave's split (dynamic.cuh SplitPlan) through the runner, on both GEMMs: at T = 1 over K = 2
// the 16-row kernels' items are few (FC1 2 × 44 n-tiles, FC2 2 × 23) and long (H = 2880: FC1's 45
// k-stages; I = 2816: FC2's 44), so on a 132-SM device both are shared among every resident CTA
// (DynamicSplit checks those two plans); the f16 variant (NVFP4-a4) and the bf16-table one
// (MXFP4-a16), with biases. T = 2 and 3 take the split or whole items by how many experts they touch.
TEST(GpuDynamic, LastWaveSplit) {
  REQUIRE_GPU();
  for (const auto& [f, m] : {std::pair{WeightFormat::kNVFP4, ActMode::kA4}, std::pair{WeightFormat::kMXFP4, ActMode::kA16}}) {
    const MoeConfig c = make_config(4, 2880, 2816, 2, f, m, Activation::kSilu, true);
    for (const int64_t T : {1, 2, 3}) {
      const Problem p = testkit::make_problem({c, T, static_cast<uint64_t>(90 + T)});
      const auto out = run_on_gpu(p, {.backend = Backend::kDynamic}, IndexType::kInt32);
      const auto acc = check_against_reference(p, out.data(), testkit::default_tolerance(c));
      EXPECT_TRUE(acc.pass) << c.to_string() << " T=" << T << ": " << acc.summary();
    }
  }
}

TEST(GpuDynamic, SmallCallAfterLargeCall) {
  REQUIRE_GPU();
  const MoeConfig c = make_config(16, 512, 256, 4, WeightFormat::kNVFP4, ActMode::kA4, Activation::kSilu, true);
  const Problem big = testkit::make_problem({c, 3000, 64});
  Problem small = testkit::make_problem({c, 3, 65});
  small.checkpoint = big.checkpoint;
  PreparedWeights w = prepare_weights(c, big.checkpoint.view(), {.device = 0});
  MoeRunner r(c, w, {.max_tokens = 3000, .backend = Backend::kDynamic});
  for (const Problem* p : {&big, static_cast<const Problem*>(&small), &big}) expect_run_matches_reference(r, *p);
}

TEST(GpuDynamic, DeterministicInAGraphAndPickedByAutoAboveDirectMicro) {
  REQUIRE_GPU();
  const MoeConfig c = make_config(64, 512, 256, 8, WeightFormat::kMXFP4, ActMode::kA16, Activation::kSwigluOai, true);
  const Problem p = testkit::make_problem({c, 500, 66});
  PreparedWeights w = prepare_weights(c, p.checkpoint.view(), {.device = 0});
  // kAuto (gpu_runner.cpp, sessions 32 and 39's sweeps): on sm_90 direct_micro only at T = 2 of
  // top-k 2 and T = 1 of top-k 1 in NVFP4-a4 (here K = 8: never), then dynamic; elsewhere
  // direct_micro while ≤ 32 routes per touched expert within the bf16 variant's 512 routes (T ≤ 64),
  // then generic.
  MoeRunner autor(c, w, {.max_tokens = 16384});
  const bool sm90 = device_is_sm90();
  for (int64_t T : {1, 2, 32, 64}) EXPECT_EQ(autor.plan(T), sm90 ? Backend::kDynamic : Backend::kDirectMicro) << T;
  for (int64_t T : {65, 4096, 16384}) EXPECT_EQ(autor.plan(T), sm90 ? Backend::kDynamic : Backend::kGeneric) << T;
  MoeRunner r(c, w, {.max_tokens = 500, .backend = Backend::kDynamic, .deterministic = true});
  EXPECT_EQ(r.plan(500), Backend::kDynamic);
  expect_graph_replays_deterministic(p, r, 5);
}

// Without RunnerOptions::deterministic, dynamic's register path sums the top-k in FC2's epilogue by
// fp32 reductions from 4096 routes on (launch_dynamic.cu kScatterMinRoutes): into the fp32 output
// itself, or into Y's buffer that the combine launch rounds into a bf16 output. Both outputs, both
// weight formats, biases, a gated and the clamped activation, against the reference; the same calls
// with deterministic replay bit for bit in a graph; a call below the line after one above it (the
// combine again) and a call above it after that (zeroed sums again).
TEST(GpuDynamic, ScatterAddTopKSumMatchesReference) {
  REQUIRE_SM90();
  for (const auto& [f, m, a] : {std::tuple{WeightFormat::kNVFP4, ActMode::kA4, Activation::kSilu},
                                std::tuple{WeightFormat::kMXFP4, ActMode::kA16, Activation::kSwigluOai}})
    for (const OutputDType out : {OutputDType::kBF16, OutputDType::kFP32}) {
      MoeConfig c = make_config(32, 512, 256, 8, f, m, a, true);
      c.output_dtype = out;
      const Problem big = testkit::make_problem({c, 600, 91});  // 4800 routes: the scatter-add
      Problem small = testkit::make_problem({c, 40, 92});      // 320: Y and the combine
      small.checkpoint = big.checkpoint;
      PreparedWeights w = prepare_weights(c, big.checkpoint.view(), {.device = 0});
      const size_t esz = out == OutputDType::kBF16 ? 2 : 4;
      for (const bool det : {false, true}) {
        MoeRunner r(c, w, {.max_tokens = 600, .backend = Backend::kDynamic, .deterministic = det});
        for (const Problem* q : {&big, static_cast<const Problem*>(&small), &big}) {
          DeviceInputs in(*q);
          DeviceArray<unsigned char> o(q->tokens * c.hidden * esz);
          if (esz == 2) o.fill_bytes(&testkit::kPoisonBF16, 2);
          else o.fill_bytes(&testkit::kPoisonF32, 4);
          r.run(in.x.get(), in.ids.get(), IndexType::kInt32, in.w.get(), o.get(), q->tokens);
          GPU_CHECK(cudaDeviceSynchronize());
          const auto got = o.download();
          const auto acc = check_against_reference(*q, got.data(), testkit::default_tolerance(c));
          EXPECT_TRUE(acc.pass) << c.to_string() << " T=" << q->tokens << (det ? " deterministic" : "") << ": "
                                << acc.summary();
        }
        if (det && out == OutputDType::kBF16) expect_graph_replays_deterministic(big, r, 3);
      }
    }
}

// Calls queued back to back on one stream with no sync between them. dynamic's kernels after the
// routing are programmatic dependents (launch_dynamic.cu): each starts before the one before it ends
// and waits for it before reading its output. Every queued call must give what it gives alone, so
// no kernel of one call reads what a later kernel (of it or of the next call) writes, or the other
// way round. Two sizes alternate (other tile lists and rows), in both GEMM variants: NVFP4-a4 (f16)
// and a16 (the bf16 tables, the longer set-up that overlaps the kernel before).
TEST(GpuDynamic, BackToBackCallsOnOneStreamStayApart) {
  REQUIRE_SM90();
  for (const ActMode m : {ActMode::kA4, ActMode::kA16}) {
    const MoeConfig c = make_config(64, 512, 256, 8, WeightFormat::kNVFP4, m, Activation::kSilu, true);
    const Problem a = testkit::make_problem({c, 40, 81});
    Problem b = testkit::make_problem({c, 9, 82});
    b.checkpoint = a.checkpoint;
    PreparedWeights w = prepare_weights(c, a.checkpoint.view(), {.device = 0});
    MoeRunner r(c, w, {.max_tokens = 40, .backend = Backend::kDynamic});
    ASSERT_EQ(r.plan(40), Backend::kDynamic);
    ASSERT_EQ(r.plan(9), Backend::kDynamic);
    const Problem* ps[2] = {&a, &b};
    DeviceInputs ia(a), ib(b);
    DeviceInputs* ins[2] = {&ia, &ib};
    std::vector<uint16_t> alone[2];  // each call run alone, synchronised, and checked
    for (int k = 0; k < 2; ++k) {
      DeviceArray<uint16_t> out(ps[k]->tokens * c.hidden);
      out.fill_bytes(&testkit::kPoisonBF16, 2);
      r.run(ins[k]->x.get(), ins[k]->ids.get(), IndexType::kInt32, ins[k]->w.get(), out.get(), ps[k]->tokens);
      GPU_CHECK(cudaDeviceSynchronize());
      alone[k] = out.download();
      const auto acc = check_against_reference(*ps[k], alone[k].data(), testkit::default_tolerance(c));
      EXPECT_TRUE(acc.pass) << to_string(m) << " T=" << ps[k]->tokens << ": " << acc.summary();
    }
    constexpr int kCalls = 12;
    std::vector<DeviceArray<uint16_t>> outs;
    for (int i = 0; i < kCalls; ++i) {
      outs.emplace_back(ps[i % 2]->tokens * c.hidden);
      outs.back().fill_bytes(&testkit::kPoisonBF16, 2);
    }
    cudaStream_t s;
    GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < kCalls; ++i) {
      const int k = i % 2;
      r.run(ins[k]->x.get(), ins[k]->ids.get(), IndexType::kInt32, ins[k]->w.get(), outs[i].get(), ps[k]->tokens, s);
    }
    GPU_CHECK(cudaStreamSynchronize(s));
    GPU_CHECK(cudaStreamDestroy(s));
    for (int i = 0; i < kCalls; ++i) {
      const auto o = outs[i].download();
      EXPECT_EQ(0, std::memcmp(o.data(), alone[i % 2].data(), o.size() * 2))
          << to_string(m) << ": queued call " << i << " (T=" << ps[i % 2]->tokens << ") differs from the same call alone";
    }
  }
}

// The bf16 path with the copy holding 3 of 8 experts: groups of 3, 3, 2 in one call, against the
// reference, replayed in a graph; the line between the paths on one runner; budgets refused by name.
TEST(GpuDynamic, Bf16PathMatchesReferenceAndReplays) {
  REQUIRE_SM90();
  const MoeConfig c = make_config(8, 512, 256, 4, WeightFormat::kNVFP4, ActMode::kA4, Activation::kSilu, true);
  // One expert's larger GEMM in bf16 tiles of 128 × 64: FC1 (2 · 256 rows × 512 k) = 512 KiB.
  constexpr int64_t kPerExpert = 2 * 256 * 512 * 2;
  const Problem big = testkit::make_problem({c, 300, 71});  // 150 routes per expert
  Problem small = testkit::make_problem({c, 20, 72});       // 10 per expert: the register path
  small.checkpoint = big.checkpoint;
  PreparedWeights w = prepare_weights(c, big.checkpoint.view(), {.device = 0});
  RunnerOptions o{.max_tokens = 300, .backend = Backend::kDynamic};
  const size_t without = MoeRunner(c, w, o).workspace_bytes();
  o.prefill_bf16_bytes = 3 * kPerExpert + kPerExpert / 2;
  o.prefill_bf16_min_rows = 64;
  MoeRunner r(c, w, o);
  EXPECT_EQ(r.workspace_bytes() - without, static_cast<size_t>(3 * kPerExpert)) << "three whole experts";
  EXPECT_TRUE(r.plan_bf16_copy(300));
  EXPECT_TRUE(r.plan_bf16_copy(128));   // 64 per expert: on the line
  EXPECT_FALSE(r.plan_bf16_copy(127));
  EXPECT_FALSE(r.plan_bf16_copy(20));
  for (const Problem* p : {&big, static_cast<const Problem*>(&small), &big}) expect_run_matches_reference(r, *p);
  expect_graph_replays_deterministic(big, r, 3);
  // kAuto takes the register path for decode (direct_micro's line beside it is top-k 2's and
  // NVFP4-a4 top-k 1's; here K = 4) and the copy for prefill.
  MoeRunner autor(c, w, {.max_tokens = 300, .prefill_bf16_bytes = 8 * kPerExpert, .prefill_bf16_min_rows = 64});
  EXPECT_EQ(autor.plan(1), Backend::kDynamic);
  EXPECT_EQ(autor.plan(2), Backend::kDynamic);
  EXPECT_FALSE(autor.plan_bf16_copy(2));
  EXPECT_EQ(autor.plan(300), Backend::kDynamic);
  EXPECT_TRUE(autor.plan_bf16_copy(300));
  // A budget below one expert, and negative values, are refused by name.
  try {
    MoeRunner(c, w, {.max_tokens = 300, .backend = Backend::kDynamic, .prefill_bf16_bytes = kPerExpert - 1});
    ADD_FAILURE() << "a budget below one expert was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("options.prefill_bf16_bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(MoeRunner(c, w, {.prefill_bf16_bytes = -1}), InvalidArgument);
  EXPECT_THROW(MoeRunner(c, w, {.prefill_bf16_min_rows = 0}), InvalidArgument);
}

// ---- the runner: graphs, streams, determinism ------------------------------------------------------
TEST(GpuRunner, CudaGraphReplayWithNewInputs) {
  REQUIRE_GPU();
  const MoeConfig c = make_config(32, 512, 256, 4);
  Problem p1 = testkit::make_problem({c, 64, 21});
  Problem p2 = testkit::make_problem({c, 64, 22});
  p2.checkpoint = p1.checkpoint;  // same weights, new tokens and routing
  PreparedWeights w = prepare_weights(c, p1.checkpoint.view(), {.device = 0});
  MoeRunner r(c, w, {.max_tokens = 64});
  DeviceInputs in(p1);
  DeviceArray<uint16_t> out(64 * 512);
  testgpu::CapturedGraph graph([&](cudaStream_t s) {
    r.run(in.x.get(), in.ids.get(), IndexType::kInt32, in.w.get(), out.get(), 64, s);
  });
  for (const Problem* p : {static_cast<const Problem*>(&p1), static_cast<const Problem*>(&p2)}) {
    in.x.upload(p->x);
    in.ids.upload(p->ids);
    in.w.upload(p->topk_weights);
    out.fill_bytes(&testkit::kPoisonBF16, 2);
    graph.launch();
    const auto o = out.download();
    const auto acc = check_against_reference(*p, o.data(), testkit::default_tolerance(c));
    EXPECT_TRUE(acc.pass) << acc.summary();
  }
}

TEST(GpuRunner, TwoRunnersOnTwoStreamsAtOnce) {
  REQUIRE_GPU();
  const MoeConfig c = make_config(32, 512, 256, 4);
  const Problem pa = testkit::make_problem({c, 200, 31});
  const Problem pb = testkit::make_problem({c, 150, 32});
  PreparedWeights wa = prepare_weights(c, pa.checkpoint.view(), {.device = 0});
  PreparedWeights wb = prepare_weights(c, pb.checkpoint.view(), {.device = 0});
  MoeRunner ra(c, wa, {.max_tokens = 200}), rb(c, wb, {.max_tokens = 200});
  DeviceInputs ia(pa), ib(pb);
  DeviceArray<uint16_t> oa(200 * 512), ob(150 * 512);
  oa.fill_bytes(&testkit::kPoisonBF16, 2);
  ob.fill_bytes(&testkit::kPoisonBF16, 2);
  cudaStream_t sa, sb;
  GPU_CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  GPU_CHECK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
  for (int i = 0; i < 5; ++i) {  // interleave several launches on both streams
    ra.run(ia.x.get(), ia.ids.get(), IndexType::kInt32, ia.w.get(), oa.get(), 200, sa);
    rb.run(ib.x.get(), ib.ids.get(), IndexType::kInt32, ib.w.get(), ob.get(), 150, sb);
  }
  GPU_CHECK(cudaStreamSynchronize(sa));
  GPU_CHECK(cudaStreamSynchronize(sb));
  const auto a = oa.download(), b = ob.download();
  EXPECT_TRUE(check_against_reference(pa, a.data(), testkit::default_tolerance(c)).pass);
  EXPECT_TRUE(check_against_reference(pb, b.data(), testkit::default_tolerance(c)).pass);
  GPU_CHECK(cudaStreamDestroy(sa));
  GPU_CHECK(cudaStreamDestroy(sb));
}

TEST(GpuRunner, DeterministicAcross20Runs) {
  REQUIRE_GPU();
  const MoeConfig c = make_config(64, 512, 256, 8);
  const Problem p = testkit::make_problem({c, 333, 41});
  PreparedWeights w = prepare_weights(c, p.checkpoint.view(), {.device = 0});
  MoeRunner r(c, w, {.max_tokens = 333, .deterministic = true});
  DeviceInputs in(p);
  DeviceArray<uint16_t> out(333 * 512);
  std::vector<uint16_t> first;
  for (int i = 0; i < 20; ++i) {
    out.fill_bytes(&testkit::kPoisonBF16, 2);
    r.run(in.x.get(), in.ids.get(), IndexType::kInt32, in.w.get(), out.get(), 333);
    GPU_CHECK(cudaDeviceSynchronize());
    const auto o = out.download();
    if (i == 0) {
      first = o;
      EXPECT_TRUE(check_against_reference(p, o.data(), testkit::default_tolerance(c)).pass);
    } else {
      ASSERT_EQ(0, std::memcmp(o.data(), first.data(), o.size() * 2)) << "run " << i << " differs from run 0";
    }
  }
}

// Every GPU kernel reads the one fragment-order copy (device_weights.h): a prepared layer holds its
// codes and block scales once, plus alpha / input scales and biases. H and I here are multiples of
// the padding (64), so nothing is padded.
TEST(GpuRunner, PreparedWeightsHoldOneCopy) {
  REQUIRE_GPU();
  for (bool bias : {false, true}) {
    const MoeConfig c = make_config(8, 512, 256, 2, WeightFormat::kMXFP4, ActMode::kA16, Activation::kSilu, bias);
    const Problem p = testkit::make_problem({c, 1, 72});
    const PreparedWeights w = prepare_weights(c, p.checkpoint.view(), {.device = 0});
    const size_t E = 8, H = 512, I = 256, bs = 32;
    const size_t weights = E * (2 * I * H + H * I) / 2 + E * (2 * I * H + H * I) / bs;
    const size_t extras = 4 * E * sizeof(float) + (bias ? E * (2 * I + H) * sizeof(float) : 0);
    EXPECT_EQ(w.device_bytes(), weights + extras) << "bias " << bias;
  }
}

TEST(GpuRunner, DispatchAndForcedBackends) {
  REQUIRE_GPU();
  const MoeConfig c = make_config(64, 256, 128, 8);
  const Problem p = testkit::make_problem({c, 4, 71});
  PreparedWeights w = prepare_weights(c, p.checkpoint.view(), {.device = 0});
  MoeRunner r(c, w, {.max_tokens = 4096});
  // kAuto (gpu_runner.cpp, sessions 32 and 39's sweeps): on sm_90 direct_micro only at T = 2 of
  // top-k 2 and T = 1 of top-k 1 in NVFP4-a4 (here K = 8: never; K = 2 below: T = 2; K = 1 below:
  // T = 1), then dynamic; elsewhere direct_micro up to its capacity (1024 routes on the f16 variant)
  // while ≤ 32 per touched expert, then generic.
  const bool sm90 = device_is_sm90();
  for (int64_t T : {1, 2, 8, 32, 64, 128}) EXPECT_EQ(r.plan(T), sm90 ? Backend::kDynamic : Backend::kDirectMicro) << T;
  {
    const MoeConfig c2 = make_config(64, 256, 128, 2);
    const Problem p2 = testkit::make_problem({c2, 2, 73});
    PreparedWeights w2 = prepare_weights(c2, p2.checkpoint.view(), {.device = 0});
    MoeRunner r2(c2, w2, {.max_tokens = 64});
    EXPECT_EQ(r2.plan(1), sm90 ? Backend::kDynamic : Backend::kDirectMicro);  // 2 routes
    EXPECT_EQ(r2.plan(2), Backend::kDirectMicro);                               // 4 routes
    EXPECT_EQ(r2.plan(3), sm90 ? Backend::kDynamic : Backend::kDirectMicro);
    expect_run_matches_reference(r2, p2);
    // T = 1 on the same runner (dynamic on sm_90, beside the direct_micro workspace of the line's 2
    // tokens; direct_micro elsewhere).
    Problem p21 = testkit::make_problem({c2, 1, 74});
    p21.checkpoint = p2.checkpoint;
    expect_run_matches_reference(r2, p21);
  }
  {
    // T = 1 of top-k 1 in NVFP4-a4 (gpu_runner.cpp, session 39's H200 sweep): direct_micro's f16
    // variant on sm_90 too; T = 2 dynamic there (direct_micro elsewhere: 2 routes); the same shape in
    // MXFP4-a4 (the bf16 variant) dynamic at T = 1 on sm_90.
    const MoeConfig c1 = make_config(64, 256, 128, 1);
    const Problem p1 = testkit::make_problem({c1, 1, 75});
    PreparedWeights w1 = prepare_weights(c1, p1.checkpoint.view(), {.device = 0});
    MoeRunner r1(c1, w1, {.max_tokens = 64});
    EXPECT_EQ(r1.plan(1), Backend::kDirectMicro);
    EXPECT_EQ(r1.plan(2), sm90 ? Backend::kDynamic : Backend::kDirectMicro);
    expect_run_matches_reference(r1, p1);
    Problem p12 = testkit::make_problem({c1, 2, 76});
    p12.checkpoint = p1.checkpoint;
    expect_run_matches_reference(r1, p12);
    const MoeConfig cmx = make_config(64, 256, 128, 1, WeightFormat::kMXFP4);
    const Problem pmx = testkit::make_problem({cmx, 1, 77});
    PreparedWeights wmx = prepare_weights(cmx, pmx.checkpoint.view(), {.device = 0});
    EXPECT_EQ(MoeRunner(cmx, wmx, {.max_tokens = 64}).plan(1), sm90 ? Backend::kDynamic : Backend::kDirectMicro);
  }
  // kAuto allocates direct_micro's workspace only for its line: none at K = 8 on sm_90, where the
  // line is top-k 2's (and top-k 1's in NVFP4-a4), so its workspace is dynamic's.
  if (sm90) {
    EXPECT_EQ(r.workspace_bytes(), MoeRunner(c, w, {.max_tokens = 4096, .backend = Backend::kDynamic}).workspace_bytes());
  }
  for (int64_t T : {129, 4096}) EXPECT_EQ(r.plan(T), sm90 ? Backend::kDynamic : Backend::kGeneric) << T;
  EXPECT_EQ(MoeRunner(c, w, {.max_tokens = 64, .backend = Backend::kGeneric}).plan(1), Backend::kGeneric);
  // Forced: each variant's capacity (NVFP4-a4: the f16 variant, 1024 routes; a16: bf16, 512).
  MoeRunner forced(c, w, {.max_tokens = 4096, .backend = Backend::kDirectMicro});
  EXPECT_EQ(forced.plan(128), Backend::kDirectMicro);  // 1024 routes
  EXPECT_ERROR(Unsupported, forced.plan(129), "options.backend", "T·K = 129·8 = 1032", "past the 1024");
  const MoeConfig c16 = make_config(64, 256, 128, 8, WeightFormat::kNVFP4, ActMode::kA16);
  const Problem p16 = testkit::make_problem({c16, 4, 72});
  PreparedWeights w16 = prepare_weights(c16, p16.checkpoint.view(), {.device = 0});
  MoeRunner forced16(c16, w16, {.max_tokens = 4096, .backend = Backend::kDirectMicro});
  EXPECT_EQ(forced16.plan(64), Backend::kDirectMicro);  // 512 routes
  EXPECT_ERROR(Unsupported, forced16.plan(65), "options.backend", "T·K = 65·8 = 520", "past the 512");
  MoeRunner auto16(c16, w16, {.max_tokens = 4096});  // the bf16 variant: the same line on sm_90
  EXPECT_EQ(auto16.plan(1), sm90 ? Backend::kDynamic : Backend::kDirectMicro);
  EXPECT_EQ(auto16.plan(2), sm90 ? Backend::kDynamic : Backend::kDirectMicro);
  EXPECT_EQ(auto16.plan(64), sm90 ? Backend::kDynamic : Backend::kDirectMicro);
  EXPECT_NE(auto16.plan(65), Backend::kDirectMicro);
  // Forced static (sm_90): up to 4096 routes (kStaticCapacity); micro is not built.
  MoeRunner forced_static(c, w, {.max_tokens = 4096, .backend = Backend::kStatic});
  if (device_is_sm90()) {
    EXPECT_EQ(forced_static.plan(512), Backend::kStatic);  // 4096 routes
    EXPECT_ERROR(Unsupported, forced_static.plan(513), "options.backend", "T·K = 513·8 = 4104", "past the 4096");
  } else {
    EXPECT_ERROR(Unsupported, forced_static.plan(1), "options.backend", "sm_90");
  }
  EXPECT_THROW(MoeRunner(c, w, {.max_tokens = 8, .backend = Backend::kMicro}).plan(1), Unsupported);
}

// static: one launch with four grid barriers, so a graph replays it with the barrier's words where
// the last replay left them; every replay bit-identical, and a small call after a large one on the
// same runner (the tile list and rows of the large call still in the workspace) matches too.
TEST(GpuRunner, StaticDeterministicInAGraphAndAfterALargerCall) {
  REQUIRE_GPU();
  if (!device_is_sm90()) GTEST_SKIP() << "static needs sm_90 (wgmma)";
  for (ActMode m : {ActMode::kA4, ActMode::kA16}) {
    const MoeConfig c = make_config(64, 512, 256, 8, WeightFormat::kNVFP4, m, Activation::kSilu, true);
    const Problem p = testkit::make_problem({c, 20, 83});
    Problem big = testkit::make_problem({c, 400, 84}), small = testkit::make_problem({c, 3, 85});
    big.checkpoint = small.checkpoint = p.checkpoint;
    PreparedWeights w = prepare_weights(c, p.checkpoint.view(), {.device = 0});
    MoeRunner r(c, w, {.max_tokens = 400, .backend = Backend::kStatic});
    ASSERT_EQ(r.plan(400), Backend::kStatic);
    for (const Problem* q : {&big, &small, &big}) expect_run_matches_reference(r, *q);
    expect_graph_replays_deterministic(p, r, 20);
  }
}

TEST(GpuRunner, DirectMicroDeterministicAndInAGraph) {
  REQUIRE_GPU();
  const MoeConfig c = make_config(64, 512, 256, 8, WeightFormat::kNVFP4, ActMode::kA4, Activation::kSilu, true);
  const Problem p = testkit::make_problem({c, 20, 81});
  PreparedWeights w = prepare_weights(c, p.checkpoint.view(), {.device = 0});
  MoeRunner r(c, w, {.max_tokens = 20, .backend = Backend::kDirectMicro});
  expect_graph_replays_deterministic(p, r, 20);
}

TEST(GpuRunner, SmallCallAfterLargeCall) {
  REQUIRE_GPU();
  const MoeConfig c = make_config(16, 256, 128, 2);
  const Problem big = testkit::make_problem({c, 2048, 51});
  Problem small = testkit::make_problem({c, 3, 52});
  small.checkpoint = big.checkpoint;
  PreparedWeights w = prepare_weights(c, big.checkpoint.view(), {.device = 0});
  MoeRunner r(c, w, {.max_tokens = 2048});
  for (const Problem* p : {static_cast<const Problem*>(&big), static_cast<const Problem*>(&small)}) expect_run_matches_reference(r, *p);
}

TEST(GpuRunner, ErrorsAreTypedOnTheGpuToo) {
  REQUIRE_GPU();
  const MoeConfig c = make_config(8, 256, 128, 2);
  const Problem p = testkit::make_problem({c, 4, 61});
  PreparedWeights w = prepare_weights(c, p.checkpoint.view(), {.device = 0});
  MoeRunner r(c, w, {.max_tokens = 4});
  DeviceInputs in(p);
  DeviceArray<uint16_t> out(8 * 256);
  EXPECT_THROW(r.run(in.x.get(), in.ids.get(), IndexType::kInt32, in.w.get(), out.get(), 5), CapacityError);
  EXPECT_THROW(MoeRunner(c, w, {.backend = Backend::kReference}), Unsupported);
  EXPECT_THROW(prepare_weights(c, p.checkpoint.view(), {.device = 4096}), InvalidArgument);
}

}  // namespace
}  // namespace fp4moe
