// Validation of the public API: MoeConfig::validate, the parse_* functions, prepare_weights,
// MoeRunner and run(). Each bad input must raise the exact typed error (InvalidArgument /
// Unsupported / CapacityError), name the argument, and carry the offending value in its message.
// Host backend only (prepare_weights with the default options).
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

#include "cpu/expect_error.h"
#include "fp4moe/fp4moe.h"
#include "testing/problem.h"

using namespace fp4moe;
using fp4moe::testing_errors::expect_error;

namespace {

MoeConfig base_config() {
  MoeConfig c;
  c.num_experts = 8, c.hidden = 128, c.intermediate = 64, c.top_k = 2;
  c.format = WeightFormat::kNVFP4, c.mode = ActMode::kA4, c.activation = Activation::kSilu;
  return c;
}

template <typename F>
MoeConfig with(F&& edit) {
  MoeConfig c = base_config();
  edit(c);
  return c;
}

std::string addr(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

}  // namespace

// =================================================================================================
// MoeConfig::validate
// =================================================================================================

TEST(ConfigValidate, BaseConfigIsValid) {
  EXPECT_NO_THROW(base_config().validate());
  EXPECT_NO_THROW(with([](MoeConfig& c) { c.num_experts = 1024, c.top_k = 32; }).validate());  // the limits
  EXPECT_NO_THROW(with([](MoeConfig& c) { c.local_expert_first = 6, c.local_expert_count = 2; }).validate());
  EXPECT_NO_THROW(with([](MoeConfig& c) { c.mode = ActMode::kA16, c.hidden = 16, c.intermediate = 16; }).validate());
  EXPECT_NO_THROW(with([](MoeConfig& c) { c.hidden = 2880, c.intermediate = 2880, c.format = WeightFormat::kMXFP4; })
                      .validate());  // gpt-oss: H not a multiple of 128
}

TEST(ConfigValidate, NumExperts) {
  for (int e : {0, -3, 1025, 100000}) {
    const MoeConfig c = with([&](MoeConfig& c) { c.num_experts = e; });
    EXPECT_ERROR(InvalidArgument, c.validate(), "num_experts", "got " + std::to_string(e), "1024");
  }
}

TEST(ConfigValidate, TopK) {
  for (int k : {0, -1, 33, 64}) {
    const MoeConfig c = with([&](MoeConfig& c) { c.top_k = k; });
    EXPECT_ERROR(InvalidArgument, c.validate(), "top_k", "got " + std::to_string(k), "32");
  }
}

TEST(ConfigValidate, LocalRangeOutsideE) {
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.local_expert_first = -1, c.local_expert_count = 2; }).validate(),
               "local_expert_first", "got -1", "num_experts=8");
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.local_expert_first = 8, c.local_expert_count = 1; }).validate(),
               "local_expert_first", "got 8", "num_experts=8");
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.local_expert_first = 6, c.local_expert_count = 4; }).validate(),
               "local_expert_count", "[6, 10)", "num_experts=8");
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.local_expert_first = 2, c.local_expert_count = 0; }).validate(),
               "local_expert_count", "[2, 2)");
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.local_expert_first = 0, c.local_expert_count = -2; }).validate(),
               "local_expert_count", "[0, -2)");
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.local_expert_first = 3, c.local_expert_count = -1; }).validate(),
               "local_expert_count", "got 3");
}

TEST(ConfigValidate, HiddenAndIntermediateNotAMultipleOfTheBlock) {
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.hidden = 130; }).validate(), "hidden", "130", "16");
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.intermediate = 24; }).validate(), "intermediate", "24", "16");
  // MXFP4 blocks are 32 wide.
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.format = WeightFormat::kMXFP4, c.hidden = 48; }).validate(),
               "hidden", "48", "32");
  EXPECT_ERROR(InvalidArgument,
               with([](MoeConfig& c) { c.format = WeightFormat::kMXFP4, c.intermediate = 80; }).validate(),
               "intermediate", "80", "32");
  // a8 quantises activations in blocks of 32 even with NVFP4 weights.
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.mode = ActMode::kA8, c.hidden = 48; }).validate(), "hidden",
               "48", "32");
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.mode = ActMode::kA8, c.intermediate = 16; }).validate(),
               "intermediate", "16", "32");
  // a16 still has 16-wide NVFP4 weight blocks.
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.mode = ActMode::kA16, c.hidden = 8; }).validate(), "hidden",
               "8", "16");
}

