// EpMoeLayer: one MoE layer across the ranks of an NCCL communicator (fp4moe/ep.h says what and why).
//
// Host synchronisation points (everything else is stream-ordered on the caller's stream):
//   - the constructor: all-gather of every rank's expert range and layer shape;
//   - run() with all-gather + reduce-scatter (or kAuto) and no tokens_per_rank: all-gather of the
//     token counts, the host waits to learn T_max;
//   - run() with all-to-all: all-gather of the count matrix, the host waits to size send/recv.
#include <nccl.h>

#include <algorithm>
#include <array>
#include <optional>
#include <vector>

#include "ep/launch_ep.h"
#include "fp4moe/ep.h"
#include "fp4moe/errors.h"
#include "host/cuda_check.h"
#include "host/prepared.h"
#include "host/run_args.h"

#define FP4MOE_NCCL_CHECK(call)                                                                             \
  do {                                                                                                      \
    const ncclResult_t fp4moe_nccl_ = (call);                                                               \
    if (fp4moe_nccl_ != ncclSuccess)                                                                        \
      throw ::fp4moe::CudaError(#call, ::fp4moe::detail::concat(#call, ": ", ncclGetErrorString(fp4moe_nccl_), \
                                                                " (", ncclGetLastError(nullptr), ") at ",   \
                                                                __FILE__, ":", __LINE__));                  \
  } while (0)

namespace fp4moe {
namespace {

using gpu::DeviceBuffer;
using gpu::DeviceGuard;

// ncclGroupStart/End; a group left by an exception is still closed.
class NcclGroup {
 public:
  NcclGroup() { FP4MOE_NCCL_CHECK(ncclGroupStart()); }
  void end() {
    open_ = false;
    FP4MOE_NCCL_CHECK(ncclGroupEnd());
  }
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

