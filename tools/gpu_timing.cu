// Device buffers, GPU facts, the shared device helpers, L2 flushing and CUDA-graph timing.
// See gpu.h and gpu_kernels.h.
#include <algorithm>
#include <cstring>

#include "cuda_check.h"
#include "gpu.h"
#include "gpu_kernels.h"
#include "points.h"

namespace fp4moe::cli {

// ---- buffers and facts ------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) TOOL_CUDA(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) (void)cudaFree(ptr_);  // never throw from a destructor
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) (void)cudaFree(ptr_);
    ptr_ = o.ptr_, bytes_ = o.bytes_;
    o.ptr_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  if (offset + bytes > bytes_) throw CudaError("upload", "upload past the end of a device buffer");
  if (bytes) TOOL_CUDA(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) throw CudaError("download", "download past the end of a device buffer");
  if (bytes) TOOL_CUDA(cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

DeviceInputs upload_inputs(const std::vector<uint16_t>& x, const std::vector<int32_t>& ids,
                           const std::vector<float>& w, int64_t tokens_per_set, int hidden, int top_k) {
  DeviceInputs d;
  d.tokens = tokens_per_set, d.hidden = hidden, d.top_k = top_k;
  d.x = DeviceBuffer(x.size() * 2);
  d.x.upload(x.data(), x.size() * 2);
  d.ids = DeviceBuffer(ids.size() * 4);
  d.ids.upload(ids.data(), ids.size() * 4);
  d.w = DeviceBuffer(w.size() * 4);
  d.w.upload(w.data(), w.size() * 4);
  d.out = DeviceBuffer(size_t(tokens_per_set) * hidden * 2);
  d.poison_out();
  return d;
}

void DeviceInputs::poison_out() const {
  const std::vector<uint16_t> poison(out.bytes() / 2, testkit::kPoisonBF16);
  TOOL_CUDA(cudaMemcpy(out.get(), poison.data(), out.bytes(), cudaMemcpyHostToDevice));
}

GpuFacts gpu_facts(int device) {
  cudaDeviceProp p;
  TOOL_CUDA(cudaGetDeviceProperties(&p, device));
  GpuFacts f;
  f.name = p.name;
  f.cc_major = p.major, f.cc_minor = p.minor;
  f.memory_gib = p.totalGlobalMem / double(1 << 30);
  // CUDA 13 dropped the clock fields from cudaDeviceProp: read them as attributes (kHz).
  int khz = 0, l2 = 0;
  TOOL_CUDA(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, device));
  TOOL_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  TOOL_CUDA(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  f.sm_clock_max_mhz = khz / 1000;
  TOOL_CUDA(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device));
  f.mem_clock_mhz = khz / 1000;
  TOOL_CUDA(cudaDeviceGetAttribute(&f.bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  f.l2_bytes = static_cast<size_t>(l2);
  f.l2_mib = l2 / double(1 << 20);
  return f;
}

// ---- device helpers ---------------------------------------------------------------------------

namespace {

constexpr int kStreamThreads = 256;
constexpr int kStreamUnroll = 4;  // 16-byte loads in flight per thread

__global__ void read_stream_kernel(const uint4* __restrict__ p, size_t n16, unsigned* sink) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t acc = 0;
  // Main loop: kStreamUnroll independent loads issued before any is consumed.
  for (; i + (kStreamUnroll - 1) * stride < n16; i += kStreamUnroll * stride) {
    uint4 v[kStreamUnroll];
#pragma unroll
    for (int u = 0; u < kStreamUnroll; ++u) v[u] = __ldg(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < kStreamUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) atomicAdd(sink, 1u);
}

__device__ __forceinline__ uint64_t hash64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_bf16_kernel(uint16_t* p, size_t n, float scale, uint64_t seed) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    // 24 random bits → u in (0, 1) → [-scale, scale]; never exactly zero.
    const float u = (static_cast<float>(hash64(seed ^ (i * 0xD6E8FEB86659FD93ull)) >> 40) + 0.5f) * (1.0f / 16777216.0f);
    const float v = scale * (2.0f * u - 1.0f);
    uint32_t b = __float_as_uint(v);
    b += 0x7FFFu + ((b >> 16) & 1u);  // round to nearest even
    p[i] = static_cast<uint16_t>(b >> 16);
  }
}

__global__ void fill_e4m3_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    // Exponent field kept in [4, 9] (magnitudes 2^-3 .. 2^2): no NaN (0x7F), no huge sums.
    const uint64_t h = hash64(seed ^ (i * 0xD6E8FEB86659FD93ull));
    const uint8_t sign = static_cast<uint8_t>((h >> 8) & 0x80u), mant = static_cast<uint8_t>(h & 7u);
    const uint8_t exp = static_cast<uint8_t>(4 + (h >> 16) % 6);
    p[i] = static_cast<uint8_t>(sign | (exp << 3) | mant);
  }
}

int fill_grid(size_t n) { return static_cast<int>(std::min<size_t>((n + 255) / 256, 65536)); }

}  // namespace

void launch_read_stream(const void* p, size_t bytes, unsigned* sink, int grid, cudaStream_t stream) {
  read_stream_kernel<<<grid, kStreamThreads, 0, stream>>>(static_cast<const uint4*>(p), bytes / 16, sink);
  TOOL_CUDA_LAUNCH("read_stream_kernel");
}