TEST(ConfigValidate, HiddenAndIntermediateNotPositive) {
  for (int v : {0, -16}) {
    EXPECT_ERROR(InvalidArgument, with([&](MoeConfig& c) { c.hidden = v; }).validate(), "hidden",
                 "got " + std::to_string(v));
    EXPECT_ERROR(InvalidArgument, with([&](MoeConfig& c) { c.intermediate = v; }).validate(), "intermediate",
                 "got " + std::to_string(v));
  }
}

TEST(ConfigValidate, TooLargeIsUnsupported) {
  EXPECT_ERROR(Unsupported, with([](MoeConfig& c) { c.hidden = 65536 + 16; }).validate(), "hidden", "65552", "65536");
  EXPECT_ERROR(Unsupported, with([](MoeConfig& c) { c.intermediate = 65536 + 16; }).validate(), "intermediate", "65552",
               "65536");
  EXPECT_NO_THROW(with([](MoeConfig& c) { c.hidden = 65536; }).validate());
}

TEST(ConfigValidate, SwigluParameters) {
  auto sw = [](float a, float b, float l) {
    return with([&](MoeConfig& c) { c.activation = Activation::kSwigluOai, c.swiglu = {a, b, l}; });
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  EXPECT_NO_THROW(sw(1.702f, 1.0f, 7.0f).validate());
  EXPECT_NO_THROW(sw(1.702f, 1.0f, inf).validate());  // no clamp
  EXPECT_ERROR(InvalidArgument, sw(nan, 1.0f, 7.0f).validate(), "swiglu", "alpha=nan");
  EXPECT_ERROR(InvalidArgument, sw(1.0f, inf, 7.0f).validate(), "swiglu", "beta=inf");
  EXPECT_ERROR(InvalidArgument, sw(1.0f, 1.0f, 0.0f).validate(), "swiglu.limit", "got 0");
  EXPECT_ERROR(InvalidArgument, sw(1.0f, 1.0f, -7.0f).validate(), "swiglu.limit", "got -7");
  EXPECT_ERROR(InvalidArgument, sw(1.0f, 1.0f, nan).validate(), "swiglu.limit", "nan");
  // The parameters belong to swiglu_oai only.
  EXPECT_NO_THROW(with([&](MoeConfig& c) { c.swiglu.limit = -1.0f; }).validate());
}

TEST(ConfigValidate, OutOfRangeEnums) {
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.format = static_cast<WeightFormat>(7); }).validate(), "format",
               "7");
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.mode = static_cast<ActMode>(9); }).validate(), "mode", "9");
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.activation = static_cast<Activation>(-1); }).validate(),
               "activation", "-1");
  EXPECT_ERROR(InvalidArgument, with([](MoeConfig& c) { c.output_dtype = static_cast<OutputDType>(3); }).validate(),
               "output_dtype", "3");
}

// =================================================================================================
// parse_*
// =================================================================================================

TEST(Parse, EveryNameRoundTrips) {
  for (WeightFormat f : {WeightFormat::kNVFP4, WeightFormat::kMXFP4}) EXPECT_EQ(parse_weight_format(to_string(f)), f);
  for (ActMode m : {ActMode::kA4, ActMode::kA16, ActMode::kA8}) EXPECT_EQ(parse_act_mode(to_string(m)), m);
  for (Activation a : {Activation::kSilu, Activation::kGeluTanh, Activation::kSwigluOai, Activation::kRelu2})
    EXPECT_EQ(parse_activation(to_string(a)), a);
  for (Backend b : {Backend::kAuto, Backend::kReference, Backend::kGeneric, Backend::kDirectMicro, Backend::kMicro,
                    Backend::kStatic, Backend::kDynamic})
    EXPECT_EQ(parse_backend(to_string(b)), b);
  EXPECT_EQ(parse_weight_format("nvfp4"), WeightFormat::kNVFP4);
  EXPECT_EQ(parse_act_mode("a16"), ActMode::kA16);
  EXPECT_EQ(parse_activation("swigluoai_uninterleave"), Activation::kSwigluOai);  // the reference's name
  EXPECT_EQ(parse_backend("direct_micro"), Backend::kDirectMicro);
}

