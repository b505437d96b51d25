#include <gtest/gtest.h>

#include "fp4moe/fp4moe.h"
#include "reference/reference.h"
#include "testing/problem.h"

using namespace fp4moe;

// The host runner equals the reference called directly, on a real random problem.
TEST(Smoke, HostRunnerMatchesReference) {
  MoeConfig c;
  c.num_experts = 8, c.hidden = 128, c.intermediate = 64, c.top_k = 2;
  testkit::ProblemSpec spec{c, 5, 7};
  spec.scale_layout = ScaleLayout::kSwizzled128x4;
  testkit::Problem p = testkit::make_problem(spec);
  PreparedWeights w = prepare_weights(c, p.checkpoint.view());
  EXPECT_EQ(w.device_bytes(), 0u) << "host-prepared weights hold nothing on a device";
  std::vector<uint16_t> out(p.x.size(), testkit::kPoisonBF16);
  MoeRunner r(c, w, {.max_tokens = 8});
  r.run(p.x.data(), p.ids.data(), IndexType::kInt32, p.topk_weights.data(), out.data(), p.tokens);
  auto ref = reference::moe_forward_f64(c, testkit::canonical(p), p.x.data(), p.ids.data(), IndexType::kInt32,
                                        p.topk_weights.data(), p.tokens);
  auto acc = testkit::compare(ref, out.data(), OutputDType::kBF16, p.tokens, c.hidden, 4e-3);
  EXPECT_TRUE(acc.pass) << acc.summary();
  double rms = 0;
  for (double v : ref) rms += v * v;
  EXPECT_GT(rms, 0.0);
}
