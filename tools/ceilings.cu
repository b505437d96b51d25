// The hardware ceilings of bench-protocol.md, measured in the benchmark's own process: read-only
// streaming bandwidth, device-to-device copy bandwidth, cuBLAS bf16 and cuBLASLt fp8 GEMM rates, and
// the SM clock the GPU actually runs at. Each figure is the best of several event-timed repetitions
// after warm-up (a ceiling is what the hardware can do, so the best run is the honest one).
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "cuda_check.h"
#include "gpu.h"
#include "gpu_kernels.h"

namespace fp4moe::cli {
namespace {

constexpr int kWarmup = 3, kReps = 10;

// Event-timed repetitions of `launch`; returns the shortest in seconds.
template <typename F>
double best_seconds(cudaStream_t stream, F&& launch) {
  for (int i = 0; i < kWarmup; ++i) launch();
  cudaEvent_t a, b;
  TOOL_CUDA(cudaEventCreate(&a));
  TOOL_CUDA(cudaEventCreate(&b));
  double best = 1e30;
  try {
    for (int i = 0; i < kReps; ++i) {
      TOOL_CUDA(cudaEventRecord(a, stream));
      launch();
      TOOL_CUDA(cudaEventRecord(b, stream));
      TOOL_CUDA(cudaEventSynchronize(b));
      float ms = 0;
      TOOL_CUDA(cudaEventElapsedTime(&ms, a, b));
      best = std::min(best, 1e-3 * ms);
    }
  } catch (...) {
    (void)cudaEventDestroy(a);
    (void)cudaEventDestroy(b);
    throw;
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  return best;
}

__global__ void clock_spin_kernel(long long cycles, long long* out) {
  const long long t0 = clock64();
  long long t = t0;
  while (t - t0 < cycles) t = clock64();
  if (threadIdx.x == 0) out[blockIdx.x] = t - t0;
}

// cycles counted on every SM / elapsed time of the launch → MHz (slightly low: launch overhead).
double measure_sm_clock_mhz(int sms, cudaStream_t stream) {
  DeviceBuffer out(sizeof(long long) * sms);
  const long long cycles = 20'000'000;  // ≈ 10 ms at 2 GHz
  const double s = best_seconds(stream, [&] {
    clock_spin_kernel<<<sms, 32, 0, stream>>>(cycles, out.as<long long>());
    TOOL_CUDA_LAUNCH("clock_spin_kernel");
  });
  return cycles / s / 1e6;
}

double gemm_bf16_tflops(cudaStream_t stream) {
  constexpr int n = 8192;
  const size_t elems = size_t(n) * n;
  DeviceBuffer a(elems * 2), b(elems * 2), c(elems * 2), ws(64 << 20);
  launch_fill_bf16(a.get(), elems, 1.0f, 11, stream);
  launch_fill_bf16(b.get(), elems, 1.0f, 12, stream);
  cublasHandle_t h;
  TOOL_CUBLAS(cublasCreate(&h));
  double s = 0;
  try {
    TOOL_CUBLAS(cublasSetStream(h, stream));
    TOOL_CUBLAS(cublasSetWorkspace(h, ws.get(), ws.bytes()));
    const float alpha = 1.0f, beta = 0.0f;
    s = best_seconds(stream, [&] {
      TOOL_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n, b.get(),
                               CUDA_R_16BF, n, &beta, c.get(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
  } catch (...) {
    (void)cublasDestroy(h);
    throw;
  }
  TOOL_CUBLAS(cublasDestroy(h));
  return 2.0 * n * n * double(n) / s / 1e12;
}

// FP8 on Hopper through cuBLASLt: e4m3 A and B, the "TN" layout the fp8 kernels require
// (A transposed), fp32 accumulation, bf16 D, unit scales.
double gemm_fp8_tflops(cudaStream_t stream) {
  constexpr int n = 8192;
  const size_t elems = size_t(n) * n;
  const size_t ws_bytes = 64 << 20;
  DeviceBuffer a(elems), b(elems), d(elems * 2), ws(ws_bytes);
  launch_fill_e4m3(a.get(), elems, 21, stream);
  launch_fill_e4m3(b.get(), elems, 22, stream);
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  auto cleanup = [&] {
    if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (la) (void)cublasLtMatrixLayoutDestroy(la);
    if (lb) (void)cublasLtMatrixLayoutDestroy(lb);
    if (ld) (void)cublasLtMatrixLayoutDestroy(ld);
    if (desc) (void)cublasLtMatmulDescDestroy(desc);
    if (lt) (void)cublasLtDestroy(lt);
  };
  double s = 0;
  try {
    TOOL_CUBLASLT(cublasLtCreate(&lt));
    TOOL_CUBLASLT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    TOOL_CUBLASLT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    TOOL_CUBLASLT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    // Column-major: A stored k×m (used transposed), B k×n, D m×n.
    TOOL_CUBLASLT(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n, n, n));
    TOOL_CUBLASLT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n, n, n));
    TOOL_CUBLASLT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, n, n));
    TOOL_CUBLASLT(cublasLtMatmulPreferenceCreate(&pref));
    TOOL_CUBLASLT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                       sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    TOOL_CUBLASLT(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found == 0) throw CudaError("cublasLtMatmulAlgoGetHeuristic", "cuBLASLt found no fp8 e4m3 algorithm for 8192^3");
    const float alpha = 1.0f, beta = 0.0f;
    s = best_seconds(stream, [&] {
      TOOL_CUBLASLT(cublasLtMatmul(lt, desc, &alpha, a.get(), la, b.get(), lb, &beta, d.get(), ld, d.get(), ld,
                                   &heur.algo, ws.get(), ws_bytes, stream));
    });
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
  return 2.0 * n * n * double(n) / s / 1e12;
}

}  // namespace

Ceilings measure_ceilings(int device) {
  TOOL_CUDA(cudaSetDevice(device));
  const GpuFacts facts = gpu_facts(device);
  cudaStream_t stream;
  TOOL_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Ceilings c;
  std::ostringstream detail;
  try {
    c.sm_clock_mhz = measure_sm_clock_mhz(facts.sms, stream);

    // Read-only stream over 4 GiB (as much as fits when memory is short).
    size_t free_b = 0, total_b = 0;
    TOOL_CUDA(cudaMemGetInfo(&free_b, &total_b));
    const size_t bytes = std::min<size_t>(size_t(4) << 30, free_b / 2 / 4096 * 4096);
    {
      DeviceBuffer buf(bytes), sink(16);
      TOOL_CUDA(cudaMemsetAsync(buf.get(), 0x5A, bytes, stream));
      TOOL_CUDA(cudaMemsetAsync(sink.get(), 0, 16, stream));
      const int grid = read_stream_grid(device);
      const double s = best_seconds(stream, [&] { launch_read_stream(buf.get(), bytes, sink.as<unsigned>(), grid, stream); });
      c.read_tbs = bytes / s / 1e12;
      // Copy: first half → second half.
      const size_t half = bytes / 2 / 4096 * 4096;
      const double sc = best_seconds(stream, [&] {
        TOOL_CUDA(cudaMemcpyAsync(static_cast<char*>(buf.get()) + half, buf.get(), half, cudaMemcpyDeviceToDevice, stream));
      });
      c.copy_tbs = 2.0 * half / sc / 1e12;
      detail << "read: " << bytes / double(1 << 30) << " GiB, 16-byte loads, 4 in flight/thread, grid " << grid
             << " x 256; copy: cudaMemcpyAsync " << half / double(1 << 30) << " GiB (read+written counted); ";
    }
    c.bf16_tflops = gemm_bf16_tflops(stream);
    c.fp8_tflops = gemm_fp8_tflops(stream);
    detail << "GEMMs 8192^3 (cuBLAS bf16→bf16, cuBLASLt e4m3 TN→bf16, fp32 accumulate); best of " << kReps
           << " after " << kWarmup << " warm-up; SM clock from clock64() spin on every SM";
  } catch (...) {
    (void)cudaStreamDestroy(stream);
    throw;
  }
  TOOL_CUDA(cudaStreamDestroy(stream));
  c.detail = detail.str();
  return c;
}

}  // namespace fp4moe::cli
