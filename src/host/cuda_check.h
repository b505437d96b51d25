// Checking CUDA calls on the host: every failure becomes a CudaError naming the call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "fp4moe/errors.h"

#define FP4MOE_CUDA_CHECK(call)                                                                        \
  do {                                                                                                 \
    const cudaError_t fp4moe_err_ = (call);                                                            \
    if (fp4moe_err_ != cudaSuccess)                                                                    \
      throw ::fp4moe::CudaError(#call, ::fp4moe::detail::concat(#call, ": ", cudaGetErrorName(fp4moe_err_), \
                                                                " (", cudaGetErrorString(fp4moe_err_), ") at ", \
                                                                __FILE__, ":", __LINE__));             \
  } while (0)

// After a kernel launch: the launch itself (configuration) failed?
#define FP4MOE_CHECK_LAUNCH(name) FP4MOE_CUDA_CHECK((static_cast<void>(name), cudaGetLastError()))

namespace fp4moe::gpu {

// Makes `device` current for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    FP4MOE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) FP4MOE_CUDA_CHECK(cudaSetDevice(device));
    device_ = device;
  }
  ~DeviceGuard() {
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0, device_ = 0;
};

// An owned device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, const char* what) : bytes_(bytes) {
    if (bytes == 0) return;
    const cudaError_t e = cudaMalloc(&ptr_, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw CapacityError(what, detail::concat(what, ": cudaMalloc of ", bytes, " bytes failed: ", cudaGetErrorString(e)));
    }
  }
  ~DeviceBuffer() {
    if (ptr_) (void)cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <typename T = void>
  T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace fp4moe::gpu
