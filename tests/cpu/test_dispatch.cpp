// kAuto's direct_micro / dynamic line (gpu_runner.cpp) against the sweeps it was read from
// (bench/results/h100-decode-sweep-20261205-s17.md for a4, …-s18-a16.md for a16, …-s18-llama4-qwen235.md
// for the other two shapes): for each named shape they measured, the backend the rule takes at each T
// must be the one that was faster there, save the points the rule gives up (deepseek-v3 a16 T = 2,
// qwen3-235b-a22b a4 and a16 T = 4: 1.9–2.6 % slower), which are left out. No GPU needed: the rule is
// host arithmetic.
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
  // The faster backend at each point of the sweep (true: direct_micro), a4 then a16.
  const std::vector<SweepPoint> sweep = {
      {"qwen3-30b-a3b", ActMode::kA4, 1, true},    {"qwen3-30b-a3b", ActMode::kA4, 4, true},
      {"qwen3-30b-a3b", ActMode::kA4, 8, true},    {"qwen3-30b-a3b", ActMode::kA4, 32, false},
      {"qwen3-30b-a3b", ActMode::kA4, 64, false},  {"qwen3-30b-a3b", ActMode::kA4, 128, false},
      {"deepseek-v3", ActMode::kA4, 2, true},      {"deepseek-v3", ActMode::kA4, 4, false},
      {"deepseek-v3", ActMode::kA4, 8, false},     {"deepseek-v3", ActMode::kA4, 128, false},
      {"gpt-oss-120b", ActMode::kA4, 4, true},     {"gpt-oss-120b", ActMode::kA4, 8, false},
      {"gpt-oss-120b", ActMode::kA4, 64, false},   {"mixtral-8x7b", ActMode::kA4, 1, true},
      {"mixtral-8x7b", ActMode::kA4, 8, true},     {"mixtral-8x7b", ActMode::kA4, 16, false},
      {"mixtral-8x7b", ActMode::kA4, 128, false},  {"qwen3-30b-a3b", ActMode::kA16, 1, true},
      {"qwen3-30b-a3b", ActMode::kA16, 8, true},   {"qwen3-30b-a3b", ActMode::kA16, 16, false},
      {"qwen3-30b-a3b", ActMode::kA16, 64, false}, {"deepseek-v3", ActMode::kA16, 1, true},
      {"deepseek-v3", ActMode::kA16, 4, false},    {"deepseek-v3", ActMode::kA16, 64, false},
      {"gpt-oss-120b", ActMode::kA16, 2, true},    {"gpt-oss-120b", ActMode::kA16, 4, false},
      {"gpt-oss-120b", ActMode::kA16, 128, false}, {"mixtral-8x7b", ActMode::kA16, 2, true},
      {"mixtral-8x7b", ActMode::kA16, 4, false},   {"mixtral-8x7b", ActMode::kA16, 16, false},
      {"mixtral-8x7b", ActMode::kA16, 128, false},
      // Session 18's sweep of the two shapes left out (…-s18-llama4-qwen235.md).
      {"llama4-scout", ActMode::kA4, 8, true},     {"llama4-scout", ActMode::kA4, 16, false},
      {"llama4-scout", ActMode::kA4, 32, false},   {"llama4-scout", ActMode::kA16, 4, true},
      {"llama4-scout", ActMode::kA16, 16, false},  {"qwen3-235b-a22b", ActMode::kA4, 2, true},
      {"qwen3-235b-a22b", ActMode::kA4, 8, false}, {"qwen3-235b-a22b", ActMode::kA16, 2, true},
      {"qwen3-235b-a22b", ActMode::kA16, 8, false},
  };
  for (const SweepPoint& p : sweep) {
    const MoeConfig c = shape_config(p.model, p.mode);
    EXPECT_EQ(gpu::direct_micro_preferred(c, p.tokens * c.top_k, /*dynamic_runs=*/true), p.direct_micro_faster)
        << p.model << (p.mode == ActMode::kA4 ? " a4" : " a16") << " T=" << p.tokens;
  }
}

TEST(Dispatch, DirectMicroLineArithmetic) {
  MoeConfig c = shape_config("qwen3-30b-a3b", ActMode::kA4);
  // 2048 × 768 gated: (1536 + 2048) · 2048 ... elements · (1/2 + 1/16) bytes.
  EXPECT_EQ(gpu::expert_weight_bytes(c), (int64_t{1536} * 2048 + 2048 * 768) * 9 / 16);
  // f16 variant: ≤ 16 routes always; 64 routes over ≤ 64 experts = 177 MB ≤ 256 MB; 128 → 354 MB.
  EXPECT_TRUE(gpu::direct_micro_preferred(c, 16, true));
  EXPECT_TRUE(gpu::direct_micro_preferred(c, 64, true));
  EXPECT_FALSE(gpu::direct_micro_preferred(c, 128, true));
  // The "≤ 16 routes" clause stops at 896 MiB of touched weights: llama4-scout's 16 experts hold
  // 16 × 67.5 MiB = 1080 MiB, so 16 routes go to dynamic, 13 (878 MiB) still to direct_micro.
  const MoeConfig l = shape_config("llama4-scout", ActMode::kA4);
  EXPECT_TRUE(gpu::direct_micro_preferred(l, 13, true));
  EXPECT_FALSE(gpu::direct_micro_preferred(l, 14, true));
  // More than 4 routes per touched expert: dynamic, whatever the bytes.
  c.num_experts = 8;
  EXPECT_FALSE(gpu::direct_micro_preferred(c, 40, true));
  EXPECT_TRUE(gpu::direct_micro_preferred(c, 16, true));
  // Without dynamic (not sm_90): 32 routes per touched expert.
  EXPECT_TRUE(gpu::direct_micro_preferred(c, 256, false));
  EXPECT_FALSE(gpu::direct_micro_preferred(c, 257, false));
  // The bf16 variant (a16): ≤ 4 routes always (mixtral-8x7b T = 2: 4 routes, 378 MiB), then ≤ 200 MiB
  // of touched weights (deepseek-v3: 23.6 MiB an expert, so 8 experts pass and 9 do not), and never
  // past 4 routes per touched expert.
  MoeConfig m = shape_config("mixtral-8x7b", ActMode::kA16);
  EXPECT_TRUE(gpu::direct_micro_preferred(m, 4, true));
  EXPECT_FALSE(gpu::direct_micro_preferred(m, 5, true));
  MoeConfig d = shape_config("deepseek-v3", ActMode::kA16);
  EXPECT_EQ(gpu::expert_weight_bytes(d), (int64_t{4096} * 7168 + 7168 * 2048) * 9 / 16);
  EXPECT_TRUE(gpu::direct_micro_preferred(d, 8, true));
  EXPECT_FALSE(gpu::direct_micro_preferred(d, 9, true));
  // The local expert range bounds the touched experts: 8 local experts hold 189 MiB, so every count
  // up to 4 per expert passes.
  d.local_expert_count = 8;
  EXPECT_TRUE(gpu::direct_micro_preferred(d, 32, true));
  EXPECT_FALSE(gpu::direct_micro_preferred(d, 33, true));
}

}  // namespace
}  // namespace fp4moe
