// fp4moe/activation.h — the activation formulas (reference §3), one implementation for the CPU
// reference (double) and the kernels (float).
//
// g is the gate, u the up projection, both after the FC1 alpha and bias. Non-gated relu2 ignores u.
#pragma once

#include <cmath>

#include "fp4moe/config.h"
#include "fp4moe/formats.h"

namespace fp4moe {

template <typename T>
FP4MOE_HD T sigmoid(T a) {
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
