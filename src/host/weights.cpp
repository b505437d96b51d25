// Quantising weights, scale layouts, and the checkpoint → canonical conversion (with validation).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <vector>

#include "common/parallel_for.h"
#include "fp4moe/errors.h"
#include "fp4moe/formats.h"
#include "fp4moe/weights.h"

namespace fp4moe {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t scale_bytes(ScaleLayout layout, int64_t rows, int64_t scale_cols) {
  return layout == ScaleLayout::kLinear ? rows * scale_cols : swizzled_scale_bytes(rows, scale_cols);
}

// Source row of canonical row n ([up; gate]) in a W13 stored in `layout`.
int source_row(GateUpLayout layout, int n, int I) {
  const bool gate = n >= I;
  const int i = gate ? n - I : n;
  switch (layout) {
    case GateUpLayout::kUpGate: return n;
    case GateUpLayout::kGateUp: return gate ? i : I + i;
    case GateUpLayout::kInterleaved: return 2 * i + (gate ? 0 : 1);
  }
  return n;
}

void require_positive_finite(const float* v, int n, const char* name) {
  if (!v) return;
  for (int e = 0; e < n; ++e)
    FP4MOE_REQUIRE(std::isfinite(v[e]) && v[e] > 0.0f, InvalidArgument, name,
                   "must be finite and positive, got ", v[e], " for local expert ", e);
}

// Validate and canonicalise one projection: scales to linear, rows reordered through `row_of`.
QuantizedProjection canonical_projection(const ProjectionView& v, const char* name, int experts, int rows,
                                         int cols, WeightFormat format, const auto& row_of, int threads) {
  const std::string packed_name = std::string(name) + ".packed";
  const std::string scales_name = std::string(name) + ".scales";
  FP4MOE_REQUIRE(v.packed != nullptr, InvalidArgument, packed_name, "is null");
  FP4MOE_REQUIRE(v.scales != nullptr, InvalidArgument, scales_name, "is null");
  const std::string gs_name = std::string(name) + ".global_scale";
  if (format == WeightFormat::kMXFP4)
    FP4MOE_REQUIRE(v.global_scale == nullptr, InvalidArgument, gs_name, "MXFP4 weights have no global scale; pass nullptr");
  require_positive_finite(v.global_scale, experts, gs_name.c_str());

  QuantizedProjection p;
  p.experts = experts, p.rows = rows, p.cols = cols, p.format = format, p.scale_layout = ScaleLayout::kLinear;
  const int bs = p.block();
  const int64_t sc = cols / bs, row_bytes = cols / 2;
  const int64_t src_slab = scale_bytes(v.scale_layout, rows, sc);
  const int64_t ktiles = ceil_div(sc, 4);
  p.packed.resize(static_cast<size_t>(experts) * rows * row_bytes);
  p.scales.resize(static_cast<size_t>(experts) * rows * sc);
  if (format == WeightFormat::kNVFP4) p.global_scale.assign(experts, 1.0f);
  // One expert a task (a DeepSeek-V3 layer's 5.6 GB took seconds on one thread); a task's error is
  // kept and the lowest expert's rethrown after, so the message is the one a serial pass gives.
  auto copy_expert = [&](int e) {
    if (format == WeightFormat::kNVFP4 && v.global_scale) p.global_scale[e] = v.global_scale[e];
    const uint8_t* src_scales = v.scales + e * src_slab;
    for (int n = 0; n < rows; ++n) {
      const int s = row_of(n);
      const uint8_t* src_row = v.packed + (static_cast<int64_t>(e) * rows + s) * row_bytes;
      uint8_t* dst_row = p.packed.data() + (static_cast<int64_t>(e) * rows + n) * row_bytes;
      std::memcpy(dst_row, src_row, row_bytes);
      for (int64_t kb = 0; kb < sc; ++kb) {
        const uint8_t b = v.scale_layout == ScaleLayout::kLinear ? src_scales[s * sc + kb]
                                                                 : src_scales[swizzled_scale_offset(s, kb, ktiles)];
        p.scales[(static_cast<int64_t>(e) * rows + n) * sc + kb] = b;
        if (format == WeightFormat::kNVFP4) {
          FP4MOE_REQUIRE((b & 0x7F) != 0x7F, InvalidArgument, scales_name, "E4M3 block scale is NaN (0x",
                         std::hex, int(b), std::dec, ") at local expert ", e, ", row ", s, ", block ", kb);
        } else {
          FP4MOE_REQUIRE(b != fmt::kUE8M0NaN, InvalidArgument, scales_name, "UE8M0 block scale is NaN (0xff) at local expert ",
                         e, ", row ", s, ", block ", kb);
          if (b >= 253) {  // 2^126 · 4 and 2^127 · 2 are past fp32's range
            const float limit = b == 254 ? 2.0f : 4.0f;
            for (int i = 0; i < bs; ++i) {
              const float c = fmt::abs_f(fmt::e2m1_decode(fmt::unpack_e2m1(dst_row, kb * bs + i)));
              FP4MOE_REQUIRE(c < limit, InvalidArgument, scales_name, "block at local expert ", e, ", row ", s,
                             ", block ", kb, " decodes past fp32's range (scale 2^", int(b) - 127, " × ", c, ")");
            }
          }
        }
      }
    }
  };
  std::vector<std::exception_ptr> errors(static_cast<size_t>(experts));
  parallel_for(experts, threads, [&](int64_t e) {
    try {
      copy_expert(static_cast<int>(e));
    } catch (...) {
      errors[static_cast<size_t>(e)] = std::current_exception();
    }
  });
  for (const std::exception_ptr& err : errors)
    if (err) std::rethrow_exception(err);
  return p;
}

}  // namespace

