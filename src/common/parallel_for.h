// fn(i) for i in [0, n) on up to `threads` host threads (0: all hardware threads), the indices handed
// out one at a time from a shared counter (uneven tasks balance themselves). Used by the CPU
// reference, the host-side weight repacking (host/device_weights.cpp) and the test data generators.
// fn must not throw: an exception escaping a worker thread terminates the program.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace fp4moe {

template <class Fn>
void parallel_for(int64_t n, int threads, const Fn& fn) {
  if (n <= 0) return;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<int64_t>(threads, n));
  if (threads == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

}  // namespace fp4moe
