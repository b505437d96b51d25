// The CPU fused MoE. See reference.h for the numerics.
//
// Work is done per chunk of tokens (bounded memory), per local expert: the expert's routed rows are
// quantised once, then FC1 and FC2 stream the expert's weights row by row, dequantising each row
// once and applying it to every routed row. Tasks are (expert, block of output rows); each task
// writes disjoint outputs, so the result does not depend on the thread count.
#include "reference/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/parallel_for.h"
#include "fp4moe/activation.h"
#include "fp4moe/errors.h"
#include "fp4moe/formats.h"

namespace fp4moe::reference {
namespace {

// Four independent accumulators in a fixed order: vectorisable and deterministic.
double dot(const double* a, const double* b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

int64_t read_id(const void* ids, IndexType type, int64_t i) {
  return type == IndexType::kInt32 ? static_cast<const int32_t*>(ids)[i]
                                   : static_cast<const int64_t*>(ids)[i];
}

struct Route {
  int64_t token;  // within the chunk
  int slot;       // j in [0, K)
};

}  // namespace

void quant_dequant(const MoeConfig& config, const float* v, int n, float g, double* out) {
  if (config.mode == ActMode::kA16) {
    for (int i = 0; i < n; ++i) out[i] = v[i];
    return;
  }
  uint8_t codes[fmt::kMxBlock];
  if (config.mode == ActMode::kA8) {
    for (int b = 0; b < n; b += fmt::kMxBlock) {
      const double s = fmt::ue8m0_decode(fmt::mxfp8_quantize_block(v + b, codes));
      for (int i = 0; i < fmt::kMxBlock; ++i) out[b + i] = fmt::e4m3_decode(codes[i]) * s;
    }
  } else if (config.format == WeightFormat::kNVFP4) {
    for (int b = 0; b < n; b += fmt::kNvfp4Block) {
      const double s = static_cast<double>(fmt::e4m3_decode(fmt::nvfp4_quantize_block(v + b, g, codes))) * g;
      for (int i = 0; i < fmt::kNvfp4Block; ++i) out[b + i] = fmt::e2m1_decode(codes[i]) * s;
    }
  } else {
    for (int b = 0; b < n; b += fmt::kMxBlock) {
      const double s = fmt::ue8m0_decode(fmt::mxfp4_quantize_block(v + b, codes));
      for (int i = 0; i < fmt::kMxBlock; ++i) out[b + i] = fmt::e2m1_decode(codes[i]) * s;
    }
  }
}

namespace {

// Decode tables, filled from the fmt:: decoders (so the values are exactly theirs): a packed byte →
// its two E2M1 values (low nibble first), and a block-scale byte → its E4M3 / UE8M0 value.
struct DecodeTables {
  double e2m1_pair[256][2];
  float e4m3[256], ue8m0[256];
  DecodeTables() {
    for (int b = 0; b < 256; ++b) {
      e2m1_pair[b][0] = fmt::e2m1_decode(static_cast<uint8_t>(b & 0xF));
      e2m1_pair[b][1] = fmt::e2m1_decode(static_cast<uint8_t>(b >> 4));
      e4m3[b] = fmt::e4m3_decode(static_cast<uint8_t>(b));
      ue8m0[b] = fmt::ue8m0_decode(static_cast<uint8_t>(b));
    }
  }
};
const DecodeTables& tables() {
  static const DecodeTables t;
  return t;
}

}  // namespace

// out[i] = e2m1(code_i) · (scale · g) in double, one table look-up per packed byte.
void dequant_row(const QuantizedProjection& p, int e, int r, double* out) {
  const DecodeTables& tab = tables();
  const int bs = p.block();
  const int64_t sc = p.cols / bs;
  const uint8_t* row = p.packed.data() + (static_cast<int64_t>(e) * p.rows + r) * (p.cols / 2);
  const double g = p.format == WeightFormat::kNVFP4 ? p.global_scale[e] : 1.0;
  const float* scale_value = p.format == WeightFormat::kNVFP4 ? tab.e4m3 : tab.ue8m0;
  // Linear scales (the canonical form): the row's bytes are contiguous.
  const uint8_t* srow = p.scale_layout == ScaleLayout::kLinear
                            ? p.scales.data() + (static_cast<int64_t>(e) * p.rows + r) * sc
                            : nullptr;
  for (int64_t kb = 0; kb < sc; ++kb) {
    const uint8_t sb = srow ? srow[kb] : p.scale_at(e, r, static_cast<int>(kb));
    const double s = static_cast<double>(scale_value[sb]) * g;
    const uint8_t* bytes = row + kb * bs / 2;
    double* o = out + kb * bs;
    for (int j = 0; j < bs / 2; ++j) {
      const double* v = tab.e2m1_pair[bytes[j]];
      o[2 * j] = v[0] * s;
      o[2 * j + 1] = v[1] * s;
    }
  }
}

namespace {

// The whole forward pass; with h_amax it stops after the activation and records, per local
// expert, the largest |h| (after bf16 rounding) instead.
std::vector<double> forward(const MoeConfig& config, const QuantizedCheckpoint& w, const uint16_t* x,
                            const void* ids, IndexType ids_type, const float* topk_weights, int64_t T,
                            int threads, std::vector<float>* h_amax) {
  const int H = config.hidden, I = config.intermediate, K = config.top_k;
  const int N1 = config.fc1_rows();
  const int EL = config.local_count(), first = config.local_expert_first;
  FP4MOE_REQUIRE(w.w13.rows == N1 && w.w13.cols == H && w.w2.rows == H && w.w2.cols == I &&
                     w.w13.experts == EL && w.w2.experts == EL,
                 InvalidArgument, "weights", "canonical weights do not match ", config.to_string());
  std::vector<double> result(h_amax ? 0 : static_cast<size_t>(T) * H, 0.0);
  if (h_amax) h_amax->assign(EL, 0.0f);
  const bool nv_a4 = config.needs_input_scales();
  const double sw_alpha = config.swiglu.alpha, sw_beta = config.swiglu.beta, sw_limit = config.swiglu.limit;

  // Token chunks keep the per-route buffers bounded (≈ 16 M doubles each).
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 24) / (static_cast<int64_t>(K) * std::max(H, N1)));
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t tn = std::min(chunk, T - t0);
    // Routes per local expert, in (token, slot) order.
    std::vector<std::vector<Route>> routes(EL);
    for (int64_t t = 0; t < tn; ++t)
      for (int j = 0; j < K; ++j) {
        const int64_t e = read_id(ids, ids_type, (t0 + t) * K + j) - first;
        if (e >= 0 && e < EL) routes[e].push_back({t, j});
      }
    std::vector<int> active;
    for (int e = 0; e < EL; ++e)
      if (!routes[e].empty()) active.push_back(e);

