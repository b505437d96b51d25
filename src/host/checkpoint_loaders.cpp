// Loading one MoE layer's experts from ModelOpt NVFP4 and gpt-oss MXFP4 safetensors checkpoints
// (include/fp4moe/checkpoint.h). Every tensor's dtype and shape is checked against what the layer
// needs before a byte is copied; errors name the file and the tensor.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "fp4moe/checkpoint.h"
#include "fp4moe/errors.h"
#include "fp4moe/formats.h"

namespace fp4moe {
namespace {

std::string default_prefix(const LayerLoadOptions& o) {
  std::string p = o.prefix.empty() ? std::string("model.layers.{L}.mlp.experts.") : o.prefix;
  const std::string key = "{L}";
  for (size_t pos; (pos = p.find(key)) != std::string::npos;) p.replace(pos, key.size(), std::to_string(o.layer));
  return p;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// The tensor `name`, checked to be one of `dtypes` and, where `shape` is non-empty, of that shape
// (-1 entries: any extent, returned through the tensor's own shape).
const StTensor& need(const CheckpointFiles& files, const std::string& name, std::initializer_list<StDType> dtypes,
                     const std::vector<int64_t>& shape) {
  const StTensor& t = files.get(name);
  bool ok = false;
  std::string accepted;
  for (StDType d : dtypes) {
    ok |= t.dtype == d;
    accepted += (accepted.empty() ? "" : " or ") + std::string(to_string(d));
  }
  FP4MOE_REQUIRE(ok, InvalidArgument, t.file, "tensor '", name, "': dtype ", to_string(t.dtype), ", expected ",
                 accepted);
  bool match = t.shape.size() == shape.size();
  for (size_t i = 0; match && i < shape.size(); ++i) match = shape[i] < 0 || shape[i] == t.shape[i];
  FP4MOE_REQUIRE(match, InvalidArgument, t.file, "tensor '", name, "': shape ", shape_str(t.shape), ", expected ",
                 shape_str(shape), " (-1: any)");
  return t;
}

// A scalar fp32 ([] or [1]).
float need_scalar(const CheckpointFiles& files, const std::string& name) {
  const StTensor& t = files.get(name);
  FP4MOE_REQUIRE(t.dtype == StDType::kF32, InvalidArgument, t.file, "tensor '", name, "': dtype ", to_string(t.dtype),
                 ", expected F32");
  FP4MOE_REQUIRE(t.numel() == 1 && t.shape.size() <= 1, InvalidArgument, t.file, "tensor '", name, "': shape ",
                 shape_str(t.shape), ", expected a scalar ([] or [1])");
  float v;
  std::memcpy(&v, t.data, 4);
  return v;
}

float half_to_float(uint16_t h) {
  const uint32_t s = (h >> 15) & 1u, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  float v;
  if (e == 0) v = std::ldexp(static_cast<float>(m), -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(m | 0x400u), static_cast<int>(e) - 25);
  return s ? -v : v;
}

// Element i of a BF16 / F16 / F32 tensor as fp32 (exact).
float float_at(const StTensor& t, int64_t i) {
  switch (t.dtype) {
    case StDType::kBF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return fmt::f32_from_bf16(h);
    }
    case StDType::kF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return half_to_float(h);
    }
    default: {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      return f;
    }
  }
}

void finish_config(MoeConfig& c, const LayerLoadOptions& o, const std::string& where) {
  c.top_k = o.top_k;
  c.mode = o.mode;
  FP4MOE_REQUIRE(o.top_k > 0, InvalidArgument, "options.top_k", "must be given (> 0) for ", where, ", got ", o.top_k);
  c.validate();
}

}  // namespace

