// tools/gpu.h — the GPU side of the tool: device buffers, the hardware ceilings, L2 flushing and
// CUDA-graph timing, and the cuBLAS bf16 MoE peer. Implemented in ceilings.cu, gpu_timing.cu and
// peer_cublas.cu. Every function throws fp4moe::CudaError on a failed CUDA call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fp4moe/config.h"
#include "testing/problem.h"

struct CUstream_st;

namespace fp4moe::cli {

// cudaMalloc'ed bytes, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A problem's inputs on the device, and an output buffer of the same shape. With `sets` > 1 the
// problem holds sets × T tokens and set s is rows [s·T, (s+1)·T).
struct DeviceInputs {
  DeviceBuffer x, ids, w, out;  // [S·T, H] bf16, [S·T, K] int32, [S·T, K] fp32, [T, H] bf16
  int64_t tokens = 0;           // T per set
  int hidden = 0, top_k = 0;
  const void* x_set(int s) const { return x.as<char>() + size_t(s) * tokens * hidden * 2; }
  const void* ids_set(int s) const { return ids.as<char>() + size_t(s) * tokens * top_k * 4; }
  const float* w_set(int s) const { return reinterpret_cast<const float*>(w.as<char>() + size_t(s) * tokens * top_k * 4); }
  void poison_out() const;  // fill out with the testkit poison pattern (synchronous)
};
DeviceInputs upload_inputs(const std::vector<uint16_t>& x, const std::vector<int32_t>& ids,
                           const std::vector<float>& w, int64_t tokens_per_set, int hidden, int top_k);

// Facts about one GPU, for `info` and the run header.
struct GpuFacts {
  std::string name;
  int cc_major = 0, cc_minor = 0, sms = 0;
  double memory_gib = 0, l2_mib = 0;
  size_t l2_bytes = 0;
  int sm_clock_max_mhz = 0, mem_clock_mhz = 0, bus_bits = 0;
  double peak_dram_tbs() const { return 2.0 * mem_clock_mhz * 1e6 * bus_bits / 8 / 1e12; }
};
GpuFacts gpu_facts(int device);

// The ceilings of bench-protocol.md, measured in this process.
struct Ceilings {
  double read_tbs = 0;       // read-only streaming, 16-byte loads, 4 in flight per thread
  double copy_tbs = 0;       // cudaMemcpyAsync device to device, bytes read + written
  double bf16_tflops = 0;    // cuBLAS bf16 8192³
  double fp8_tflops = 0;     // cuBLASLt fp8 e4m3 8192³
  double sm_clock_mhz = 0;   // measured: clock64() cycles of a spin kernel on every SM / event time
  std::string detail;        // how each was measured (sizes, repetitions)
};
Ceilings measure_ceilings(int device);

// Evicts the weights from L2 before each timed call: a read-only kernel streaming an unrelated
// buffer of 4 × L2 bytes (reads leave no dirty lines whose write-back the next call would pay for).
class L2Flusher {
 public:
  explicit L2Flusher(size_t l2_bytes);
  void enqueue(CUstream_st* stream) const;
  size_t bytes() const { return buffer_.bytes(); }

 private:
  DeviceBuffer buffer_, sink_;
  int grid_ = 0;
};

// Times `body(stream, set)` (a capturable sequence of launches) by the protocol: one CUDA graph
// per input set holding [flush, body(set)], plus a graph holding [flush] alone. After `warmup`
// replays of each, `iters` replays alternate flush-only and flush+body graphs (sets round-robin),
// each bracketed by CUDA events. Time of a call = event time of its flush+body replay minus the
// median flush-only replay.
struct Timing {
  double median_us = 0, min_us = 0, max_us = 0;
  double flush_us = 0;  // median of the flush-only graph (subtracted)
  int iters = 0, sets = 0;
};
Timing time_graphs(const std::function<void(CUstream_st*, int)>& body, int sets, int warmup, int iters,
                   const L2Flusher& flusher, CUstream_st* stream);
// The input set that timed replay i (0 ≤ i < iters) of time_graphs runs; the bench takes the floor
// of the same sequence (fill_counts), so the two stay paired.
inline int timed_replay_set(int replay, int sets) { return replay % sets; }

// A bf16 MoE from cuBLAS (bench-protocol.md's peer): routing precomputed on the host per set
// (routes sorted by expert), then on the device: gather the routed rows, one cublasGemmEx per active
// expert for FC1 (bf16 in, bf16 out, fp32 accumulate), the gated activation, one cublasGemmEx per
// active expert for FC2, and a weighted sum of each token's K rows into out. Random bf16 weights of
// the layer's shape, allocated for the experts the sets reach only. No biases.
class CublasBf16Peer {
 public:
  // ids_sets[s], w_sets[s]: host [T, K] of set s; x_sets[s]: device [T, H] bf16; out: device [T, H].
  CublasBf16Peer(const MoeConfig& config, int64_t tokens, const std::vector<const int32_t*>& ids_sets,
                 const std::vector<const float*>& w_sets, const std::vector<const void*>& x_sets, void* out,
                 uint64_t seed);
  ~CublasBf16Peer();
  void enqueue(CUstream_st* stream, int set);  // capturable
  size_t weight_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe::cli