TEST(Parse, UnknownNames) {
  EXPECT_ERROR(InvalidArgument, parse_weight_format("fp8"), "format", "'fp8'", "nvfp4, mxfp4");
  EXPECT_ERROR(InvalidArgument, parse_weight_format("NVFP4"), "format", "'NVFP4'");  // case matters
  EXPECT_ERROR(InvalidArgument, parse_act_mode("a2"), "mode", "'a2'", "a4, a16, a8");
  EXPECT_ERROR(InvalidArgument, parse_activation("gelu"), "activation", "'gelu'", "gelu_tanh");
  EXPECT_ERROR(InvalidArgument, parse_backend("fast"), "backend", "'fast'", "dynamic");
  EXPECT_ERROR(InvalidArgument, parse_backend(""), "backend", "''");
  EXPECT_ERROR(InvalidArgument, parse_backend("turbo", "--backend"), "--backend", "'turbo'");
}

// =================================================================================================
// prepare_weights
// =================================================================================================

TEST(PrepareWeights, BadDeviceAndBadConfig) {
  const MoeConfig c = base_config();
  const testkit::Problem p = testkit::make_problem({c, 2, 1});
  EXPECT_ERROR(InvalidArgument, prepare_weights(c, p.checkpoint.view(), {.device = -2}), "options.device", "-2");
  EXPECT_ERROR(InvalidArgument, prepare_weights(c, p.checkpoint.view(), {.device = -1, .host_threads = -3}),
               "options.host_threads", "-3");
  // The config is validated before the checkpoint is read.
  EXPECT_ERROR(InvalidArgument, prepare_weights(with([](MoeConfig& c) { c.hidden = 130; }), p.checkpoint.view()),
               "hidden", "130");
  EXPECT_ERROR(InvalidArgument, prepare_weights(with([](MoeConfig& c) { c.top_k = 33; }), CheckpointView{}), "top_k",
               "33");
  // Null checkpoint pointers.
  EXPECT_ERROR(InvalidArgument, prepare_weights(c, CheckpointView{}), "w13.packed", "null");
  const PreparedWeights empty;
  EXPECT_ERROR(InvalidArgument, empty.config(), "weights", "empty");
}

// =================================================================================================
// MoeRunner and run()
// =================================================================================================

namespace {

// Buffers with a known 64-byte-aligned base, so base + n bytes has a known alignment.
struct Aligned {
  std::vector<uint8_t> storage;
  uint8_t* base;
  explicit Aligned(size_t bytes) : storage(bytes + 128) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(storage.data());
    base = storage.data() + ((64 - p % 64) % 64);
  }
};

struct RunFixture : ::testing::Test {
  MoeConfig c = base_config();
  testkit::Problem p = testkit::make_problem({c, 4, 3});
  PreparedWeights w = prepare_weights(c, p.checkpoint.view());
  int64_t T = 4;
  Aligned x{4 * 128 * 2}, ids{4 * 2 * 8}, tw{4 * 2 * 4}, out{4 * 128 * 4};

  void SetUp() override {
    std::memcpy(x.base, p.x.data(), p.x.size() * 2);
    std::memcpy(ids.base, p.ids.data(), p.ids.size() * 4);
    std::memcpy(tw.base, p.topk_weights.data(), p.topk_weights.size() * 4);
  }
  const float* weights_ptr(size_t offset = 0) const { return reinterpret_cast<const float*>(tw.base + offset); }
};

}  // namespace

TEST_F(RunFixture, ValidCallRuns) {
  MoeRunner r(c, w, {.max_tokens = T});
  EXPECT_EQ(r.plan(T), Backend::kReference);
  std::fill(out.storage.begin(), out.storage.end(), 0xAB);
  EXPECT_NO_THROW(r.run(x.base, ids.base, IndexType::kInt32, weights_ptr(), out.base, T));
  // Every output element was written (the poison byte pattern 0xABAB is gone somewhere).
  const uint16_t* o = reinterpret_cast<const uint16_t*>(out.base);
  int untouched = 0;
  for (int i = 0; i < T * 128; ++i) untouched += o[i] == 0xABAB;
  EXPECT_EQ(untouched, 0);
}

