// `fp4moe bench --ep N`: one MoE layer expert-parallel over N local GPUs (fp4moe/ep.h).
//
// Per layer (shape × format × mode) the weights are drawn once, rank r gets experts
// split_experts(E, N)[r]; per point (T tokens on every rank) fresh inputs, rank r's tokens are rows
// [r·T, (r+1)·T) of one draw. Each strategy asked for is timed with CUDA events on every rank's
// stream (one host thread per rank, warmup then iters calls back to back; no L2 flush, no graphs:
// the all-to-all path synchronises the host every call); the layer time is the slowest rank's mean.
// The one-GPU time is MoeRunner on GPU 0 over all experts and all N·T tokens, timed the same way,
// where the whole layer fits on one GPU. Bytes: what each rank moved over NCCL (EpTraffic), the
// largest rank's. A markdown table on stdout, JSON lines appended to <out-dir>/<run-name>.jsonl.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "report.h"
#include "fp4moe/ep.h"
#include "fp4moe/fp4moe.h"
#include "points.h"

#if FP4MOE_HAVE_EP
#include <cuda_runtime_api.h>

#include <exception>
#include <filesystem>

#include "cuda_check.h"
#include "gpu.h"
#include "testing/on_ranks.h"
#endif

namespace fp4moe::cli {

#if !FP4MOE_HAVE_EP

int run_ep_bench(const Args&) {
  throw UsageError("--ep: this fp4moe was built without NCCL (CMake did not find it; configure with "
                   "-DFP4MOE_NCCL_ROOT=<dir with include/nccl.h and lib/libnccl.so*>)");
}

#else

namespace {

using testkit::on_ranks;

CheckpointView slice(const QuantizedCheckpoint& q, const MoeConfig& layer, int first) {
  CheckpointView v = q.view();
  const int64_t H = layer.hidden, I = layer.intermediate, N1 = layer.fc1_rows();
  v.w13.packed += first * N1 * H / 2;
  v.w13.scales += first * q.w13.scale_bytes_per_expert();
  if (v.w13.global_scale) v.w13.global_scale += first;
  v.w2.packed += first * H * I / 2;
  v.w2.scales += first * q.w2.scale_bytes_per_expert();
  if (v.w2.global_scale) v.w2.global_scale += first;
  if (v.fc1_input_scale) v.fc1_input_scale += first;
  if (v.fc2_input_scale) v.fc2_input_scale += first;
  if (v.b13) v.b13 += first * N1;
  if (v.b2) v.b2 += first * H;
  return v;
}

// Device copies of rows [t0, t0 + T) and an output.
struct RankBuffers {
  DeviceBuffer x, ids, w, out;
  RankBuffers(const testkit::Inputs& in, const MoeConfig& c, int64_t t0, int64_t T)
      : x(std::max<int64_t>(T, 1) * c.hidden * 2), ids(std::max<int64_t>(T, 1) * c.top_k * 4),
        w(std::max<int64_t>(T, 1) * c.top_k * 4), out(std::max<int64_t>(T, 1) * c.hidden * 2) {
    TOOL_CUDA(cudaMemcpy(x.get(), in.x.data() + t0 * c.hidden, T * c.hidden * 2, cudaMemcpyHostToDevice));
    TOOL_CUDA(cudaMemcpy(ids.get(), in.ids.data() + t0 * c.top_k, T * c.top_k * 4, cudaMemcpyHostToDevice));
    TOOL_CUDA(cudaMemcpy(w.get(), in.topk_weights.data() + t0 * c.top_k, T * c.top_k * 4, cudaMemcpyHostToDevice));
  }
};

// Mean µs per call of `call` on `s`: warmup calls, then iters calls between two events.
template <typename F>
double time_calls(F call, cudaStream_t s, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) call();
  TOOL_CUDA(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  TOOL_CUDA(cudaEventCreate(&a));
  TOOL_CUDA(cudaEventCreate(&b));
  TOOL_CUDA(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) call();
  TOOL_CUDA(cudaEventRecord(b, s));
  TOOL_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  TOOL_CUDA(cudaEventElapsedTime(&ms, a, b));
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  return 1000.0 * ms / iters;
}

struct EpRow {
  std::string layer, strategy, status = "ok";
  int world = 0;
  int64_t tokens_per_rank = 0;
  double time_us = 0, one_gpu_us = 0;
  int64_t sent = 0, received = 0, rows_computed = 0;  // the largest rank's
};

}  // namespace

int run_ep_bench(const Args& args) {
  const int n = args.ep;
  const int have = cuda_device_count();
  if (have < n) throw UsageError("--ep " + std::to_string(n) + ": needs " + std::to_string(n) + " GPUs, found " +
                                 std::to_string(have));
  const uint64_t seed = args.seed ? *args.seed : (uint64_t(std::random_device{}()) & 0x7FFFFFFF);
  const std::vector<int64_t> tokens = !args.tokens.empty() ? args.tokens : std::vector<int64_t>{1, 16, 128, 1024};
  const int iters = args.iters > 0 ? args.iters : 20;
  const int warmup = args.warmup >= 0 ? args.warmup : 3;
  std::vector<EpStrategy> strategies;
  if (args.ep_strategy == "both") strategies = {EpStrategy::kAllGatherReduceScatter, EpStrategy::kAllToAll};
  else strategies = {parse_ep_strategy(args.ep_strategy, "--ep-strategy")};
  const std::string run = args.run_name.empty() ? "bench-ep" + std::to_string(n) + "-" + utc_now("%Y%m%d-%H%M%S")
                                                : args.run_name;
  std::filesystem::create_directories(args.out_dir);
  const std::string jsonl = args.out_dir + "/" + run + ".jsonl";
  std::printf("# fp4moe bench --ep %d: %s, seed %llu, %d warmup + %d timed calls per rank (CUDA events, no L2 "
              "flush)\n\n",
              n, reproducing_command(args, seed).c_str(), static_cast<unsigned long long>(seed), warmup, iters);
  std::printf("| layer | T/rank | strategy | µs/layer | 1-GPU µs (N·T tokens) | EP/1-GPU | MB sent/rank | MB recv/rank "
              "| rows/rank | status |\n|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);

  std::vector<ncclComm_t> comms;
  {
    std::vector<int> devs(n);
    for (int i = 0; i < n; ++i) devs[i] = i;
    comms = ep_init_local_comms(devs);
  }
  struct CommGuard {
    std::vector<ncclComm_t>& c;
    ~CommGuard() {
      try {
        ep_destroy_comms(c);
      } catch (...) {
      }
    }
  } guard{comms};

  int failures = 0;
  for (const LayerPoints& lp : group_by_layer(expand_points(args, tokens))) {
    const MoeConfig layer = lp.config();
    const std::string name = lp.points.front().shape.name + " " + std::string(to_string(layer.format)) + "-" +
                             std::string(to_string(layer.mode));
    if (layer.num_experts < n) {
      std::printf("| %s | - | - | - | - | - | - | - | - | skipped: E=%d < %d ranks |\n", name.c_str(),
                  layer.num_experts, n);
      continue;
    }
    const QuantizedCheckpoint ck = build_layer(layer, seed, args.threads);
    const std::vector<ExpertRange> ranges = split_experts(layer.num_experts, n);
    std::vector<PreparedWeights> weights(n);
    on_ranks(n, [&](int r) {
      MoeConfig c = layer;
      c.local_expert_first = ranges[r].first, c.local_expert_count = ranges[r].count;
      weights[r] = prepare_weights(c, slice(ck, layer, ranges[r].first), {.device = r});
    });
    std::optional<PreparedWeights> whole;  // the one-GPU layer, where it fits
    std::string whole_status;
    try {
      TOOL_CUDA(cudaSetDevice(0));
      whole = prepare_weights(layer, ck.view(), {.device = 0});
    } catch (const std::exception& e) {
      whole_status = std::string("one GPU: ") + e.what();
    }

    for (const Point& pt : lp.points) {
      const int64_t T = pt.tokens;
      const testkit::Inputs in = build_inputs(pt, n * T, seed, args.threads);
      // The one-GPU time of the same layer on all N·T tokens.
      double one_us = 0;
      if (whole) {
        try {
          TOOL_CUDA(cudaSetDevice(0));
          MoeRunner runner(layer, *whole, {.max_tokens = n * T, .backend = args.backend});
          RankBuffers b(in, layer, 0, n * T);
          cudaStream_t s;
          TOOL_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
          one_us = time_calls([&] { runner.run(b.x.get(), b.ids.get(), IndexType::kInt32,
                                               static_cast<const float*>(b.w.get()), b.out.get(), n * T, s); },
                              s, warmup, iters);
          (void)cudaStreamDestroy(s);
        } catch (const std::exception& e) {
          whole_status = std::string("one GPU: ") + e.what();
          (void)cudaGetLastError();
        }
      }
      for (EpStrategy st : strategies) {
        EpRow row;
        row.layer = name, row.strategy = std::string(to_string(st)), row.world = n, row.tokens_per_rank = T;
        row.one_gpu_us = one_us;
        std::vector<double> us(n);
        std::vector<EpTraffic> tr(n);
        try {
          const std::vector<int64_t> counts(n, T);
          on_ranks(n, [&](int r) {
            MoeConfig c = layer;
            c.local_expert_first = ranges[r].first, c.local_expert_count = ranges[r].count;
            EpMoeLayer ep(comms[r], c, weights[r], {.max_tokens = T, .strategy = st, .backend = args.backend});
            RankBuffers b(in, layer, r * T, T);
            cudaStream_t s;
            TOOL_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            us[r] = time_calls([&] { ep.run(b.x.get(), b.ids.get(), IndexType::kInt32,
                                            static_cast<const float*>(b.w.get()), b.out.get(), T, s, counts); },
                               s, warmup, iters);
            tr[r] = ep.last_traffic();
            (void)cudaStreamDestroy(s);
          });
          row.time_us = *std::max_element(us.begin(), us.end());
          for (const EpTraffic& t : tr) {
            row.sent = std::max(row.sent, t.sent());
            row.received = std::max(row.received, t.received());
            row.rows_computed = std::max(row.rows_computed, t.rows_computed);
          }
        } catch (const std::exception& e) {
          row.status = std::string("error: ") + e.what();
          ++failures;
        }
        char ratio[32] = "-", one[32] = "-";
        if (row.one_gpu_us > 0 && row.time_us > 0) std::snprintf(ratio, sizeof ratio, "%.2f", row.time_us / row.one_gpu_us);
        if (row.one_gpu_us > 0) std::snprintf(one, sizeof one, "%.1f", row.one_gpu_us);
        const std::string status = row.status == "ok" && !whole_status.empty() ? "ok (" + whole_status + ")" : row.status;
        std::printf("| %s | %lld | %s | %.1f | %s | %s | %.3f | %.3f | %lld | %s |\n", name.c_str(),
                    static_cast<long long>(T), row.strategy.c_str(), row.time_us, one, ratio, row.sent / 1e6,
                    row.received / 1e6, static_cast<long long>(row.rows_computed), status.c_str());
        std::fflush(stdout);
        std::ofstream j(jsonl, std::ios::app);
        std::ostringstream o;
        o << "{\"run\":\"" << run << "\",\"kind\":\"ep\",\"layer\":\"" << row.layer << "\",\"config\":\""
          << layer.to_string() << "\",\"world\":" << n << ",\"tokens_per_rank\":" << T << ",\"strategy\":\""
          << row.strategy << "\",\"time_us\":" << row.time_us << ",\"one_gpu_us\":" << row.one_gpu_us
          << ",\"bytes_sent_per_rank\":" << row.sent << ",\"bytes_received_per_rank\":" << row.received
          << ",\"rows_per_rank\":" << row.rows_computed << ",\"iters\":" << iters << ",\"warmup\":" << warmup
          << ",\"seed\":" << seed << ",\"status\":\"";
        for (char ch : status) o << (ch == '"' || ch == '\\' ? std::string("\\") + ch : std::string(1, ch));
        o << "\"}";
        j << o.str() << "\n";
      }
    }
  }
  std::printf("\nJSON lines: %s\n", jsonl.c_str());
  return failures ? 1 : 0;
}

#endif

}  // namespace fp4moe::cli
