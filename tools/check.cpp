// `fp4moe check`: random problems through MoeRunner, compared against the float64 reference.
//
// Per layer (shape, format, mode, bias): random weights drawn and prepared for the device once. Per
// point (token count): fresh random inputs, poison the output, run, then compare a sample of tokens
// against reference::moe_forward_f64 (every token when T ≤ 64, else the first, the last and 64 random
// ones — the reference is independent per token, so the sample's rows are gathered and run alone)
// and count the poison pattern over EVERY output element.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "commands.h"
#include "cuda_check.h"
#include "fp4moe/fp4moe.h"
#include "gpu.h"
#include "points.h"
#include "reference/reference.h"
#include "testing/problem.h"

namespace fp4moe::cli {
namespace {

struct CheckRow {
  Point point;
  std::string backend = "-";
  std::string status;  // "PASS", "FAIL", "unsupported: …", "error: …"
  testkit::Accuracy acc;
  bool compared = false;
};

// Runs the inputs once through a runner on the GPU or the host; returns the whole [T, H] output.
std::vector<uint16_t> run_once(const testkit::Inputs& in, const MoeConfig& c, MoeRunner& runner, bool gpu) {
  const int64_t T = in.tokens;
  const int H = c.hidden;
  std::vector<uint16_t> out(size_t(T) * H, testkit::kPoisonBF16);
  if (!gpu) {
    runner.run(in.x.data(), in.ids.data(), IndexType::kInt32, in.topk_weights.data(), out.data(), T);
    return out;
  }
  const DeviceInputs d = upload_inputs(in.x, in.ids, in.topk_weights, T, H, c.top_k);
  cudaStream_t stream;
  TOOL_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  try {
    runner.run(d.x.get(), d.ids.get(), IndexType::kInt32, d.w.as<float>(), d.out.get(), T, stream);
    TOOL_CUDA(cudaStreamSynchronize(stream));
    TOOL_CUDA(cudaGetLastError());
  } catch (...) {
    (void)cudaStreamDestroy(stream);
    throw;
  }
  TOOL_CUDA(cudaStreamDestroy(stream));
  d.out.download(out.data(), out.size() * 2);
  return out;
}

// One point on the layer's prepared weights (which keep the canonical host form the reference reads).
CheckRow check_point(const Point& point, const PreparedWeights& weights, bool gpu, const Args& args, uint64_t seed) {
  CheckRow row;
  row.point = point;
  const MoeConfig c = point.config();
  const int64_t T = point.tokens;
  const int H = c.hidden, K = c.top_k;
  try {
    const testkit::Inputs in = build_inputs(point, T, seed, args.threads);
    MoeRunner runner(c, weights, runner_options(args, args.backend, T));
    row.backend = backend_label(runner, T);
    const std::vector<uint16_t> out = run_once(in, c, runner, gpu);

    const std::vector<int64_t> rows = sample_rows(T, seed);
    const auto xs = gather_rows(in.x, H, rows);
    const auto ids = gather_rows(in.ids, K, rows);
    const auto ws = gather_rows(in.topk_weights, K, rows);
    const std::vector<double> ref = reference::moe_forward_f64(c, weights.host(), xs.data(), ids.data(),
                                                               IndexType::kInt32, ws.data(),
                                                               static_cast<int64_t>(rows.size()), args.threads);
    const auto out_rows = gather_rows(out, H, rows);
    row.acc = testkit::compare(ref, out_rows.data(), OutputDType::kBF16, static_cast<int64_t>(rows.size()), H,
                               testkit::default_tolerance(c));
    // Unwritten elements anywhere, not only in the sample.
    row.acc.unwritten = std::count(out.begin(), out.end(), testkit::kPoisonBF16);
    row.acc.pass = row.acc.pass && row.acc.unwritten == 0;
    row.compared = true;
    row.status = row.acc.pass ? "PASS" : "FAIL";
  } catch (const std::exception& e) {
    row.status = error_status(e);
  }
  return row;
}

std::string table_row(const CheckRow& r) {
  const Point& p = r.point;
  std::string s = "| " + p.shape.name + " | " + std::string(to_string(p.format)) + " | " +
                  std::string(to_string(p.mode)) + (p.bias ? "+bias" : "") + " | " +
                  std::string(to_string(p.shape.activation)) + " | " + std::to_string(p.tokens) + " | " + r.backend +
                  " | ";
  if (r.compared)
    s += format_sci(r.acc.rel_l2, 2) + " | " + format_sci(r.acc.worst_token_rel, 2) + " | " +
         format_sci(r.acc.max_abs, 2) + " | " + std::to_string(r.acc.unwritten) + " | ";
  else
    s += "- | - | - | - | ";
  std::string status = r.status;
  if (r.compared && r.acc.nonfinite) status += " (" + std::to_string(r.acc.nonfinite) + " non-finite)";
  return s + status + " |";
}

}  // namespace

int run_check(const Args& args) {
  const bool gpu = use_gpu(args);
  const uint64_t seed = args.seed.value_or(1);
  const std::vector<int64_t> tokens = args.tokens.empty() ? std::vector<int64_t>{1, 7, 64} : args.tokens;
  const std::vector<Point> points = expand_points(args, tokens);
  if (gpu) {
    TOOL_CUDA(cudaSetDevice(0));
    std::printf("fp4moe check on GPU 0 (%s), seed %llu, %zu points\n", gpu_facts(0).name.c_str(),
                static_cast<unsigned long long>(seed), points.size());
  } else {
    std::printf("fp4moe check on the CPU (reference backend%s), seed %llu, %zu points\n",
                args.device == DeviceChoice::kCpu ? "" : "; no CUDA device found",
                static_cast<unsigned long long>(seed), points.size());
  }
  std::printf("tolerance: rel_l2 <= 1.5e-2 for a4, 5e-3 for a16/a8; worst_token_rel <= 4x that; no unwritten or "
              "spurious non-finite element\n");
  std::printf("compared: every token when T <= 64, else the first, the last and 64 random tokens; unwritten "
              "counted over every element\n\n");
  std::printf("| model | format | mode | act | T | backend | rel_l2 | worst_token_rel | max_abs | unwritten | result |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  int pass = 0, fail = 0, unsupported = 0;
  auto report = [&](const CheckRow& r) {
    std::printf("%s\n", table_row(r).c_str());
    std::fflush(stdout);
    if (r.status == "PASS") ++pass;
    else if (r.status.rfind("unsupported", 0) == 0) ++unsupported;
    else ++fail;
  };
  // One layer's weights are drawn and prepared once for all its token counts (and drawn once for all
  // its activation modes: the cache); inputs are fresh per point.
  LayerCache drawn;
  for (const LayerPoints& layer : group_by_layer(points)) {
    const MoeConfig c = layer.config();
    std::string layer_error;
    // keep_host_copy on the GPU: the reference reads the canonical host form.
    const PreparedWeights weights = prepare_layer(c, seed, args.threads, gpu, gpu, layer_error, &drawn);
    for (const Point& point : layer.points) {
      if (!layer_error.empty()) {
        CheckRow r;
        r.point = point;
        r.status = layer_error;
        report(r);
      } else {
        report(check_point(point, weights, gpu, args, seed));
      }
    }
  }
  std::printf("\n%d passed, %d failed, %d unsupported\n", pass, fail, unsupported);
  return fail ? 1 : 0;
}

}  // namespace fp4moe::cli