TEST_F(RunFixture, MoreTokensThanMaxTokens) {
  MoeRunner r(c, w, {.max_tokens = 3});
  EXPECT_ERROR(CapacityError, r.run(x.base, ids.base, IndexType::kInt32, weights_ptr(), out.base, 4), "num_tokens",
               "got 4", "max_tokens=3");
  EXPECT_ERROR(CapacityError, r.plan(4), "num_tokens", "got 4", "max_tokens=3");
  EXPECT_ERROR(CapacityError, r.run(x.base, ids.base, IndexType::kInt32, weights_ptr(), out.base, -1), "num_tokens",
               "got -1");
  EXPECT_NO_THROW(r.run(x.base, ids.base, IndexType::kInt32, weights_ptr(), out.base, 3));
}

TEST_F(RunFixture, ZeroTokensIsANoOpThatDoesNotTouchOut) {
  MoeRunner r(c, w, {.max_tokens = T});
  std::fill(out.storage.begin(), out.storage.end(), 0x5A);
  EXPECT_NO_THROW(r.run(x.base, ids.base, IndexType::kInt32, weights_ptr(), out.base, 0));
  for (uint8_t b : out.storage) ASSERT_EQ(b, 0x5A);
  EXPECT_NO_THROW(r.run(nullptr, nullptr, IndexType::kInt32, nullptr, nullptr, 0));  // nothing is read
  EXPECT_NO_THROW(fused_moe(c, w, nullptr, nullptr, IndexType::kInt32, nullptr, out.base, 0));
  for (uint8_t b : out.storage) ASSERT_EQ(b, 0x5A);
}

TEST_F(RunFixture, NullPointers) {
  MoeRunner r(c, w, {.max_tokens = T});
  EXPECT_ERROR(InvalidArgument, r.run(nullptr, ids.base, IndexType::kInt32, weights_ptr(), out.base, T), "x", "null",
               "num_tokens=4");
  EXPECT_ERROR(InvalidArgument, r.run(x.base, nullptr, IndexType::kInt32, weights_ptr(), out.base, T), "topk_ids",
               "null");
  EXPECT_ERROR(InvalidArgument, r.run(x.base, ids.base, IndexType::kInt32, nullptr, out.base, T), "topk_weights",
               "null");
  EXPECT_ERROR(InvalidArgument, r.run(x.base, ids.base, IndexType::kInt32, weights_ptr(), nullptr, T), "out", "null");
  EXPECT_ERROR(InvalidArgument, fused_moe(c, w, x.base, ids.base, IndexType::kInt32, weights_ptr(), nullptr, T), "out",
               "null");
}

TEST_F(RunFixture, MisalignedPointers) {
  MoeRunner r(c, w, {.max_tokens = T});
  for (int off : {1, 2, 8}) {
    const void* xm = reinterpret_cast<const char*>(x.base) + off;
    EXPECT_ERROR(InvalidArgument, r.run(xm, ids.base, IndexType::kInt32, weights_ptr(), out.base, T), "x", "16-byte",
                 addr(xm));
    void* om = out.base + off;
    EXPECT_ERROR(InvalidArgument, r.run(x.base, ids.base, IndexType::kInt32, weights_ptr(), om, T), "out", "16-byte",
                 addr(om));
  }
  const void* i32 = ids.base + 2;
  EXPECT_ERROR(InvalidArgument, r.run(x.base, i32, IndexType::kInt32, weights_ptr(), out.base, T), "topk_ids", addr(i32));
  const void* i64 = ids.base + 4;  // 4-aligned is enough for int32, not for int64
  EXPECT_ERROR(InvalidArgument, r.run(x.base, i64, IndexType::kInt64, weights_ptr(), out.base, T), "topk_ids", addr(i64));
  EXPECT_ERROR(InvalidArgument, r.run(x.base, ids.base, IndexType::kInt32, weights_ptr(1), out.base, T), "topk_weights",
               addr(weights_ptr(1)));
  EXPECT_ERROR(InvalidArgument, r.run(x.base, ids.base, static_cast<IndexType>(7), weights_ptr(), out.base, T),
               "ids_type", "7");
}

TEST_F(RunFixture, ForcedGpuBackendOnHostWeights) {
  for (Backend b : {Backend::kGeneric, Backend::kDirectMicro, Backend::kMicro, Backend::kStatic, Backend::kDynamic}) {
    RunnerOptions o;
    o.max_tokens = T, o.backend = b;
    EXPECT_ERROR(Unsupported, MoeRunner(c, w, o), "options.backend", std::string(to_string(b)));
    EXPECT_ERROR(Unsupported, fused_moe(c, w, x.base, ids.base, IndexType::kInt32, weights_ptr(), out.base, T, o),
                 "options.backend", std::string(to_string(b)));
  }
  for (Backend b : {Backend::kAuto, Backend::kReference}) {
    RunnerOptions o;
    o.max_tokens = T, o.backend = b;
    EXPECT_NO_THROW(MoeRunner(c, w, o));
  }
}

