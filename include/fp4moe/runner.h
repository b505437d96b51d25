// fp4moe/runner.h — running the fused MoE: MoeRunner and the one-shot fused_moe().
//
//   out[t] = Σ_{j<K} w[t,j] · FC2_e( act( FC1_e( Qin(x[t]) ) ) ),   e = ids[t,j]
//
// Routes whose expert id lies outside the config's local range (including −1, and any id outside
// [0, E)) contribute nothing. Every element of `out` is written by each call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fp4moe/config.h"
#include "fp4moe/weights.h"

struct CUstream_st;  // cudaStream_t without including the CUDA headers

namespace fp4moe {

struct RunnerOptions {
  int64_t max_tokens = 4096;       // capacity: the workspace is sized for this many tokens
  Backend backend = Backend::kAuto;
  // Bit-identical output from run to run. false lets the dynamic backend sum each token's top-k
  // routes by fp32 reductions in its FC2 epilogue on calls of at least 4096 routes (T·K), whose order
  // varies: results then differ from run to run in the fp32 summation order only (before the one
  // rounding to bf16), and the call skips the Y round trip. true keeps every backend's fixed order.
  bool deterministic = false;
  int cpu_threads = 0;             // reference backend: 0 = all hardware threads
  // Large prefill on the dynamic backend: device bytes the runner may hold for a bf16 copy of the
  // expert weights (0: none). Calls with at least prefill_bf16_min_rows routes per expert (T·K / E)
  // then dequantise each touched expert's weights once per call into it, groups of experts at a
  // time, and multiply on plain bf16 tensor-core GEMMs; other calls dequantise per m-tile of 128
  // rows, which costs less memory and more time from a few hundred rows per expert on. Results are
  // the same up to fp32 summation order (the bf16 values are exact either way). A budget above 0
  // must hold at least one expert's larger GEMM (InvalidArgument otherwise); the runner reserves
  // no more than all local experts need, and nothing when max_tokens never reaches the line.
  int64_t prefill_bf16_bytes = 0;
  // The default line. Session 8 (H200) set it at 512: the copy then won from 512 routes per expert
  // on. The register path has since caught up: on the H200 at bbda34c (bench/results/NOTES.md
  // session 39, h200-bf16-20261207-s39-partial.jsonl against the prefill table of the same call) the
  // copy lost at every point where it was taken, 512 routes per expert (deepseek-v3, gpt-oss-120b
  // T = 16384: 1.33-1.72x the register path's time) and 1024 (qwen3-30b-a3b, qwen3-235b-a22b,
  // llama4-scout T = 16384: 1.12-1.45x); at 4096 (mixtral-8x7b T = 16384) session 8's copy took
  // 21.8 ms against the register path's 19.8 ms now. So the line sits past every measured regime:
  // a budget alone no longer slows a call down; a server that measures its own crossover sets it.
  int64_t prefill_bf16_min_rows = 8192;
  // The dynamic backend's m-tile on its register path (calls that do not take the bf16 copy): 0
  // chooses it from the routed rows per expert (the default: 16, 32, 64 or 128); 16, 32, 64 or 128 force it,
  // for tile sweeps and for servers that measured their own routing. Any other value:
  // InvalidArgument. Results are the same up to fp32 summation order.
  int dynamic_tile_m = 0;
};

// Whether RunnerOptions::dynamic_tile_m takes v (the runner and the `fp4moe` command check with it).
constexpr bool is_dynamic_tile_m(int v) { return v == 0 || v == 16 || v == 32 || v == 64 || v == 128; }

// Owns prepared weights, a workspace sized for max_tokens and the per-T plan. run() allocates
// nothing, never synchronises the host and never reads device data on the host, so it may be
// captured in a CUDA graph. One runner per stream (the workspace is the runner's own).
class MoeRunner {
 public:
  MoeRunner(const MoeConfig& config, PreparedWeights weights, const RunnerOptions& options = {});
  ~MoeRunner();
  MoeRunner(MoeRunner&&) noexcept;
  MoeRunner& operator=(MoeRunner&&) noexcept;
  MoeRunner(const MoeRunner&) = delete;
  MoeRunner& operator=(const MoeRunner&) = delete;

  // x: [T, H] bf16 (raw 16-bit patterns); topk_ids: [T, K] int32 or int64; topk_weights: [T, K]
  // fp32; out: [T, H] of config.output_dtype. Host pointers for a host runner, device pointers
  // on the runner's device otherwise. All row-major and contiguous. x and out 16-byte aligned.
  void run(const void* x, const void* topk_ids, IndexType ids_type, const float* topk_weights,
           void* out, int64_t num_tokens, CUstream_st* stream = nullptr);

  // The backend a call with num_tokens tokens runs on (after validation of num_tokens).
  Backend plan(int64_t num_tokens) const;
  // Whether that call dequantises the weights once into the bf16 copy (RunnerOptions::prefill_bf16_bytes).
  bool plan_bf16_copy(int64_t num_tokens) const;
  const MoeConfig& config() const;
  const RunnerOptions& options() const;
  int device() const;
  size_t workspace_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// One-shot form: builds a runner for num_tokens and runs it once (synchronous on the host
// backend; stream-ordered on a GPU, but it allocates, so not for graph capture).
void fused_moe(const MoeConfig& config, const PreparedWeights& weights, const void* x,
               const void* topk_ids, IndexType ids_type, const float* topk_weights, void* out,
               int64_t num_tokens, const RunnerOptions& options = {}, CUstream_st* stream = nullptr);

// Build and device facts for `fp4moe info`.
struct BuildInfo {
  const char* version;
  const char* git_commit;
  const char* cuda_version;   // the toolkit this was built with
  const char* cuda_archs;     // e.g. "sm_90a"
};
BuildInfo build_info();
int cuda_device_count();      // 0 where there is no GPU or no driver; never throws

}  // namespace fp4moe
