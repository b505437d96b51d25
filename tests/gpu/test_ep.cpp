// The expert-parallel layer (fp4moe/ep.h) on the GPUs of this machine, one host thread per rank.
//
//   world of 1: EpMoeLayer equals MoeRunner bit for bit, for both strategies (the local MoE's fp32
//               output rounded once to bf16 is what MoeRunner stores; the all-to-all path sums the
//               per-route results in MoeRunner's slot order).
//   world of N (N = every GPU, at least 2): each rank's rows equal the one-GPU MoeRunner's rows on
//               the same inputs within the reduction-order tolerance (all-gather + reduce-scatter sums
//               the ranks' partial sums in NCCL's order: one bf16 ulp may flip where a sum lies near a
//               rounding boundary).
// Skipped, with the reason, without NCCL in the build or with fewer GPUs than a test needs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "fp4moe/ep.h"
#include "fp4moe/fp4moe.h"
#include "gpu/gpu_util.h"
#include "testing/on_ranks.h"
#include "testing/problem.h"

namespace fp4moe {
namespace {

#if FP4MOE_HAVE_EP

using testgpu::DeviceArray;
using testkit::Problem;

#define REQUIRE_GPUS(n)                                                                                    \
  do {                                                                                                     \
    const int have_ = cuda_device_count();                                                                 \
    if (have_ < (n)) GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found " << have_ << ": EP test skipped"; \
  } while (0)

MoeConfig make_config(int E, int H, int I, int K, ActMode m = ActMode::kA4, OutputDType out = OutputDType::kBF16) {
  MoeConfig c;
  c.num_experts = E, c.hidden = H, c.intermediate = I, c.top_k = K, c.mode = m, c.output_dtype = out;
  return c;
}

// Experts [first, first + count) of a checkpoint in linear scale layout (what make_problem draws).
CheckpointView slice(const QuantizedCheckpoint& q, const MoeConfig& layer, int first) {
  CheckpointView v = q.view();
  const int H = layer.hidden, I = layer.intermediate, N1 = layer.fc1_rows();
  v.w13.packed += int64_t{first} * N1 * H / 2;
  v.w13.scales += first * q.w13.scale_bytes_per_expert();
  if (v.w13.global_scale) v.w13.global_scale += first;
  v.w2.packed += int64_t{first} * H * I / 2;
  v.w2.scales += first * q.w2.scale_bytes_per_expert();
  if (v.w2.global_scale) v.w2.global_scale += first;
  if (v.fc1_input_scale) v.fc1_input_scale += first;
  if (v.fc2_input_scale) v.fc2_input_scale += first;
  if (v.b13) v.b13 += int64_t{first} * N1;
  if (v.b2) v.b2 += int64_t{first} * H;
  return v;
}

size_t out_bytes(const MoeConfig& c) { return c.output_dtype == OutputDType::kBF16 ? 2 : 4; }

// Rows [t0, t0 + T) of a problem's inputs on the current device.
struct RankInputs {
  DeviceArray<uint16_t> x;
  DeviceArray<int32_t> ids;
  DeviceArray<int64_t> ids64;
  DeviceArray<float> w;
  RankInputs(const Problem& p, int64_t t0, int64_t T) {
    const int H = p.config.hidden, K = p.config.top_k;
    const int64_t n = std::max<int64_t>(T, 1);  // a rank with no tokens still passes valid pointers
    x = DeviceArray<uint16_t>(n * H);
    ids = DeviceArray<int32_t>(n * K);
    ids64 = DeviceArray<int64_t>(n * K);
    w = DeviceArray<float>(n * K);
    if (T == 0) return;
    x.upload({p.x.begin() + t0 * H, p.x.begin() + (t0 + T) * H});
    ids.upload({p.ids.begin() + t0 * K, p.ids.begin() + (t0 + T) * K});
    ids64.upload({p.ids.begin() + t0 * K, p.ids.begin() + (t0 + T) * K});
    w.upload({p.topk_weights.begin() + t0 * K, p.topk_weights.begin() + (t0 + T) * K});
  }
  const void* ids_ptr(IndexType it) const {
    return it == IndexType::kInt32 ? static_cast<const void*>(ids.get()) : ids64.get();
  }
};

DeviceArray<unsigned char> poisoned_out(const MoeConfig& c, int64_t T) {
  DeviceArray<unsigned char> out(std::max<int64_t>(T, 1) * c.hidden * out_bytes(c));
  if (out_bytes(c) == 2) out.fill_bytes(&testkit::kPoisonBF16, 2);
  else out.fill_bytes(&testkit::kPoisonF32, 4);
  return out;
}

// MoeRunner on device 0 over all experts and all tokens of p.
std::vector<unsigned char> one_gpu(const Problem& p, IndexType it, Backend backend = Backend::kAuto) {
  if (cudaSetDevice(0) != cudaSuccess) throw std::runtime_error("cudaSetDevice(0) failed");
  PreparedWeights w = prepare_weights(p.config, p.checkpoint.view(), {.device = 0});
  MoeRunner r(p.config, w, {.max_tokens = p.tokens, .backend = backend});
  RankInputs in(p, 0, p.tokens);
  auto out = poisoned_out(p.config, p.tokens);
  r.run(in.x.get(), in.ids_ptr(it), it, in.w.get(), out.get(), p.tokens);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("cudaDeviceSynchronize failed");
  auto h = out.download();
  h.resize(p.tokens * p.config.hidden * out_bytes(p.config));
  return h;
}

using testkit::on_ranks;

struct Comms {
  std::vector<ncclComm_t> c;
  explicit Comms(int n) {
    std::vector<int> devs(n);
    for (int i = 0; i < n; ++i) devs[i] = i;
    c = ep_init_local_comms(devs);
  }
  ~Comms() {
    try {
      ep_destroy_comms(c);
    } catch (...) {
    }
  }
};

// Runs p over `world` ranks with tokens split as `split` (Σ = p.tokens); returns each rank's output.
std::vector<std::vector<unsigned char>> run_ep(const Problem& p, int world, const std::vector<int64_t>& split,
                                               EpOptions o, IndexType it, bool give_counts,
                                               std::vector<EpTraffic>* traffic = nullptr) {
  Comms comms(world);
  const std::vector<ExpertRange> ranges = split_experts(p.config.num_experts, world);
  std::vector<std::vector<unsigned char>> outs(world);
  if (traffic) traffic->assign(world, {});
  o.max_tokens = std::max<int64_t>(*std::max_element(split.begin(), split.end()), 1);
  on_ranks(world, [&](int r) {
    MoeConfig c = p.config;
    c.local_expert_first = ranges[r].first, c.local_expert_count = ranges[r].count;
    PreparedWeights w = prepare_weights(c, slice(p.checkpoint, p.config, ranges[r].first), {.device = r});
    EpMoeLayer layer(comms.c[r], c, w, o);
    EXPECT_EQ(layer.rank(), r);
    EXPECT_EQ(layer.world_size(), world);
    int64_t t0 = 0;
    for (int q = 0; q < r; ++q) t0 += split[q];
    const int64_t T = split[r];
    RankInputs in(p, t0, T);
    auto out = poisoned_out(c, T);
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess) throw std::runtime_error("cudaStreamCreate failed");
    layer.run(in.x.get(), in.ids_ptr(it), it, in.w.get(), out.get(), T, s,
              give_counts ? std::span<const int64_t>(split) : std::span<const int64_t>());
    const cudaError_t e = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    if (e != cudaSuccess) throw std::runtime_error(std::string("run: ") + cudaGetErrorString(e));
    auto h = out.download();
    h.resize(T * c.hidden * out_bytes(c));
    outs[r] = std::move(h);
    if (traffic) (*traffic)[r] = layer.last_traffic();
  });
  return outs;
}

// ---- world of 1: bit for bit -------------------------------------------------------------------

struct BitCase {
  EpStrategy strategy;
  IndexType ids;
  OutputDType out;
  bool give_counts;
  Backend backend = Backend::kAuto;  // of both sides
};

class EpWorldOfOne : public ::testing::TestWithParam<BitCase> {};

TEST_P(EpWorldOfOne, EqualsMoeRunnerBitForBit) {
  REQUIRE_GPUS(1);
  const BitCase bc = GetParam();
  // Bit for bit needs both sides on one backend with each route's value independent of its batch.
  // The all-gather runner of a world of 1 sees MoeRunner's very call (T tokens, top_k K), so kAuto
  // picks the same backend on both sides. The all-to-all runner sees T·K rows of top_k 1, where kAuto
  // may pick another backend than MoeRunner's for T tokens of top_k K (T = 1, K = 4: direct_micro
  // for MoeRunner, dynamic for the T·K = 4 rows; gpu_runner.cpp's line), so those cases force dynamic
  // on both sides: at a world of 1 it gets the same routes, m-tiles and work items either way. a4
  // quantises with static scales, so each route's value does not depend on its batch.
  for (ActMode m : {ActMode::kA4, ActMode::kA16})
    for (int64_t T : {1, 5, 16, 300}) {
      const Problem p = testkit::make_problem({make_config(16, 256, 160, 4, m, bc.out), T, uint64_t(T * 13 + 1)});
      const auto want = one_gpu(p, bc.ids, bc.backend);
      std::vector<EpTraffic> tr;
      const auto got =
          run_ep(p, 1, {T}, {.strategy = bc.strategy, .backend = bc.backend}, bc.ids, bc.give_counts, &tr);
      ASSERT_EQ(got[0].size(), want.size());
      EXPECT_TRUE(got[0] == want) << to_string(bc.strategy) << " " << p.config.to_string() << " T=" << T
                                  << ": differs from MoeRunner";
      EXPECT_EQ(tr[0].sent(), 0);
      EXPECT_EQ(tr[0].received(), 0);
      EXPECT_EQ(tr[0].strategy, bc.strategy == EpStrategy::kAuto ? EpStrategy::kAllGatherReduceScatter : bc.strategy);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, EpWorldOfOne,
    ::testing::Values(BitCase{EpStrategy::kAllGatherReduceScatter, IndexType::kInt32, OutputDType::kBF16, true},
                      BitCase{EpStrategy::kAllGatherReduceScatter, IndexType::kInt64, OutputDType::kBF16, false},
                      BitCase{EpStrategy::kAllGatherReduceScatter, IndexType::kInt32, OutputDType::kFP32, false},
                      BitCase{EpStrategy::kAllToAll, IndexType::kInt32, OutputDType::kBF16, false, Backend::kDynamic},
                      BitCase{EpStrategy::kAllToAll, IndexType::kInt64, OutputDType::kBF16, true, Backend::kDynamic},
                      BitCase{EpStrategy::kAllToAll, IndexType::kInt32, OutputDType::kFP32, false, Backend::kDynamic},
                      BitCase{EpStrategy::kAuto, IndexType::kInt32, OutputDType::kBF16, false}),
    [](const auto& info) {
      const BitCase& b = info.param;
      return std::string(to_string(b.strategy)) + (b.ids == IndexType::kInt32 ? "_i32" : "_i64") + "_" +
             std::string(to_string(b.out)) + (b.give_counts ? "_counts" : "");
    });

TEST(EpWorldOfOneEdge, InvalidIdsAndZeroTokens) {
  REQUIRE_GPUS(1);
  testkit::ProblemSpec spec{make_config(16, 256, 128, 4), 40, 7};
  spec.routing = testkit::ProblemSpec::Routing::kSomeInvalid;  // −1 and ids ≥ E: nothing
  const Problem p = testkit::make_problem(spec);
  // kGeneric on both sides: the all-to-all path runs only the valid routes, a smaller batch, for
  // which kAuto could pick another backend.
  const auto want = one_gpu(p, IndexType::kInt32, Backend::kGeneric);
  for (EpStrategy s : {EpStrategy::kAllGatherReduceScatter, EpStrategy::kAllToAll}) {
    const auto got = run_ep(p, 1, {p.tokens}, {.strategy = s, .backend = Backend::kGeneric}, IndexType::kInt32, false);
    EXPECT_TRUE(got[0] == want) << to_string(s);
  }
  const Problem none = testkit::make_problem({make_config(16, 256, 128, 4), 1, 8});
  for (EpStrategy s : {EpStrategy::kAllGatherReduceScatter, EpStrategy::kAllToAll}) {
    Problem empty = none;
    empty.tokens = 0;
    const auto got = run_ep(empty, 1, {0}, {.strategy = s}, IndexType::kInt32, false);
    EXPECT_TRUE(got[0].empty());
  }
}

TEST(EpWorldOfOneEdge, AllGatherInACudaGraph) {
  REQUIRE_GPUS(1);
  const Problem p = testkit::make_problem({make_config(16, 256, 128, 4), 24, 9});
  const auto want = one_gpu(p, IndexType::kInt32);
  Comms comms(1);
  GPU_CHECK(cudaSetDevice(0));
  PreparedWeights w = prepare_weights(p.config, p.checkpoint.view(), {.device = 0});
  EpMoeLayer layer(comms.c[0], p.config, w, {.max_tokens = p.tokens, .strategy = EpStrategy::kAllGatherReduceScatter});
  RankInputs in(p, 0, p.tokens);
  auto out = poisoned_out(p.config, p.tokens);
  const std::vector<int64_t> counts = {p.tokens};
  cudaStream_t s;
  GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  GPU_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  layer.run(in.x.get(), in.ids.get(), IndexType::kInt32, in.w.get(), out.get(), p.tokens, s, counts);
  GPU_CHECK(cudaStreamEndCapture(s, &graph));
  GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  GPU_CHECK(cudaGraphLaunch(exec, s));
  GPU_CHECK(cudaStreamSynchronize(s));
  auto got = out.download();
  EXPECT_TRUE(got == want) << "graph replay differs from MoeRunner";
  GPU_CHECK(cudaGraphExecDestroy(exec));
  GPU_CHECK(cudaGraphDestroy(graph));
  GPU_CHECK(cudaStreamDestroy(s));
}

TEST(EpWorldOfOneEdge, ReceiveCapacityIsACapacityError) {
  REQUIRE_GPUS(1);
  const Problem p = testkit::make_problem({make_config(16, 256, 128, 4), 10, 10});
  EXPECT_THROW(run_ep(p, 1, {10}, {.strategy = EpStrategy::kAllToAll, .max_recv_routes = 39}, IndexType::kInt32,
                      false),
               CapacityError);  // 40 routes, room for 39
}

// ---- world of N: the one-GPU result within the reduction-order tolerance -----------------------

// Relative L2 over everything ≤ 1e-3 and per element at most one bf16 ulp (fp32: 1e-5 relative)
// plus a small absolute slack for sums that cancel.
void expect_close(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want, OutputDType dt,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const size_t n = got.size() / (dt == OutputDType::kBF16 ? 2 : 4);
  auto value = [&](const std::vector<unsigned char>& v, size_t i) -> double {
    if (dt == OutputDType::kFP32) {
      float f;
      std::memcpy(&f, &v[i * 4], 4);
      return f;
    }
    uint16_t b;
    std::memcpy(&b, &v[i * 2], 2);
    const uint32_t u = uint32_t{b} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  double num = 0, den = 0, rms = 0;
  for (size_t i = 0; i < n; ++i) rms += value(want, i) * value(want, i);
  rms = std::sqrt(rms / std::max<size_t>(n, 1));
  int64_t bad = 0, nonfinite = 0;
  const double ulp = dt == OutputDType::kBF16 ? 1.0 / 128 : 1e-5;
  for (size_t i = 0; i < n; ++i) {
    const double a = value(got, i), b = value(want, i);
    if (!std::isfinite(a)) {
      ++nonfinite;
      continue;
    }
    num += (a - b) * (a - b), den += b * b;
    if (std::abs(a - b) > ulp * std::max(std::abs(a), std::abs(b)) + 1e-3 * rms) ++bad;
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  EXPECT_EQ(nonfinite, 0) << what << ": non-finite (or unwritten) elements";
  EXPECT_EQ(bad, 0) << what << ": elements past one ulp";
  EXPECT_LE(rel, 1e-3) << what;
}

TEST(EpMultiGpu, MatchesOneGpu) {
  const int n = cuda_device_count();
  if (n < 2) GTEST_SKIP() << "needs at least 2 CUDA devices, found " << n << ": multi-GPU EP test skipped";
  // E = 4·n + 3: the world size does not divide E. Different token counts per rank, one rank empty.
  for (int64_t per : {3, 100}) {
    const MoeConfig layer = make_config(4 * n + 3, 256, 128, 4);
    std::vector<int64_t> split(n);
    int64_t total = 0;
    for (int r = 0; r < n; ++r) total += split[r] = (r == 1 ? 0 : per + 5 * r);
    const Problem p = testkit::make_problem({layer, total, uint64_t(per * 31 + n)});
    for (IndexType it : {IndexType::kInt32, IndexType::kInt64}) {
      const auto want = one_gpu(p, it);
      for (EpStrategy s : {EpStrategy::kAllGatherReduceScatter, EpStrategy::kAllToAll, EpStrategy::kAuto})
        for (bool counts : {false, true}) {
          std::vector<EpTraffic> tr;
          const auto got = run_ep(p, n, split, {.strategy = s}, it, counts, &tr);
          int64_t t0 = 0;
          for (int r = 0; r < n; ++r) {
            const size_t row = layer.hidden * out_bytes(layer);
            const std::vector<unsigned char> slice(want.begin() + t0 * row, want.begin() + (t0 + split[r]) * row);
            expect_close(got[r], slice, layer.output_dtype,
                         std::string(to_string(s)) + " world " + std::to_string(n) + " rank " + std::to_string(r) +
                             " T=" + std::to_string(split[r]));
            t0 += split[r];
          }
          EXPECT_GT(tr[0].sent() + tr[0].received(), 0) << to_string(s);
        }
    }
  }
}

#else

TEST(EpWorldOfOne, EqualsMoeRunnerBitForBit) {
  GTEST_SKIP() << "built without NCCL (CMake did not find it; set FP4MOE_NCCL_ROOT): no EP tests";
}
TEST(EpMultiGpu, MatchesOneGpu) {
  GTEST_SKIP() << "built without NCCL (CMake did not find it; set FP4MOE_NCCL_ROOT): no EP tests";
}

#endif

}  // namespace
}  // namespace fp4moe
