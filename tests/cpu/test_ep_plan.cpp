// Expert parallelism, what runs without a GPU: expert ranges per rank and their validation,
// strategy names and kAuto's choice, and EpMoeLayer's argument checks that come before any NCCL or
// CUDA call (where the build has the layer).
#include <gtest/gtest.h>

#include <vector>

#include "cpu/expect_error.h"
#include "fp4moe/ep.h"
#include "fp4moe/fp4moe.h"
#include "testing/problem.h"

namespace fp4moe {
namespace {

using testing_errors::throws_error;

TEST(EpSplit, CoversEveryExpertOnceBalanced) {
  for (int E : {1, 7, 8, 60, 128, 256, 1024})
    for (int W = 1; W <= std::min(E, 16); ++W) {
      const std::vector<ExpertRange> r = split_experts(E, W);
      ASSERT_EQ(static_cast<int>(r.size()), W);
      int next = 0, lo = E, hi = 0;
      for (const ExpertRange& g : r) {
        EXPECT_EQ(g.first, next) << "E=" << E << " W=" << W;  // contiguous, in rank order
        next += g.count;
        lo = std::min(lo, g.count), hi = std::max(hi, g.count);
      }
      EXPECT_EQ(next, E);
      EXPECT_LE(hi - lo, 1) << "E=" << E << " W=" << W;  // balanced
      EXPECT_NO_THROW(validate_expert_ranges(E, r));
    }
}

TEST(EpSplit, WorldSizeNotDividingExperts) {
  // 10 experts on 4 ranks: 3, 3, 2, 2.
  const std::vector<ExpertRange> want = {{0, 3}, {3, 3}, {6, 2}, {8, 2}};
  EXPECT_EQ(split_experts(10, 4), want);
}

TEST(EpSplit, Rejections) {
  EXPECT_TRUE(throws_error<InvalidArgument>([] { split_experts(8, 0); }, "world_size", {"got 0"}));
  EXPECT_TRUE(throws_error<InvalidArgument>([] { split_experts(8, 9); }, "world_size", {"num_experts=8", "got 9"}));
  EXPECT_TRUE(throws_error<InvalidArgument>([] { split_experts(0, 1); }, "num_experts", {"got 0"}));
  EXPECT_TRUE(throws_error<InvalidArgument>([] { split_experts(2000, 2); }, "num_experts", {"got 2000"}));
}

TEST(EpRanges, AnyOrderIsFine) {
  const std::vector<ExpertRange> r = {{6, 4}, {0, 3}, {3, 3}};
  EXPECT_NO_THROW(validate_expert_ranges(10, r));
}

TEST(EpRanges, Rejections) {
  auto check = [](std::vector<ExpertRange> r, int E = 10) { return [r, E] { validate_expert_ranges(E, r); }; };
  EXPECT_TRUE(throws_error<InvalidArgument>(check({{0, 5}, {4, 6}}), "expert_ranges",
                                            {"expert 4", "rank 0", "rank 1", "overlap"}));
  EXPECT_TRUE(throws_error<InvalidArgument>(check({{0, 5}, {6, 4}}), "expert_ranges", {"expert 5", "no rank"}));
  EXPECT_TRUE(throws_error<InvalidArgument>(check({{0, 5}, {5, 0}, {5, 5}}), "expert_ranges",
                                            {"rank 1", "[5, 5)", "non-empty"}));
  EXPECT_TRUE(throws_error<InvalidArgument>(check({{0, 5}, {5, 6}}), "expert_ranges", {"rank 1", "[5, 11)"}));
  EXPECT_TRUE(throws_error<InvalidArgument>(check({{-1, 3}, {2, 8}}), "expert_ranges", {"rank 0"}));
  EXPECT_TRUE(throws_error<InvalidArgument>(check({}), "expert_ranges", {"no ranks"}));
}

TEST(EpRankConfig, TheRanksSlice) {
  MoeConfig layer;
  layer.num_experts = 10, layer.hidden = 64, layer.intermediate = 32, layer.top_k = 2;
  const MoeConfig c = ep_rank_config(layer, 4, 2);
  EXPECT_EQ(c.local_expert_first, 6);
  EXPECT_EQ(c.local_expert_count, 2);
  EXPECT_EQ(c.hidden, 64);
  EXPECT_TRUE(throws_error<InvalidArgument>([&] { ep_rank_config(layer, 4, 4); }, "rank", {"got 4"}));
  EXPECT_TRUE(throws_error<InvalidArgument>([&] { ep_rank_config(c, 4, 0); }, "layer", {"[6, 8)"}));
}

TEST(EpStrategyNames, RoundTripAndRejection) {
  for (EpStrategy s : {EpStrategy::kAuto, EpStrategy::kAllGatherReduceScatter, EpStrategy::kAllToAll})
    EXPECT_EQ(parse_ep_strategy(to_string(s)), s);
  EXPECT_EQ(parse_ep_strategy("a2a"), EpStrategy::kAllToAll);
  EXPECT_EQ(parse_ep_strategy("ag"), EpStrategy::kAllGatherReduceScatter);
  EXPECT_TRUE(throws_error<InvalidArgument>([] { parse_ep_strategy("ring", "--ep-strategy"); }, "--ep-strategy",
                                            {"'ring'", "alltoall"}));
}

TEST(EpStrategyChoice, Deterministic) {
  EXPECT_EQ(choose_ep_strategy(1, 8, 100000), EpStrategy::kAllGatherReduceScatter);  // one rank: no traffic
  EXPECT_EQ(choose_ep_strategy(8, 8, 100000), EpStrategy::kAllGatherReduceScatter);  // K >= W: AG moves less
  EXPECT_EQ(choose_ep_strategy(8, 4, 1), EpStrategy::kAllGatherReduceScatter);       // decode: no host round trip
  EXPECT_EQ(choose_ep_strategy(8, 4, 256), EpStrategy::kAllToAll);                   // 1024 routes, K < W
  EXPECT_EQ(choose_ep_strategy(8, 4, 255), EpStrategy::kAllGatherReduceScatter);
  EXPECT_TRUE(throws_error<InvalidArgument>([] { choose_ep_strategy(0, 4, 1); }, "world_size", {"got 0"}));
  EXPECT_TRUE(throws_error<InvalidArgument>([] { choose_ep_strategy(2, 0, 1); }, "top_k", {"got 0"}));
  EXPECT_TRUE(throws_error<InvalidArgument>([] { choose_ep_strategy(2, 4, -1); }, "max_tokens_per_rank", {"-1"}));
}

#if FP4MOE_HAVE_EP
// Checks before any NCCL call: these run on a machine without GPUs.
class EpLayerArgs : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg.num_experts = 4, cfg.hidden = 64, cfg.intermediate = 32, cfg.top_k = 2;
    cfg.local_expert_first = 0, cfg.local_expert_count = 2;
    p = testkit::make_problem({cfg, 1, 3});
    host_weights = prepare_weights(cfg, p.checkpoint.view());  // device -1
  }
  MoeConfig cfg;
  testkit::Problem p;
  PreparedWeights host_weights;
  // Not a communicator: never dereferenced, the checks below fail before any NCCL call.
  ncclComm_t fake = reinterpret_cast<ncclComm_t>(uintptr_t{0x1000});
};

