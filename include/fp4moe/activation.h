// fp4moe/activation.h — the activation formulas (reference §3), one implementation for the CPU
// reference (double) and the kernels (float).
//
// g is the gate, u the up projection, both after the FC1 alpha and bias. Non-gated relu2 ignores u.
#pragma once

#include <cmath>
#include <type_traits>

#include "fp4moe/config.h"
#include "fp4moe/formats.h"

namespace fp4moe {

// σ(a) = 1 / (1 + e^-a). On the device in fp32 as the reference system computes it
// (../shared/reference/b12x-system.md §3: rcp.approx(1 + exp(-a)), exp by ex2.approx): about 5
// instructions instead of an accurate expf and an IEEE division (~30 with its slow-path branch).
// Relative error ~2^-21, so h = g·σ·u, rounded to bf16 next, lands on the other neighbouring bf16
// about once in 2^13 elements (docs/numerics.md's a4 tolerance covers an FC2-input code flip there).
// a → -inf: e^-a = inf and rcp.approx(inf) = 0, as 1 / inf; NaN stays NaN. The CPU reference keeps
// the exact form in double.
template <typename T>
FP4MOE_HD T sigmoid(T a) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same_v<T, float>) {
    float e, r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(a * -1.4426950408889634f));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
    return r;
  }
#endif
  return T(1) / (T(1) + exp(-a));
}

template <typename T>
FP4MOE_HD T apply_activation(Activation act, T g, T u, T sw_alpha, T sw_beta, T sw_limit) {
  switch (act) {
    case Activation::kSilu:
      return g * sigmoid(g) * u;
    case Activation::kGeluTanh: {
      // gelu_tanh(g) = g · ½(1 + tanh z) = g · σ(2z), z = √(2/π)·(g + 0.044715·g³)
      const T z = T(0.7978845608028654) * (g + T(0.044715) * g * g * g);
      return g * sigmoid(T(2) * z) * u;
    }
    case Activation::kSwigluOai: {
      // gpt-oss: the gate is clamped from above, the up branch on both sides (limit = inf: none).
      g = g > sw_limit ? sw_limit : g;  // written so that NaN stays NaN
      u = u < -sw_limit ? -sw_limit : (u > sw_limit ? sw_limit : u);
      return g * sigmoid(sw_alpha * g) * (u + sw_beta);
    }
    case Activation::kRelu2: {
      const T r = g < T(0) ? T(0) : g;  // NaN stays NaN
      return r * r;
    }
  }
  return T(0);
}

}  // namespace fp4moe
