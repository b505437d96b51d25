// Output stores shared by every backend's final top-k sum.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

namespace fp4moe::kernels {

// out[o .. o+3] = s, as fp32 (one 16-byte store) or bf16 (round to nearest even, one 8-byte store).
__device__ __forceinline__ void store_out4(void* out, bool out_fp32, int64_t o, float4 s) {
  if (out_fp32) {
    *reinterpret_cast<float4*>(static_cast<float*>(out) + o) = s;
  } else {
    __nv_bfloat162 lo = __floats2bfloat162_rn(s.x, s.y), hi = __floats2bfloat162_rn(s.z, s.w);
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(out) + o) =
        make_uint2(*reinterpret_cast<uint32_t*>(&lo), *reinterpret_cast<uint32_t*>(&hi));
  }
}

// out[o] = s, as fp32 or bf16 (round to nearest even).
__device__ __forceinline__ void store_out1(void* out, bool out_fp32, int64_t o, float s) {
  if (out_fp32) static_cast<float*>(out)[o] = s;
  else static_cast<__nv_bfloat16*>(out)[o] = __float2bfloat16_rn(s);
}

__device__ __forceinline__ void add4(float4& s, const float4& v) { s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w; }

}  // namespace fp4moe::kernels
