// Tensor maps of the GEMMs' operands (tensor_map.h).
#include "host/tensor_map.h"

#include <cuda_bf16.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled: the driver's encoder, reached through the runtime
#include <cuda_runtime.h>

#include "fp4moe/errors.h"
#include "host/cuda_check.h"
#include "kernels/common/wgmma_layout.h"

namespace fp4moe::gpu {
namespace {

// The driver's tensor-map encoder, through the runtime's entry-point query. The first call looks it
// up; a failed lookup throws and the next call tries again.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    FP4MOE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    FP4MOE_REQUIRE(found == cudaDriverEntryPointSuccess && f != nullptr, Unsupported, "backend",
                   "dynamic and static need the driver's cuTensorMapEncodeTiled (CUDA 12.0+), which this driver "
                   "does not provide (query result ", static_cast<int>(found), ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

CUtensorMap activation_map(const kernels::MoeGemmParams& p, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(p.k_pad), static_cast<cuuint64_t>(p.a_rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p.k_pad) * sizeof(__nv_bfloat16)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kernels::wgmma::kTileK), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t unit[2] = {1, 1};
  // The element type only sets the size here (no OOB NaN fill): bf16 and f16 copy alike.
  const CUresult r = tensor_map_encoder()(&map, p.f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                          2, const_cast<__nv_bfloat16*>(p.a), dims, strides, box, unit,
                                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FP4MOE_REQUIRE(r == CUDA_SUCCESS, InvalidArgument, "activations", "cuTensorMapEncodeTiled refused the activation map (CUresult ",
                 static_cast<int>(r), "): address ", static_cast<const void*>(p.a), ", ", p.a_rows, " rows × ", p.k_pad,
                 " columns, boxes of ", box_rows, " rows");
  return map;
}

CUtensorMap weight_map(const kernels::MoeGemmParams& p, WeightPart part, int box_tiles) {
  FP4MOE_REQUIRE(p.w_experts > 0 && p.w_rows > 0 && p.w_rows % 16 == 0 && p.k_pad > 0 && p.k_pad % 64 == 0,
                 InvalidArgument, "weights", "the weight tensor maps need experts > 0, rows a positive multiple of 16 and k a ",
                 "positive multiple of 64; got ", p.w_experts, " experts × ", p.w_rows, " rows × ", p.k_pad, " k");
  CUtensorMap map;
  const bool codes = part == WeightPart::kCodes;
  // One fragment tile (16 rows × 64 k): 512 bytes of codes as 128 words, or 16 · 64 / block scale bytes.
  const cuuint64_t unit_elems = codes ? 128 : static_cast<cuuint64_t>(16 * (64 / p.block));
  const cuuint64_t unit_bytes = codes ? 512 : unit_elems;
  const cuuint64_t ktiles = static_cast<cuuint64_t>(p.k_pad / kernels::wgmma::kTileK);
  const cuuint64_t row_tiles = static_cast<cuuint64_t>(p.w_experts) * static_cast<cuuint64_t>(p.w_rows / 16);
  const cuuint64_t dims[3] = {unit_elems, ktiles, row_tiles};
  const cuuint64_t strides[2] = {unit_bytes, unit_bytes * ktiles};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(unit_elems), 1, static_cast<cuuint32_t>(box_tiles)};
  const cuuint32_t unit[3] = {1, 1, 1};
  void* base = codes ? const_cast<uint4*>(p.w_frag) : static_cast<void*>(const_cast<uint8_t*>(p.s_frag));
  const CUresult r = tensor_map_encoder()(&map, codes ? CU_TENSOR_MAP_DATA_TYPE_UINT32 : CU_TENSOR_MAP_DATA_TYPE_UINT8,
                                          3, base, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FP4MOE_REQUIRE(r == CUDA_SUCCESS, InvalidArgument, "weights", "cuTensorMapEncodeTiled refused the weight ",
                 codes ? "code" : "scale", " map (CUresult ", static_cast<int>(r), "): address ", base, ", ", p.w_experts,
                 " experts × ", p.w_rows, " rows × ", p.k_pad, " k, boxes of ", box_tiles, " row tiles");
  return map;
}

void require_tensor_map_encoder() { (void)tensor_map_encoder(); }

}  // namespace fp4moe::gpu
