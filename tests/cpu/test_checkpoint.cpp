// Safetensors parsing (strict, typed errors on hostile input) and the ModelOpt NVFP4 / gpt-oss
// MXFP4 layer loaders, checked against testkit problems through the reference backend.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "expect_error.h"
#include "fp4moe/checkpoint.h"
#include "fp4moe/fp4moe.h"
#include "reference/reference.h"
#include "testing/problem.h"

using namespace fp4moe;
using fp4moe::testing_errors::throws_error;

namespace {

std::string temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("fp4moe_ckpt_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::vector<uint8_t> header_file(const std::string& json, size_t data_bytes) {
  std::vector<uint8_t> b(8 + json.size() + data_bytes, 0);
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(b.data() + 8, json.data(), json.size());
  return b;
}

::testing::AssertionResult rejects(const std::vector<uint8_t>& bytes, std::initializer_list<std::string> needles) {
  return throws_error<InvalidArgument>([&] { SafetensorsFile::from_bytes(bytes.data(), bytes.size(), "f.st"); },
                                       "f.st", needles);
}

}  // namespace

TEST(Safetensors, RoundTrip) {
  const uint8_t a[6] = {1, 2, 3, 4, 5, 6};
  const float b[2] = {1.5f, -2.0f};
  auto bytes = serialize_safetensors({{"a", StDType::kU8, {2, 3}, a}, {"b.x", StDType::kF32, {2}, b},
                                      {"empty", StDType::kBF16, {0, 4}, nullptr}},
                                     {{"format", "pt"}});
  auto f = SafetensorsFile::from_bytes(bytes.data(), bytes.size());
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b.x", "empty"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const StTensor& ta = f.get("a");
  EXPECT_EQ(ta.dtype, StDType::kU8);
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(0, std::memcmp(ta.data, a, 6));
  float bb[2];
  std::memcpy(bb, f.get("b.x").data, 8);
  EXPECT_EQ(bb[1], -2.0f);
  EXPECT_EQ(f.get("empty").nbytes, 0u);
  const std::string path = temp_path("rt.safetensors");
  write_safetensors(path, {{"a", StDType::kU8, {2, 3}, a}});
  auto g = SafetensorsFile::open(path);
  EXPECT_EQ(0, std::memcmp(g.get("a").data, a, 6));
  EXPECT_TRUE(throws_error<InvalidArgument>([&] { g.get("nope"); }, path, {"no tensor 'nope'"}));
}

TEST(Safetensors, RejectsMalformedFiles) {
  EXPECT_TRUE(rejects({1, 2, 3}, {"shorter than the 8-byte header length"}));
  auto ok = header_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4);
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(ok.data(), ok.size()));
  // Header length past the end of the file.
  auto big = ok;
  big[0] = 0xFF, big[5] = 0x01;
  EXPECT_TRUE(rejects(big, {"runs past the end of the file"}));
  // Truncated data.
  auto trunc = ok;
  trunc.resize(trunc.size() - 1);
  EXPECT_TRUE(rejects(trunc, {"tensor 'a'", "run past the end of the data"}));
  // Bad JSON, deep nesting, duplicate key, wrong types.
  EXPECT_TRUE(rejects(header_file(R"({"a":{"dtype":"U8",)", 0), {"malformed safetensors header"}));
  EXPECT_TRUE(rejects(header_file("{\"a\":" + std::string(500, '[') + std::string(500, ']') + "}", 0),
                      {"nesting deeper than 64"}));
  EXPECT_TRUE(rejects(header_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{}})", 1),
                      {"duplicate key"}));
  EXPECT_TRUE(rejects(header_file(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1),
                      {"tensor 'a'", "unknown dtype 'Q7'"}));
  EXPECT_TRUE(rejects(header_file(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1),
                      {"tensor 'a'", "non-negative integers"}));
  EXPECT_TRUE(rejects(header_file(R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1),
                      {"tensor 'a'", "non-negative integers"}));
  // Lying shape / dtype: byte counts disagree.
  EXPECT_TRUE(rejects(header_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,4]}})", 4),
                      {"tensor 'a'", "hold 4 bytes but F32 of this shape needs 16"}));
  EXPECT_TRUE(rejects(header_file(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}})", 4),
                      {"tensor 'a'", "too large"}));
  // Overlap, hole, trailing bytes, offsets reversed.
  EXPECT_TRUE(rejects(header_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4),
                      {"tensor 'b'", "overlap"}));
  EXPECT_TRUE(rejects(header_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4), {"tensor 'a'", "hole"}));
  EXPECT_TRUE(rejects(header_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 4), {"cover 2 bytes"}));
  EXPECT_TRUE(rejects(header_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4), {"end before they begin"}));
  EXPECT_TRUE(rejects(header_file(R"([1,2])", 0), {"does not start with '{'"}));
  EXPECT_TRUE(rejects(header_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":1}})", 0), {"unknown field 'x'"}));
  EXPECT_TRUE(throws_error<InvalidArgument>([] { SafetensorsFile::open("/nonexistent/x.safetensors"); },
                                            "/nonexistent/x.safetensors", {"cannot open"}));
}

