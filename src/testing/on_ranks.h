// f(rank) for ranks 0..n-1, each on its own thread with its device current; the first exception
// (by rank) is rethrown. Shared by the expert-parallel tests and `fp4moe bench --ep`.
#pragma once

#include <cuda_runtime_api.h>

#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "fp4moe/errors.h"

namespace fp4moe::testkit {

template <typename F>
void on_ranks(int n, F f) {
  std::vector<std::exception_ptr> err(n);
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        const cudaError_t e = cudaSetDevice(r);
        if (e != cudaSuccess)
          throw CudaError("cudaSetDevice", "cudaSetDevice(" + std::to_string(r) + ") failed: " + cudaGetErrorName(e) +
                                               " (" + cudaGetErrorString(e) + ")");
        f(r);
      } catch (...) {
        err[r] = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

}  // namespace fp4moe::testkit
