// The cuBLAS bf16 MoE peer of bench-protocol.md. See gpu.h.
//
// Per call (all captured in one CUDA graph with the L2 flush):
//   gather      xs[r, :] = x[token(r), :]                 routes r sorted by expert (host-planned)
//   FC1         y1[rows of e] = xs[rows of e] · W13_eᵀ    one cublasGemmEx per active expert
//   activation  h[r, i] = act(gate = y1[r, I + i], up = y1[r, i])   ([up; gate] rows, bf16 out)
//   FC2         y2[rows of e] = h[rows of e] · W2_eᵀ      one cublasGemmEx per active expert
//   combine     out[t, :] = Σ_j w[t, j] · y2[route(t, j), :]   fp32 sum in slot order, bf16 out
// A loop of cublasGemmEx is used rather than cublasGemmGroupedBatchedEx: its host-side parameter
// arrays make graph capture of it hard to reason about, and a loop is obviously correct.
#include <algorithm>
#include <cmath>

#include "cuda_check.h"
#include "fp4moe/activation.h"
#include "fp4moe/formats.h"
#include "gpu.h"
#include "gpu_kernels.h"

namespace fp4moe::cli {
namespace {

// xs[r, :] = x[tok[r], :], rows of h8 16-byte chunks. grid: one block per route row.
__global__ void gather_rows_kernel(const uint4* __restrict__ x, const int* __restrict__ tok, uint4* __restrict__ xs,
                                   int h8) {
  const int r = blockIdx.x;
  const uint4* src = x + static_cast<size_t>(tok[r]) * h8;
  uint4* dst = xs + static_cast<size_t>(r) * h8;
  for (int c = threadIdx.x; c < h8; c += blockDim.x) dst[c] = src[c];
}

__global__ void activation_kernel(const uint16_t* __restrict__ y1, uint16_t* __restrict__ h, int64_t rows, int inter,
                                  int n1, bool gated, Activation act, float alpha, float beta, float limit) {
  const int64_t n = rows * inter;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / inter;
    const int i = static_cast<int>(idx % inter);
    const uint16_t* row = y1 + r * n1;
    const float up = gated ? fmt::f32_from_bf16(row[i]) : 0.0f;
    const float gate = gated ? fmt::f32_from_bf16(row[inter + i]) : fmt::f32_from_bf16(row[i]);
    h[idx] = fmt::bf16_from_f32(apply_activation<float>(act, gate, up, alpha, beta, limit));
  }
}

// out[t, c] = Σ_j w[t, j] · y2[pos[t, j], c] (pos −1: the route goes nowhere). grid: one block per token.
__global__ void combine_kernel(const uint16_t* __restrict__ y2, const int* __restrict__ pos,
                               const float* __restrict__ w, uint16_t* __restrict__ out, int k, int hidden) {
  const int t = blockIdx.x;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int p = pos[t * k + j];
      if (p >= 0) acc += w[t * k + j] * fmt::f32_from_bf16(y2[static_cast<size_t>(p) * hidden + c]);
    }
    out[static_cast<size_t>(t) * hidden + c] = fmt::bf16_from_f32(acc);
  }
}

}  // namespace

struct CublasBf16Peer::Impl {
  MoeConfig c;
  int64_t tokens = 0;
  int n1 = 0;
  DeviceBuffer w13, w2;  // [slots, N1, H], [slots, H, I] bf16: only the experts some set reaches
  struct Group {
    int slot, begin, count;
  };
  struct Set {
    const void* x = nullptr;
    DeviceBuffer tok, pos, w;  // [rows] int32, [T, K] int32, [T, K] fp32
    std::vector<Group> groups;
    int rows = 0;
  };
  std::vector<Set> sets;
  DeviceBuffer xs, y1, h, y2, workspace;
  void* out = nullptr;
  cublasHandle_t handle = nullptr;
};