namespace {

// The testkit problem's canonical checkpoint written as a ModelOpt NVFP4 layer (layer 3).
struct ModelOptWriter {
  std::vector<std::vector<uint8_t>> keep_u8;
  std::vector<std::vector<float>> keep_f;
  std::vector<StTensorData> tensors;
  const void* u8(std::vector<uint8_t> v) { return keep_u8.emplace_back(std::move(v)).data(); }
  const void* f32(float v) { return keep_f.emplace_back(1, v).data(); }

  void add(const QuantizedProjection& p, const std::vector<float>* in_scale, int e, const std::string& proj, int row0,
           int rows) {
    const std::string n = "model.layers.3.mlp.experts." + std::to_string(e) + "." + proj + ".";
    const size_t rb = p.cols / 2, sb = p.cols / 16;
    const uint8_t* w = p.packed.data() + (static_cast<size_t>(e) * p.rows + row0) * rb;
    const uint8_t* s = p.scales.data() + (static_cast<size_t>(e) * p.rows + row0) * sb;
    tensors.push_back({n + "weight", StDType::kU8, {rows, p.cols / 2}, u8({w, w + rows * rb})});
    tensors.push_back({n + "weight_scale", StDType::kF8_E4M3, {rows, p.cols / 16}, u8({s, s + rows * sb})});
    tensors.push_back({n + "weight_scale_2", StDType::kF32, {}, f32(p.global_scale[e])});
    if (in_scale) tensors.push_back({n + "input_scale", StDType::kF32, {1}, f32((*in_scale)[e])});
  }
};

}  // namespace

