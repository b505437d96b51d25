// fp4moe._ext — the nanobind module under the Python package. Thin: it checks DLPack tensors
// (device, dtype, shape, contiguity), hands raw pointers to the C++ API and maps its typed errors to
// Python exceptions. The FlashInfer-style argument handling lives in python/fp4moe/api.py.
#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fp4moe/checkpoint.h"
#include "fp4moe/fp4moe.h"
#include "reference/reference.h"
#include "testing/problem.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace fp4moe;

namespace {

using Array = nb::ndarray<>;  // any DLPack tensor (numpy, torch, cupy, jax), any device
constexpr int kCPU = 1, kCUDA = 2, kCUDAHost = 3;

std::string dtype_name(nb::dlpack::dtype d) {
  const char* code = "?";
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Int: code = "int"; break;
    case nb::dlpack::dtype_code::UInt: code = "uint"; break;
    case nb::dlpack::dtype_code::Float: code = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: code = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: code = "complex"; break;
    case nb::dlpack::dtype_code::Bool: code = "bool"; break;
    default: break;
  }
  return std::string(code) + std::to_string(d.bits);
}

bool is(const Array& a, nb::dlpack::dtype_code c, int bits) {
  return a.dtype().code == static_cast<uint8_t>(c) && a.dtype().bits == bits && a.dtype().lanes == 1;
}
bool is_bytes(const Array& a) { return a.dtype().bits == 8 && a.dtype().lanes == 1; }
bool is_16bit_raw(const Array& a) {
  return is(a, nb::dlpack::dtype_code::Bfloat, 16) || is(a, nb::dlpack::dtype_code::UInt, 16) ||
         is(a, nb::dlpack::dtype_code::Int, 16);
}

std::string shape_of(const Array& a) {
  std::string s = "[";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + "]";
}

void require_contiguous(const Array& a, const char* name) {
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1)
      FP4MOE_REQUIRE(a.stride(i) == expect, InvalidArgument, name, "must be row-major contiguous (shape ", shape_of(a),
                     ")");
    expect *= static_cast<int64_t>(a.shape(i));
  }
}

void require_shape(const Array& a, const char* name, std::initializer_list<int64_t> shape) {
  bool ok = a.ndim() == shape.size();
  size_t i = 0;
  for (int64_t s : shape) ok = ok && static_cast<int64_t>(a.shape(i++)) == s;
  std::string want = "[";
  i = 0;
  for (int64_t s : shape) want += (i++ ? ", " : "") + std::to_string(s);
  FP4MOE_REQUIRE(ok, InvalidArgument, name, "shape ", shape_of(a), ", expected ", want, "]");
}

// A host array of exactly `bytes` bytes (any shape), contiguous.
const uint8_t* host_bytes(const std::optional<Array>& a, const char* name, int64_t bytes, bool required = true) {
  if (!a) {
    FP4MOE_REQUIRE(!required, InvalidArgument, name, "is required");
    return nullptr;
  }
  FP4MOE_REQUIRE(a->device_type() == kCPU || a->device_type() == kCUDAHost, InvalidArgument, name,
                 "must be a host (CPU) array for preparation");
  require_contiguous(*a, name);
  FP4MOE_REQUIRE(static_cast<int64_t>(a->nbytes()) == bytes, InvalidArgument, name, "holds ", a->nbytes(),
                 " bytes (shape ", shape_of(*a), ", ", dtype_name(a->dtype()), "), expected ", bytes);
  return static_cast<const uint8_t*>(a->data());
}

const float* host_f32(const std::optional<Array>& a, const char* name, int64_t count) {
  if (!a) return nullptr;
  FP4MOE_REQUIRE(is(*a, nb::dlpack::dtype_code::Float, 32), InvalidArgument, name, "must be float32, got ",
                 dtype_name(a->dtype()));
  return reinterpret_cast<const float*>(host_bytes(a, name, count * 4));
}

