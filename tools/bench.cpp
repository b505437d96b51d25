// `fp4moe bench`: the measurement of bench-protocol.md.
//
// On a GPU: the ceilings first (ceilings.cu), then per layer (shape, format, mode, bias) the weights,
// drawn and prepared once, and per point (token count) fresh inputs, fp4moe and the cuBLAS bf16 peer,
// each timed by time_graphs (gpu_timing.cu: CUDA-graph replays with an L2 flush, the flush's own time
// subtracted, inputs rotated over a few sets). Without a GPU: the CPU reference backend with a
// steady clock, and no floor or efficiency. Either way: a markdown table on stdout, JSON lines
// appended to <out-dir>/<run-name>.jsonl and <out-dir>/<run-name>.md.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "commands.h"
#include "cuda_check.h"
#include "fp4moe/fp4moe.h"
#include "gpu.h"
#include "points.h"
#include "report.h"

namespace fp4moe::cli {
namespace {

struct BenchContext {
  const Args& args;
  uint64_t seed;
  int iters, warmup;
  // GPU only:
  std::optional<Ceilings> ceilings;
  const L2Flusher* flusher = nullptr;
  cudaStream_t stream = nullptr;
};

// Bytes, touched experts and the floor of the replay whose time is the median, with flops. The GPU
// timing replays the input sets in turn (timed_replay_set) and reports the median replay; where the
// sets touch different numbers of experts (decode at a few routes per expert) the times follow the
// touched bytes, so the median replay is one of the median-bytes set. Until session 18 the floor was
// the sets' mean bytes against that median time: mixtral-8x7b T = 4 (seed 18) draws sets of 6, 4, 5
// and 6 of 8 experts, a mean of 5.25, while over 20 replays the median time lies between the 5- and
// the 6-expert sets' (a median of 5.5 experts): its efficiency read 0.606, now 0.631 on the same
// H100. (That is not the whole of its dip below T = 2 and 8, 0.75: bench/results/NOTES.md, session 18.)
void fill_counts(BenchRow& row, const MoeConfig& c, const testkit::Inputs& in, int sets, int iters,
                 const BenchContext& ctx) {
  const int64_t T = row.point.tokens;
  std::vector<Traffic> per_set;
  for (int s = 0; s < sets; ++s) per_set.push_back(traffic(c, in.ids.data() + size_t(s) * T * c.top_k, T));
  std::vector<double> bytes(std::max(iters, 1)), touched(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    const Traffic& tr = per_set[timed_replay_set(static_cast<int>(i), sets)];
    bytes[i] = tr.bytes;
    touched[i] = tr.touched_experts;
  }
  row.bytes = median(bytes);
  row.touched_experts = median(touched);
  row.flops = flops(c, T);
  row.sets = sets;
  if (ctx.ceilings) {
    const double rate = c.mode == ActMode::kA8 ? ctx.ceilings->fp8_tflops : ctx.ceilings->bf16_tflops;
    row.floor_us = 1e6 * std::max(row.bytes / (ctx.ceilings->read_tbs * 1e12), row.flops / (rate * 1e12));
  }
}

BenchRow bench_point_cpu(const Point& point, const PreparedWeights& weights, const BenchContext& ctx) {
  BenchRow row;
  row.point = point;
  row.backend = "reference (cpu)";
  const MoeConfig c = point.config();
  const int64_t T = point.tokens;
  try {
    const testkit::Inputs p = build_inputs(point, T, ctx.seed, ctx.args.threads);
    fill_counts(row, c, p, 1, 1, ctx);
    MoeRunner runner(c, weights, runner_options(ctx.args, ctx.args.backend, T));
    std::vector<uint16_t> out(size_t(T) * c.hidden, testkit::kPoisonBF16);
    auto call = [&] { runner.run(p.x.data(), p.ids.data(), IndexType::kInt32, p.topk_weights.data(), out.data(), T); };
    for (int i = 0; i < ctx.warmup; ++i) call();
    std::vector<double> us;
    for (int i = 0; i < ctx.iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      call();
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    row.time_us = median(us);
    row.min_us = *std::min_element(us.begin(), us.end());
    row.max_us = *std::max_element(us.begin(), us.end());
  } catch (const std::exception& e) {
    row.status = error_status(e);
  }
  return row;
}

// Times `point` on `backend`, and the peers when `peers` (once per point, with the first backend).
BenchRow bench_point_gpu(const Point& point, const PreparedWeights& weights, const BenchContext& ctx, Backend backend,
                         bool peers) {
  BenchRow row;
  row.point = point;
  row.backend = std::string(to_string(backend));
  const MoeConfig c = point.config();
  const int64_t T = point.tokens;
  // Input sets rotated between calls; at most 32 Ki tokens in all (host and device memory).
  const int sets = static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(ctx.args.sets, 32768 / T), 1, 64));
  std::optional<testkit::Inputs> problem;
  std::optional<DeviceInputs> inputs;
  try {
    problem = build_inputs(point, T * sets, ctx.seed, ctx.args.threads);
    fill_counts(row, c, *problem, sets, ctx.iters, ctx);
    inputs = upload_inputs(problem->x, problem->ids, problem->topk_weights, T, c.hidden, c.top_k);
  } catch (const std::exception& e) {
    row.status = error_status(e);
    return row;
  }
  const DeviceInputs& d = *inputs;

