// fp4moe/config.h — what the MoE layer is (MoeConfig) and the typed enums around it.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace fp4moe {

enum class WeightFormat : int { kNVFP4, kMXFP4 };

// What the tokens become before each GEMM (design.md §1).
enum class ActMode : int {
  kA4,   // quantised to the weight's format (NVFP4 with a global scale, or MXFP4)
  kA16,  // bf16, unquantised
  kA8,   // MXFP8: E4M3 with a UE8M0 scale per 32
};

enum class Activation : int { kSilu, kGeluTanh, kSwigluOai, kRelu2 };

enum class OutputDType : int { kBF16, kFP32 };
enum class IndexType : int { kInt32, kInt64 };

// Which implementation runs a call. kAuto picks per call; a forced backend that cannot run the
// shape raises Unsupported, it never falls back.
enum class Backend : int {
  kAuto,
  kReference,    // the CPU implementation (src/reference)
  kGeneric,      // the general GPU path: routing pre-pass + grouped GEMMs + combine
  kDirectMicro,  // smallest decode: one cooperative launch, no routing pre-pass
  kMicro,        // small decode: not built; forcing it raises Unsupported
  kStatic,       // after the routing + gather launch, FC1, FC2 and the top-k sum in one cooperative launch of
                 // dynamic's GEMM core, sm_90, T·K <= 4096; forced only (slower than dynamic: README "Status")
  kDynamic,      // prefill: persistent, warp-specialised
};

// The gpt-oss SwiGLU parameters: out = g·σ(α·g)·(u + β) after g = min(g, L), u = clamp(u, -L, L).
// limit = +inf means no clamp.
struct SwigluParams {
  float alpha = 1.702f;
  float beta = 1.0f;
  float limit = std::numeric_limits<float>::infinity();
};

struct MoeConfig {
  int num_experts = 0;          // E, global
  int local_expert_first = 0;   // this instance holds experts [first, first + count)
  int local_expert_count = -1;  // -1: all E
  int hidden = 0;               // H
  int intermediate = 0;         // I (logical; padded internally where a kernel needs it)
  int top_k = 0;                // K
  WeightFormat format = WeightFormat::kNVFP4;
  ActMode mode = ActMode::kA4;
  Activation activation = Activation::kSilu;
  SwigluParams swiglu{};
  bool has_bias = false;        // per-expert b13 [2I or I] and b2 [H]
  OutputDType output_dtype = OutputDType::kBF16;

  int local_count() const { return local_expert_count < 0 ? num_experts : local_expert_count; }
  bool gated() const { return activation != Activation::kRelu2; }
  int fc1_rows() const { return gated() ? 2 * intermediate : intermediate; }  // N of FC1
  int weight_block() const { return format == WeightFormat::kNVFP4 ? 16 : 32; }
  // Block size along K of the activation quantiser for this mode (0 for a16).
  int act_block() const {
    return mode == ActMode::kA16 ? 0 : (mode == ActMode::kA8 ? 32 : weight_block());
  }
  // True when FC1/FC2 inputs are NVFP4 with per-expert global scales (the only mode that needs
  // fc1/fc2 input scales).
  bool needs_input_scales() const { return mode == ActMode::kA4 && format == WeightFormat::kNVFP4; }

  // Throws InvalidArgument / Unsupported naming the field and its value.
  void validate() const;
  std::string to_string() const;
};

// Limits promised by design.md §5.
inline constexpr int kMaxExperts = 1024;
inline constexpr int kMaxTopK = 32;

std::string_view to_string(WeightFormat);
std::string_view to_string(ActMode);
std::string_view to_string(Activation);
std::string_view to_string(OutputDType);
std::string_view to_string(Backend);

// Parse the names printed by to_string (also "nvfp4", "a16", "swiglu_oai", "direct_micro", …);
// throw InvalidArgument naming `argument` and listing the accepted names.
WeightFormat parse_weight_format(std::string_view s, const char* argument = "format");
ActMode parse_act_mode(std::string_view s, const char* argument = "mode");
Activation parse_activation(std::string_view s, const char* argument = "activation");
Backend parse_backend(std::string_view s, const char* argument = "backend");

}  // namespace fp4moe
