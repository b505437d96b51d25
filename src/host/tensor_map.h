// Tensor maps of the GEMMs' operands for the producers' tensor copies (TMA): the activations (A1 /
// A2) of dynamic's register path (kernels/dynamic.cuh, boxes of its m-tile) and bf16 path
// (kernels/dynamic_bf16.cuh, 256-row boxes) and of the static backend's GEMMs; the register path's
// packed weights (codes and scales).
#pragma once

#include <cuda.h>

#include "kernels/common/moe_gemm.cuh"

namespace fp4moe::gpu {

// p.a as the producer reads it: a_rows × k_pad 16-bit values (bf16, or f16 on the NVFP4-a4 path),
// boxes of 64 k × box_rows rows written to shared memory with the 128B swizzle of the wgmma operand
// (one 128-byte row of 64 k per routed row, exactly the swizzle atom); rows past a_rows arrive as
// zeros. A pure host computation, so it may run while a stream is being captured. Throws
// InvalidArgument naming "activations" if the driver refuses the map.
CUtensorMap activation_map(const kernels::MoeGemmParams& p, int box_rows);

// The register path's weights (p.w_frag or p.s_frag, device_weights.h) as a 3-D tensor: (one
// fragment tile: 128 code words or 16 · 64 / block scale bytes) × (k_pad / 64 k-tiles) × (w_experts ·
// w_rows / 16 row tiles), boxes of one k-tile of box_tiles consecutive row tiles, unswizzled (the
// stage holds them packed: [row tile][tile]); row tiles past the last expert's arrive as zeros.
// Throws InvalidArgument naming "weights" if the driver refuses the map.
enum class WeightPart { kCodes, kScales };
CUtensorMap weight_map(const kernels::MoeGemmParams& p, WeightPart part, int box_tiles);

// Looks up the driver's cuTensorMapEncodeTiled (through the runtime, no libcuda link) once, so that
// the first lookup happens outside any stream capture; throws Unsupported naming "backend" if the
// driver lacks it.
void require_tensor_map_encoder();

}  // namespace fp4moe::gpu
