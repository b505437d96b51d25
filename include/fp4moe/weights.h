// fp4moe/weights.h — expert weights: checkpoint layouts in, prepared weights out.
//
// A checkpoint hands us, per projection, packed E2M1 codes, block scales (linear or the 128x4
// swizzle of reference §1.4) and, for NVFP4, a per-expert global *decode* scale. prepare_weights()
// validates all of it once and repacks it into whatever layout the chosen device reads; no cache is
// keyed on data pointers (reference F9): preparing twice gives two independent objects.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "fp4moe/config.h"

namespace fp4moe {

enum class ScaleLayout : int {
  kLinear,         // [E, N, K/block] row-major bytes
  kSwizzled128x4,  // per expert: rows padded to 128, scale columns to 4, 512-byte atoms
};

// Row order of a gated W13 (and of b13).
enum class GateUpLayout : int {
  kUpGate,       // [up; gate] concatenated: rows [0, I) up, [I, 2I) gate (the reference's order)
  kGateUp,       // [gate; up] concatenated
  kInterleaved,  // gate/up interleaved row by row, gate first: row 2i gate, 2i+1 up (gpt-oss)
};

// One projection of all local experts, as a checkpoint stores it. Host memory.
struct ProjectionView {
  const uint8_t* packed = nullptr;       // [E_local, N, K/2] E2M1, element 2j in the low nibble
  const uint8_t* scales = nullptr;       // E4M3 (NVFP4) or UE8M0 (MXFP4) bytes, in scale_layout
  ScaleLayout scale_layout = ScaleLayout::kLinear;
  const float* global_scale = nullptr;   // [E_local] NVFP4 decode scale; nullptr means 1.0.
                                         // Must be nullptr for MXFP4.
};

// The experts of one MoE layer in checkpoint form. Host memory. Shapes follow the MoeConfig:
// W13 [E_local, N1, H] with N1 = 2I (gated) or I (relu2); W2 [E_local, H, I].
struct CheckpointView {
  ProjectionView w13;
  ProjectionView w2;
  GateUpLayout gate_up = GateUpLayout::kUpGate;
  const float* fc1_input_scale = nullptr;  // [E_local] decode scale of the FC1 input (nvfp4 a4)
  const float* fc2_input_scale = nullptr;  // [E_local] decode scale of the FC2 input (nvfp4 a4)
  const float* b13 = nullptr;              // [E_local, N1], rows in gate_up order (has_bias)
  const float* b2 = nullptr;               // [E_local, H] (has_bias)
};

// An owned, quantised projection.
struct QuantizedProjection {
  int experts = 0, rows = 0, cols = 0;  // E_local, N, K
  WeightFormat format = WeightFormat::kNVFP4;
  ScaleLayout scale_layout = ScaleLayout::kLinear;
  std::vector<uint8_t> packed;       // [experts, rows, cols/2]
  std::vector<uint8_t> scales;       // experts · scale_bytes_per_expert()
  std::vector<float> global_scale;   // [experts] (NVFP4); empty for MXFP4

  int block() const { return format == WeightFormat::kNVFP4 ? 16 : 32; }
  int64_t scale_bytes_per_expert() const;
  ProjectionView view() const;
  // Block scale of (expert, row, block column), whatever the layout.
  uint8_t scale_at(int e, int row, int kb) const;
};

// An owned checkpoint. Also the canonical host form the reference backend reads (linear scales,
// [up; gate] row order) — see canonicalize().
struct QuantizedCheckpoint {
  QuantizedProjection w13, w2;
  GateUpLayout gate_up = GateUpLayout::kUpGate;
  std::vector<float> fc1_input_scale, fc2_input_scale;  // [E_local] or empty
  std::vector<float> b13, b2;                           // [E_local, N1], [E_local, H] or empty
  CheckpointView view() const;
};

// Quantise dense fp32 weights [experts, rows, cols] to `format`. NVFP4 uses a per-expert global
// decode scale amax_expert / (448·6) (1.0 for an all-zero expert), as ModelOpt does.
QuantizedProjection quantize_projection(const float* w, int experts, int rows, int cols,
                                        WeightFormat format, ScaleLayout layout);

// Dense fp32 → a whole checkpoint for `config`. w13: [E_local, N1, H] rows in `gate_up` order;
// w2: [E_local, H, I]. Input scales and biases are copied when given (nullptr: left empty).
QuantizedCheckpoint quantize_checkpoint(const MoeConfig& config, const float* w13, const float* w2,
                                        GateUpLayout gate_up, ScaleLayout layout,
                                        const float* fc1_input_scale = nullptr,
                                        const float* fc2_input_scale = nullptr,
                                        const float* b13 = nullptr, const float* b2 = nullptr);

// The byte offset of scale (row m, block column kb) inside one expert's 128x4-swizzled slab,
// ktiles = ceil(ceil(K/block)/4) (reference §1.4).
inline int64_t swizzled_scale_offset(int64_t m, int64_t kb, int64_t ktiles) {
  return ((m / 128) * ktiles + kb / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + (kb % 4);
}
int64_t swizzled_scale_bytes(int64_t rows, int64_t scale_cols);
// Convert one expert's scales between layouts (padding bytes of the swizzled form are zero).
std::vector<uint8_t> swizzle_scales(const uint8_t* linear, int64_t rows, int64_t scale_cols);
std::vector<uint8_t> unswizzle_scales(const uint8_t* swizzled, int64_t rows, int64_t scale_cols);

// Validate a checkpoint against `config` and convert it to the canonical host form: linear
// scales, [up; gate] rows, global scales filled in (1.0 where absent). Rejects NaN block scales,
// MXFP4 blocks whose values overflow fp32 (scale 2^127 with |code| ≥ 2, 2^126 with |code| ≥ 4),
// and global / input scales that are not finite and positive. Runs on up to `threads` host threads,
// one expert at a time (0: all hardware threads); the error, if any, is the lowest expert's first.
QuantizedCheckpoint canonicalize(const MoeConfig& config, const CheckpointView& checkpoint, int threads = 0);

struct PrepareOptions {
  int device = -1;             // -1: host (reference backend); >= 0: this CUDA device
  bool keep_host_copy = false; // for a CUDA device: also keep the canonical host form
  int host_threads = 0;        // host threads that repack the weights for the device (0: all hardware threads)
};

// Weights prepared for one device. Cheap to copy (shared, immutable).
class PreparedWeights {
 public:
  struct Impl;
  PreparedWeights() = default;
  explicit PreparedWeights(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

  const MoeConfig& config() const;
  int device() const;                    // -1 for host
  bool has_host() const;
  const QuantizedCheckpoint& host() const;  // throws Unsupported when not kept
  // Bytes the prepared layer holds on its device: one copy of the FP4 codes and block scales in the
  // kernels' layout (padded to the tile sizes), the per-expert scales and the biases. 0 for host.
  size_t device_bytes() const;
  const Impl& impl() const { return *impl_; }
  explicit operator bool() const { return static_cast<bool>(impl_); }

 private:
  std::shared_ptr<const Impl> impl_;
};

PreparedWeights prepare_weights(const MoeConfig& config, const CheckpointView& checkpoint,
                                const PrepareOptions& options = {});

}  // namespace fp4moe