LoadedLayer load_modelopt_nvfp4(const CheckpointFiles& files, const LayerLoadOptions& o) {
  const std::string prefix = default_prefix(o);
  const Activation act = o.activation.value_or(Activation::kSilu);
  const bool gated = act != Activation::kRelu2;
  int E = o.num_experts;
  if (E < 0) {
    E = 0;
    while (E < kMaxExperts && files.find(prefix + std::to_string(E) + ".down_proj.weight")) ++E;
    FP4MOE_REQUIRE(E > 0, InvalidArgument, files.description(), "no tensor '", prefix,
                   "0.down_proj.weight': not a ModelOpt MoE layer (layer ", o.layer, ", prefix '", prefix, "')");
  }
  FP4MOE_REQUIRE(o.local_expert_first >= 0 && o.local_expert_first < E, InvalidArgument, "options.local_expert_first",
                 "must lie in [0, ", E, "), got ", o.local_expert_first);
  const int EL = o.local_expert_count < 0 ? E - o.local_expert_first : o.local_expert_count;
  FP4MOE_REQUIRE(EL >= 1 && o.local_expert_first + EL <= E, InvalidArgument, "options.local_expert_count",
                 "experts [", o.local_expert_first, ", ", o.local_expert_first + EL, ") are not within the ", E,
                 " experts of the layer");

  auto name = [&](int e, const char* proj, const char* what) {
    return prefix + std::to_string(e) + "." + proj + "." + what;
  };
  const int e0 = o.local_expert_first;
  // Shapes from the first local expert: down_proj.weight [H, I/2], up_proj.weight [I, H/2].
  const StTensor& down0 = need(files, name(e0, "down_proj", "weight"), {StDType::kU8}, {-1, -1});
  const StTensor& up0 = need(files, name(e0, "up_proj", "weight"), {StDType::kU8}, {-1, -1});
  const int64_t H = down0.shape[0], I = up0.shape[0];
  FP4MOE_REQUIRE(up0.shape[1] * 2 == H && down0.shape[1] * 2 == I && H > 0 && I > 0 && H <= (1 << 20) && I <= (1 << 20),
                 InvalidArgument, up0.file, "tensor '", up0.name, "' ", shape_str(up0.shape), " and '", down0.name, "' ",
                 shape_str(down0.shape), " do not describe [I, H/2] and [H, I/2]");

  MoeConfig c;
  c.num_experts = E;
  c.local_expert_first = o.local_expert_first;
  c.local_expert_count = EL == E ? -1 : EL;
  c.hidden = static_cast<int>(H);
  c.intermediate = static_cast<int>(I);
  c.format = WeightFormat::kNVFP4;
  c.activation = act;
  c.swiglu = o.swiglu.value_or(SwigluParams{});
  c.has_bias = false;
  finish_config(c, o, "a ModelOpt checkpoint");

  const int64_t N1 = gated ? 2 * I : I;
  LoadedLayer out;
  out.config = c;
  QuantizedCheckpoint& ck = out.checkpoint;
  ck.gate_up = GateUpLayout::kUpGate;
  auto init = [&](QuantizedProjection& p, int64_t rows, int64_t cols) {
    p.experts = EL, p.rows = static_cast<int>(rows), p.cols = static_cast<int>(cols);
    p.format = WeightFormat::kNVFP4, p.scale_layout = ScaleLayout::kLinear;
    p.packed.resize(static_cast<size_t>(EL * rows * cols / 2));
    p.scales.resize(static_cast<size_t>(EL * rows * cols / 16));
    p.global_scale.resize(EL);
  };
  init(ck.w13, N1, H);
  init(ck.w2, H, I);
  const bool want_inputs = c.needs_input_scales();
  if (want_inputs) {
    ck.fc1_input_scale.resize(EL);
    ck.fc2_input_scale.resize(EL);
  }

  // Copy projection `proj` of expert e into rows [row0, row0 + rows) of p; returns its global scale.
  auto copy = [&](QuantizedProjection& p, int le, int e, const char* proj, int64_t row0, int64_t rows, int64_t cols) {
    const StTensor& w = need(files, name(e, proj, "weight"), {StDType::kU8}, {rows, cols / 2});
    const StTensor& s = need(files, name(e, proj, "weight_scale"), {StDType::kF8_E4M3, StDType::kU8}, {rows, cols / 16});
    const size_t wb = static_cast<size_t>(rows * cols / 2), sb = static_cast<size_t>(rows * cols / 16);
    std::memcpy(p.packed.data() + static_cast<size_t>(le * p.rows + row0) * (cols / 2), w.data, wb);
    std::memcpy(p.scales.data() + static_cast<size_t>(le * p.rows + row0) * (cols / 16), s.data, sb);
    const std::string g_name = name(e, proj, "weight_scale_2");
    const float g = need_scalar(files, g_name);
    FP4MOE_REQUIRE(std::isfinite(g) && g > 0, InvalidArgument, files.get(g_name).file, "tensor '", g_name,
                   "': must be finite and positive, got ", g);
    return g;
  };
  auto input_scale = [&](int e, const char* proj) {
    const std::string n = name(e, proj, "input_scale");
    const StTensor* t = files.find(n);
    FP4MOE_REQUIRE(t != nullptr, InvalidArgument, files.description(), "no tensor '", n,
                   "': mode a4 with NVFP4 weights needs the checkpoint's static input scales");
    return need_scalar(files, n);
  };

  for (int le = 0; le < EL; ++le) {
    const int e = e0 + le;
    const float g_up = copy(ck.w13, le, e, "up_proj", 0, I, H);
    float g13 = g_up;
    if (gated) {
      const float g_gate = copy(ck.w13, le, e, "gate_proj", I, I, H);
      if (g_gate != g_up) {
        FP4MOE_REQUIRE(o.rescale_mismatched_gate_up, InvalidArgument, files.get(name(e, "gate_proj", "weight_scale_2")).file,
                       "expert ", e, ": gate_proj.weight_scale_2 = ", g_gate, " differs from up_proj.weight_scale_2 = ",
                       g_up, "; the fused W13 takes one global scale per expert (set rescale_mismatched_gate_up to "
                       "re-round the block scales of one half to the larger)");
        g13 = std::max(g_gate, g_up);
        const float g_old = g_gate < g_up ? g_gate : g_up;
        const int64_t row0 = g_gate < g_up ? I : 0;  // the half whose scales are re-rounded
        uint8_t* s = ck.w13.scales.data() + static_cast<size_t>(le * N1 + row0) * (H / 16);
        for (int64_t i = 0; i < I * (H / 16); ++i)
          s[i] = fmt::e4m3_encode(static_cast<float>(static_cast<double>(fmt::e4m3_decode(s[i])) * g_old / g13));
      }
    }
    ck.w13.global_scale[le] = g13;
    ck.w2.global_scale[le] = copy(ck.w2, le, e, "down_proj", 0, H, I);
    if (want_inputs) {
      float in1 = input_scale(e, "up_proj");
      if (gated) in1 = std::max(in1, input_scale(e, "gate_proj"));  // one quantisation of x feeds both
      ck.fc1_input_scale[le] = in1;
      ck.fc2_input_scale[le] = input_scale(e, "down_proj");
    }
  }
  return out;
}