TEST(CheckpointLoader, ModelOptNvfp4MatchesTheReference) {
  for (Activation act : {Activation::kSilu, Activation::kRelu2}) {
    testkit::ProblemSpec spec;
    spec.config.num_experts = 4, spec.config.hidden = 64, spec.config.intermediate = 32, spec.config.top_k = 2;
    spec.config.activation = act;
    spec.tokens = 5;
    const auto p = testkit::make_problem(spec);
    const auto canon = testkit::canonical(p);
    const int I = spec.config.intermediate;
    ModelOptWriter w;
    for (int e = 0; e < 4; ++e) {
      if (act != Activation::kRelu2) {
        w.add(canon.w13, &canon.fc1_input_scale, e, "gate_proj", I, I);
      }
      w.add(canon.w13, &canon.fc1_input_scale, e, "up_proj", 0, I);
      w.add(canon.w2, &canon.fc2_input_scale, e, "down_proj", 0, spec.config.hidden);
    }
    // Split over two shards to exercise CheckpointFiles.
    const size_t half = w.tensors.size() / 2;
    const std::string dir = temp_path("modelopt_" + std::to_string(static_cast<int>(act)));
    std::filesystem::create_directories(dir);
    write_safetensors(dir + "/model-00001-of-00002.safetensors", {w.tensors.begin(), w.tensors.begin() + half});
    write_safetensors(dir + "/model-00002-of-00002.safetensors", {w.tensors.begin() + half, w.tensors.end()});
    LayerLoadOptions o;
    o.layer = 3, o.top_k = 2, o.activation = act;
    const LoadedLayer L = load_modelopt_nvfp4(CheckpointFiles({dir}), o);
    EXPECT_EQ(L.config.num_experts, 4);
    EXPECT_EQ(L.config.hidden, 64);
    EXPECT_EQ(L.config.intermediate, 32);
    const auto got = canonicalize(L.config, L.checkpoint.view());
    EXPECT_EQ(got.w13.packed, canon.w13.packed);
    EXPECT_EQ(got.w13.scales, canon.w13.scales);
    EXPECT_EQ(got.w2.scales, canon.w2.scales);
    EXPECT_EQ(got.fc1_input_scale, canon.fc1_input_scale);
    const auto a = reference::moe_forward_f64(p.config, canon, p.x.data(), p.ids.data(), IndexType::kInt32,
                                              p.topk_weights.data(), p.tokens, 1);
    const auto b = reference::moe_forward_f64(L.config, got, p.x.data(), p.ids.data(), IndexType::kInt32,
                                              p.topk_weights.data(), p.tokens, 1);
    EXPECT_EQ(a, b);

    // A local range loads just those experts.
    o.local_expert_first = 1, o.local_expert_count = 2;
    const LoadedLayer L2 = load_modelopt_nvfp4(CheckpointFiles({dir}), o);
    EXPECT_EQ(L2.config.local_count(), 2);
    EXPECT_EQ(L2.checkpoint.w2.global_scale[0], canon.w2.global_scale[1]);
  }
}

TEST(CheckpointLoader, ModelOptErrorsNameFileAndTensor) {
  testkit::ProblemSpec spec;
  spec.config.num_experts = 2, spec.config.hidden = 32, spec.config.intermediate = 16, spec.config.top_k = 1;
  const auto canon = testkit::canonical(testkit::make_problem(spec));
  ModelOptWriter w;
  for (int e = 0; e < 2; ++e) {
    w.add(canon.w13, &canon.fc1_input_scale, e, "gate_proj", 16, 16);
    w.add(canon.w13, &canon.fc1_input_scale, e, "up_proj", 0, 16);
    w.add(canon.w2, &canon.fc2_input_scale, e, "down_proj", 0, 32);
  }
  // Expert 1's down_proj.weight_scale declared U16 (a lying dtype with a consistent byte count).
  for (auto& t : w.tensors)
    if (t.name == "model.layers.3.mlp.experts.1.down_proj.weight_scale") t.dtype = StDType::kU16, t.shape = {32, 1};
  const std::string path = temp_path("bad_dtype.safetensors");
  write_safetensors(path, w.tensors);
  LayerLoadOptions o;
  o.layer = 3, o.top_k = 1;
  EXPECT_TRUE(throws_error<InvalidArgument>([&] { load_modelopt_nvfp4(CheckpointFiles({path}), o); }, path,
                                            {"model.layers.3.mlp.experts.1.down_proj.weight_scale", "dtype U16"}));
  o.layer = 4;
  EXPECT_TRUE(throws_error<InvalidArgument>([&] { load_modelopt_nvfp4(CheckpointFiles({path}), o); }, path,
                                            {"model.layers.4.mlp.experts.0.down_proj.weight"}));
  o.layer = 3, o.top_k = 0;
  EXPECT_TRUE(throws_error<InvalidArgument>([&] { load_modelopt_nvfp4(CheckpointFiles({path}), o); }, "options.top_k",
                                            {"must be given"}));
}