ScaleLayout parse_layout(const std::string& s, const char* arg) {
  if (s == "linear") return ScaleLayout::kLinear;
  if (s == "swizzled" || s == "swizzled128x4") return ScaleLayout::kSwizzled128x4;
  throw InvalidArgument(arg, std::string(arg) + ": unknown scale layout '" + s + "' (accepted: linear, swizzled)");
}
GateUpLayout parse_gate_up(const std::string& s) {
  if (s == "up_gate") return GateUpLayout::kUpGate;
  if (s == "gate_up") return GateUpLayout::kGateUp;
  if (s == "interleaved") return GateUpLayout::kInterleaved;
  throw InvalidArgument("gate_up", "gate_up: unknown value '" + s + "' (accepted: up_gate, gate_up, interleaved)");
}
OutputDType parse_output(const std::string& s) {
  if (s == "bf16" || s == "bfloat16") return OutputDType::kBF16;
  if (s == "fp32" || s == "float32") return OutputDType::kFP32;
  throw InvalidArgument("output_dtype", "output_dtype: unknown value '" + s + "' (accepted: bf16, fp32)");
}

int64_t scale_bytes(ScaleLayout l, int64_t rows, int64_t cols) {
  return l == ScaleLayout::kLinear ? rows * cols : swizzled_scale_bytes(rows, cols);
}

PreparedWeights prepare(const MoeConfig& c, const std::optional<Array>& w13, const std::optional<Array>& w13_sf,
                        const std::string& w13_layout, const std::optional<Array>& w13_gs,
                        const std::optional<Array>& w2, const std::optional<Array>& w2_sf,
                        const std::string& w2_layout, const std::optional<Array>& w2_gs, const std::string& gate_up,
                        const std::optional<Array>& fc1_in, const std::optional<Array>& fc2_in,
                        const std::optional<Array>& b13, const std::optional<Array>& b2, int device) {
  c.validate();
  const int64_t EL = c.local_count(), N1 = c.fc1_rows(), H = c.hidden, I = c.intermediate, bs = c.weight_block();
  CheckpointView v;
  v.w13.scale_layout = parse_layout(w13_layout, "w1_weight_sf");
  v.w2.scale_layout = parse_layout(w2_layout, "w2_weight_sf");
  v.w13.packed = host_bytes(w13, "w1_weight", EL * N1 * H / 2);
  v.w13.scales = host_bytes(w13_sf, "w1_weight_sf", EL * scale_bytes(v.w13.scale_layout, N1, H / bs));
  v.w13.global_scale = host_f32(w13_gs, "w1_global_scale", EL);
  v.w2.packed = host_bytes(w2, "w2_weight", EL * H * I / 2);
  v.w2.scales = host_bytes(w2_sf, "w2_weight_sf", EL * scale_bytes(v.w2.scale_layout, H, I / bs));
  v.w2.global_scale = host_f32(w2_gs, "w2_global_scale", EL);
  v.gate_up = parse_gate_up(gate_up);
  v.fc1_input_scale = host_f32(fc1_in, "fc1_input_scale", EL);
  v.fc2_input_scale = host_f32(fc2_in, "fc2_input_scale", EL);
  v.b13 = host_f32(b13, "w1_bias", EL * N1);
  v.b2 = host_f32(b2, "w2_bias", EL * H);
  PrepareOptions o;
  o.device = device;
  nb::gil_scoped_release release;
  return prepare_weights(c, v, o);
}

struct PyRunner {
  MoeRunner runner;
  int device;
};