int read_stream_grid(int device) {
  int per_sm = 0, sms = 0;
  TOOL_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, read_stream_kernel, kStreamThreads, 0));
  TOOL_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return std::max(1, std::min(per_sm, 8)) * sms;
}

void launch_fill_bf16(void* p, size_t count, float scale, uint64_t seed, cudaStream_t stream) {
  if (!count) return;
  fill_bf16_kernel<<<fill_grid(count), 256, 0, stream>>>(static_cast<uint16_t*>(p), count, scale, seed);
  TOOL_CUDA_LAUNCH("fill_bf16_kernel");
}

void launch_fill_e4m3(void* p, size_t count, uint64_t seed, cudaStream_t stream) {
  if (!count) return;
  fill_e4m3_kernel<<<fill_grid(count), 256, 0, stream>>>(static_cast<uint8_t*>(p), count, seed);
  TOOL_CUDA_LAUNCH("fill_e4m3_kernel");
}

// ---- L2 flush and graph timing ----------------------------------------------------------------

L2Flusher::L2Flusher(size_t l2_bytes) {
  const size_t bytes = ((4 * std::max<size_t>(l2_bytes, 1 << 20)) + 4095) / 4096 * 4096;
  buffer_ = DeviceBuffer(bytes);
  sink_ = DeviceBuffer(16);
  TOOL_CUDA(cudaMemset(buffer_.get(), 0x5A, bytes));
  TOOL_CUDA(cudaMemset(sink_.get(), 0, 16));
  int device = 0;
  TOOL_CUDA(cudaGetDevice(&device));
  grid_ = read_stream_grid(device);
}

void L2Flusher::enqueue(CUstream_st* stream) const {
  launch_read_stream(buffer_.get(), buffer_.bytes(), sink_.as<unsigned>(), grid_, stream);
}

namespace {

// A CUDA graph captured from `record(stream)`, destroyed with the object.
class Graph {
 public:
  Graph(const std::function<void(cudaStream_t)>& record, cudaStream_t stream) {
    TOOL_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      record(stream);
    } catch (...) {
      cudaGraph_t g = nullptr;
      (void)cudaStreamEndCapture(stream, &g);  // leave the stream usable
      if (g) (void)cudaGraphDestroy(g);
      (void)cudaGetLastError();
      throw;
    }
    TOOL_CUDA(cudaStreamEndCapture(stream, &graph_));
    TOOL_CUDA(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  ~Graph() {
    if (exec_) (void)cudaGraphExecDestroy(exec_);
    if (graph_) (void)cudaGraphDestroy(graph_);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void launch(cudaStream_t stream) const { TOOL_CUDA(cudaGraphLaunch(exec_, stream)); }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Events created and destroyed together.
class EventPool {
 public:
  explicit EventPool(size_t n) : events_(n, nullptr) {
    for (auto& e : events_) TOOL_CUDA(cudaEventCreate(&e));
  }
  ~EventPool() {
    for (auto e : events_)
      if (e) (void)cudaEventDestroy(e);
  }
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

}  // namespace

Timing time_graphs(const std::function<void(CUstream_st*, int)>& body, int sets, int warmup, int iters,
                   const L2Flusher& flusher, CUstream_st* stream) {
  const Graph flush_only([&](cudaStream_t s) { flusher.enqueue(s); }, stream);
  std::vector<std::unique_ptr<Graph>> graphs;
  for (int set = 0; set < sets; ++set)
    graphs.push_back(std::make_unique<Graph>(
        [&](cudaStream_t s) {
          flusher.enqueue(s);
          body(s, set);
        },
        stream));

  for (int w = 0; w < warmup; ++w) {
    flush_only.launch(stream);
    for (const auto& g : graphs) g->launch(stream);
  }
  TOOL_CUDA(cudaStreamSynchronize(stream));

  // Event pairs: [4i, 4i+1] around a flush-only replay, [4i+2, 4i+3] around a flush+body replay.
  // Everything is queued before the one synchronisation, so the GPU never waits on the host.
  const EventPool ev(4 * static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    TOOL_CUDA(cudaEventRecord(ev[4 * i], stream));
    flush_only.launch(stream);
    TOOL_CUDA(cudaEventRecord(ev[4 * i + 1], stream));
    TOOL_CUDA(cudaEventRecord(ev[4 * i + 2], stream));
    graphs[timed_replay_set(i, sets)]->launch(stream);
    TOOL_CUDA(cudaEventRecord(ev[4 * i + 3], stream));
  }
  TOOL_CUDA(cudaStreamSynchronize(stream));

  std::vector<double> flush_us(iters), total_us(iters);
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    TOOL_CUDA(cudaEventElapsedTime(&ms, ev[4 * i], ev[4 * i + 1]));
    flush_us[i] = 1e3 * ms;
    TOOL_CUDA(cudaEventElapsedTime(&ms, ev[4 * i + 2], ev[4 * i + 3]));
    total_us[i] = 1e3 * ms;
  }
  Timing t;
  t.flush_us = median(flush_us);
  std::vector<double> call_us(iters);
  for (int i = 0; i < iters; ++i) call_us[i] = total_us[i] - t.flush_us;
  t.median_us = median(call_us);
  t.min_us = *std::min_element(call_us.begin(), call_us.end());
  t.max_us = *std::max_element(call_us.begin(), call_us.end());
  t.iters = iters;
  t.sets = sets;
  return t;
}

}  // namespace fp4moe::cli
