// fp4moe/ep.h — one MoE layer across the GPUs of an NCCL communicator (expert parallelism).
//
// Data-parallel attention, expert-parallel MoE: rank r holds its own T_r tokens (x, ids, weights)
// and a contiguous range of experts (MoeConfig's local range). EpMoeLayer::run() computes, for the
// rank's tokens, the same out[t] = Σ_j w[t,j] · FC2_e(act(FC1_e(Qin(x[t])))) as one MoeRunner over
// all experts would, with the experts' work done on the ranks that own them. Two strategies:
//
//   kAllGatherReduceScatter  every rank gathers every rank's tokens (ncclAllGather of x, ids,
//       weights; ranks with fewer tokens pad to the largest count T_max with id −1), runs the fused
//       MoE on all world·T_max tokens with its own experts (other routes add nothing), with fp32
//       output, and ncclReduceScatter (sum, fp32) hands each rank the sum of its T_max rows; a cast
//       kernel writes the rank's T rows in the config's output dtype. The sum is fp32 because a bf16
//       reduce-scatter rounds every partial sum (and every hop of the ring) to 8 bits of mantissa;
//       fp32 keeps one rounding, at the end — and makes a world of 1 bit-identical to MoeRunner (with
//       EpOptions::deterministic and RunnerOptions::deterministic both true past 4096 routes).
//       With tokens_per_rank given to run(), no host synchronisation: capturable in a CUDA graph.
//       Without it, the counts are all-gathered and the host waits for them.
//   kAllToAll  each rank sends every routed row (token, slot) only to the rank owning its expert
//       (x row bf16, expert id, router weight), the owner runs the fused MoE on the rows it received
//       (top_k 1: one route per row, fp32 output = w · FC2(...)), sends the per-route results back,
//       and the source sums them per token in slot order (from 0, in fp32, then one rounding) — the
//       very order MoeRunner's combine uses, so the result does not depend on the world size as long
//       as each route's value does not depend on the batch it is computed in. Row counts per
//       destination are exchanged first (ncclAllGather of the world × world count matrix) and the
//       host waits for them to size the ncclSend/ncclRecv: not capturable.
//   kAuto  resolved per call from the world size, top_k and the largest per-rank token count, the
//       same on every rank (choose_ep_strategy).
//
// Every rank must call run() for every layer call, also with T = 0 (the collectives need all).
// One process may drive several GPUs (ep_init_local_comms), but then each rank's calls must come
// from its own host thread: run() blocks on the host (count exchange) and NCCL collectives of one
// communicator clique issued one after another from a single thread would deadlock.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "fp4moe/config.h"
#include "fp4moe/runner.h"
#include "fp4moe/weights.h"

// ncclComm_t without including nccl.h (an identical typedef there is allowed).
typedef struct ncclComm* ncclComm_t;
struct CUstream_st;

