// MoeConfig: validation, printing, and the names of the enums.
#include <array>
#include <cmath>
#include <sstream>

#include "fp4moe/config.h"
#include "fp4moe/errors.h"

namespace fp4moe {
namespace {

template <typename Enum, size_t N>
Enum parse_enum(std::string_view s, const char* argument,
                const std::array<std::pair<std::string_view, Enum>, N>& names) {
  for (const auto& [name, value] : names)
    if (s == name) return value;
  std::string accepted;
  for (const auto& [name, value] : names) accepted += (accepted.empty() ? "" : ", ") + std::string(name);
  throw InvalidArgument(argument, detail::concat(argument, ": unknown value '", s, "' (accepted: ", accepted, ")"));
}

}  // namespace

std::string_view to_string(WeightFormat f) { return f == WeightFormat::kNVFP4 ? "nvfp4" : "mxfp4"; }

std::string_view to_string(ActMode m) {
  switch (m) {
    case ActMode::kA4: return "a4";
    case ActMode::kA16: return "a16";
    case ActMode::kA8: return "a8";
  }
  return "?";
}

std::string_view to_string(Activation a) {
  switch (a) {
    case Activation::kSilu: return "silu";
    case Activation::kGeluTanh: return "gelu_tanh";
    case Activation::kSwigluOai: return "swiglu_oai";
    case Activation::kRelu2: return "relu2";
  }
  return "?";
}

std::string_view to_string(OutputDType d) { return d == OutputDType::kBF16 ? "bf16" : "fp32"; }

std::string_view to_string(Backend b) {
  switch (b) {
    case Backend::kAuto: return "auto";
    case Backend::kReference: return "reference";
    case Backend::kGeneric: return "generic";
    case Backend::kDirectMicro: return "direct_micro";
    case Backend::kMicro: return "micro";
    case Backend::kStatic: return "static";
    case Backend::kDynamic: return "dynamic";
  }
  return "?";
}

WeightFormat parse_weight_format(std::string_view s, const char* argument) {
  return parse_enum<WeightFormat, 2>(s, argument, {{{"nvfp4", WeightFormat::kNVFP4}, {"mxfp4", WeightFormat::kMXFP4}}});
}

ActMode parse_act_mode(std::string_view s, const char* argument) {
  return parse_enum<ActMode, 3>(s, argument, {{{"a4", ActMode::kA4}, {"a16", ActMode::kA16}, {"a8", ActMode::kA8}}});
}

Activation parse_activation(std::string_view s, const char* argument) {
  return parse_enum<Activation, 5>(s, argument,
                                   {{{"silu", Activation::kSilu},
                                     {"gelu_tanh", Activation::kGeluTanh},
                                     {"swiglu_oai", Activation::kSwigluOai},
                                     {"swigluoai_uninterleave", Activation::kSwigluOai},
                                     {"relu2", Activation::kRelu2}}});
}

Backend parse_backend(std::string_view s, const char* argument) {
  return parse_enum<Backend, 7>(s, argument,
                                {{{"auto", Backend::kAuto},
                                  {"reference", Backend::kReference},
                                  {"generic", Backend::kGeneric},
                                  {"direct_micro", Backend::kDirectMicro},
                                  {"micro", Backend::kMicro},
                                  {"static", Backend::kStatic},
                                  {"dynamic", Backend::kDynamic}}});
}

void MoeConfig::validate() const {
  // Enums arrive from casts and bindings too: an out-of-range value is an error, not a default.
  FP4MOE_REQUIRE(format == WeightFormat::kNVFP4 || format == WeightFormat::kMXFP4, InvalidArgument, "format",
                 "unknown WeightFormat value ", static_cast<int>(format));
  FP4MOE_REQUIRE(mode == ActMode::kA4 || mode == ActMode::kA16 || mode == ActMode::kA8, InvalidArgument, "mode",
                 "unknown ActMode value ", static_cast<int>(mode));
  FP4MOE_REQUIRE(activation == Activation::kSilu || activation == Activation::kGeluTanh ||
                     activation == Activation::kSwigluOai || activation == Activation::kRelu2,
                 InvalidArgument, "activation", "unknown Activation value ", static_cast<int>(activation));
  FP4MOE_REQUIRE(output_dtype == OutputDType::kBF16 || output_dtype == OutputDType::kFP32, InvalidArgument,
                 "output_dtype", "unknown OutputDType value ", static_cast<int>(output_dtype));
  FP4MOE_REQUIRE(num_experts >= 1 && num_experts <= kMaxExperts, InvalidArgument, "num_experts",
                 "must be in [1, ", kMaxExperts, "], got ", num_experts);
  FP4MOE_REQUIRE(top_k >= 1 && top_k <= kMaxTopK, InvalidArgument, "top_k", "must be in [1, ", kMaxTopK,
                 "], got ", top_k);
  FP4MOE_REQUIRE(local_expert_first >= 0 && local_expert_first < num_experts, InvalidArgument,
                 "local_expert_first", "must be in [0, num_experts=", num_experts, "), got ", local_expert_first);
  FP4MOE_REQUIRE(local_expert_count == -1 || (local_expert_count >= 1 && local_expert_first + local_expert_count <= num_experts),
                 InvalidArgument, "local_expert_count", "local range [", local_expert_first, ", ",
                 local_expert_first + local_expert_count, ") must be non-empty and inside [0, num_experts=",
                 num_experts, ") (or -1 for all experts)");
  FP4MOE_REQUIRE(local_expert_count != -1 || local_expert_first == 0, InvalidArgument, "local_expert_count",
                 "-1 (all experts) needs local_expert_first = 0, got ", local_expert_first);
  FP4MOE_REQUIRE(hidden >= 1, InvalidArgument, "hidden", "must be positive, got ", hidden);
  FP4MOE_REQUIRE(intermediate >= 1, InvalidArgument, "intermediate", "must be positive, got ", intermediate);
  // Every quantised operand is cut into blocks along K: H for W13 and x, I for W2 and the
  // intermediate. The activation blocks of a8 are 32 wide whatever the weight format.
  const int block = std::max(weight_block(), act_block());
  FP4MOE_REQUIRE(hidden % block == 0, InvalidArgument, "hidden", "must be a multiple of the block size ", block,
                 " (", fp4moe::to_string(format), ", ", fp4moe::to_string(mode), "), got ", hidden);
  FP4MOE_REQUIRE(intermediate % block == 0, InvalidArgument, "intermediate", "must be a multiple of the block size ",
                 block, " (", fp4moe::to_string(format), ", ", fp4moe::to_string(mode), "), got ", intermediate);
  FP4MOE_REQUIRE(hidden <= 65536, Unsupported, "hidden", "up to 65536 is supported, got ", hidden);
  FP4MOE_REQUIRE(intermediate <= 65536, Unsupported, "intermediate", "up to 65536 is supported, got ", intermediate);
  if (activation == Activation::kSwigluOai) {
    FP4MOE_REQUIRE(std::isfinite(swiglu.alpha) && std::isfinite(swiglu.beta), InvalidArgument, "swiglu",
                   "alpha and beta must be finite, got alpha=", swiglu.alpha, " beta=", swiglu.beta);
    FP4MOE_REQUIRE(swiglu.limit > 0.0f, InvalidArgument, "swiglu.limit",
                   "must be positive (+inf for no clamp), got ", swiglu.limit);
  }
}

std::string MoeConfig::to_string() const {
  std::ostringstream os;
  os << "MoeConfig(E=" << num_experts;
  if (local_expert_count != -1) os << " local=[" << local_expert_first << "," << local_expert_first + local_expert_count << ")";
  os << " H=" << hidden << " I=" << intermediate << " K=" << top_k << " " << fp4moe::to_string(format) << "-"
     << fp4moe::to_string(mode) << " " << fp4moe::to_string(activation);
  if (activation == Activation::kSwigluOai)
    os << "(alpha=" << swiglu.alpha << " beta=" << swiglu.beta << " limit=" << swiglu.limit << ")";
  if (has_bias) os << " bias";
  os << " out=" << fp4moe::to_string(output_dtype) << ")";
  return os.str();
}

}  // namespace fp4moe
