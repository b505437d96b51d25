// Expert parallelism, the parts without NCCL: expert ranges per rank, their validation, strategy
// names and kAuto's choice (fp4moe/ep.h). The layer itself is src/ep/ (built only with NCCL).
#include <algorithm>
#include <vector>

#include "fp4moe/ep.h"
#include "fp4moe/errors.h"

namespace fp4moe {

std::string_view to_string(EpStrategy s) {
  switch (s) {
    case EpStrategy::kAuto: return "auto";
    case EpStrategy::kAllGatherReduceScatter: return "allgather";
    case EpStrategy::kAllToAll: return "alltoall";
  }
  return "?";
}

EpStrategy parse_ep_strategy(std::string_view s, const char* argument) {
  if (s == "auto") return EpStrategy::kAuto;
  if (s == "allgather" || s == "ag" || s == "allgather_reducescatter") return EpStrategy::kAllGatherReduceScatter;
  if (s == "alltoall" || s == "a2a") return EpStrategy::kAllToAll;
  throw InvalidArgument(argument, detail::concat(argument, ": unknown value '", s,
                                                 "' (accepted: auto, allgather, ag, allgather_reducescatter, "
                                                 "alltoall, a2a)"));
}

std::vector<ExpertRange> split_experts(int num_experts, int world_size) {
  FP4MOE_REQUIRE(num_experts >= 1 && num_experts <= kMaxExperts, InvalidArgument, "num_experts", "must be in [1, ",
                 kMaxExperts, "], got ", num_experts);
  FP4MOE_REQUIRE(world_size >= 1 && world_size <= num_experts, InvalidArgument, "world_size",
                 "must be in [1, num_experts=", num_experts, "] (every rank holds at least one expert), got ",
                 world_size);
  std::vector<ExpertRange> r(world_size);
  const int base = num_experts / world_size, extra = num_experts % world_size;
  int first = 0;
  for (int i = 0; i < world_size; ++i) {
    r[i] = {first, base + (i < extra ? 1 : 0)};
    first += r[i].count;
  }
  return r;
}

void validate_expert_ranges(int num_experts, std::span<const ExpertRange> ranges) {
  FP4MOE_REQUIRE(num_experts >= 1 && num_experts <= kMaxExperts, InvalidArgument, "num_experts", "must be in [1, ",
                 kMaxExperts, "], got ", num_experts);
  FP4MOE_REQUIRE(!ranges.empty(), InvalidArgument, "expert_ranges", "no ranks");
  std::vector<int> owner(num_experts, -1);
  for (size_t r = 0; r < ranges.size(); ++r) {
    const ExpertRange& g = ranges[r];
    FP4MOE_REQUIRE(g.count >= 1 && g.first >= 0 && int64_t{g.first} + g.count <= num_experts, InvalidArgument,
                   "expert_ranges", "rank ", r, " holds [", g.first, ", ", int64_t{g.first} + g.count,
                   "), which must be non-empty and inside [0, num_experts=", num_experts, ")");
    for (int e = g.first; e < g.first + g.count; ++e) {
      FP4MOE_REQUIRE(owner[e] < 0, InvalidArgument, "expert_ranges", "expert ", e, " is held by rank ", owner[e],
                     " and by rank ", r, " (ranges must not overlap)");
      owner[e] = static_cast<int>(r);
    }
  }
  const auto hole = std::find(owner.begin(), owner.end(), -1);
  FP4MOE_REQUIRE(hole == owner.end(), InvalidArgument, "expert_ranges", "expert ", hole - owner.begin(),
                 " is held by no rank (the ranges of ", ranges.size(), " ranks must cover [0, num_experts=",
                 num_experts, ") exactly)");
}

MoeConfig ep_rank_config(const MoeConfig& layer, int world_size, int rank) {
  FP4MOE_REQUIRE(layer.local_expert_first == 0 && layer.local_count() == layer.num_experts, InvalidArgument,
                 "layer", "must hold all experts (local range [0, num_experts)), got local range [",
                 layer.local_expert_first, ", ", layer.local_expert_first + layer.local_count(), ")");
  const std::vector<ExpertRange> r = split_experts(layer.num_experts, world_size);
  FP4MOE_REQUIRE(rank >= 0 && rank < world_size, InvalidArgument, "rank", "must be in [0, world_size=", world_size,
                 "), got ", rank);
  MoeConfig c = layer;
  c.local_expert_first = r[rank].first;
  c.local_expert_count = r[rank].count;
  return c;
}

EpStrategy choose_ep_strategy(int world_size, int top_k, int64_t max_tokens_per_rank) {
  FP4MOE_REQUIRE(world_size >= 1, InvalidArgument, "world_size", "must be at least 1, got ", world_size);
  FP4MOE_REQUIRE(top_k >= 1 && top_k <= kMaxTopK, InvalidArgument, "top_k", "must be in [1, ", kMaxTopK, "], got ",
                 top_k);
  FP4MOE_REQUIRE(max_tokens_per_rank >= 0, InvalidArgument, "max_tokens_per_rank", "must be >= 0, got ",
                 max_tokens_per_rank);
  if (world_size == 1) return EpStrategy::kAllGatherReduceScatter;  // no traffic either way; no host sync
  if (top_k < world_size && max_tokens_per_rank * top_k >= 1024) return EpStrategy::kAllToAll;
  return EpStrategy::kAllGatherReduceScatter;
}

}  // namespace fp4moe
