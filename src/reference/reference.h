// src/reference — the CPU implementation of every mode: the test oracle and the host backend.
//
// Numerics (design.md §1, §7): every quantised operand is dequantised exactly (to double), products
// and sums are float64, with the same quantisation points as the kernels:
//   x (bf16) ─Q1→ FC1 (+b13) ─act→ round to bf16 ─Q2→ FC2 (+b2) ─·w[t,j]→ Σ_j in order → out
// Q1/Q2 are NVFP4 (per-expert decode scales fc1/fc2_input_scale), MXFP4, MXFP8 or identity (a16).
// The final sum is rounded double → fp32 → output dtype, as a kernel that sums in fp32 would.
#pragma once

#include <cstdint>
#include <vector>

#include "fp4moe/config.h"
#include "fp4moe/weights.h"

namespace fp4moe::reference {

// Quantise-dequantise n values (n a multiple of the mode's block, or any n for a16) exactly as the
// kernels quantise a GEMM input of `config`. `g` is the NVFP4 decode global scale (ignored
// otherwise). Output: the dequantised values, code · scale · g, in double.
void quant_dequant(const MoeConfig& config, const float* v, int n, float g, double* out);

// Dequantise one row of a canonical projection (expert e, row r) into double, including the
// per-expert global scale.
void dequant_row(const QuantizedProjection& p, int e, int r, double* out);

// The whole fused MoE on the host. `weights` is the canonical form (canonicalize()). Pointers are
// host memory; x holds bf16 bit patterns; out is config.output_dtype. threads = 0: all hardware
// threads. Deterministic: the result does not depend on the thread count.
void moe_forward(const MoeConfig& config, const QuantizedCheckpoint& weights, const uint16_t* x,
                 const void* topk_ids, IndexType ids_type, const float* topk_weights,
                 int64_t num_tokens, void* out, int threads = 0);

// The same, returning the float64 result before the output rounding, [T, H]. For tests.
std::vector<double> moe_forward_f64(const MoeConfig& config, const QuantizedCheckpoint& weights,
                                    const uint16_t* x, const void* topk_ids, IndexType ids_type,
                                    const float* topk_weights, int64_t num_tokens, int threads = 0);

// Per local expert, the largest |h| of the bf16-rounded intermediate over the given tokens (0 for
// experts no token reaches). For calibrating fc2_input_scale. fc2_input_scale may be absent.
std::vector<float> intermediate_amax(const MoeConfig& config, const QuantizedCheckpoint& weights,
                                     const uint16_t* x, const void* topk_ids, IndexType ids_type,
                                     int64_t num_tokens, int threads = 0);

}  // namespace fp4moe::reference
