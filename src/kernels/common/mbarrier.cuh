// Shared-memory mbarriers (PTX ISA 9.7.13.15 "mbarrier") for producer/consumer pipelines inside one
// CTA, named barriers for sub-CTA groups, and a test-only watchdog that turns a pipeline deadlock
// into a report instead of a hung test suite.
//
// Phases: an mbarrier initialised with count n completes its current phase when n arrivals have
// been made, then starts the next phase. try_wait.parity(P) succeeds once the phase with parity P
// has completed; on a fresh barrier (phase 0 running) parity 1 counts as completed. So a pipeline
// step `it` over S stages uses stage it % S with phase parity (it / S) & 1: consumers wait "full"
// with that parity, producers wait "empty" with the opposite parity (their first round passes).
// arrive has release and try_wait acquire semantics at CTA scope (the defaults).
#pragma once

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace fp4moe::kernels::ptx {

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_addr(bar))
               : "memory");
}

// This thread's arrival, and `bytes` more transaction bytes that the phase waits for (bulk copies
// that complete_tx on this barrier, ptx::bulk_copy_g2s). Issue it before the copies it announces.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
                   smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

// One bounded wait (the hardware may suspend the thread for a while); true once the phase of
// parity `parity` has completed.
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// Barrier over `threads` threads (a multiple of 32) of the CTA with id 1..15 (0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Tests pass a watchdog so that a pipeline deadlock (a bug: wrong arrival counts or parities) fails
// the test instead of hanging the suite: every wait gives up after kWatchdogNs, the first thread of
// the CTA to give up raises `aborted` (shared) and every later wait of the CTA returns at once, so
// the kernel finishes and the first CTA of the grid to give up writes
//   report[0] = 1, [1] = block, [2] = thread, [3] = pipeline step, [4] = which barrier, [5] = parity.
// Without a report (production) waits are unbounded: a slow wait is not a deadlock. A 2 s limit
// once turned compute-sanitizer racecheck's slowdown into wrong results (a consumer gave up on
// "full" at step 0 while the instrumented producer was still copying), and preemption or
// time-slicing could do the same to a server: a hang is visible, a silently wrong answer is not.
// The limit is far above any wait of a correct kernel, even under the sanitizers.
// No printf: a function call anywhere in a kernel makes ptxas serialise all its wgmma.
inline constexpr uint64_t kWatchdogNs = 60'000'000'000ull;
inline constexpr int kWatchdogReportInts = 6;

struct Watchdog {
  int* aborted;  // shared, 0 at kernel start
  int* report;   // global [kWatchdogReportInts], zeroed by the caller (tests); null: no time limit
};

// A wait past kWatchdogNs: the CTA's aborted flag raised, and the grid's first such thread's report.
__device__ __forceinline__ void give_up(const Watchdog& wd, int what, int step, int parity) {
  if (atomicExch(wd.aborted, 1) == 0 && atomicCAS(wd.report, 0, 1) == 0) {
    wd.report[1] = static_cast<int>(blockIdx.x);
    wd.report[2] = static_cast<int>(threadIdx.x);
    wd.report[3] = step;
    wd.report[4] = what;
    wd.report[5] = parity;
  }
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity, const Watchdog& wd, int what, int step) {
  if (mbar_try_wait(bar, parity)) return;
  if (wd.report == nullptr) {
    while (!mbar_try_wait(bar, parity)) {
    }
    return;
  }
  const uint64_t t0 = globaltimer_ns();
  while (!mbar_try_wait(bar, parity)) {
    if (*static_cast<volatile int*>(wd.aborted)) return;
    if (globaltimer_ns() - t0 > kWatchdogNs) {
      give_up(wd, what, step, static_cast<int>(parity));
      return;
    }
  }
}

// Waits until *flag (global, raised by another CTA with release semantics) is non-zero, with acquire
// semantics at GPU scope; under a watchdog as mbar_wait (the report's parity field is 0).
__device__ __forceinline__ void flag_wait(const unsigned* flag, const Watchdog& wd, int what, int step) {
  if (ld_acquire_gpu(flag) != 0) return;
  const uint64_t t0 = wd.report ? globaltimer_ns() : 0;
  while (ld_acquire_gpu(flag) == 0) {
    __nanosleep(32);
    if (wd.report == nullptr) continue;
    if (*static_cast<volatile int*>(wd.aborted)) return;
    if (globaltimer_ns() - t0 > kWatchdogNs) {
      give_up(wd, what, step, 0);
      return;
    }
  }
}

}  // namespace fp4moe::kernels::ptx