void run(PyRunner& r, const Array& x, const Array& ids, const Array& weights, const Array& out, uintptr_t stream) {
  const MoeConfig& c = r.runner.config();
  const bool host = r.device < 0;
  const int64_t T = x.ndim() >= 1 ? static_cast<int64_t>(x.shape(0)) : 0;
  auto check_device = [&](const Array& a, const char* name) {
    if (host) {
      FP4MOE_REQUIRE(a.device_type() == kCPU || a.device_type() == kCUDAHost, InvalidArgument, name,
                     "is on a CUDA device but the weights were prepared for the CPU");
    } else {
      FP4MOE_REQUIRE(a.device_type() == kCUDA && a.device_id() == r.device, InvalidArgument, name,
                     "must be on cuda:", r.device, " (where the weights were prepared); got device type ",
                     a.device_type(), " id ", a.device_id());
    }
    require_contiguous(a, name);
  };
  check_device(x, "x");
  check_device(ids, "token_selected_experts");
  check_device(weights, "token_final_scales");
  check_device(out, "output");
  FP4MOE_REQUIRE(is_16bit_raw(x), InvalidArgument, "x", "must be bfloat16 (or its uint16 bits), got ",
                 dtype_name(x.dtype()));
  require_shape(x, "x", {T, c.hidden});
  IndexType it;
  if (is(ids, nb::dlpack::dtype_code::Int, 32)) it = IndexType::kInt32;
  else if (is(ids, nb::dlpack::dtype_code::Int, 64)) it = IndexType::kInt64;
  else throw InvalidArgument("token_selected_experts", "token_selected_experts: must be int32 or int64, got " + dtype_name(ids.dtype()));
  require_shape(ids, "token_selected_experts", {T, c.top_k});
  FP4MOE_REQUIRE(is(weights, nb::dlpack::dtype_code::Float, 32), InvalidArgument, "token_final_scales",
                 "must be float32, got ", dtype_name(weights.dtype()));
  require_shape(weights, "token_final_scales", {T, c.top_k});
  if (c.output_dtype == OutputDType::kBF16)
    FP4MOE_REQUIRE(is_16bit_raw(out), InvalidArgument, "output", "must be bfloat16 (or uint16 bits), got ",
                   dtype_name(out.dtype()));
  else
    FP4MOE_REQUIRE(is(out, nb::dlpack::dtype_code::Float, 32), InvalidArgument, "output", "must be float32, got ",
                   dtype_name(out.dtype()));
  require_shape(out, "output", {T, c.hidden});
  nb::gil_scoped_release release;
  r.runner.run(x.data(), ids.data(), it, static_cast<const float*>(weights.data()), out.data(), T,
               reinterpret_cast<CUstream_st*>(stream));
}

// An empty array owned by the module (host memory or cudaMalloc), exported through DLPack.
Array empty(std::vector<size_t> shape, const std::string& dtype, int device) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  nb::dlpack::dtype dt{};
  if (dtype == "bf16") dt = nb::dtype<uint16_t>(), dt.code = static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat);
  else if (dtype == "fp32") dt = nb::dtype<float>();
  else throw InvalidArgument("dtype", "dtype: bf16 or fp32, got " + dtype);
  const size_t bytes = n * dt.bits / 8;
  void* p = nullptr;
  nb::capsule owner;
  if (device < 0) {
    p = ::operator new(bytes ? bytes : 1);
    owner = nb::capsule(p, [](void* q) noexcept { ::operator delete(q); });
  } else {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device);
    const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    cudaSetDevice(prev);
    if (e != cudaSuccess) throw CapacityError("output", std::string("output: cudaMalloc failed: ") + cudaGetErrorString(e));
    owner = nb::capsule(p, [](void* q) noexcept { cudaFree(q); });
  }
  return Array(p, shape.size(), shape.data(), owner, nullptr, dt, device < 0 ? kCPU : kCUDA, device < 0 ? 0 : device);
}

template <typename T>
nb::ndarray<nb::numpy, T> numpy_copy(const std::vector<T>& v, std::vector<size_t> shape) {
  auto* data = new std::vector<T>(v);
  nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(data->data(), shape.size(), shape.data(), owner);
}