TEST(CheckpointLoader, GptOssMxfp4MatchesTheReference) {
  testkit::ProblemSpec spec;
  MoeConfig& c = spec.config;
  c.num_experts = 3, c.hidden = 64, c.intermediate = 32, c.top_k = 2;
  c.format = WeightFormat::kMXFP4, c.activation = Activation::kSwigluOai, c.swiglu = {1.702f, 1.0f, 7.0f};
  c.has_bias = true;
  spec.gate_up = GateUpLayout::kInterleaved;
  spec.tokens = 4;
  const auto p = testkit::make_problem(spec);
  const auto canon = testkit::canonical(p);
  const QuantizedCheckpoint& ck = p.checkpoint;  // interleaved rows, linear scales, fp32 biases
  ASSERT_EQ(ck.gate_up, GateUpLayout::kInterleaved);
  // Biases as bf16, as gpt-oss stores them; the problem's own biases rounded the same way.
  auto to_bf16 = [](const std::vector<float>& v) {
    std::vector<uint16_t> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = fmt::bf16_from_f32(v[i]);
    return r;
  };
  const auto b13 = to_bf16(ck.b13), b2 = to_bf16(ck.b2);
  const int64_t E = 3, N1 = 64, H = 64, I = 32;
  const std::string pre = "model.layers.0.mlp.experts.";
  const std::string path = temp_path("gptoss.safetensors");
  write_safetensors(path, {{pre + "gate_up_proj_blocks", StDType::kU8, {E, N1, H / 32, 16}, ck.w13.packed.data()},
                           {pre + "gate_up_proj_scales", StDType::kU8, {E, N1, H / 32}, ck.w13.scales.data()},
                           {pre + "gate_up_proj_bias", StDType::kBF16, {E, N1}, b13.data()},
                           {pre + "down_proj_blocks", StDType::kU8, {E, H, I / 32, 16}, ck.w2.packed.data()},
                           {pre + "down_proj_scales", StDType::kU8, {E, H, I / 32}, ck.w2.scales.data()},
                           {pre + "down_proj_bias", StDType::kBF16, {E, H}, b2.data()}});
  LayerLoadOptions o;
  o.top_k = 2;
  const LoadedLayer L = load_gpt_oss_mxfp4(CheckpointFiles({path}), o);
  EXPECT_EQ(L.config.format, WeightFormat::kMXFP4);
  EXPECT_EQ(L.config.activation, Activation::kSwigluOai);
  EXPECT_EQ(L.config.swiglu.limit, 7.0f);
  EXPECT_TRUE(L.config.has_bias);
  auto got = canonicalize(L.config, L.checkpoint.view());
  EXPECT_EQ(got.w13.packed, canon.w13.packed);
  EXPECT_EQ(got.w13.scales, canon.w13.scales);
  auto want = canon;
  for (auto& v : want.b13) v = fmt::round_bf16(v);
  for (auto& v : want.b2) v = fmt::round_bf16(v);
  EXPECT_EQ(got.b13, want.b13);
  const auto a = reference::moe_forward_f64(p.config, want, p.x.data(), p.ids.data(), IndexType::kInt32,
                                            p.topk_weights.data(), p.tokens, 1);
  const auto b = reference::moe_forward_f64(L.config, got, p.x.data(), p.ids.data(), IndexType::kInt32,
                                            p.topk_weights.data(), p.tokens, 1);
  EXPECT_EQ(a, b);
  // Prepared and run through the public API.
  PreparedWeights pw = prepare_weights(L.config, L.checkpoint.view());
  std::vector<uint16_t> out(p.tokens * H);
  fused_moe(L.config, pw, p.x.data(), p.ids.data(), IndexType::kInt32, p.topk_weights.data(), out.data(), p.tokens);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], fmt::bf16_from_f32(static_cast<float>(b[i]))) << i;
}