TEST_F(EpLayerArgs, Rejections) {
  EXPECT_TRUE(throws_error<InvalidArgument>([&] { EpMoeLayer(nullptr, cfg, host_weights); }, "comm", {"null"}));
  EXPECT_TRUE(throws_error<InvalidArgument>([&] { EpMoeLayer(fake, cfg, PreparedWeights{}); }, "weights", {"empty"}));
  EXPECT_TRUE(throws_error<InvalidArgument>(
      [&] { EpMoeLayer(fake, cfg, host_weights, {.strategy = static_cast<EpStrategy>(7)}); }, "options.strategy",
      {"got 7"}));
  EXPECT_TRUE(throws_error<InvalidArgument>([&] { EpMoeLayer(fake, cfg, host_weights, {.max_tokens = 0}); },
                                            "options.max_tokens", {"got 0"}));
  EXPECT_TRUE(throws_error<InvalidArgument>([&] { EpMoeLayer(fake, cfg, host_weights, {.max_recv_routes = 0}); },
                                            "options.max_recv_routes", {"got 0"}));
  EXPECT_TRUE(throws_error<Unsupported>([&] { EpMoeLayer(fake, cfg, host_weights); }, "weights", {"CUDA device"}));
  MoeConfig bad = cfg;
  bad.top_k = 0;
  EXPECT_TRUE(throws_error<InvalidArgument>([&] { EpMoeLayer(fake, bad, host_weights); }, "top_k", {"got 0"}));
}
#else
TEST(EpLayerArgs, Rejections) { GTEST_SKIP() << "built without NCCL: no expert-parallel layer (fp4moe_ep)"; }
#endif

}  // namespace
}  // namespace fp4moe
