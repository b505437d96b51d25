// kAuto's direct_micro / dynamic line (gpu_runner.cpp) against the sweep it was read from
// (bench/results/h100-decode-sweep-20261206-s24.md, all six named shapes, a4 and a16, T = 1…64): the
// backend the rule takes at each point must be the one that was faster there, save the ten points
// the rule gives up (gpu_runner.cpp names them), which are left out. No GPU needed: the rule is host
// arithmetic.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "host/device_weights.h"
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

struct SweepPoint {
  const char* model;
  ActMode mode;
  int64_t tokens;
  bool direct_micro_faster;
};

TEST(Dispatch, DirectMicroLineFollowsTheSweep) {
  // The faster backend at each point of session 24's sweep (true: direct_micro), a4 then a16, save
  // the ten points the rule gives up (gpu_runner.cpp names them).
  const std::vector<SweepPoint> sweep = {
      {"qwen3-30b-a3b", ActMode::kA4, 1, true}, {"qwen3-30b-a3b", ActMode::kA4, 2, false}, {"qwen3-30b-a3b", ActMode::kA4, 4, false},
      {"qwen3-30b-a3b", ActMode::kA4, 6, false}, {"qwen3-30b-a3b", ActMode::kA4, 8, false}, {"qwen3-30b-a3b", ActMode::kA4, 16, false},
      {"qwen3-30b-a3b", ActMode::kA4, 32, false}, {"qwen3-30b-a3b", ActMode::kA4, 64, false}, {"qwen3-235b-a22b", ActMode::kA4, 4, false},
      {"qwen3-235b-a22b", ActMode::kA4, 6, false}, {"qwen3-235b-a22b", ActMode::kA4, 8, false}, {"qwen3-235b-a22b", ActMode::kA4, 16, false},
      {"qwen3-235b-a22b", ActMode::kA4, 32, false}, {"qwen3-235b-a22b", ActMode::kA4, 64, false}, {"deepseek-v3", ActMode::kA4, 1, true},
      {"deepseek-v3", ActMode::kA4, 2, false}, {"deepseek-v3", ActMode::kA4, 6, false}, {"deepseek-v3", ActMode::kA4, 8, false},
      {"deepseek-v3", ActMode::kA4, 16, false}, {"deepseek-v3", ActMode::kA4, 32, false}, {"deepseek-v3", ActMode::kA4, 64, false},
      {"gpt-oss-120b", ActMode::kA4, 1, true}, {"gpt-oss-120b", ActMode::kA4, 2, true}, {"gpt-oss-120b", ActMode::kA4, 4, false},
      {"gpt-oss-120b", ActMode::kA4, 6, false}, {"gpt-oss-120b", ActMode::kA4, 8, false}, {"gpt-oss-120b", ActMode::kA4, 16, false},
      {"gpt-oss-120b", ActMode::kA4, 32, false}, {"gpt-oss-120b", ActMode::kA4, 64, false}, {"llama4-scout", ActMode::kA4, 1, true},
      {"llama4-scout", ActMode::kA4, 2, true}, {"llama4-scout", ActMode::kA4, 4, true}, {"llama4-scout", ActMode::kA4, 8, true},
      {"llama4-scout", ActMode::kA4, 16, false}, {"llama4-scout", ActMode::kA4, 32, false}, {"llama4-scout", ActMode::kA4, 64, false},
      {"mixtral-8x7b", ActMode::kA4, 1, true}, {"mixtral-8x7b", ActMode::kA4, 2, true}, {"mixtral-8x7b", ActMode::kA4, 4, true},
      {"mixtral-8x7b", ActMode::kA4, 6, false}, {"mixtral-8x7b", ActMode::kA4, 8, false}, {"mixtral-8x7b", ActMode::kA4, 16, false},
      {"mixtral-8x7b", ActMode::kA4, 32, false}, {"mixtral-8x7b", ActMode::kA4, 64, false}, {"qwen3-30b-a3b", ActMode::kA16, 2, false},
      {"qwen3-30b-a3b", ActMode::kA16, 4, false}, {"qwen3-30b-a3b", ActMode::kA16, 6, false}, {"qwen3-30b-a3b", ActMode::kA16, 8, false},
      {"qwen3-30b-a3b", ActMode::kA16, 16, false}, {"qwen3-30b-a3b", ActMode::kA16, 32, false}, {"qwen3-30b-a3b", ActMode::kA16, 64, false},
      {"qwen3-235b-a22b", ActMode::kA16, 4, false}, {"qwen3-235b-a22b", ActMode::kA16, 6, false}, {"qwen3-235b-a22b", ActMode::kA16, 8, false},
      {"qwen3-235b-a22b", ActMode::kA16, 16, false}, {"qwen3-235b-a22b", ActMode::kA16, 32, false}, {"qwen3-235b-a22b", ActMode::kA16, 64, false},
      {"deepseek-v3", ActMode::kA16, 2, false}, {"deepseek-v3", ActMode::kA16, 4, false}, {"deepseek-v3", ActMode::kA16, 6, false},
      {"deepseek-v3", ActMode::kA16, 8, false}, {"deepseek-v3", ActMode::kA16, 16, false}, {"deepseek-v3", ActMode::kA16, 32, false},
      {"deepseek-v3", ActMode::kA16, 64, false}, {"gpt-oss-120b", ActMode::kA16, 1, true}, {"gpt-oss-120b", ActMode::kA16, 2, true},
      {"gpt-oss-120b", ActMode::kA16, 4, false}, {"gpt-oss-120b", ActMode::kA16, 6, false}, {"gpt-oss-120b", ActMode::kA16, 8, false},
      {"gpt-oss-120b", ActMode::kA16, 16, false}, {"gpt-oss-120b", ActMode::kA16, 32, false}, {"gpt-oss-120b", ActMode::kA16, 64, false},
      {"llama4-scout", ActMode::kA16, 1, true}, {"llama4-scout", ActMode::kA16, 2, true}, {"llama4-scout", ActMode::kA16, 8, true},
      {"llama4-scout", ActMode::kA16, 16, false}, {"llama4-scout", ActMode::kA16, 32, false}, {"llama4-scout", ActMode::kA16, 64, false},
      {"mixtral-8x7b", ActMode::kA16, 1, true}, {"mixtral-8x7b", ActMode::kA16, 2, true}, {"mixtral-8x7b", ActMode::kA16, 4, true},
      {"mixtral-8x7b", ActMode::kA16, 6, false}, {"mixtral-8x7b", ActMode::kA16, 8, false}, {"mixtral-8x7b", ActMode::kA16, 16, false},
      {"mixtral-8x7b", ActMode::kA16, 32, false}, {"mixtral-8x7b", ActMode::kA16, 64, false},
  };
  for (const SweepPoint& p : sweep) {
    const MoeConfig c = shape_config(p.model, p.mode);
    EXPECT_EQ(gpu::direct_micro_preferred(c, p.tokens * c.top_k, /*dynamic_runs=*/true), p.direct_micro_faster)
        << p.model << (p.mode == ActMode::kA4 ? " a4" : " a16") << " T=" << p.tokens;
  }
}

TEST(Dispatch, DirectMicroLineArithmetic) {
  MoeConfig c = shape_config("qwen3-30b-a3b", ActMode::kA4);
  // Beside dynamic (sm_90): direct_micro up to 8 routes, whatever the variant, bytes or experts.
  for (const ActMode mode : {ActMode::kA4, ActMode::kA16, ActMode::kA8}) {
    for (const char* name : {"qwen3-30b-a3b", "mixtral-8x7b", "llama4-scout", "deepseek-v3"}) {
      MoeConfig m = shape_config(name, mode);
      EXPECT_TRUE(gpu::direct_micro_preferred(m, 1, true)) << name;
      EXPECT_TRUE(gpu::direct_micro_preferred(m, 8, true)) << name;
      EXPECT_FALSE(gpu::direct_micro_preferred(m, 9, true)) << name;
      m.local_expert_count = 2;
      EXPECT_TRUE(gpu::direct_micro_preferred(m, 8, true)) << name;
      EXPECT_FALSE(gpu::direct_micro_preferred(m, 16, true)) << name;
    }
  }
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