namespace fp4moe {

enum class EpStrategy : int { kAuto, kAllGatherReduceScatter, kAllToAll };

std::string_view to_string(EpStrategy);
// "auto", "allgather" (or "ag", "allgather_reducescatter"), "alltoall" (or "a2a").
EpStrategy parse_ep_strategy(std::string_view s, const char* argument = "strategy");

// A rank's experts: [first, first + count).
struct ExpertRange {
  int first = 0, count = 0;
  bool operator==(const ExpertRange&) const = default;
};

// Contiguous, balanced ranges for world_size ranks: the first E % W ranks hold one expert more.
// Throws InvalidArgument when world_size < 1 or world_size > num_experts (a rank without experts).
std::vector<ExpertRange> split_experts(int num_experts, int world_size);

// The ranges of all ranks (index = rank) must be non-empty and cover [0, num_experts) exactly once;
// any order. Throws InvalidArgument naming the rank and the range.
void validate_expert_ranges(int num_experts, std::span<const ExpertRange> ranges);

// `layer` (a config over all experts) restricted to rank's range of split_experts(E, world_size).
MoeConfig ep_rank_config(const MoeConfig& layer, int world_size, int rank);

// kAuto's choice (deterministic, so every rank agrees): all-to-all when it moves fewer bytes
// (top_k < world_size: a route crosses to one rank instead of every token to every rank) and the
// routes are many enough (T_max·top_k ≥ 1024) for bandwidth rather than the host round trip of its
// count exchange to dominate; all-gather + reduce-scatter otherwise. A placeholder until measured
// on a multi-GPU machine (issue 7).
EpStrategy choose_ep_strategy(int world_size, int top_k, int64_t max_tokens_per_rank);

// Bytes this rank moved in the last run(), over NCCL to or from other ranks (copies to itself are
// not counted). Logical volumes: what the rank's data would cost on a wire, not NCCL's ring traffic.
struct EpTraffic {
  EpStrategy strategy = EpStrategy::kAuto;  // the strategy that ran
  int64_t max_tokens_per_rank = 0;           // T_max of that call
  int64_t dispatch_sent = 0, dispatch_received = 0;  // tokens / routed rows out, and in
  int64_t combine_sent = 0, combine_received = 0;    // results out, and in
  int64_t rows_computed = 0;  // rows the rank's fused MoE ran on (tokens for AG, routes for A2A)
  int64_t sent() const { return dispatch_sent + combine_sent; }
  int64_t received() const { return dispatch_received + combine_received; }
};

struct EpOptions {
  int64_t max_tokens = 4096;          // per rank: the most tokens one rank passes to run()
  EpStrategy strategy = EpStrategy::kAuto;
  Backend backend = Backend::kAuto;   // of the fused MoE each rank runs
  bool deterministic = false;         // of the fused MoE each rank runs (RunnerOptions::deterministic)
  // kAllToAll: the most routed rows one rank may receive in one call. -1: world · max_tokens · top_k
  // (every route of every rank; never exceeded, but large). A call that would exceed it throws
  // CapacityError on every rank alike (they all see the count matrix).
  int64_t max_recv_routes = -1;
};

class EpMoeLayer {
 public:
  // comm: an initialised communicator whose device is weights.device(); the caller owns it (and
  // keeps it alive while the layer lives). config: the rank's layer (num_experts = E of the whole
  // layer, local range = this rank's experts); weights prepared for that config on that device.
  // Collective: every rank constructs its layer at the same time (the ranges are all-gathered and
  // checked with validate_expert_ranges); it synchronises the host once.
  EpMoeLayer(ncclComm_t comm, const MoeConfig& config, PreparedWeights weights, const EpOptions& options = {});
  ~EpMoeLayer();
  EpMoeLayer(EpMoeLayer&&) noexcept;
  EpMoeLayer& operator=(EpMoeLayer&&) noexcept;
  EpMoeLayer(const EpMoeLayer&) = delete;
  EpMoeLayer& operator=(const EpMoeLayer&) = delete;

  // x [T, H] bf16, topk_ids [T, K] (global expert ids), topk_weights [T, K] fp32, out [T, H] of
  // config.output_dtype: device pointers on the layer's device, as MoeRunner::run. T may differ
  // between ranks (0 included). tokens_per_rank: every rank's T (index = rank, same on every rank,
  // [rank] == num_tokens) when the caller knows them; lets all-gather + reduce-scatter skip the count
  // exchange. Stream-ordered on `stream`; synchronises the host where the class comment says.
  void run(const void* x, const void* topk_ids, IndexType ids_type, const float* topk_weights, void* out,
           int64_t num_tokens, CUstream_st* stream = nullptr, std::span<const int64_t> tokens_per_rank = {});

  int rank() const;
  int world_size() const;
  int device() const;
  const MoeConfig& config() const;
  const EpOptions& options() const;
  const std::vector<ExpertRange>& expert_ranges() const;  // every rank's, index = rank
  const EpTraffic& last_traffic() const;                  // of the last run()
  size_t workspace_bytes() const;                         // device bytes of this layer's buffers

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// EpMoeLayer and the two functions below are in the library fp4moe_ep, built only where CMake
// found NCCL (it defines FP4MOE_HAVE_EP for its users); the rest of this header is in fp4moe.

// For tests and benchmarks: one communicator per device for a process that drives all of them
// (ncclCommInitAll); rank i runs on devices[i]. Throws CudaError naming the NCCL call.
std::vector<ncclComm_t> ep_init_local_comms(std::span<const int> devices);
void ep_destroy_comms(std::span<ncclComm_t> comms);  // ncclCommDestroy each (null ones skipped)

}  // namespace fp4moe