 private:
  bool open_ = true;
};

// Page-locked host memory for the count exchanges.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes) { FP4MOE_CUDA_CHECK(cudaMallocHost(&p_, bytes)); }
  ~PinnedBuffer() {
    if (p_) (void)cudaFreeHost(p_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  template <typename T>
  T* get() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
};

class OwnedStream {
 public:
  OwnedStream() { FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~OwnedStream() { (void)cudaStreamDestroy(s_); }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};


// What every rank tells the others at construction.
enum Field { kFirst, kCount, kExperts, kHidden, kInter, kTopK, kFormat, kMode, kAct, kBias, kMaxTokens, kFields };

}  // namespace

struct EpMoeLayer::Impl {
  ncclComm_t comm = nullptr;
  int rank = 0, world = 1, device = 0;
  MoeConfig config;
  EpOptions options;
  std::vector<ExpertRange> ranges;
  int64_t max_tokens_all = 0;  // the largest max_tokens of any rank
  int64_t max_recv = 0;        // all-to-all: routed rows one rank may receive
  EpTraffic traffic;
  size_t bytes = 0;

  std::optional<MoeRunner> ag_runner, a2a_runner;
  // all-gather + reduce-scatter: gathered x, ids, weights; the fused MoE's fp32 output; the rank's sum.
  DeviceBuffer ag_x, ag_ids, ag_w, ag_y, ag_rs;
  // all-to-all.
  DeviceBuffer owner, block_counts, block_offsets, count_matrix, send_base, route_pos, send_route, send_id, send_w,
      send_x, recv_x, recv_id, recv_w, recv_y, back;
  DeviceBuffer tokens_dev;  // int64 [world]: the token count exchange
  PinnedBuffer host_counts;  // int64 [world · world]

  DeviceBuffer alloc(size_t b, const char* what) {
    bytes += b;
    return DeviceBuffer(b, what);
  }

  // Every rank's T (index = rank): the caller's, or all-gathered (the host waits).
  std::vector<int64_t> tokens_per_rank(int64_t T, std::span<const int64_t> given, cudaStream_t s) {
    if (!given.empty()) return {given.begin(), given.end()};
    int64_t* d = tokens_dev.get<int64_t>();
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(d + rank, &T, sizeof(int64_t), cudaMemcpyHostToDevice, s));
    FP4MOE_NCCL_CHECK(ncclAllGather(d + rank, d, 1, ncclInt64, comm, s));
    FP4MOE_CUDA_CHECK(
        cudaMemcpyAsync(host_counts.get<int64_t>(), d, world * sizeof(int64_t), cudaMemcpyDeviceToHost, s));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
    return {host_counts.get<int64_t>(), host_counts.get<int64_t>() + world};
  }

  void run_allgather(const void* x, const void* ids, IndexType it, const float* w, void* out, int64_t T,
                     int64_t Tmax, cudaStream_t s);
  void run_alltoall(const void* x, const void* ids, IndexType it, const float* w, void* out, int64_t T,
                    cudaStream_t s);
};

EpMoeLayer::EpMoeLayer(ncclComm_t comm, const MoeConfig& config, PreparedWeights weights, const EpOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  config.validate();
  FP4MOE_REQUIRE(static_cast<bool>(weights), InvalidArgument, "weights", "PreparedWeights is empty");
  FP4MOE_REQUIRE(comm != nullptr, InvalidArgument, "comm", "is null");
  FP4MOE_REQUIRE(options.max_tokens >= 1, InvalidArgument, "options.max_tokens", "must be at least 1, got ",
                 options.max_tokens);
  const int st = static_cast<int>(options.strategy);
  FP4MOE_REQUIRE(st >= 0 && st <= 2, InvalidArgument, "options.strategy",
                 "must be kAuto, kAllGatherReduceScatter or kAllToAll, got ", st);
  FP4MOE_REQUIRE(options.max_recv_routes == -1 || options.max_recv_routes >= 1, InvalidArgument,
                 "options.max_recv_routes", "must be -1 (every route) or at least 1, got ", options.max_recv_routes);
  FP4MOE_REQUIRE(weights.device() >= 0, Unsupported, "weights",
                 "the expert-parallel layer runs on GPUs; prepare the weights for a CUDA device, not the host");
  FP4MOE_REQUIRE(config.hidden % 8 == 0, Unsupported, "hidden", "the expert-parallel layer needs H % 8 == 0, got ",
                 config.hidden);

  FP4MOE_NCCL_CHECK(ncclCommCount(comm, &m.world));
  FP4MOE_NCCL_CHECK(ncclCommUserRank(comm, &m.rank));
  int comm_device = -1;
  FP4MOE_NCCL_CHECK(ncclCommCuDevice(comm, &comm_device));
  FP4MOE_REQUIRE(comm_device == weights.device(), InvalidArgument, "comm", "is on device ", comm_device,
                 " but the weights were prepared for device ", weights.device());
  m.comm = comm;
  m.device = comm_device;
  m.config = config;
  m.options = options;
  DeviceGuard guard(m.device);

  // Every rank's range and shape.
  {
    OwnedStream s;
    const int W = m.world;
    DeviceBuffer all(sizeof(int64_t) * kFields * W, "ep.construct");
    std::array<int64_t, kFields> mine{};
    mine[kFirst] = config.local_expert_first, mine[kCount] = config.local_count();
    mine[kExperts] = config.num_experts, mine[kHidden] = config.hidden, mine[kInter] = config.intermediate;
    mine[kTopK] = config.top_k, mine[kFormat] = static_cast<int>(config.format);
    mine[kMode] = static_cast<int>(config.mode), mine[kAct] = static_cast<int>(config.activation);
    mine[kBias] = config.has_bias, mine[kMaxTokens] = options.max_tokens;
    int64_t* d = all.get<int64_t>();
    FP4MOE_CUDA_CHECK(
        cudaMemcpyAsync(d + kFields * m.rank, mine.data(), sizeof mine, cudaMemcpyHostToDevice, s.get()));
    FP4MOE_NCCL_CHECK(ncclAllGather(d + kFields * m.rank, d, kFields, ncclInt64, comm, s.get()));
    std::vector<int64_t> h(kFields * W);
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, h.size() * sizeof(int64_t), cudaMemcpyDeviceToHost, s.get()));
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    static const char* names[kFields] = {"local_expert_first", "local_expert_count", "num_experts", "hidden",
                                         "intermediate", "top_k", "format", "mode", "activation", "has_bias",
                                         "max_tokens"};
    for (int r = 0; r < W; ++r) {
      for (int f = kExperts; f <= kBias; ++f)
        FP4MOE_REQUIRE(h[kFields * r + f] == h[f], InvalidArgument, "config", "rank ", r, " has ", names[f], "=",
                       h[kFields * r + f], " but rank 0 has ", h[f], " (every rank must run the same layer)");
      m.ranges.push_back({static_cast<int>(h[kFields * r + kFirst]), static_cast<int>(h[kFields * r + kCount])});
      m.max_tokens_all = std::max(m.max_tokens_all, h[kFields * r + kMaxTokens]);
    }
    validate_expert_ranges(config.num_experts, m.ranges);
  }