int64_t swizzled_scale_bytes(int64_t rows, int64_t scale_cols) {
  return ceil_div(rows, 128) * ceil_div(scale_cols, 4) * 512;
}

std::vector<uint8_t> swizzle_scales(const uint8_t* linear, int64_t rows, int64_t scale_cols) {
  std::vector<uint8_t> out(static_cast<size_t>(swizzled_scale_bytes(rows, scale_cols)), 0);
  const int64_t ktiles = ceil_div(scale_cols, 4);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t kb = 0; kb < scale_cols; ++kb) out[swizzled_scale_offset(m, kb, ktiles)] = linear[m * scale_cols + kb];
  return out;
}

std::vector<uint8_t> unswizzle_scales(const uint8_t* swizzled, int64_t rows, int64_t scale_cols) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * scale_cols));
  const int64_t ktiles = ceil_div(scale_cols, 4);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t kb = 0; kb < scale_cols; ++kb) out[m * scale_cols + kb] = swizzled[swizzled_scale_offset(m, kb, ktiles)];
  return out;
}

int64_t QuantizedProjection::scale_bytes_per_expert() const {
  return scale_bytes(scale_layout, rows, cols / block());
}

ProjectionView QuantizedProjection::view() const {
  return {packed.data(), scales.data(), scale_layout, global_scale.empty() ? nullptr : global_scale.data()};
}

uint8_t QuantizedProjection::scale_at(int e, int row, int kb) const {
  const int64_t sc = cols / block();
  const uint8_t* slab = scales.data() + e * scale_bytes_per_expert();
  return scale_layout == ScaleLayout::kLinear ? slab[row * sc + kb] : slab[swizzled_scale_offset(row, kb, ceil_div(sc, 4))];
}

CheckpointView QuantizedCheckpoint::view() const {
  CheckpointView v;
  v.w13 = w13.view();
  v.w2 = w2.view();
  v.gate_up = gate_up;
  v.fc1_input_scale = fc1_input_scale.empty() ? nullptr : fc1_input_scale.data();
  v.fc2_input_scale = fc2_input_scale.empty() ? nullptr : fc2_input_scale.data();
  v.b13 = b13.empty() ? nullptr : b13.data();
  v.b2 = b2.empty() ? nullptr : b2.data();
  return v;
}

QuantizedProjection quantize_projection(const float* w, int experts, int rows, int cols, WeightFormat format,
                                        ScaleLayout layout) {
  FP4MOE_REQUIRE(w != nullptr, InvalidArgument, "w", "is null");
  FP4MOE_REQUIRE(experts >= 1 && rows >= 1 && cols >= 1, InvalidArgument, "shape", "experts, rows and cols must be "
                 "positive, got ", experts, "x", rows, "x", cols);
  QuantizedProjection p;
  p.experts = experts, p.rows = rows, p.cols = cols, p.format = format, p.scale_layout = ScaleLayout::kLinear;
  const int bs = p.block();
  FP4MOE_REQUIRE(cols % bs == 0, InvalidArgument, "cols", "must be a multiple of the block size ", bs, ", got ", cols);
  const int64_t sc = cols / bs, per_expert = static_cast<int64_t>(rows) * cols;
  p.packed.assign(static_cast<size_t>(experts) * rows * cols / 2, 0);
  p.scales.assign(static_cast<size_t>(experts) * rows * sc, 0);
  if (format == WeightFormat::kNVFP4) p.global_scale.assign(experts, 1.0f);
  uint8_t codes[fmt::kMxBlock];
  for (int e = 0; e < experts; ++e) {
    const float* we = w + e * per_expert;
    float g = 1.0f;
    if (format == WeightFormat::kNVFP4) {
      float amax = 0.0f;
      for (int64_t i = 0; i < per_expert; ++i) amax = std::max(amax, std::fabs(we[i]));
      // Decode scale that maps the expert's amax to the top of E2M1 × E4M3 (6 · 448).
      if (amax > 0.0f && std::isfinite(amax)) g = amax / (6.0f * 448.0f);
      p.global_scale[e] = g;
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t kb = 0; kb < sc; ++kb) {
        const float* v = we + r * cols + kb * bs;
        const uint8_t s = format == WeightFormat::kNVFP4 ? fmt::nvfp4_quantize_block(v, g, codes)
                                                         : fmt::mxfp4_quantize_block(v, codes);
        p.scales[(e * rows + r) * sc + kb] = s;
        uint8_t* dst = p.packed.data() + (e * per_expert + r * cols + kb * bs) / 2;
        for (int i = 0; i < bs; i += 2) dst[i / 2] = fmt::pack_e2m1x2(codes[i], codes[i + 1]);
      }
  }
  if (layout == ScaleLayout::kSwizzled128x4) {
    std::vector<uint8_t> sw;
    for (int e = 0; e < experts; ++e) {
      const auto s = swizzle_scales(p.scales.data() + e * rows * sc, rows, sc);
      sw.insert(sw.end(), s.begin(), s.end());
    }
    p.scales = std::move(sw);
    p.scale_layout = layout;
  }
  return p;
}