LoadedLayer load_gpt_oss_mxfp4(const CheckpointFiles& files, const LayerLoadOptions& o) {
  const std::string prefix = default_prefix(o);
  const Activation act = o.activation.value_or(Activation::kSwigluOai);
  FP4MOE_REQUIRE(act != Activation::kRelu2, InvalidArgument, "options.activation",
                 "gpt-oss experts are gated (interleaved gate/up); relu2 does not apply");
  const StTensor& gu = need(files, prefix + "gate_up_proj_blocks", {StDType::kU8}, {-1, -1, -1, 16});
  const int64_t E = gu.shape[0], N1 = gu.shape[1], H = gu.shape[2] * 32;
  FP4MOE_REQUIRE(E >= 1 && E <= kMaxExperts && N1 >= 2 && N1 % 2 == 0 && N1 <= (1 << 21) && H >= 32 && H <= (1 << 20),
                 InvalidArgument, gu.file, "tensor '", gu.name, "': shape ", shape_str(gu.shape),
                 " is not [E, 2I, H/32, 16] with E in [1, ", kMaxExperts, "] and an even 2I");
  const int64_t I = N1 / 2;
  FP4MOE_REQUIRE(I % 32 == 0, InvalidArgument, gu.file, "tensor '", gu.name, "': I = ", I,
                 " is not a multiple of 32 (down_proj's MXFP4 blocks run along I)");
  const StTensor& gus = need(files, prefix + "gate_up_proj_scales", {StDType::kU8, StDType::kF8_E8M0}, {E, N1, H / 32});
  const StTensor& dn = need(files, prefix + "down_proj_blocks", {StDType::kU8}, {E, H, I / 32, 16});
  const StTensor& dns = need(files, prefix + "down_proj_scales", {StDType::kU8, StDType::kF8_E8M0}, {E, H, I / 32});
  const StTensor* gub = files.find(prefix + "gate_up_proj_bias");
  const StTensor* dnb = files.find(prefix + "down_proj_bias");
  FP4MOE_REQUIRE((gub == nullptr) == (dnb == nullptr), InvalidArgument, files.description(),
                 "gate_up_proj_bias and down_proj_bias must both be present or both absent");
  if (gub) {
    gub = &need(files, prefix + "gate_up_proj_bias", {StDType::kBF16, StDType::kF16, StDType::kF32}, {E, N1});
    dnb = &need(files, prefix + "down_proj_bias", {StDType::kBF16, StDType::kF16, StDType::kF32}, {E, H});
  }
  FP4MOE_REQUIRE(o.local_expert_first >= 0 && o.local_expert_first < E, InvalidArgument, "options.local_expert_first",
                 "must lie in [0, ", E, "), got ", o.local_expert_first);
  const int64_t EL = o.local_expert_count < 0 ? E - o.local_expert_first : o.local_expert_count;
  FP4MOE_REQUIRE(EL >= 1 && o.local_expert_first + EL <= E, InvalidArgument, "options.local_expert_count",
                 "experts [", o.local_expert_first, ", ", o.local_expert_first + EL, ") are not within the ", E,
                 " experts of the layer");
  FP4MOE_REQUIRE(o.num_experts < 0 || o.num_experts == E, InvalidArgument, "options.num_experts", "is ",
                 o.num_experts, " but the checkpoint holds ", E, " experts");

  MoeConfig c;
  c.num_experts = static_cast<int>(E);
  c.local_expert_first = o.local_expert_first;
  c.local_expert_count = EL == E ? -1 : static_cast<int>(EL);
  c.hidden = static_cast<int>(H);
  c.intermediate = static_cast<int>(I);
  c.format = WeightFormat::kMXFP4;
  c.activation = act;
  c.swiglu = o.swiglu.value_or(SwigluParams{1.702f, 1.0f, 7.0f});
  c.has_bias = gub != nullptr;
  finish_config(c, o, "a gpt-oss checkpoint");

  LoadedLayer out;
  out.config = c;
  QuantizedCheckpoint& ck = out.checkpoint;
  ck.gate_up = GateUpLayout::kInterleaved;
  const int64_t e0 = o.local_expert_first;
  auto slice = [&](QuantizedProjection& p, const StTensor& blocks, const StTensor& scales, int64_t rows, int64_t cols) {
    p.experts = static_cast<int>(EL), p.rows = static_cast<int>(rows), p.cols = static_cast<int>(cols);
    p.format = WeightFormat::kMXFP4, p.scale_layout = ScaleLayout::kLinear;
    const size_t pb = static_cast<size_t>(rows * cols / 2), sb = static_cast<size_t>(rows * cols / 32);
    p.packed.assign(blocks.data + e0 * pb, blocks.data + (e0 + EL) * pb);
    p.scales.assign(scales.data + e0 * sb, scales.data + (e0 + EL) * sb);
  };
  slice(ck.w13, gu, gus, N1, H);
  slice(ck.w2, dn, dns, H, I);
  if (gub) {
    ck.b13.resize(static_cast<size_t>(EL * N1));
    ck.b2.resize(static_cast<size_t>(EL * H));
    for (int64_t i = 0; i < EL * N1; ++i) ck.b13[i] = float_at(*gub, e0 * N1 + i);
    for (int64_t i = 0; i < EL * H; ++i) ck.b2[i] = float_at(*dnb, e0 * H + i);
  }
  return out;
}

}  // namespace fp4moe