  const int W = m.world, H = config.hidden, K = config.top_k;
  const bool want_ag = options.strategy != EpStrategy::kAllToAll;
  // kAuto picks all-to-all only where choose_ep_strategy can return it.
  const bool want_a2a = options.strategy == EpStrategy::kAllToAll ||
                        (options.strategy == EpStrategy::kAuto && W > 1 && K < W);
  m.tokens_dev = m.alloc(sizeof(int64_t) * W, "ep.tokens");
  m.host_counts = PinnedBuffer(sizeof(int64_t) * W * W);

  if (want_ag) {
    const int64_t Tg = W * m.max_tokens_all;
    MoeConfig c = config;
    c.output_dtype = OutputDType::kFP32;  // summed across ranks in fp32, rounded once (ep.h)
    RunnerOptions ro;
    ro.max_tokens = Tg;
    ro.backend = options.backend;
    ro.deterministic = options.deterministic;
    m.ag_runner.emplace(c, weights, ro);
    m.bytes += m.ag_runner->workspace_bytes();
    m.ag_x = m.alloc(Tg * H * 2, "ep.ag_x");
    m.ag_ids = m.alloc(Tg * K * 4, "ep.ag_ids");
    m.ag_w = m.alloc(Tg * K * 4, "ep.ag_w");
    m.ag_y = m.alloc(Tg * H * 4, "ep.ag_y");
    m.ag_rs = m.alloc(m.max_tokens_all * H * 4, "ep.ag_rs");
  }
  if (want_a2a) {
    m.max_recv = options.max_recv_routes > 0 ? options.max_recv_routes : W * m.max_tokens_all * K;
    // One route per row: the same weights under a config with top_k 1 (the device layouts do not
    // depend on top_k; the canonical host copy is not needed on the GPU).
    MoeConfig c1 = config;
    c1.top_k = 1;
    c1.output_dtype = OutputDType::kFP32;
    auto impl = std::make_shared<PreparedWeights::Impl>();
    impl->config = weights.config();
    impl->config.top_k = 1;
    impl->device = weights.device();
    impl->dev = weights.impl().dev;
    RunnerOptions ro;
    ro.max_tokens = m.max_recv;
    ro.backend = options.backend;
    ro.deterministic = options.deterministic;
    try {
      m.a2a_runner.emplace(c1, PreparedWeights(std::move(impl)), ro);
    } catch (const CapacityError& e) {
      throw CapacityError("options.max_recv_routes",
                          detail::concat("options.max_recv_routes: ", m.max_recv,
                                         " received rows do not fit the fused MoE's workspace: ", e.what()));
    }
    m.bytes += m.a2a_runner->workspace_bytes();
    const int64_t routes = options.max_tokens * K;
    const int64_t blocks = ep::a2a_blocks(routes);
    std::vector<int> owner(config.num_experts);
    for (int r = 0; r < W; ++r)
      for (int e = m.ranges[r].first; e < m.ranges[r].first + m.ranges[r].count; ++e) owner[e] = r;
    m.owner = m.alloc(owner.size() * sizeof(int), "ep.owner");
    FP4MOE_CUDA_CHECK(cudaMemcpy(m.owner.get(), owner.data(), owner.size() * sizeof(int), cudaMemcpyHostToDevice));
    m.block_counts = m.alloc(std::max<int64_t>(blocks, 1) * W * sizeof(int), "ep.block_counts");
    m.block_offsets = m.alloc(std::max<int64_t>(blocks, 1) * W * sizeof(int), "ep.block_offsets");
    m.count_matrix = m.alloc(sizeof(int64_t) * W * W, "ep.count_matrix");
    m.send_base = m.alloc(sizeof(int) * (W + 1), "ep.send_base");
    m.route_pos = m.alloc(routes * sizeof(int), "ep.route_pos");
    m.send_route = m.alloc(routes * sizeof(int), "ep.send_route");
    m.send_id = m.alloc(routes * sizeof(int32_t), "ep.send_id");
    m.send_w = m.alloc(routes * sizeof(float), "ep.send_w");
    m.send_x = m.alloc(routes * H * 2, "ep.send_x");
    m.back = m.alloc(routes * H * 4, "ep.back");
    m.recv_x = m.alloc(m.max_recv * H * 2, "ep.recv_x");
    m.recv_id = m.alloc(m.max_recv * sizeof(int32_t), "ep.recv_id");
    m.recv_w = m.alloc(m.max_recv * sizeof(float), "ep.recv_w");
    m.recv_y = m.alloc(m.max_recv * H * 4, "ep.recv_y");
  }
}