TEST_F(RunFixture, PrefillBf16Options) {
  RunnerOptions o;
  o.max_tokens = T, o.prefill_bf16_bytes = -1;
  EXPECT_ERROR(InvalidArgument, MoeRunner(c, w, o), "options.prefill_bf16_bytes", "-1");
  o.prefill_bf16_bytes = 0, o.prefill_bf16_min_rows = 0;
  EXPECT_ERROR(InvalidArgument, MoeRunner(c, w, o), "options.prefill_bf16_min_rows", "0");
  o.prefill_bf16_bytes = int64_t{1} << 30, o.prefill_bf16_min_rows = 1;
  const MoeRunner r(c, w, o);  // host weights: the reference backend, never a copy
  EXPECT_FALSE(r.plan_bf16_copy(T));
  EXPECT_EQ(r.workspace_bytes(), 0u);
}

TEST_F(RunFixture, DynamicTileMOption) {
  RunnerOptions o;
  o.max_tokens = T;
  for (int bad : {-32, 1, 8, 24, 48, 96, 256}) {
    o.dynamic_tile_m = bad;
    EXPECT_ERROR(InvalidArgument, MoeRunner(c, w, o), "options.dynamic_tile_m", std::to_string(bad));
  }
  for (int ok : {0, 16, 32, 64, 128}) {
    o.dynamic_tile_m = ok;
    EXPECT_NO_THROW(MoeRunner(c, w, o));
  }
}

TEST_F(RunFixture, WeightsPreparedForAnotherConfig) {
  const auto other = [&](auto edit) {
    MoeConfig o = c;
    edit(o);
    return o;
  };
  EXPECT_ERROR(InvalidArgument, MoeRunner(other([](MoeConfig& o) { o.hidden = 256; }), w), "weights", "H=128", "H=256");
  EXPECT_ERROR(InvalidArgument, MoeRunner(other([](MoeConfig& o) { o.intermediate = 32; }), w), "weights", "I=64",
               "I=32");
  EXPECT_ERROR(InvalidArgument, MoeRunner(other([](MoeConfig& o) { o.num_experts = 16; }), w), "weights", "E=8",
               "E=16");
  EXPECT_ERROR(InvalidArgument, MoeRunner(other([](MoeConfig& o) { o.top_k = 4; }), w), "weights", "K=2", "K=4");
  EXPECT_ERROR(InvalidArgument, MoeRunner(other([](MoeConfig& o) { o.format = WeightFormat::kMXFP4; }), w), "weights",
               "nvfp4", "mxfp4");
  EXPECT_ERROR(InvalidArgument, MoeRunner(other([](MoeConfig& o) { o.activation = Activation::kGeluTanh; }), w),
               "weights", "silu", "gelu_tanh");
  EXPECT_ERROR(InvalidArgument, MoeRunner(other([](MoeConfig& o) { o.mode = ActMode::kA16; }), w), "weights", "a16");
  EXPECT_ERROR(InvalidArgument, MoeRunner(other([](MoeConfig& o) { o.has_bias = true; }), w), "weights", "bias");
  EXPECT_ERROR(InvalidArgument,
               MoeRunner(other([](MoeConfig& o) { o.local_expert_first = 2, o.local_expert_count = 4; }), w), "weights",
               "local=[2,6)");
  EXPECT_ERROR(InvalidArgument, fused_moe(other([](MoeConfig& o) { o.hidden = 256; }), w, x.base, ids.base,
                                          IndexType::kInt32, weights_ptr(), out.base, T),
               "weights", "H=256");
  // Only the output dtype may differ.
  EXPECT_NO_THROW(MoeRunner(other([](MoeConfig& o) { o.output_dtype = OutputDType::kFP32; }), w, {.max_tokens = T}));
  EXPECT_ERROR(InvalidArgument, MoeRunner(c, PreparedWeights{}), "weights", "empty");
}