nb::dict checkpoint_arrays(const QuantizedCheckpoint& q) {
  nb::dict d;
  auto proj = [&](const QuantizedProjection& p, const char* n) {
    const size_t E = p.experts, R = p.rows, C = p.cols;
    d[(std::string(n) + "_packed").c_str()] = numpy_copy(p.packed, {E, R, C / 2});
    d[(std::string(n) + "_scales").c_str()] = numpy_copy(p.scales, {p.scales.size()});
    d[(std::string(n) + "_scale_layout").c_str()] = p.scale_layout == ScaleLayout::kLinear ? "linear" : "swizzled";
    if (!p.global_scale.empty()) d[(std::string(n) + "_global_scale").c_str()] = numpy_copy(p.global_scale, {E});
  };
  proj(q.w13, "w13");
  proj(q.w2, "w2");
  d["gate_up"] = q.gate_up == GateUpLayout::kUpGate ? "up_gate" : (q.gate_up == GateUpLayout::kGateUp ? "gate_up" : "interleaved");
  if (!q.fc1_input_scale.empty()) d["fc1_input_scale"] = numpy_copy(q.fc1_input_scale, {q.fc1_input_scale.size()});
  if (!q.fc2_input_scale.empty()) d["fc2_input_scale"] = numpy_copy(q.fc2_input_scale, {q.fc2_input_scale.size()});
  if (!q.b13.empty()) d["b13"] = numpy_copy(q.b13, {static_cast<size_t>(q.w13.experts), static_cast<size_t>(q.w13.rows)});
  if (!q.b2.empty()) d["b2"] = numpy_copy(q.b2, {static_cast<size_t>(q.w2.experts), static_cast<size_t>(q.w2.rows)});
  return d;
}