  // fp4moe.
  try {
    MoeRunner runner(c, weights, runner_options(ctx.args, backend, T));
    row.backend = backend_label(runner, T);
    auto call = [&](cudaStream_t s, int set) {
      runner.run(d.x_set(set), d.ids_set(set), IndexType::kInt32, d.w_set(set), d.out.get(), T, s);
    };
    call(ctx.stream, 0);  // once outside capture: errors surface with their own message
    TOOL_CUDA(cudaStreamSynchronize(ctx.stream));
    const Timing t = time_graphs(call, sets, ctx.warmup, ctx.iters, *ctx.flusher, ctx.stream);
    row.time_us = t.median_us, row.min_us = t.min_us, row.max_us = t.max_us, row.flush_us = t.flush_us;
    if (row.floor_us && t.median_us > 0) row.efficiency = *row.floor_us / t.median_us;
  } catch (const std::exception& e) {
    row.status = error_status(e);
    (void)cudaStreamSynchronize(ctx.stream);
    (void)cudaGetLastError();  // clear a non-sticky error so the peer can still run
  }

  // The cuBLAS bf16 peer on the same inputs.
  if (ctx.args.peer && peers) {
    try {
      std::vector<const int32_t*> ids_sets;
      std::vector<const float*> w_sets;
      std::vector<const void*> x_sets;
      for (int s = 0; s < sets; ++s) {
        ids_sets.push_back(problem->ids.data() + size_t(s) * T * c.top_k);
        w_sets.push_back(problem->topk_weights.data() + size_t(s) * T * c.top_k);
        x_sets.push_back(d.x_set(s));
      }
      CublasBf16Peer peer(c, T, ids_sets, w_sets, x_sets, d.out.get(), ctx.seed);
      peer.enqueue(ctx.stream, 0);
      TOOL_CUDA(cudaStreamSynchronize(ctx.stream));
      const Timing t = time_graphs([&](cudaStream_t s, int set) { peer.enqueue(s, set); }, sets, ctx.warmup, ctx.iters,
                                   *ctx.flusher, ctx.stream);
      row.peers["cublas_bf16"] = t.median_us;
    } catch (const std::exception& e) {
      row.notes["cublas_bf16"] = error_status(e);
      (void)cudaStreamSynchronize(ctx.stream);
      (void)cudaGetLastError();
    }
  }
  return row;
}

}  // namespace

