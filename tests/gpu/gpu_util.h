// Helpers for the GPU tests: skip without a GPU (visibly), device arrays, checked CUDA calls.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4moe/runner.h"

#define GPU_CHECK(call)                                                                          \
  do {                                                                                           \
    const cudaError_t e_ = (call);                                                               \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
  } while (0)

// Every GPU test starts with this: where there is no GPU the test is reported as SKIPPED with the
// reason, never as passed.
#define REQUIRE_GPU()                                                         \
  do {                                                                        \
    if (fp4moe::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped"; \
  } while (0)

namespace fp4moe::testgpu {

// Device 0 is a Hopper (sm_90) GPU: wgmma, and so the dynamic backend, can run there.
inline bool device_is_sm90() {
  int major = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess && major == 9;
}

// Tests of wgmma kernels (dynamic): skipped with the reason off sm_90.
#define REQUIRE_SM90()                                                                             \
  do {                                                                                             \
    REQUIRE_GPU();                                                                                 \
    if (!fp4moe::testgpu::device_is_sm90()) GTEST_SKIP() << "wgmma needs an sm_90 GPU: skipped"; \
  } while (0)

// A typed device array; copies in and out with checked calls (throwing, so usable in helpers).
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : n_(n) {
    if (n && cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
  }
  explicit DeviceArray(const std::vector<T>& h) : DeviceArray(h.size()) { upload(h); }
  ~DeviceArray() {
    if (p_) cudaFree(p_);
  }
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_), std::swap(n_, o.n_);
    return *this;
  }
  void upload(const std::vector<T>& h) {
    if (h.size() != n_) throw std::runtime_error("size mismatch");
    if (cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy H2D failed");
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy D2H failed");
    return h;
  }
  void fill_bytes(const void* pattern, size_t pattern_bytes) {
    std::vector<unsigned char> h(n_ * sizeof(T));
    for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<const unsigned char*>(pattern)[i % pattern_bytes];
    if (cudaMemcpy(p_, h.data(), h.size(), cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy H2D failed");
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// A CUDA graph captured from whatever `enqueue(stream)` launches on a fresh non-blocking stream;
// launch() replays it on that stream and waits. Throws on any CUDA failure.
class CapturedGraph {
 public:
  template <typename F>
  explicit CapturedGraph(F&& enqueue) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    enqueue(stream_);
    check(cudaStreamEndCapture(stream_, &graph_), "cudaStreamEndCapture");
    check(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  }
  ~CapturedGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch() {
    check(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace fp4moe::testgpu