    // Per-route buffers, indexed by (token, slot).
    std::vector<double> xq(static_cast<size_t>(tn) * K * H);   // quantised FC1 input
    std::vector<double> fc1(static_cast<size_t>(tn) * K * N1);  // FC1 output (after alpha, bias)
    std::vector<double> hq(static_cast<size_t>(tn) * K * I);    // quantised FC2 input
    std::vector<double> y(static_cast<size_t>(tn) * K * H);     // weighted FC2 output
    auto rix = [&](const Route& r) { return static_cast<size_t>(r.token) * K + r.slot; };

    // Q1: quantise each routed row with its expert's FC1 input scale.
    parallel_for(static_cast<int64_t>(active.size()), threads, [&](int64_t a) {
      const int e = active[a];
      std::vector<float> xf(H);
      const float g = nv_a4 ? w.fc1_input_scale[e] : 1.0f;
      for (const Route& r : routes[e]) {
        const uint16_t* xr = x + (t0 + r.token) * H;
        for (int k = 0; k < H; ++k) xf[k] = fmt::f32_from_bf16(xr[k]);
        quant_dequant(config, xf.data(), H, g, &xq[rix(r) * H]);
      }
    });

    // FC1: tasks of (expert, block of rows).
    constexpr int kRowBlock = 64;
    const int n1_blocks = (N1 + kRowBlock - 1) / kRowBlock;
    parallel_for(static_cast<int64_t>(active.size()) * n1_blocks, threads, [&](int64_t task) {
      const int e = active[task / n1_blocks];
      const int nb = static_cast<int>(task % n1_blocks);
      std::vector<double> wrow(H);
      for (int n = nb * kRowBlock; n < std::min(N1, (nb + 1) * kRowBlock); ++n) {
        dequant_row(w.w13, e, n, wrow.data());
        const double bias = config.has_bias ? w.b13[static_cast<size_t>(e) * N1 + n] : 0.0;
        for (const Route& r : routes[e]) fc1[rix(r) * N1 + n] = dot(&xq[rix(r) * H], wrow.data(), H) + bias;
      }
    });