EpMoeLayer::~EpMoeLayer() = default;
EpMoeLayer::EpMoeLayer(EpMoeLayer&&) noexcept = default;
EpMoeLayer& EpMoeLayer::operator=(EpMoeLayer&&) noexcept = default;

int EpMoeLayer::rank() const { return impl_->rank; }
int EpMoeLayer::world_size() const { return impl_->world; }
int EpMoeLayer::device() const { return impl_->device; }
const MoeConfig& EpMoeLayer::config() const { return impl_->config; }
const EpOptions& EpMoeLayer::options() const { return impl_->options; }
const std::vector<ExpertRange>& EpMoeLayer::expert_ranges() const { return impl_->ranges; }
const EpTraffic& EpMoeLayer::last_traffic() const { return impl_->traffic; }
size_t EpMoeLayer::workspace_bytes() const { return impl_->bytes; }

void EpMoeLayer::run(const void* x, const void* ids, IndexType it, const float* w, void* out, int64_t T,
                     CUstream_st* stream, std::span<const int64_t> tokens_per_rank) {
  Impl& m = *impl_;
  FP4MOE_REQUIRE(T >= 0 && T <= m.options.max_tokens, CapacityError, "num_tokens", "must be in [0, max_tokens=",
                 m.options.max_tokens, "], got ", T);
  validate_run_args(x, ids, it, w, out, T);
  if (!tokens_per_rank.empty()) {
    FP4MOE_REQUIRE(static_cast<int>(tokens_per_rank.size()) == m.world, InvalidArgument, "tokens_per_rank",
                   "has ", tokens_per_rank.size(), " entries for a world of ", m.world);
    FP4MOE_REQUIRE(tokens_per_rank[m.rank] == T, InvalidArgument, "tokens_per_rank", "entry ", m.rank,
                   " (this rank) is ", tokens_per_rank[m.rank], " but num_tokens is ", T);
    for (int r = 0; r < m.world; ++r)
      FP4MOE_REQUIRE(tokens_per_rank[r] >= 0 && tokens_per_rank[r] <= m.max_tokens_all, InvalidArgument,
                     "tokens_per_rank", "entry ", r, " is ", tokens_per_rank[r], ", outside [0, ", m.max_tokens_all,
                     "]");
  }
  DeviceGuard guard(m.device);
  cudaStream_t s = stream;
  if (m.options.strategy == EpStrategy::kAllToAll) {
    m.run_alltoall(x, ids, it, w, out, T, s);
    if (!tokens_per_rank.empty())
      m.traffic.max_tokens_per_rank = *std::max_element(tokens_per_rank.begin(), tokens_per_rank.end());
    return;
  }
  const std::vector<int64_t> counts = m.tokens_per_rank(T, tokens_per_rank, s);
  const int64_t Tmax = *std::max_element(counts.begin(), counts.end());
  EpStrategy strategy = m.options.strategy;
  if (strategy == EpStrategy::kAuto) strategy = choose_ep_strategy(m.world, m.config.top_k, Tmax);
  if (strategy == EpStrategy::kAllToAll) m.run_alltoall(x, ids, it, w, out, T, s);
  else m.run_allgather(x, ids, it, w, out, T, Tmax, s);
  m.traffic.max_tokens_per_rank = Tmax;
}

