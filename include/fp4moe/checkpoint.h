// fp4moe/checkpoint.h — reading the experts of one MoE layer from safetensors checkpoints.
//
// SafetensorsFile is a strict reader of the safetensors format (8-byte little-endian header length
// N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the data). Everything is validated when the file is opened: header length within the file,
// well-formed JSON (bounded nesting), known dtypes, shapes whose byte size matches the offsets,
// offsets sorted, contiguous, non-overlapping and covering exactly the data. A malformed, truncated
// or lying file throws fp4moe::InvalidArgument whose argument is the file name and whose message
// names the tensor; nothing reads past the buffer.
//
// The loaders turn one layer of a real checkpoint into a QuantizedCheckpoint (the owned form
// prepare_weights() takes through .view()) plus the MoeConfig its shapes imply:
//   * ModelOpt NVFP4: per expert e and projection p in {gate_proj, up_proj, down_proj}:
//       {prefix}{e}.{p}.weight         uint8 [N, K/2]   (E2M1, element 2j in the low nibble)
//       {prefix}{e}.{p}.weight_scale   F8_E4M3 [N, K/16] (linear)
//       {prefix}{e}.{p}.weight_scale_2 F32 scalar ([] or [1]): decode global scale
//       {prefix}{e}.{p}.input_scale    F32 scalar: decode scale of that projection's input
//     with prefix "model.layers.{L}.mlp.experts.". relu2 layers have no gate_proj.
//   * gpt-oss MXFP4: {prefix}gate_up_proj_blocks U8 [E, 2I, H/32, 16], gate_up_proj_scales U8
//     [E, 2I, H/32] (UE8M0), gate_up_proj_bias BF16/F32 [E, 2I] (gate/up interleaved row by row,
//     gate first), down_proj_blocks [E, H, I/32, 16], down_proj_scales [E, H, I/32],
//     down_proj_bias [E, H].
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fp4moe/config.h"
#include "fp4moe/weights.h"

namespace fp4moe {

// safetensors dtype names ("U8", "F8_E4M3", "BF16", ...). Sub-byte types (F4) count in bits.
enum class StDType : int {
  kBool, kU8, kI8, kF8_E4M3, kF8_E5M2, kF8_E8M0, kF4, kI16, kU16, kF16, kBF16,
  kI32, kU32, kF32, kI64, kU64, kF64,
};
const char* to_string(StDType);
int dtype_bits(StDType);

struct StTensor {
  std::string name;
  std::string file;  // the file it is in (for messages)
  StDType dtype = StDType::kU8;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the file's buffer; valid while the file lives
  size_t nbytes = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps the file read-only and validates it. `path` names the file in every error.
  static SafetensorsFile open(const std::string& path);
  // Parses bytes already in memory (copied). `name` stands for the file in errors.
  static SafetensorsFile from_bytes(const uint8_t* data, size_t size, const std::string& name = "<memory>");

  const std::string& path() const;
  bool contains(const std::string& tensor) const;
  std::vector<std::string> names() const;                    // sorted
  const std::map<std::string, std::string>& metadata() const;
  // Throws InvalidArgument (argument = the file) when absent.
  const StTensor& get(const std::string& tensor) const;
  const StTensor* find(const std::string& tensor) const;    // nullptr when absent

  struct Impl;
  SafetensorsFile() = default;

 private:
  std::shared_ptr<const Impl> impl_;
};

// Writes a safetensors file (for tests and tools). Tensors are written in the given order; each
// data pointer must hold the dtype/shape's byte count.
struct StTensorData {
  std::string name;
  StDType dtype;
  std::vector<int64_t> shape;
  const void* data;
};
void write_safetensors(const std::string& path, const std::vector<StTensorData>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
std::vector<uint8_t> serialize_safetensors(const std::vector<StTensorData>& tensors,
                                           const std::map<std::string, std::string>& metadata = {});

// A set of checkpoint files (e.g. the shards model-0000k-of-0000n.safetensors); a tensor is looked
// up in all of them (a name in two files is an error).
class CheckpointFiles {
 public:
  // Each path is a .safetensors file or a directory whose *.safetensors files are all opened.
  explicit CheckpointFiles(const std::vector<std::string>& paths);
  const StTensor* find(const std::string& tensor) const;
  const StTensor& get(const std::string& tensor) const;  // InvalidArgument naming the tensor and the paths
  std::string description() const;                        // the paths, for messages

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> index_;
};

// What the checkpoint does not say about the layer.
struct LayerLoadOptions {
  int layer = 0;
  int top_k = 0;                      // required (> 0): routing is not in the expert tensors
  ActMode mode = ActMode::kA4;
  std::optional<Activation> activation;  // default: silu (ModelOpt), swiglu_oai (gpt-oss)
  std::optional<SwigluParams> swiglu;    // default: {1.702, 1, 7} for gpt-oss, else SwigluParams{}
  int local_expert_first = 0;         // load experts [first, first + count) of the layer
  int local_expert_count = -1;        // -1: all experts found
  int num_experts = -1;               // -1: inferred (ModelOpt: count of experts present)
  std::string prefix;                 // empty: the loader's default with {L} = layer
  // ModelOpt stores weight_scale_2 for gate_proj and up_proj separately; the fused W13 takes one per
  // expert. When they differ: false → InvalidArgument; true → the larger is used and the other
  // half's E4M3 block scales are re-rounded to it (lossy where a scale is not representable).
  bool rescale_mismatched_gate_up = false;
};

struct LoadedLayer {
  MoeConfig config;
  QuantizedCheckpoint checkpoint;  // .view() goes to prepare_weights(config, ...)
};

// prefix default: "model.layers.{L}.mlp.experts." (then "{e}.gate_proj.weight" ...).
LoadedLayer load_modelopt_nvfp4(const CheckpointFiles& files, const LayerLoadOptions& options);
// prefix default: "model.layers.{L}.mlp.experts." (then "gate_up_proj_blocks" ...).
LoadedLayer load_gpt_oss_mxfp4(const CheckpointFiles& files, const LayerLoadOptions& options);

}  // namespace fp4moe