QuantizedCheckpoint quantize_checkpoint(const MoeConfig& config, const float* w13, const float* w2,
                                        GateUpLayout gate_up, ScaleLayout layout, const float* fc1_input_scale,
                                        const float* fc2_input_scale, const float* b13, const float* b2) {
  config.validate();
  const int EL = config.local_count(), H = config.hidden, I = config.intermediate, N1 = config.fc1_rows();
  QuantizedCheckpoint q;
  q.w13 = quantize_projection(w13, EL, N1, H, config.format, layout);
  q.w2 = quantize_projection(w2, EL, H, I, config.format, layout);
  q.gate_up = gate_up;
  if (fc1_input_scale) q.fc1_input_scale.assign(fc1_input_scale, fc1_input_scale + EL);
  if (fc2_input_scale) q.fc2_input_scale.assign(fc2_input_scale, fc2_input_scale + EL);
  if (b13) q.b13.assign(b13, b13 + static_cast<size_t>(EL) * N1);
  if (b2) q.b2.assign(b2, b2 + static_cast<size_t>(EL) * H);
  return q;
}

QuantizedCheckpoint canonicalize(const MoeConfig& config, const CheckpointView& ck, int threads) {
  FP4MOE_REQUIRE(threads >= 0, InvalidArgument, "threads", "must be 0 (all hardware threads) or a positive count, got ",
                 threads);
  config.validate();
  const int EL = config.local_count(), H = config.hidden, I = config.intermediate, N1 = config.fc1_rows();
  if (!config.gated())
    FP4MOE_REQUIRE(ck.gate_up == GateUpLayout::kUpGate, InvalidArgument, "gate_up",
                   "relu2 has no gate/up halves; the layout must be kUpGate (identity)");
  const GateUpLayout gu = config.gated() ? ck.gate_up : GateUpLayout::kUpGate;
  QuantizedCheckpoint c;
  c.gate_up = GateUpLayout::kUpGate;
  c.w13 = canonical_projection(ck.w13, "w13", EL, N1, H, config.format, [&](int n) { return source_row(gu, n, I); },
                               threads);
  c.w2 = canonical_projection(ck.w2, "w2", EL, H, I, config.format, [](int n) { return n; }, threads);
  if (config.needs_input_scales()) {
    FP4MOE_REQUIRE(ck.fc1_input_scale != nullptr, InvalidArgument, "fc1_input_scale",
                   "is required for nvfp4-a4 (the FC1 input's decode global scale, one per local expert)");
    FP4MOE_REQUIRE(ck.fc2_input_scale != nullptr, InvalidArgument, "fc2_input_scale",
                   "is required for nvfp4-a4 (the FC2 input's decode global scale, one per local expert)");
    require_positive_finite(ck.fc1_input_scale, EL, "fc1_input_scale");
    require_positive_finite(ck.fc2_input_scale, EL, "fc2_input_scale");
    c.fc1_input_scale.assign(ck.fc1_input_scale, ck.fc1_input_scale + EL);
    c.fc2_input_scale.assign(ck.fc2_input_scale, ck.fc2_input_scale + EL);
  }
  if (config.has_bias) {
    FP4MOE_REQUIRE(ck.b13 != nullptr, InvalidArgument, "b13", "is required when has_bias (shape [", EL, ", ", N1, "])");
    FP4MOE_REQUIRE(ck.b2 != nullptr, InvalidArgument, "b2", "is required when has_bias (shape [", EL, ", ", H, "])");
    c.b13.resize(static_cast<size_t>(EL) * N1);
    for (int e = 0; e < EL; ++e)
      for (int n = 0; n < N1; ++n) c.b13[static_cast<size_t>(e) * N1 + n] = ck.b13[static_cast<size_t>(e) * N1 + source_row(gu, n, I)];
    c.b2.assign(ck.b2, ck.b2 + static_cast<size_t>(EL) * H);
  } else {
    FP4MOE_REQUIRE(ck.b13 == nullptr, InvalidArgument, "b13", "was given but the config has has_bias = false");
    FP4MOE_REQUIRE(ck.b2 == nullptr, InvalidArgument, "b2", "was given but the config has has_bias = false");
  }
  return c;
}

}  // namespace fp4moe