void EpMoeLayer::Impl::run_allgather(const void* x, const void* ids, IndexType it, const float* w, void* out,
                                     int64_t T, int64_t Tmax, cudaStream_t s) {
  const int H = config.hidden, K = config.top_k, W = world;
  traffic = {};
  traffic.strategy = EpStrategy::kAllGatherReduceScatter;
  if (Tmax == 0) return;  // every rank sees the same counts: nobody calls a collective
  (void)ag_runner->plan(W * Tmax);  // a forced backend that cannot run throws here, on every rank alike
  uint16_t* gx = ag_x.get<uint16_t>();
  int32_t* gids = ag_ids.get<int32_t>();
  float* gw = ag_w.get<float>();
  uint16_t* slot_x = gx + rank * Tmax * H;
  if (T > 0) FP4MOE_CUDA_CHECK(cudaMemcpyAsync(slot_x, x, T * H * 2, cudaMemcpyDeviceToDevice, s));
  if (T < Tmax) FP4MOE_CUDA_CHECK(cudaMemsetAsync(slot_x + T * H, 0, (Tmax - T) * H * 2, s));
  ep::launch_ag_pack(ids, it, w, T * K, Tmax * K, config.num_experts, gids + rank * Tmax * K, gw + rank * Tmax * K, s);
  {
    NcclGroup g;
    FP4MOE_NCCL_CHECK(ncclAllGather(slot_x, gx, Tmax * H * 2, ncclUint8, comm, s));
    FP4MOE_NCCL_CHECK(ncclAllGather(gids + rank * Tmax * K, gids, Tmax * K, ncclInt32, comm, s));
    FP4MOE_NCCL_CHECK(ncclAllGather(gw + rank * Tmax * K, gw, Tmax * K, ncclFloat32, comm, s));
    g.end();
  }
  ag_runner->run(gx, gids, IndexType::kInt32, gw, ag_y.get(), W * Tmax, s);
  const bool out_fp32 = config.output_dtype == OutputDType::kFP32;
  float* sum = (out_fp32 && T == Tmax) ? static_cast<float*>(out) : ag_rs.get<float>();
  FP4MOE_NCCL_CHECK(ncclReduceScatter(ag_y.get(), sum, Tmax * H, ncclFloat32, ncclSum, comm, s));
  if (sum != out && T > 0) {
    if (out_fp32) FP4MOE_CUDA_CHECK(cudaMemcpyAsync(out, sum, T * H * 4, cudaMemcpyDeviceToDevice, s));
    else ep::launch_cast_out(sum, out, T * H, s);
  }
  const int64_t others = W - 1;
  traffic.dispatch_sent = traffic.dispatch_received = others * Tmax * (int64_t{H} * 2 + int64_t{K} * 8);
  traffic.combine_sent = traffic.combine_received = others * Tmax * int64_t{H} * 4;
  traffic.rows_computed = W * Tmax;
}