CublasBf16Peer::CublasBf16Peer(const MoeConfig& c, int64_t tokens, const std::vector<const int32_t*>& ids_sets,
                               const std::vector<const float*>& w_sets, const std::vector<const void*>& x_sets,
                               void* out, uint64_t seed)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.c = c;
  m.tokens = tokens;
  m.n1 = c.fc1_rows();
  m.out = out;
  const int E = c.num_experts, K = c.top_k, H = c.hidden, I = c.intermediate;
  if (H % 8 != 0) throw InvalidArgument("hidden", "the cuBLAS peer gathers 16-byte chunks: H must be a multiple of 8");

  // Experts reached by any set get a weight slot.
  std::vector<int> slot_of(E, -1);
  int slots = 0;
  for (const int32_t* ids : ids_sets)
    for (int64_t i = 0; i < tokens * K; ++i)
      if (ids[i] >= 0 && ids[i] < E && slot_of[ids[i]] < 0) slot_of[ids[i]] = slots++;

  cudaStream_t stream = nullptr;  // setup on the legacy stream, then synchronised
  m.w13 = DeviceBuffer(size_t(std::max(slots, 1)) * m.n1 * H * 2);
  m.w2 = DeviceBuffer(size_t(std::max(slots, 1)) * H * I * 2);
  // Uniform with the variance of N(0, 1/fan_in): bound √(3 / fan_in).
  launch_fill_bf16(m.w13.get(), size_t(slots) * m.n1 * H, std::sqrt(3.0f / H), seed ^ 0x13, stream);
  launch_fill_bf16(m.w2.get(), size_t(slots) * H * I, std::sqrt(3.0f / I), seed ^ 0x2, stream);

  // Per set: routes counting-sorted by slot, in (token, j) order within a slot.
  int max_rows = 1;
  for (size_t s = 0; s < ids_sets.size(); ++s) {
    const int32_t* ids = ids_sets[s];
    Impl::Set set;
    set.x = x_sets[s];
    std::vector<int> count(std::max(slots, 1), 0);
    for (int64_t i = 0; i < tokens * K; ++i)
      if (ids[i] >= 0 && ids[i] < E) ++count[slot_of[ids[i]]];
    std::vector<int> begin(count.size() + 1, 0);
    for (size_t e = 0; e < count.size(); ++e) begin[e + 1] = begin[e] + count[e];
    set.rows = begin.back();
    std::vector<int> tok(std::max(set.rows, 1), 0), pos(tokens * K, -1), fill(begin.begin(), begin.end() - 1);
    for (int64_t i = 0; i < tokens * K; ++i) {
      if (ids[i] < 0 || ids[i] >= E) continue;
      const int r = fill[slot_of[ids[i]]]++;
      tok[r] = static_cast<int>(i / K);
      pos[i] = r;
    }
    for (size_t e = 0; e < count.size(); ++e)
      if (count[e] > 0) set.groups.push_back({static_cast<int>(e), begin[e], count[e]});
    set.tok = DeviceBuffer(tok.size() * 4);
    set.tok.upload(tok.data(), tok.size() * 4);
    set.pos = DeviceBuffer(pos.size() * 4);
    set.pos.upload(pos.data(), pos.size() * 4);
    set.w = DeviceBuffer(size_t(tokens) * K * 4);
    set.w.upload(w_sets[s], size_t(tokens) * K * 4);
    max_rows = std::max(max_rows, set.rows);
    m.sets.push_back(std::move(set));
  }
  m.xs = DeviceBuffer(size_t(max_rows) * H * 2);
  m.y1 = DeviceBuffer(size_t(max_rows) * m.n1 * 2);
  m.h = DeviceBuffer(size_t(max_rows) * I * 2);
  m.y2 = DeviceBuffer(size_t(max_rows) * H * 2);
  // A user workspace keeps cuBLAS from allocating during graph capture.
  m.workspace = DeviceBuffer(size_t(64) << 20);
  TOOL_CUBLAS(cublasCreate(&m.handle));
  TOOL_CUBLAS(cublasSetWorkspace(m.handle, m.workspace.get(), m.workspace.bytes()));
  TOOL_CUDA(cudaDeviceSynchronize());
}

CublasBf16Peer::~CublasBf16Peer() {
  if (impl_ && impl_->handle) (void)cublasDestroy(impl_->handle);
}

size_t CublasBf16Peer::weight_bytes() const { return impl_->w13.bytes() + impl_->w2.bytes(); }

void CublasBf16Peer::enqueue(CUstream_st* stream, int set_index) {
  Impl& m = *impl_;
  const Impl::Set& set = m.sets.at(set_index);
  const int H = m.c.hidden, I = m.c.intermediate, K = m.c.top_k, N1 = m.n1;
  const auto* w13 = m.w13.as<uint16_t>();
  const auto* w2 = m.w2.as<uint16_t>();
  auto* xs = m.xs.as<uint16_t>();
  auto* y1 = m.y1.as<uint16_t>();
  auto* h = m.h.as<uint16_t>();
  auto* y2 = m.y2.as<uint16_t>();
  TOOL_CUBLAS(cublasSetStream(m.handle, stream));
  const float alpha = 1.0f, beta = 0.0f;

  if (set.rows > 0) {
    gather_rows_kernel<<<set.rows, 256, 0, stream>>>(static_cast<const uint4*>(set.x), set.tok.as<int>(),
                                                     reinterpret_cast<uint4*>(xs), H / 8);
    TOOL_CUDA_LAUNCH("gather_rows_kernel");
    // Row-major Y[m, N] = X[m, Kd] · W[N, Kd]ᵀ is, column-major, Yᵀ (N × m) = op_T(W as Kd × N) · (Xᵀ as Kd × m).
    for (const Impl::Group& g : set.groups)
      TOOL_CUBLAS(cublasGemmEx(m.handle, CUBLAS_OP_T, CUBLAS_OP_N, N1, g.count, H, &alpha,
                               w13 + size_t(g.slot) * N1 * H, CUDA_R_16BF, H, xs + size_t(g.begin) * H, CUDA_R_16BF, H,
                               &beta, y1 + size_t(g.begin) * N1, CUDA_R_16BF, N1, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
    const int64_t n = int64_t(set.rows) * I;
    const int grid = static_cast<int>(std::min<int64_t>((n + 255) / 256, 65536));
    activation_kernel<<<grid, 256, 0, stream>>>(y1, h, set.rows, I, N1, m.c.gated(), m.c.activation, m.c.swiglu.alpha,
                                                m.c.swiglu.beta, m.c.swiglu.limit);
    TOOL_CUDA_LAUNCH("activation_kernel");
    for (const Impl::Group& g : set.groups)
      TOOL_CUBLAS(cublasGemmEx(m.handle, CUBLAS_OP_T, CUBLAS_OP_N, H, g.count, I, &alpha, w2 + size_t(g.slot) * H * I,
                               CUDA_R_16BF, I, h + size_t(g.begin) * I, CUDA_R_16BF, I, &beta, y2 + size_t(g.begin) * H,
                               CUDA_R_16BF, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  combine_kernel<<<static_cast<unsigned>(m.tokens), 256, 0, stream>>>(y2, set.pos.as<int>(), set.w.as<float>(),
                                                                      static_cast<uint16_t*>(m.out), K, H);
  TOOL_CUDA_LAUNCH("combine_kernel");
}

}  // namespace fp4moe::cli
