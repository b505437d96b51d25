// MoeRunner: user-facing validation, capacity, and the hand-off to the reference or GPU backends.
#include <algorithm>
#include <climits>
#include <cmath>

#include "fp4moe/errors.h"
#include "fp4moe/runner.h"
#include "host/gpu_backend.h"
#include "host/prepared.h"
#include "host/run_args.h"
#include "reference/reference.h"

namespace fp4moe {
namespace {

// Kernels index with 32-bit offsets (reference §4.5): refuse any buffer past 2^31 - 1 elements
// before the first launch. The largest are the per-route activations and results.
void check_capacity(const MoeConfig& c, int64_t max_tokens) {
  // Compared by division: max_tokens · top_k · widest would overflow int64 for a huge max_tokens.
  const int64_t widest = std::max<int64_t>({c.hidden, c.fc1_rows(), c.intermediate});
  const int64_t per_token = std::max<int64_t>(widest * c.top_k, c.hidden);
  const int64_t limit = INT32_MAX / per_token;
  FP4MOE_REQUIRE(max_tokens <= limit, CapacityError, "max_tokens", "max_tokens=", max_tokens, " needs a workspace of ",
                 max_tokens, " × ", per_token, " elements (", c.top_k, " routed rows per token × ", widest,
                 "), past the 2^31 - 1 limit of 32-bit indexing; lower max_tokens to at most ", limit);
}

// The fields that shape the prepared weights must agree with the runner's config.
void check_same_layer(const MoeConfig& a, const MoeConfig& w) {
  auto same = a.num_experts == w.num_experts && a.local_expert_first == w.local_expert_first &&
              a.local_count() == w.local_count() && a.hidden == w.hidden && a.intermediate == w.intermediate &&
              a.top_k == w.top_k && a.format == w.format && a.mode == w.mode && a.activation == w.activation &&
              a.has_bias == w.has_bias && a.swiglu.alpha == w.swiglu.alpha && a.swiglu.beta == w.swiglu.beta &&
              (a.swiglu.limit == w.swiglu.limit);
  FP4MOE_REQUIRE(same, InvalidArgument, "weights", "were prepared for ", w.to_string(), " but the runner's config is ",
                 a.to_string(), " (only output_dtype may differ)");
}

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

void validate_run_args(const void* x, const void* ids, IndexType ids_type, const float* w, const void* out,
                       int64_t T) {
  FP4MOE_REQUIRE(ids_type == IndexType::kInt32 || ids_type == IndexType::kInt64, InvalidArgument, "ids_type",
                 "must be kInt32 or kInt64, got ", static_cast<int>(ids_type));
  if (T <= 0) return;
  FP4MOE_REQUIRE(x != nullptr, InvalidArgument, "x", "is null (num_tokens=", T, ")");
  FP4MOE_REQUIRE(ids != nullptr, InvalidArgument, "topk_ids", "is null (num_tokens=", T, ")");
  FP4MOE_REQUIRE(w != nullptr, InvalidArgument, "topk_weights", "is null (num_tokens=", T, ")");
  FP4MOE_REQUIRE(out != nullptr, InvalidArgument, "out", "is null (num_tokens=", T, ")");
  FP4MOE_REQUIRE(aligned(x, 16), InvalidArgument, "x", "must be 16-byte aligned, address ", x);
  FP4MOE_REQUIRE(aligned(out, 16), InvalidArgument, "out", "must be 16-byte aligned, address ", out);
  FP4MOE_REQUIRE(aligned(ids, ids_type == IndexType::kInt32 ? 4 : 8), InvalidArgument, "topk_ids",
                 "must be aligned to its element size, address ", ids);
  FP4MOE_REQUIRE(aligned(w, 4), InvalidArgument, "topk_weights", "must be 4-byte aligned, address ", w);
}

struct MoeRunner::Impl {
  MoeConfig config;
  PreparedWeights weights;
  RunnerOptions options;
  std::unique_ptr<gpu::Runner> gpu;  // null for a host runner
};

MoeRunner::MoeRunner(const MoeConfig& config, PreparedWeights weights, const RunnerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  config.validate();
  FP4MOE_REQUIRE(static_cast<bool>(weights), InvalidArgument, "weights", "PreparedWeights is empty");
  check_same_layer(config, weights.config());
  FP4MOE_REQUIRE(options.max_tokens >= 1, InvalidArgument, "options.max_tokens", "must be at least 1, got ",
                 options.max_tokens);
  FP4MOE_REQUIRE(options.cpu_threads >= 0, InvalidArgument, "options.cpu_threads", "must be >= 0, got ",
                 options.cpu_threads);
  FP4MOE_REQUIRE(options.prefill_bf16_bytes >= 0, InvalidArgument, "options.prefill_bf16_bytes",
                 "must be >= 0 (0: no bf16 copy), got ", options.prefill_bf16_bytes);
  FP4MOE_REQUIRE(options.prefill_bf16_min_rows >= 1, InvalidArgument, "options.prefill_bf16_min_rows",
                 "must be at least 1, got ", options.prefill_bf16_min_rows);
  FP4MOE_REQUIRE(is_dynamic_tile_m(options.dynamic_tile_m), InvalidArgument, "options.dynamic_tile_m",
                 "must be 0 (chosen per call), 16, 32, 64 or 128, got ", options.dynamic_tile_m);
  check_capacity(config, options.max_tokens);
  impl_->config = config;
  impl_->weights = std::move(weights);
  impl_->options = options;
  const bool host = impl_->weights.device() < 0;
  if (host) {
    FP4MOE_REQUIRE(options.backend == Backend::kAuto || options.backend == Backend::kReference, Unsupported,
                   "options.backend", "weights prepared for the host run on the reference backend only, asked for ",
                   to_string(options.backend));
  } else {
    FP4MOE_REQUIRE(options.backend != Backend::kReference, Unsupported, "options.backend",
                   "the reference backend needs weights prepared for the host (device = -1)");
    impl_->gpu = gpu::make_runner(config, impl_->weights.impl().dev, options, impl_->weights.device());
  }
}

MoeRunner::~MoeRunner() = default;
MoeRunner::MoeRunner(MoeRunner&&) noexcept = default;
MoeRunner& MoeRunner::operator=(MoeRunner&&) noexcept = default;

const MoeConfig& MoeRunner::config() const { return impl_->config; }
const RunnerOptions& MoeRunner::options() const { return impl_->options; }
int MoeRunner::device() const { return impl_->weights.device(); }
size_t MoeRunner::workspace_bytes() const { return impl_->gpu ? impl_->gpu->workspace_bytes() : 0; }

Backend MoeRunner::plan(int64_t T) const {
  FP4MOE_REQUIRE(T >= 0 && T <= impl_->options.max_tokens, CapacityError, "num_tokens", "must be in [0, max_tokens=",
                 impl_->options.max_tokens, "], got ", T);
  if (!impl_->gpu) return Backend::kReference;
  if (impl_->options.backend == Backend::kAuto) return impl_->gpu->select(T);
  std::string why;
  FP4MOE_REQUIRE(impl_->gpu->supports(impl_->options.backend, T, &why), Unsupported, "options.backend", "backend ",
                 to_string(impl_->options.backend), " cannot run num_tokens=", T, " of ", impl_->config.to_string(),
                 ": ", why);
  return impl_->options.backend;
}

bool MoeRunner::plan_bf16_copy(int64_t T) const {
  const Backend b = plan(T);
  return impl_->gpu && impl_->gpu->uses_bf16_copy(b, T);
}

void MoeRunner::run(const void* x, const void* ids, IndexType ids_type, const float* w, void* out, int64_t T,
                    CUstream_st* stream) {
  const Backend backend = plan(T);  // validates T
  if (T == 0) return;
  validate_run_args(x, ids, ids_type, w, out, T);
  if (!impl_->gpu) {
    reference::moe_forward(impl_->config, impl_->weights.host(), static_cast<const uint16_t*>(x), ids, ids_type, w, T,
                           out, impl_->options.cpu_threads);
    return;
  }
  impl_->gpu->run(backend, x, ids, ids_type, w, out, T, stream);
}

void fused_moe(const MoeConfig& config, const PreparedWeights& weights, const void* x, const void* ids,
               IndexType ids_type, const float* w, void* out, int64_t T, const RunnerOptions& options,
               CUstream_st* stream) {
  RunnerOptions o = options;
  o.max_tokens = std::max<int64_t>(T, 1);
  MoeRunner runner(config, weights, o);
  runner.run(x, ids, ids_type, w, out, T, stream);
}

}  // namespace fp4moe