TEST_F(RunFixture, RunnerOptionsAndConfig) {
  EXPECT_ERROR(InvalidArgument, MoeRunner(c, w, {.max_tokens = 0}), "options.max_tokens", "got 0");
  EXPECT_ERROR(InvalidArgument, MoeRunner(c, w, {.max_tokens = -5}), "options.max_tokens", "got -5");
  EXPECT_ERROR(InvalidArgument, MoeRunner(c, w, {.max_tokens = 4, .cpu_threads = -1}), "options.cpu_threads",
               "got -1");
  EXPECT_ERROR(InvalidArgument, MoeRunner(with([](MoeConfig& c) { c.num_experts = 2000; }), w), "num_experts", "2000");
}

// A workspace past 2^31 - 1 elements is refused at construction, naming max_tokens.
TEST(RunnerCapacity, WorkspacePast32BitIndexing) {
  // The widest per-route row is max(H, N1 = 2I): with H = 7168 (deepseek-v3), K = 32, I = 64 it is
  // H, and max_tokens · 32 · 7168 ≤ 2^31 − 1 = 2147483647 holds up to max_tokens = 9362
  // (9362 · 229376 = 2147418112; 9363 · 229376 = 2147647488).
  MoeConfig c;
  c.num_experts = 1, c.top_k = 32, c.hidden = 7168, c.intermediate = 64, c.mode = ActMode::kA16;
  std::vector<float> w13(static_cast<size_t>(2) * 64 * 7168, 0.01f), w2(static_cast<size_t>(7168) * 64, 0.01f);
  const auto ck = quantize_checkpoint(c, w13.data(), w2.data(), GateUpLayout::kUpGate, ScaleLayout::kLinear);
  const PreparedWeights w = prepare_weights(c, ck.view());
  EXPECT_ERROR(CapacityError, MoeRunner(c, w, {.max_tokens = 20000}), "max_tokens", "20000", "2^31");
  EXPECT_ERROR(CapacityError, MoeRunner(c, w, {.max_tokens = 9363}), "max_tokens", "9363", "9362");
  EXPECT_NO_THROW(MoeRunner(c, w, {.max_tokens = 9362}));
  // Huge values must not wrap around in the size arithmetic (2^59 · 32 · 7168 ≡ 0 mod 2^64).
  for (int64_t big : {int64_t{1} << 59, int64_t{1} << 40, std::numeric_limits<int64_t>::max()})
    EXPECT_ERROR(CapacityError, MoeRunner(c, w, {.max_tokens = big}), "max_tokens", std::to_string(big));
}

TEST(RunnerCapacity, WidestRowIsTheGatedFc1) {
  // H = 1024, I = 4096 gated: N1 = 8192 is the widest row. 8192 tokens · 32 · 8192 = 2^31 exactly,
  // one past the limit; 8191 fits.
  MoeConfig c;
  c.num_experts = 1, c.top_k = 32, c.hidden = 1024, c.intermediate = 4096, c.mode = ActMode::kA16;
  c.format = WeightFormat::kMXFP4;
  std::vector<float> w13(static_cast<size_t>(8192) * 1024, 0.0f), w2(static_cast<size_t>(1024) * 4096, 0.0f);
  const auto ck = quantize_checkpoint(c, w13.data(), w2.data(), GateUpLayout::kUpGate, ScaleLayout::kLinear);
  const PreparedWeights w = prepare_weights(c, ck.view());
  EXPECT_ERROR(CapacityError, MoeRunner(c, w, {.max_tokens = 8192}), "max_tokens", "8192", "8191");
  EXPECT_NO_THROW(MoeRunner(c, w, {.max_tokens = 8191}));
}

// The brief's function form, once, so both spellings stay exercised.
TEST(ExpectErrorHelper, FunctionForm) {
  expect_error<InvalidArgument>([] { with([](MoeConfig& c) { c.hidden = 130; }).validate(); }, "hidden", "130");
  // And the helper itself can fail: wrong type, wrong argument, missing value, no throw.
  using fp4moe::testing_errors::throws_error;
  const auto bad = [] { with([](MoeConfig& c) { c.hidden = 130; }).validate(); };
  EXPECT_FALSE(throws_error<Unsupported>(bad, "hidden", {"130"}));
  EXPECT_FALSE(throws_error<InvalidArgument>(bad, "intermediate", {"130"}));
  EXPECT_FALSE(throws_error<InvalidArgument>(bad, "hidden", {"131"}));
  EXPECT_FALSE(throws_error<InvalidArgument>([] {}, "hidden", {"130"}));
}