LayerLoadOptions load_options(int layer, int top_k, const std::string& mode, std::optional<std::string> activation,
                              std::optional<float> sw_alpha, std::optional<float> sw_beta, std::optional<float> sw_limit,
                              int first, int count, int num_experts, const std::string& prefix, bool rescale) {
  LayerLoadOptions o;
  o.layer = layer, o.top_k = top_k, o.mode = parse_act_mode(mode);
  if (activation) o.activation = parse_activation(*activation);
  if (sw_alpha || sw_beta || sw_limit) {
    SwigluParams s;
    if (!activation || *o.activation == Activation::kSwigluOai) s.limit = 7.0f;
    if (sw_alpha) s.alpha = *sw_alpha;
    if (sw_beta) s.beta = *sw_beta;
    if (sw_limit) s.limit = *sw_limit;
    o.swiglu = s;
  }
  o.local_expert_first = first, o.local_expert_count = count, o.num_experts = num_experts, o.prefix = prefix;
  o.rescale_mismatched_gate_up = rescale;
  return o;
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "fp4moe native module (see the fp4moe package for the user API)";
  auto base = nb::exception<Error>(m, "Error", PyExc_RuntimeError);
  nb::exception<InvalidArgument>(m, "InvalidArgument", PyExc_ValueError);
  nb::exception<Unsupported>(m, "Unsupported", PyExc_NotImplementedError);
  nb::exception<CapacityError>(m, "CapacityError", PyExc_ValueError);
  nb::exception<CudaError>(m, "CudaError", PyExc_RuntimeError);
  (void)base;
  // The C++ default line of the bf16 copy (RunnerOptions), so the Python defaults cannot drift from it.
  m.attr("DEFAULT_PREFILL_BF16_MIN_ROWS") = RunnerOptions{}.prefill_bf16_min_rows;

  nb::class_<MoeConfig>(m, "MoeConfig")
      .def(nb::init<>())
      .def_rw("num_experts", &MoeConfig::num_experts)
      .def_rw("local_expert_first", &MoeConfig::local_expert_first)
      .def_rw("local_expert_count", &MoeConfig::local_expert_count)
      .def_rw("hidden", &MoeConfig::hidden)
      .def_rw("intermediate", &MoeConfig::intermediate)
      .def_rw("top_k", &MoeConfig::top_k)
      .def_rw("has_bias", &MoeConfig::has_bias)
      .def_prop_rw("format", [](const MoeConfig& c) { return std::string(to_string(c.format)); },
                   [](MoeConfig& c, const std::string& s) { c.format = parse_weight_format(s); })
      .def_prop_rw("mode", [](const MoeConfig& c) { return std::string(to_string(c.mode)); },
                   [](MoeConfig& c, const std::string& s) { c.mode = parse_act_mode(s); })
      .def_prop_rw("activation", [](const MoeConfig& c) { return std::string(to_string(c.activation)); },
                   [](MoeConfig& c, const std::string& s) { c.activation = parse_activation(s); })
      .def_prop_rw("output_dtype", [](const MoeConfig& c) { return std::string(to_string(c.output_dtype)); },
                   [](MoeConfig& c, const std::string& s) { c.output_dtype = parse_output(s); })
      .def_prop_rw("swiglu_alpha", [](const MoeConfig& c) { return c.swiglu.alpha; },
                   [](MoeConfig& c, float v) { c.swiglu.alpha = v; })
      .def_prop_rw("swiglu_beta", [](const MoeConfig& c) { return c.swiglu.beta; },
                   [](MoeConfig& c, float v) { c.swiglu.beta = v; })
      .def_prop_rw("swiglu_limit", [](const MoeConfig& c) { return c.swiglu.limit; },
                   [](MoeConfig& c, float v) { c.swiglu.limit = v; })
      .def("local_count", &MoeConfig::local_count)
      .def("fc1_rows", &MoeConfig::fc1_rows)
      .def("weight_block", &MoeConfig::weight_block)
      .def("needs_input_scales", &MoeConfig::needs_input_scales)
      .def("validate", &MoeConfig::validate)
      .def("__repr__", [](const MoeConfig& c) { return c.to_string(); });

  nb::class_<PreparedWeights>(m, "PreparedWeights")
      .def_prop_ro("device", &PreparedWeights::device)
      .def_prop_ro("device_bytes", &PreparedWeights::device_bytes)
      .def_prop_ro("config", [](const PreparedWeights& w) { return w.config(); });

  nb::class_<PyRunner>(m, "Runner")
      .def("__init__",
           [](PyRunner* self, const MoeConfig& c, const PreparedWeights& w, int64_t max_tokens, const std::string& backend,
              bool deterministic, int cpu_threads, int64_t prefill_bf16_bytes, int64_t prefill_bf16_min_rows,
              int dynamic_tile_m) {
             RunnerOptions o;
             o.max_tokens = max_tokens, o.backend = parse_backend(backend), o.deterministic = deterministic;
             o.cpu_threads = cpu_threads;
             o.prefill_bf16_bytes = prefill_bf16_bytes, o.prefill_bf16_min_rows = prefill_bf16_min_rows;
             o.dynamic_tile_m = dynamic_tile_m;
             new (self) PyRunner{MoeRunner(c, w, o), w.device()};
           },
           "config"_a, "weights"_a, "max_tokens"_a = 4096, "backend"_a = "auto", "deterministic"_a = false,
           "cpu_threads"_a = 0, "prefill_bf16_bytes"_a = 0,
           "prefill_bf16_min_rows"_a = RunnerOptions{}.prefill_bf16_min_rows, "dynamic_tile_m"_a = 0)
      .def("run", &run, "x"_a, "token_selected_experts"_a, "token_final_scales"_a, "output"_a, "stream"_a = 0)
      .def("plan", [](const PyRunner& r, int64_t t) { return std::string(to_string(r.runner.plan(t))); })
      .def("plan_bf16_copy", [](const PyRunner& r, int64_t t) { return r.runner.plan_bf16_copy(t); })
      .def_prop_ro("device", [](const PyRunner& r) { return r.device; })
      .def_prop_ro("config", [](const PyRunner& r) { return r.runner.config(); })
      .def_prop_ro("workspace_bytes", [](const PyRunner& r) { return r.runner.workspace_bytes(); });

  m.def("prepare", &prepare, "config"_a, "w13"_a, "w13_scales"_a, "w13_scale_layout"_a, "w13_global_scale"_a.none(),
        "w2"_a, "w2_scales"_a, "w2_scale_layout"_a, "w2_global_scale"_a.none(), "gate_up"_a,
        "fc1_input_scale"_a.none(), "fc2_input_scale"_a.none(), "b13"_a.none(), "b2"_a.none(), "device"_a);
  m.def("swizzled_scale_bytes", &swizzled_scale_bytes, "rows"_a, "scale_cols"_a);
  m.def("empty", &empty, "shape"_a, "dtype"_a, "device"_a);
  m.def("cuda_device_count", &cuda_device_count);
  m.def("build_info", [] {
    BuildInfo b = build_info();
    nb::dict d;
    d["version"] = b.version, d["git_commit"] = b.git_commit, d["cuda_version"] = b.cuda_version,
    d["cuda_archs"] = b.cuda_archs;
    return d;
  });

  // ---- checkpoints ------------------------------------------------------------------------------
  nb::class_<LoadedLayer>(m, "LoadedLayer")
      .def_prop_ro("config", [](const LoadedLayer& l) { return l.config; })
      .def("arrays", [](const LoadedLayer& l) { return checkpoint_arrays(l.checkpoint); })
      .def("prepare",
           [](const LoadedLayer& l, const MoeConfig& c, int device) {
             PrepareOptions o;
             o.device = device;
             nb::gil_scoped_release release;
             return prepare_weights(c, l.checkpoint.view(), o);
           },
           "config"_a, "device"_a);
  auto loader = [&](const char* name, LoadedLayer (*fn)(const CheckpointFiles&, const LayerLoadOptions&)) {
    m.def(name,
          [fn](const std::vector<std::string>& paths, int layer, int top_k, const std::string& mode,
               std::optional<std::string> activation, std::optional<float> a, std::optional<float> b,
               std::optional<float> lim, int first, int count, int num_experts, const std::string& prefix,
               bool rescale) {
            auto o = load_options(layer, top_k, mode, activation, a, b, lim, first, count, num_experts, prefix, rescale);
            nb::gil_scoped_release release;
            return fn(CheckpointFiles(paths), o);
          },
          "paths"_a, "layer"_a, "top_k"_a, "mode"_a = "a4", "activation"_a.none() = nb::none(),
          "swiglu_alpha"_a.none() = nb::none(), "swiglu_beta"_a.none() = nb::none(),
          "swiglu_limit"_a.none() = nb::none(), "local_expert_first"_a = 0, "local_expert_count"_a = -1,
          "num_experts"_a = -1, "prefix"_a = "", "rescale_mismatched_gate_up"_a = false);
  };
  loader("load_modelopt_nvfp4", &load_modelopt_nvfp4);
  loader("load_gpt_oss_mxfp4", &load_gpt_oss_mxfp4);

  nb::class_<SafetensorsFile>(m, "SafetensorsFile")
      .def("__init__", [](SafetensorsFile* self, const std::string& path) { new (self) SafetensorsFile(SafetensorsFile::open(path)); })
      .def_static("from_bytes", [](nb::bytes b, const std::string& name) {
        return SafetensorsFile::from_bytes(static_cast<const uint8_t*>(b.data()), b.size(), name);
      }, "data"_a, "name"_a = "<memory>")
      .def("names", &SafetensorsFile::names)
      .def("metadata", &SafetensorsFile::metadata)
      .def("__contains__", &SafetensorsFile::contains)
      .def("info", [](const SafetensorsFile& f, const std::string& n) {
        const StTensor& t = f.get(n);
        return nb::make_tuple(std::string(to_string(t.dtype)), t.shape);
      })
      .def("raw", [](nb::handle self, const std::string& n) {
        const StTensor& t = nb::cast<const SafetensorsFile&>(self).get(n);
        size_t shape[1] = {t.nbytes};
        return nb::ndarray<nb::numpy, const uint8_t>(t.data, 1, shape, self);
      }, "name"_a, "The tensor's bytes as a read-only uint8 numpy view.");

  // ---- testing helpers: the testkit problem and the float64 reference (python/tests) -------------
  m.def("_make_problem", [](const MoeConfig& c, int64_t tokens, uint64_t seed, const std::string& gate_up,
                            const std::string& layout) {
    testkit::ProblemSpec s;
    s.config = c, s.tokens = tokens, s.seed = seed, s.gate_up = parse_gate_up(gate_up);
    s.scale_layout = parse_layout(layout, "layout");
    testkit::Problem p = testkit::make_problem(s);
    nb::dict d = checkpoint_arrays(p.checkpoint);
    const size_t T = static_cast<size_t>(tokens), H = c.hidden, K = c.top_k;
    d["x"] = numpy_copy(p.x, {T, H});
    d["ids"] = numpy_copy(p.ids, {T, K});
    d["topk_weights"] = numpy_copy(p.topk_weights, {T, K});
    return d;
  });
  // The float64 reference result [T, H] for weights prepared on the host (a PreparedWeights with a host copy).
  m.def("_reference_f64", [](const PreparedWeights& w, const Array& x, const Array& ids, const Array& tw) {
    const MoeConfig& c = w.config();
    const int64_t T = static_cast<int64_t>(x.shape(0));
    require_contiguous(x, "x");
    require_contiguous(ids, "ids");
    require_contiguous(tw, "topk_weights");
    FP4MOE_REQUIRE(x.device_type() == kCPU && is_16bit_raw(x), InvalidArgument, "x", "host bf16 bits");
    require_shape(x, "x", {T, c.hidden});
    require_shape(ids, "ids", {T, c.top_k});
    require_shape(tw, "topk_weights", {T, c.top_k});
    FP4MOE_REQUIRE(is(tw, nb::dlpack::dtype_code::Float, 32), InvalidArgument, "topk_weights", "float32");
    const IndexType it = is(ids, nb::dlpack::dtype_code::Int, 64) ? IndexType::kInt64 : IndexType::kInt32;
    std::vector<double> r = reference::moe_forward_f64(c, w.host(), static_cast<const uint16_t*>(x.data()), ids.data(), it,
                                                       static_cast<const float*>(tw.data()), T);
    return numpy_copy(r, {static_cast<size_t>(T), static_cast<size_t>(c.hidden)});
  });
  // The whole C++ path on a GPU (prepare, cudaMalloc, MoeRunner::run, copy back): what a C++ user
  // gets for the same inputs. For the bit-identity test of python/tests/test_gpu.py.
  m.def("_run_cpp", [](const MoeConfig& c, const PreparedWeights& w, const Array& x, const Array& ids, const Array& tw,
                       const std::string& backend, bool deterministic) {
    const int64_t T = static_cast<int64_t>(x.shape(0));
    FP4MOE_REQUIRE(x.device_type() == kCPU && ids.device_type() == kCPU && tw.device_type() == kCPU, InvalidArgument,
                   "x", "host arrays expected");
    const IndexType it = is(ids, nb::dlpack::dtype_code::Int, 64) ? IndexType::kInt64 : IndexType::kInt32;
    const size_t osz = c.output_dtype == OutputDType::kBF16 ? 2 : 4;
    std::vector<uint8_t> out(static_cast<size_t>(T) * c.hidden * osz);
    RunnerOptions o;
    o.max_tokens = T, o.backend = parse_backend(backend), o.deterministic = deterministic;
    if (w.device() < 0) {
      fused_moe(c, w, x.data(), ids.data(), it, static_cast<const float*>(tw.data()), out.data(), T, o);
    } else {
      cudaSetDevice(w.device());
      void *dx, *di, *dw, *dout;
      const size_t xb = x.nbytes(), ib = ids.nbytes(), wb = tw.nbytes();
      cudaMalloc(&dx, xb), cudaMalloc(&di, ib), cudaMalloc(&dw, wb), cudaMalloc(&dout, out.size());
      cudaMemcpy(dx, x.data(), xb, cudaMemcpyHostToDevice);
      cudaMemcpy(di, ids.data(), ib, cudaMemcpyHostToDevice);
      cudaMemcpy(dw, tw.data(), wb, cudaMemcpyHostToDevice);
      MoeRunner r(c, w, o);
      r.run(dx, di, it, static_cast<const float*>(dw), dout, T, nullptr);
      cudaMemcpy(out.data(), dout, out.size(), cudaMemcpyDeviceToHost);
      const cudaError_t e = cudaDeviceSynchronize();
      cudaFree(dx), cudaFree(di), cudaFree(dw), cudaFree(dout);
      if (e != cudaSuccess) throw CudaError("cudaDeviceSynchronize", cudaGetErrorString(e));
    }
    return numpy_copy(out, {out.size()});
  });
}
