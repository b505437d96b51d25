// Launches of the expert-parallel packing kernels (src/kernels/ep_pack.cuh). Internal to src/ep/.
// All stream-ordered, no host synchronisation, no allocation; a launch with nothing to do is skipped.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fp4moe/config.h"

namespace fp4moe::ep {

// ids [routes] (int32 or int64) → ids_out [padded_routes] int32 (−1 outside [0, E) and past routes),
// w → w_out (0 past routes).
void launch_ag_pack(const void* ids, IndexType ids_type, const float* w, int64_t routes, int64_t padded_routes,
                    int num_experts, int32_t* ids_out, float* w_out, cudaStream_t s);

// out [n] bf16 = in [n] fp32, n a multiple of 4.
void launch_cast_out(const float* in, void* out, int64_t n, cudaStream_t s);

// The blocks the count/place kernels use for `routes` routes (block_counts/offsets are blocks × world).
int64_t a2a_blocks(int64_t routes);

// Count + scan + place + gather x: after it, send_count[world] (int64) is this rank's row of the count
// matrix, send_base[world + 1] the start of each destination's rows (and the total), send_x/id/w the
// rows grouped by destination, route_pos[routes] each route's row or −1.
struct A2aPack {
  const void* x;              // [T, H] bf16
  const void* ids;            // [T, K]
  IndexType ids_type;
  const float* w;             // [T, K]
  int64_t tokens;
  int top_k, hidden, num_experts, world;
  const int* owner;           // [E] rank holding each expert
  int* block_counts;          // [blocks, world]
  int* block_offsets;         // [blocks, world]
  int64_t* send_count;        // [world]
  int* send_base;             // [world + 1]
  int* route_pos;             // [T·K]
  int* send_route;            // [T·K]
  int32_t* send_id;           // [T·K]
  float* send_w;              // [T·K]
  void* send_x;               // [T·K, H] bf16
};
void launch_a2a_pack(const A2aPack& p, cudaStream_t s);

// out [T, H] = Σ_j back[route_pos[t·K + j]] (slot order, fp32), stored as bf16 or fp32.
void launch_a2a_combine(const float* back, const int* route_pos, int64_t tokens, int top_k, int hidden, void* out,
                        bool out_fp32, cudaStream_t s);

}  // namespace fp4moe::ep
