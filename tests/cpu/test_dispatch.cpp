// kAuto's direct_micro / dynamic line (gpu_runner.cpp) against the sweeps it was read from: the H200's
// (bench/results/h200-sweep-20261207-s39.md, all six named shapes, NVFP4 a4 and a16, T = 1…16) and
// the H100's (h100-decode-sweep-20261207-s32.md, T = 1…16; T = 32 and 64 from session 24's,
// h100-decode-sweep-20261206-s24.md, where dynamic won everywhere): the backend the rule takes at
// each point must be the one that was faster there, save the points the rule gives up (gpu_runner.cpp
// names them), which are left out. No GPU needed: the rule is host arithmetic.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "host/launch.h"
#include "testing/problem.h"

namespace fp4moe {
namespace {

MoeConfig shape_config(const std::string& name, ActMode mode) {
  const testkit::NamedShape* s = testkit::find_shape(name);
  EXPECT_NE(s, nullptr) << name;
  MoeConfig c;
  c.num_experts = s->experts;
  c.hidden = s->hidden;
  c.intermediate = s->intermediate;
  c.top_k = s->top_k;
  c.activation = s->activation;
  c.format = WeightFormat::kNVFP4;
  c.mode = mode;
  return c;
}

// One named shape and mode of the sweep: the T at which direct_micro was the faster backend, and
// the T at which dynamic was.
struct SweepRow {
  const char* model;
  ActMode mode;
  std::vector<int64_t> direct_micro_faster, dynamic_faster;
};

void expect_rule_follows(const std::vector<SweepRow>& sweep, const char* card) {
  for (const SweepRow& row : sweep) {
    const MoeConfig c = shape_config(row.model, row.mode);
    for (const bool dm : {true, false})
      for (const int64_t T : dm ? row.direct_micro_faster : row.dynamic_faster)
        EXPECT_EQ(gpu::direct_micro_preferred(c, T * c.top_k, /*dynamic_runs=*/true), dm)
            << card << ": " << row.model << (row.mode == ActMode::kA4 ? " a4" : " a16") << " T=" << T;
  }
}

TEST(Dispatch, DirectMicroLineFollowsTheH200Sweep) {
  // Session 39's sweep, a4 then a16, save the four points the rule gives up (gpu_runner.cpp names
  // them): qwen3-30b-a3b a4 T = 1, mixtral-8x7b a4 T = 1 and 4 (direct_micro's by 1.4-2.3 %) and
  // mixtral-8x7b a16 T = 2 (dynamic's by 3.6 %).
  expect_rule_follows({
      {"qwen3-30b-a3b", ActMode::kA4, {}, {2, 4, 6, 8, 16}},
      {"qwen3-235b-a22b", ActMode::kA4, {}, {1, 2, 4, 6, 8, 16}},
      {"deepseek-v3", ActMode::kA4, {}, {1, 2, 4, 6, 8, 16}},
      {"gpt-oss-120b", ActMode::kA4, {}, {1, 2, 4, 6, 8, 16}},
      {"llama4-scout", ActMode::kA4, {1}, {2, 4, 6, 8, 16}},
      {"mixtral-8x7b", ActMode::kA4, {2}, {6, 8, 16}},
      {"qwen3-30b-a3b", ActMode::kA16, {}, {1, 2, 4, 6, 8, 16}},
      {"qwen3-235b-a22b", ActMode::kA16, {}, {1, 2, 4, 6, 8, 16}},
      {"deepseek-v3", ActMode::kA16, {}, {1, 2, 4, 6, 8, 16}},
      {"gpt-oss-120b", ActMode::kA16, {}, {1, 2, 4, 6, 8, 16}},
      {"llama4-scout", ActMode::kA16, {}, {1, 2, 4, 6, 8, 16}},
      {"mixtral-8x7b", ActMode::kA16, {}, {1, 4, 6, 8, 16}},
  }, "H200");
}

TEST(Dispatch, DirectMicroLineFollowsTheH100Sweep) {
  // Session 32's sweep (and 24's at T = 32, 64), a4 then a16: the rule takes the faster backend at
  // every point.
  expect_rule_follows({
      {"qwen3-30b-a3b", ActMode::kA4, {}, {1, 2, 4, 6, 8, 16, 32, 64}},
      {"qwen3-235b-a22b", ActMode::kA4, {}, {1, 2, 4, 6, 8, 16, 32, 64}},
      {"deepseek-v3", ActMode::kA4, {}, {1, 2, 4, 6, 8, 16, 32, 64}},
      {"gpt-oss-120b", ActMode::kA4, {}, {1, 2, 4, 6, 8, 16, 32, 64}},
      {"llama4-scout", ActMode::kA4, {1}, {2, 4, 6, 8, 16, 32, 64}},
      {"mixtral-8x7b", ActMode::kA4, {2}, {1, 4, 6, 8, 16, 32, 64}},
      {"qwen3-30b-a3b", ActMode::kA16, {}, {1, 2, 4, 6, 8, 16, 32, 64}},
      {"qwen3-235b-a22b", ActMode::kA16, {}, {1, 2, 4, 6, 8, 16, 32, 64}},
      {"deepseek-v3", ActMode::kA16, {}, {1, 2, 4, 6, 8, 16, 32, 64}},
      {"gpt-oss-120b", ActMode::kA16, {}, {1, 2, 4, 6, 8, 16, 32, 64}},
      {"llama4-scout", ActMode::kA16, {}, {1, 2, 4, 6, 8, 16, 32, 64}},
      {"mixtral-8x7b", ActMode::kA16, {2}, {1, 4, 6, 8, 16, 32, 64}},
  }, "H100");
}

TEST(Dispatch, DirectMicroLineArithmetic) {
  MoeConfig c = shape_config("qwen3-30b-a3b", ActMode::kA4);
  // Beside dynamic (sm_90): direct_micro at T = 2 of top-k 2 whatever the variant, bytes, experts or
  // local range, and at T = 1 of top-k 1 in NVFP4-a4 only; every other K never.
  for (const ActMode mode : {ActMode::kA4, ActMode::kA16, ActMode::kA8}) {
    for (const char* name : {"qwen3-30b-a3b", "mixtral-8x7b", "llama4-scout", "deepseek-v3", "gpt-oss-120b"}) {
      MoeConfig m = shape_config(name, mode);
      for (const int k : {1, 2, 3, 4, 5, 8, 10}) {
        m.top_k = k;
        for (const int local : {-1, 2}) {
          m.local_expert_count = local;
          for (int64_t T = 1; T <= 8; ++T)
            EXPECT_EQ(gpu::direct_micro_preferred(m, T * k, true),
                      (T == 2 && k == 2) || (T == 1 && k == 1 && mode == ActMode::kA4))
                << name << " K=" << k << " T=" << T << " local " << local;
        }
      }
    }
  }
  // MXFP4-a4 runs direct_micro's bf16 variant: T = 1 of top-k 1 stays with dynamic.
  MoeConfig mx = shape_config("llama4-scout", ActMode::kA4);
  mx.format = WeightFormat::kMXFP4;
  EXPECT_FALSE(gpu::direct_micro_preferred(mx, 1, true));
  mx.format = WeightFormat::kNVFP4;
  EXPECT_TRUE(gpu::direct_micro_preferred(mx, 1, true));
  // Without dynamic (not sm_90): 32 routes per touched expert (touched: min(E_local, T·K)).
  c.num_experts = 8;
  EXPECT_TRUE(gpu::direct_micro_preferred(c, 256, false));
  EXPECT_FALSE(gpu::direct_micro_preferred(c, 257, false));
  c.local_expert_count = 2;
  EXPECT_TRUE(gpu::direct_micro_preferred(c, 64, false));
  EXPECT_FALSE(gpu::direct_micro_preferred(c, 65, false));
}

}  // namespace
}  // namespace fp4moe