void EpMoeLayer::Impl::run_alltoall(const void* x, const void* ids, IndexType it, const float* w, void* out,
                                    int64_t T, cudaStream_t s) {
  const int H = config.hidden, K = config.top_k, W = world;
  traffic = {};
  traffic.strategy = EpStrategy::kAllToAll;
  traffic.max_tokens_per_rank = -1;
  int64_t* cm = count_matrix.get<int64_t>();
  ep::A2aPack p{x, ids, it, w, T, K, H, config.num_experts, W, owner.get<int>(), block_counts.get<int>(),
                block_offsets.get<int>(), cm + int64_t{rank} * W, send_base.get<int>(), route_pos.get<int>(),
                send_route.get<int>(), send_id.get<int32_t>(), send_w.get<float>(), send_x.get()};
  ep::launch_a2a_pack(p, s);
  FP4MOE_NCCL_CHECK(ncclAllGather(cm + int64_t{rank} * W, cm, W, ncclInt64, comm, s));
  FP4MOE_CUDA_CHECK(
      cudaMemcpyAsync(host_counts.get<int64_t>(), cm, sizeof(int64_t) * W * W, cudaMemcpyDeviceToHost, s));
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s));
  const int64_t* M = host_counts.get<int64_t>();  // M[p·W + q]: rows rank p sends to rank q

  // Every rank checks every rank's capacity, so all of them throw alike (nobody is left waiting).
  int64_t most = 0;
  for (int q = 0; q < W; ++q) {
    int64_t r = 0;
    for (int p2 = 0; p2 < W; ++p2) r += M[int64_t{p2} * W + q];
    FP4MOE_REQUIRE(r <= max_recv, CapacityError, "options.max_recv_routes", "rank ", q, " would receive ", r,
                   " routed rows, more than max_recv_routes=", max_recv);
    most = std::max(most, r);
  }
  if (most > 0) (void)a2a_runner->plan(most);  // a forced backend that cannot run throws on every rank
  std::vector<int64_t> sc(W), so(W + 1, 0), rc(W), ro(W + 1, 0);
  for (int q = 0; q < W; ++q) {
    sc[q] = M[int64_t{rank} * W + q];
    rc[q] = M[int64_t{q} * W + rank];
    so[q + 1] = so[q] + sc[q];
    ro[q + 1] = ro[q] + rc[q];
  }
  const int64_t R = ro[W];

  // Dispatch: x rows, ids, weights, each destination's rows to it; our own by copy.
  uint16_t* sx = send_x.get<uint16_t>();
  uint16_t* rx = recv_x.get<uint16_t>();
  int32_t *sid = send_id.get<int32_t>(), *rid = recv_id.get<int32_t>();
  float *sw = send_w.get<float>(), *rw = recv_w.get<float>();
  if (sc[rank] > 0) {
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(rx + ro[rank] * H, sx + so[rank] * H, sc[rank] * H * 2,
                                      cudaMemcpyDeviceToDevice, s));
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(rid + ro[rank], sid + so[rank], sc[rank] * 4, cudaMemcpyDeviceToDevice, s));
    FP4MOE_CUDA_CHECK(cudaMemcpyAsync(rw + ro[rank], sw + so[rank], sc[rank] * 4, cudaMemcpyDeviceToDevice, s));
  }
  if (W > 1) {
    NcclGroup g;
    for (int q = 0; q < W; ++q) {
      if (q == rank) continue;
      if (sc[q] > 0) {
        FP4MOE_NCCL_CHECK(ncclSend(sx + so[q] * H, sc[q] * H * 2, ncclUint8, q, comm, s));
        FP4MOE_NCCL_CHECK(ncclSend(sid + so[q], sc[q], ncclInt32, q, comm, s));
        FP4MOE_NCCL_CHECK(ncclSend(sw + so[q], sc[q], ncclFloat32, q, comm, s));
      }
      if (rc[q] > 0) {
        FP4MOE_NCCL_CHECK(ncclRecv(rx + ro[q] * H, rc[q] * H * 2, ncclUint8, q, comm, s));
        FP4MOE_NCCL_CHECK(ncclRecv(rid + ro[q], rc[q], ncclInt32, q, comm, s));
        FP4MOE_NCCL_CHECK(ncclRecv(rw + ro[q], rc[q], ncclFloat32, q, comm, s));
      }
    }
    g.end();
  }

  // The fused MoE on the received rows: one route each, fp32 w · FC2(...).
  float* ry = recv_y.get<float>();
  if (R > 0) a2a_runner->run(rx, rid, IndexType::kInt32, rw, ry, R, s);

  // Results back to where the rows came from.
  float* bk = back.get<float>();
  if (sc[rank] > 0)
    FP4MOE_CUDA_CHECK(
        cudaMemcpyAsync(bk + so[rank] * H, ry + ro[rank] * H, sc[rank] * H * 4, cudaMemcpyDeviceToDevice, s));
  if (W > 1) {
    NcclGroup g;
    for (int q = 0; q < W; ++q) {
      if (q == rank) continue;
      if (rc[q] > 0) FP4MOE_NCCL_CHECK(ncclSend(ry + ro[q] * H, rc[q] * H, ncclFloat32, q, comm, s));
      if (sc[q] > 0) FP4MOE_NCCL_CHECK(ncclRecv(bk + so[q] * H, sc[q] * H, ncclFloat32, q, comm, s));
    }
    g.end();
  }
  ep::launch_a2a_combine(bk, route_pos.get<int>(), T, K, H, out, config.output_dtype == OutputDType::kFP32, s);

  for (int q = 0; q < W; ++q) {
    if (q == rank) continue;
    traffic.dispatch_sent += sc[q] * (int64_t{H} * 2 + 8);
    traffic.dispatch_received += rc[q] * (int64_t{H} * 2 + 8);
    traffic.combine_sent += rc[q] * int64_t{H} * 4;
    traffic.combine_received += sc[q] * int64_t{H} * 4;
  }
  traffic.rows_computed = R;
}

std::vector<ncclComm_t> ep_init_local_comms(std::span<const int> devices) {
  FP4MOE_REQUIRE(!devices.empty(), InvalidArgument, "devices", "is empty");
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  std::vector<int> devs(devices.begin(), devices.end());
  FP4MOE_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(devs.size()), devs.data()));
  return comms;
}

void ep_destroy_comms(std::span<ncclComm_t> comms) {
  for (ncclComm_t& c : comms) {
    if (c) FP4MOE_NCCL_CHECK(ncclCommDestroy(c));
    c = nullptr;
  }
}

}  // namespace fp4moe