int run_bench(const Args& args) {
  const bool gpu = use_gpu(args);
  const uint64_t seed = args.seed ? *args.seed : (uint64_t(std::random_device{}()) & 0x7FFFFFFF);
  const std::vector<int64_t> tokens =
      !args.tokens.empty() ? args.tokens : (gpu ? protocol_tokens() : std::vector<int64_t>{1, 4});
  const std::vector<Point> points = expand_points(args, tokens);

  RunFacts f;
  const BuildInfo b = build_info();
  f.version = b.version;
  f.commit = b.git_commit;
  f.device = gpu ? "cuda" : "cpu";
  f.date = utc_now("%Y-%m-%dT%H:%M:%SZ");
  f.run = args.run_name.empty() ? "bench-" + utc_now("%Y%m%d-%H%M%S") + (gpu ? "-gpu" : "-cpu") : args.run_name;
  f.seed = seed;
  f.iters = args.iters > 0 ? args.iters : (gpu ? 100 : 3);
  f.warmup = args.warmup >= 0 ? args.warmup : (gpu ? 10 : 1);
  f.sets = gpu ? args.sets : 1;
  f.command = reproducing_command(args, seed);

  BenchContext ctx{args, seed, f.iters, f.warmup, std::nullopt, nullptr, nullptr};
  std::optional<L2Flusher> flusher;
  if (gpu) {
    TOOL_CUDA(cudaSetDevice(0));
    const GpuFacts g = gpu_facts(0);
    f.gpu = g.name;
    f.sm_clock_max_mhz = g.sm_clock_max_mhz;
    std::fprintf(stderr, "measuring the ceilings on %s ...\n", g.name.c_str());
    ctx.ceilings = measure_ceilings(0);
    f.sm_clock_mhz = ctx.ceilings->sm_clock_mhz;
    f.read_tbs = ctx.ceilings->read_tbs, f.copy_tbs = ctx.ceilings->copy_tbs;
    f.bf16_tflops = ctx.ceilings->bf16_tflops, f.fp8_tflops = ctx.ceilings->fp8_tflops;
    f.ceilings_detail = ctx.ceilings->detail;
    flusher.emplace(g.l2_bytes);
    ctx.flusher = &*flusher;
    TOOL_CUDA(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
    f.method = "CUDA-graph replays timed with CUDA events; each graph = L2 flush (a read-only kernel streaming " +
               format_fixed(flusher->bytes() / 1e6, 0) + " MB = 4x L2 of an unrelated buffer, leaving no dirty lines) + "
               "one call; time of a call = its replay time minus the median replay time of an identical graph of the "
               "flush alone (flush_us); median (min, max) over " + std::to_string(f.iters) + " replays after " +
               std::to_string(f.warmup) + " warm-up replays of each graph; inputs rotated over up to " +
               std::to_string(args.sets) + " sets of (x, ids, weights) (fewer when T x sets > 32768); fp4moe and the "
               "cublas_bf16 peer on the same inputs";
  } else {
    f.gpu = "none (CPU)";
    f.method = "CPU reference backend (MoeRunner on host-prepared weights, " +
               std::string(args.threads ? std::to_string(args.threads) : "all") +
               " threads): std::chrono::steady_clock around each call, median (min, max) over " +
               std::to_string(f.iters) + " calls after " + std::to_string(f.warmup) +
               " warm-up; no floor or efficiency applies (n/a)";
  }

  std::printf("fp4moe bench %s: %s, commit %s, seed %llu\n", f.run.c_str(),
              gpu ? ("GPU 0 " + f.gpu).c_str() : "CPU reference backend (no GPU: floors and efficiency are n/a)",
              f.commit.c_str(), static_cast<unsigned long long>(seed));
  if (gpu)
    std::printf("ceilings: read-only stream %.2f TB/s, copy %.2f TB/s, bf16 GEMM %.0f TFLOP/s, fp8 GEMM %.0f TFLOP/s, "
                "SM clock %.0f MHz (max %.0f)\n",
                *f.read_tbs, *f.copy_tbs, *f.bf16_tflops, *f.fp8_tflops, f.sm_clock_mhz, f.sm_clock_max_mhz);
  std::printf("method: %s\n\n", f.method.c_str());
  std::fflush(stdout);

  // The .jsonl grows row by row, so that a run cut short keeps what it measured.
  const std::string base = args.out_dir + "/" + f.run;
  append_file(base + ".jsonl", json_header(f) + "\n");
  std::vector<BenchRow> rows;
  int errors = 0;
  size_t done = 0;
  // One layer's weights are drawn and prepared once for all its token counts (and drawn once for all
  // its activation modes: the cache); inputs are fresh per point.
  LayerCache drawn;
  for (const LayerPoints& layer : group_by_layer(points)) {
    const MoeConfig c = layer.config();
    const Point& first = layer.points.front();
    std::fprintf(stderr, "layer %s %s %s%s: drawing and preparing the weights ...\n", first.shape.name.c_str(),
                 std::string(to_string(first.format)).c_str(), std::string(to_string(first.mode)).c_str(),
                 first.bias ? "+bias" : "");
    const auto t0 = std::chrono::steady_clock::now();
    std::string layer_error;
    const PreparedWeights weights = prepare_layer(c, seed, args.threads, gpu, false, layer_error, &drawn);
    std::fprintf(stderr, "  weights ready in %.1f s%s%s\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                 layer_error.empty() ? "" : ": ", layer_error.c_str());
    for (const Point& p : layer.points) {
      std::fprintf(stderr, "[%zu/%zu] %s %s %s T=%lld ...\n", ++done, points.size(), p.shape.name.c_str(),
                   std::string(to_string(p.format)).c_str(), std::string(to_string(p.mode)).c_str(),
                   static_cast<long long>(p.tokens));
      const std::vector<Backend> backends = gpu ? args.backends : std::vector<Backend>{Backend::kReference};
      for (size_t bi = 0; bi < backends.size(); ++bi) {
        if (!layer_error.empty()) {
          BenchRow row;
          row.point = p;
          row.backend = gpu ? std::string(to_string(backends[bi])) : "reference (cpu)";
          row.status = layer_error;
          rows.push_back(row);
        } else {
          rows.push_back(gpu ? bench_point_gpu(p, weights, ctx, backends[bi], bi == 0) : bench_point_cpu(p, weights, ctx));
        }
        if (rows.back().status.rfind("error", 0) == 0) ++errors;
        append_file(base + ".jsonl", json_row(f, rows.back()) + "\n");
        const std::string table = markdown_table({rows.back()}, gpu);  // header line, rule line, the row
        const size_t row_start = table.find('\n', table.find('\n') + 1) + 1;
        std::fprintf(stderr, "  %s", table.substr(row_start).c_str());
      }
    }
  }
  if (ctx.stream) (void)cudaStreamDestroy(ctx.stream);

  std::printf("%s\n", markdown_table(rows, gpu).c_str());
  write_file(base + ".md", markdown_report(f, rows));
  std::printf("wrote %s.jsonl and %s.md\nreproduce: %s\n", base.c_str(), base.c_str(), f.command.c_str());
  return errors ? 1 : 0;
}

}  // namespace fp4moe::cli