    // Activation, bf16 rounding, Q2.
    parallel_for(static_cast<int64_t>(active.size()), threads, [&](int64_t a) {
      const int e = active[a];
      std::vector<float> hf(I);
      const float g = nv_a4 && !h_amax ? w.fc2_input_scale[e] : 1.0f;
      for (const Route& r : routes[e]) {
        const double* f = &fc1[rix(r) * N1];
        for (int i = 0; i < I; ++i) {
          // Canonical row order is [up; gate].
          const double up = config.gated() ? f[i] : 0.0;
          const double gate = config.gated() ? f[I + i] : f[i];
          const double h = apply_activation<double>(config.activation, gate, up, sw_alpha, sw_beta, sw_limit);
          hf[i] = fmt::round_bf16(static_cast<float>(h));
        }
        if (h_amax) {
          for (int i = 0; i < I; ++i) (*h_amax)[e] = std::max((*h_amax)[e], std::fabs(hf[i]));
          continue;
        }
        quant_dequant(config, hf.data(), I, g, &hq[rix(r) * I]);
      }
    });
    if (h_amax) continue;

    // FC2 and the router weight: tasks of (expert, block of output columns).
    const int n2_blocks = (H + kRowBlock - 1) / kRowBlock;
    parallel_for(static_cast<int64_t>(active.size()) * n2_blocks, threads, [&](int64_t task) {
      const int e = active[task / n2_blocks];
      const int cb = static_cast<int>(task % n2_blocks);
      std::vector<double> wrow(I);
      for (int c = cb * kRowBlock; c < std::min(H, (cb + 1) * kRowBlock); ++c) {
        dequant_row(w.w2, e, c, wrow.data());
        const double bias = config.has_bias ? w.b2[static_cast<size_t>(e) * H + c] : 0.0;
        for (const Route& r : routes[e]) {
          const double rw = topk_weights[(t0 + r.token) * K + r.slot];
          y[rix(r) * H + c] = rw * (dot(&hq[rix(r) * I], wrow.data(), I) + bias);
        }
      }
    });

    // Σ over the top-k in slot order; routes that went nowhere contribute nothing.
    std::vector<char> routed(static_cast<size_t>(tn) * K, 0);
    for (int e : active)
      for (const Route& r : routes[e]) routed[rix(r)] = 1;
    parallel_for(tn, threads, [&](int64_t t) {
      double* o = &result[static_cast<size_t>(t0 + t) * H];
      for (int j = 0; j < K; ++j) {
        if (!routed[static_cast<size_t>(t) * K + j]) continue;
        const double* yr = &y[(static_cast<size_t>(t) * K + j) * H];
        for (int c = 0; c < H; ++c) o[c] += yr[c];
      }
    });
  }
  return result;
}

}  // namespace

std::vector<double> moe_forward_f64(const MoeConfig& config, const QuantizedCheckpoint& w, const uint16_t* x,
                                    const void* ids, IndexType ids_type, const float* topk_weights, int64_t T,
                                    int threads) {
  return forward(config, w, x, ids, ids_type, topk_weights, T, threads, nullptr);
}

std::vector<float> intermediate_amax(const MoeConfig& config, const QuantizedCheckpoint& w, const uint16_t* x,
                                     const void* ids, IndexType ids_type, int64_t T, int threads) {
  std::vector<float> amax;
  forward(config, w, x, ids, ids_type, nullptr, T, threads, &amax);
  return amax;
}

void moe_forward(const MoeConfig& config, const QuantizedCheckpoint& weights, const uint16_t* x,
                 const void* ids, IndexType ids_type, const float* topk_weights, int64_t T,
                 void* out, int threads) {
  const std::vector<double> r = moe_forward_f64(config, weights, x, ids, ids_type, topk_weights, T, threads);
  if (config.output_dtype == OutputDType::kFP32) {
    float* o = static_cast<float*>(out);
    for (size_t i = 0; i < r.size(); ++i) o[i] = static_cast<float>(r[i]);
  } else {
    uint16_t* o = static_cast<uint16_t*>(out);
    for (size_t i = 0; i < r.size(); ++i) o[i] = fmt::bf16_from_f32(static_cast<float>(r[i]));
  }
}

}  // namespace fp4moe::reference
