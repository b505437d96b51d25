// Device pieces against their host twins: the quantisers byte for byte, the exact dequantisation,
// and the software grid barrier across phases, launches and graph replays.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fp4moe/formats.h"
#include "gpu/gpu_util.h"
#include "kernels/common/dequant.cuh"
#include "kernels/common/frag_dequant.cuh"
#include "kernels/common/grid_barrier.cuh"
#include "kernels/common/quantize.cuh"

namespace fp4moe {
namespace {

using testgpu::DeviceArray;

// Random block values mixing ordinary normals with the edge cases of the formats: exact ties,
// saturating values, subnormal-scale blocks, zeros, Inf and NaN.
std::vector<float> edge_rich_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 99), exp_pick(-40, 40);
  const float specials[] = {0.0f, -0.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 448.0f, 464.0f,
                            1e-30f, 1e-40f, INFINITY, -INFINITY, NAN};
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const int k = pick(rng);
    if (k < 3) v[i] = specials[rng() % (sizeof(specials) / sizeof(float))];
    else if (k < 10) v[i] = std::ldexp(normal(rng), exp_pick(rng));
    else v[i] = normal(rng);
  }
  // Whole blocks of tiny values (subnormal E4M3 scales) and of zeros.
  for (size_t b = 0; b + 32 <= n; b += 32 * 97)
    for (int i = 0; i < 32; ++i) v[b + i] = 1e-6f * normal(rng);
  for (size_t b = 32 * 13; b + 32 <= n; b += 32 * 101)
    for (int i = 0; i < 32; ++i) v[b + i] = 0.0f;
  return v;
}

enum class Q { kNvfp4, kMxfp4, kMxfp8 };

__global__ void quantize_blocks_kernel(Q q, const float* v, int blocks, float g, uint8_t* scales, uint8_t* codes) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  const int n = q == Q::kNvfp4 ? 16 : 32;
  float in[32];
  uint8_t c[32];
  for (int i = 0; i < n; ++i) in[i] = v[b * n + i];
  uint8_t s = q == Q::kNvfp4 ? fmt::nvfp4_quantize_block(in, g, c)
                             : (q == Q::kMxfp4 ? fmt::mxfp4_quantize_block(in, c) : fmt::mxfp8_quantize_block(in, c));
  scales[b] = s;
  for (int i = 0; i < n; ++i) codes[b * n + i] = c[i];
}

class GpuQuantizers : public ::testing::TestWithParam<Q> {};

TEST_P(GpuQuantizers, ByteIdenticalToHost) {
  REQUIRE_GPU();
  const Q q = GetParam();
  const int n = q == Q::kNvfp4 ? 16 : 32;
  const int blocks = (1 << 22) / n;  // ≈ 4.2 million values
  for (float g : {1.0f, 0.0123f, 3.7e-5f, 0.0f}) {
    const std::vector<float> v = edge_rich_values(static_cast<size_t>(blocks) * n, 1234 + static_cast<int>(q));
    DeviceArray<float> dv(v);
    DeviceArray<uint8_t> ds(blocks), dc(static_cast<size_t>(blocks) * n);
    quantize_blocks_kernel<<<(blocks + 255) / 256, 256>>>(q, dv.get(), blocks, g, ds.get(), dc.get());
    GPU_CHECK(cudaGetLastError());
    GPU_CHECK(cudaDeviceSynchronize());
    const auto s = ds.download();
    const auto c = dc.download();
    int64_t mismatches = 0;
    for (int b = 0; b < blocks; ++b) {
      uint8_t hc[32];
      const uint8_t hs = q == Q::kNvfp4 ? fmt::nvfp4_quantize_block(&v[b * n], g, hc)
                                        : (q == Q::kMxfp4 ? fmt::mxfp4_quantize_block(&v[b * n], hc)
                                                          : fmt::mxfp8_quantize_block(&v[b * n], hc));
      bool same = hs == s[b];
      for (int i = 0; i < n; ++i) same &= hc[i] == c[b * n + i];
      if (!same && mismatches++ < 5) ADD_FAILURE() << "block " << b << " g=" << g << ": host scale " << int(hs) << " device " << int(s[b]);
      if (q != Q::kNvfp4) break;  // g only matters for NVFP4
    }
    EXPECT_EQ(mismatches, 0);
    if (q != Q::kNvfp4) break;
  }
}

INSTANTIATE_TEST_SUITE_P(All, GpuQuantizers, ::testing::Values(Q::kNvfp4, Q::kMxfp4, Q::kMxfp8));

// The kernels' quantise-dequantise (quantize.cuh) equals the fmt:: codes decoded on the host.
__global__ void quant_dequant_kernel(kernels::QuantKind q, const float* v, int blocks, float g, __nv_bfloat16* out) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  if (kernels::quant_block(q) == 16) {
    float in[16];
    __nv_bfloat16 o[16];
    for (int i = 0; i < 16; ++i) in[i] = v[b * 16 + i];
    kernels::quant_dequant_block<16>(q, in, g, o);
    for (int i = 0; i < 16; ++i) out[b * 16 + i] = o[i];
  } else {
    float in[32];
    __nv_bfloat16 o[32];
    for (int i = 0; i < 32; ++i) in[i] = v[b * 32 + i];
    kernels::quant_dequant_block<32>(q, in, g, o);
    for (int i = 0; i < 32; ++i) out[b * 32 + i] = o[i];
  }
}

// The lane-parallel form (quantize.cuh: one element per lane, a block across 16 or 32 lanes, amax and
// NaN by shuffles), as direct_micro's phase 0 and FC1 epilogue run it.
__global__ void quant_dequant_lanes_kernel(kernels::QuantKind q, const float* v, int n, float g, __nv_bfloat16* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const __nv_bfloat16 o = kernels::quant_dequant_lanes(q, i < n ? v[i] : 0.0f, g);  // every lane shuffles
  if (i < n) out[i] = o;
}

// Four consecutive elements a lane, a block across 4 or 8 lanes (quant_dequant_lanes<kBlock, 4>), as
// the register path's FC1 epilogue runs it at 32-row tiles (moe_gemm.cuh fc1_spread_rows).
__global__ void quant_dequant_lanes4_kernel(kernels::QuantKind q, const float* v, int n, float g, __nv_bfloat16* out) {
  const int i = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
  float in[4];
  for (int j = 0; j < 4; ++j) in[j] = i + j < n ? v[i + j] : 0.0f;
  __nv_bfloat16 o[4];
  if (kernels::quant_block(q) == 16) kernels::quant_dequant_lanes<16, 4>(q, in, g, o);  // every lane shuffles
  else kernels::quant_dequant_lanes<32, 4>(q, in, g, o);
  for (int j = 0; j < 4; ++j)
    if (i + j < n) out[i + j] = o[j];
}

// got equals want bit for bit (n: the block size, for the message).
void expect_bitwise_equal(const std::vector<__nv_bfloat16>& want, const std::vector<__nv_bfloat16>& got,
                          kernels::QuantKind q, int n) {
  ASSERT_EQ(want.size(), got.size());
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&want[i], &got[i], sizeof(want[i])) != 0 && bad++ == 0) first = static_cast<int64_t>(i);
  EXPECT_EQ(bad, 0) << "quant kind " << int(q) << ": " << bad << " of " << want.size()
                    << " differ, first at element " << first << " (block " << first / n << ")";
}

// Outputs poisoned with a NaN pattern that no quantiser produces: an element left unwritten differs.
std::vector<__nv_bfloat16> poisoned(int n) { return std::vector<__nv_bfloat16>(static_cast<size_t>(n), __ushort_as_bfloat16(0x7FA5)); }

TEST(GpuQuantizers, LaneParallelEqualsBlockBitForBit) {  // one and four elements a lane
  REQUIRE_GPU();
  using kernels::QuantKind;
  for (QuantKind q : {QuantKind::kNone, QuantKind::kNvfp4, QuantKind::kMxfp4, QuantKind::kMxfp8}) {
    const int n = kernels::quant_block(q), blocks = 1 << 15, total = blocks * n;
    const std::vector<float> v = edge_rich_values(static_cast<size_t>(total), 98);  // NaN and Inf blocks too
    DeviceArray<float> dv(v);
    DeviceArray<__nv_bfloat16> dblock(poisoned(total)), dlanes(poisoned(total));
    quant_dequant_kernel<<<(blocks + 127) / 128, 128>>>(q, dv.get(), blocks, 0.37f, dblock.get());
    GPU_CHECK(cudaGetLastError());
    quant_dequant_lanes_kernel<<<(total + 255) / 256, 256>>>(q, dv.get(), total, 0.37f, dlanes.get());
    GPU_CHECK(cudaGetLastError());
    DeviceArray<__nv_bfloat16> dlanes4(poisoned(total));
    quant_dequant_lanes4_kernel<<<(total / 4 + 255) / 256, 256>>>(q, dv.get(), total, 0.37f, dlanes4.get());
    GPU_CHECK(cudaGetLastError());
    GPU_CHECK(cudaDeviceSynchronize());
    const std::vector<__nv_bfloat16> want = dblock.download();
    expect_bitwise_equal(want, dlanes.download(), q, n);
    expect_bitwise_equal(want, dlanes4.download(), q, n);
  }
}

// The bf16-input form (quantize.cuh quant_dequant_bf16_run: bf16 values read from memory in two
// passes, at most 8 live), as the bf16 path's helper warps requantise FC1's staged h: rows of 64
// values whose 16-byte chunks sit XOR-swizzled by row (chunk c of row r at c ^ (r & 7)), or plain.
__global__ void quant_dequant_bf16_run_kernel(kernels::QuantKind q, const uint16_t* v, int blocks, float g,
                                              bool swizzled, __nv_bfloat16* out) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  const int n = kernels::quant_block(q), r = b * n / 64, x = swizzled ? r & 7 : 0;
  if (n == 16) kernels::quant_dequant_bf16_run<16>(q, v + r * 64, b * 16 % 64, x, g, out + b * 16);
  else kernels::quant_dequant_bf16_run<32>(q, v + r * 64, b * 32 % 64, x, g, out + b * 32);
}

// floats to bf16 as the consumers stage h (__float2bfloat16_rn: a NaN becomes the canonical NaN, where
// fmt::bf16_from_f32 keeps its payload; the block form's kNone copy converts the same way).
__global__ void to_bf16_kernel(const float* v, int n, uint16_t* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v[i]));
}

TEST(GpuQuantizers, Bf16RunEqualsBlockBitForBit) {
  REQUIRE_GPU();
  using kernels::QuantKind;
  for (QuantKind q : {QuantKind::kNone, QuantKind::kNvfp4, QuantKind::kMxfp4, QuantKind::kMxfp8}) {
    const int n = kernels::quant_block(q), blocks = 1 << 15, total = blocks * n;
    // bf16 inputs (NaN and Inf blocks too); the block form quantises the same values as floats.
    const std::vector<float> v = edge_rich_values(static_cast<size_t>(total), 99);
    DeviceArray<float> dv32(v);
    DeviceArray<uint16_t> dh32(std::vector<uint16_t>(v.size(), 0));
    to_bf16_kernel<<<(total + 255) / 256, 256>>>(dv32.get(), total, dh32.get());
    GPU_CHECK(cudaGetLastError());
    const std::vector<uint16_t> h = dh32.download();
    std::vector<float> hv(v.size());
    for (size_t i = 0; i < v.size(); ++i) hv[i] = fmt::f32_from_bf16(h[i]);
    std::vector<uint16_t> hs(h.size());  // the same rows of 64, chunks swizzled
    for (size_t i = 0; i < h.size(); ++i) {
      const size_t r = i / 64, c = i % 64 / 8;
      hs[r * 64 + ((c ^ (r & 7)) * 8) + i % 8] = h[i];
    }
    DeviceArray<float> dv(hv);
    DeviceArray<uint16_t> dh(h), dhs(hs);
    DeviceArray<__nv_bfloat16> dblock(poisoned(total));
    quant_dequant_kernel<<<(blocks + 127) / 128, 128>>>(q, dv.get(), blocks, 0.37f, dblock.get());
    GPU_CHECK(cudaGetLastError());
    const auto want = dblock.download();
    for (bool swizzled : {false, true}) {
      DeviceArray<__nv_bfloat16> drun(poisoned(total));
      quant_dequant_bf16_run_kernel<<<(blocks + 127) / 128, 128>>>(q, swizzled ? dhs.get() : dh.get(), blocks, 0.37f,
                                                                   swizzled, drun.get());
      GPU_CHECK(cudaGetLastError());
      GPU_CHECK(cudaDeviceSynchronize());
      SCOPED_TRACE(swizzled ? "swizzled rows" : "plain rows");
      expect_bitwise_equal(want, drun.download(), q, n);
    }
  }
}

TEST(GpuQuantizers, DequantisedValuesAreExact) {
  REQUIRE_GPU();
  using kernels::QuantKind;
  for (QuantKind q : {QuantKind::kNone, QuantKind::kNvfp4, QuantKind::kMxfp4, QuantKind::kMxfp8}) {
    const int n = kernels::quant_block(q), blocks = 1 << 15;
    std::vector<float> v = edge_rich_values(static_cast<size_t>(blocks) * n, 99);
    for (auto& f : v)
      if (!std::isfinite(f)) f = 1.0f;  // NaN/Inf blocks are covered byte-wise above
    const float g = 0.37f;
    DeviceArray<float> dv(v);
    DeviceArray<__nv_bfloat16> dout(static_cast<size_t>(blocks) * n);
    quant_dequant_kernel<<<(blocks + 127) / 128, 128>>>(q, dv.get(), blocks, g, dout.get());
    GPU_CHECK(cudaGetLastError());
    GPU_CHECK(cudaDeviceSynchronize());
    const auto out = dout.download();
    int64_t bad = 0;
    for (int b = 0; b < blocks; ++b) {
      uint8_t c[32];
      for (int i = 0; i < n; ++i) {
        double expect;
        if (q == QuantKind::kNone) {
          expect = fmt::round_bf16(v[b * n + i]);
        } else if (q == QuantKind::kNvfp4) {
          const double s = fmt::e4m3_decode(fmt::nvfp4_quantize_block(&v[b * n], g, c));
          expect = fmt::e2m1_decode(c[i]) * s;  // global scale is folded into alpha, not applied here
        } else if (q == QuantKind::kMxfp4) {
          const double s = fmt::ue8m0_decode(fmt::mxfp4_quantize_block(&v[b * n], c));  // fills c first
          expect = fmt::e2m1_decode(c[i]) * s;
        } else {
          const double s = fmt::ue8m0_decode(fmt::mxfp8_quantize_block(&v[b * n], c));  // fills c first
          expect = fmt::e4m3_decode(c[i]) * s;
        }
        const double got = __bfloat162float(out[b * n + i]);
        if (got != expect && !(std::fabs(expect) < 1e-38 && std::fabs(got) < 1e-38)) ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << "quant kind " << int(q);
  }
}

// Every E2M1 code × every E4M3 scale through the kernels' bf16 dequantisation (generic's B-tile fill:
// the byte table times the block scale) equals the exact product.
__global__ void dequant_all_kernel(uint32_t* out) {
  __shared__ kernels::E2m1x2Table t;
  kernels::fill_e2m1x2_table(t);
  __syncthreads();
  const int s = blockIdx.x;  // scale byte
  const int byte = threadIdx.x;  // 256 code pairs
  const __nv_bfloat162 scale = kernels::scale_bf16x2(static_cast<uint8_t>(s), true);
  // elements 0 (low nibble) and 1 (high nibble)
  out[s * 256 + byte] = kernels::hmul2_bf16_bits(t.v[byte], *reinterpret_cast<const uint32_t*>(&scale));
}

TEST(GpuDequant, E2m1TimesE4m3IsExactInBf16) {
  REQUIRE_GPU();
  DeviceArray<uint32_t> d(256 * 256);
  dequant_all_kernel<<<256, 256>>>(d.get());
  GPU_CHECK(cudaGetLastError());
  GPU_CHECK(cudaDeviceSynchronize());
  const auto h = d.download();
  for (int s = 0; s < 256; ++s) {
    if ((s & 0x7F) == 0x7F) continue;  // NaN scales are rejected by prepare_weights
    for (int byte = 0; byte < 256; ++byte) {
      const double lo = fmt::e2m1_decode(byte & 0xF) * double(fmt::e4m3_decode(s));
      const double hi = fmt::e2m1_decode(byte >> 4) * double(fmt::e4m3_decode(s));
      ASSERT_EQ(fmt::f32_from_bf16(h[s * 256 + byte] & 0xFFFF), lo) << "scale " << s << " byte " << byte;
      ASSERT_EQ(fmt::f32_from_bf16(h[s * 256 + byte] >> 16), hi) << "scale " << s << " byte " << byte;
    }
  }
}

// Grid barrier: phase p, every CTA writes p·(blockIdx+1) into its slot, syncs, checks every other
// CTA's slot, syncs again. Many phases per launch, several launches and graph replays on the same
// (never re-zeroed) barrier words.
__global__ void barrier_kernel(kernels::GridBarrier bar, int* slots, int phases, int base, int* errors) {
  for (int p = 1; p <= phases; ++p) {
    if (threadIdx.x == 0) slots[blockIdx.x] = (base + p) * (blockIdx.x + 1);
    kernels::grid_sync(bar);
    for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x)
      if (slots[b] != (base + p) * (b + 1)) atomicAdd(errors, 1);
    kernels::grid_sync(bar);
  }
}

TEST(GpuGridBarrier, ReusableAcrossPhasesLaunchesAndGraphReplays) {
  REQUIRE_GPU();
  int sms = 0, per_sm = 0;
  GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, barrier_kernel, 128, 0));
  ASSERT_GT(per_sm, 0);
  const int grid = sms * std::min(per_sm, 2);
  DeviceArray<unsigned> state(2);
  GPU_CHECK(cudaMemset(state.get(), 0, 2 * sizeof(unsigned)));
  DeviceArray<int> slots(grid), errors(1);
  GPU_CHECK(cudaMemset(errors.get(), 0, sizeof(int)));
  kernels::GridBarrier bar{state.get(), state.get() + 1};
  int phases = 50, base = 0;
  int* slots_p = slots.get();
  int* err_p = errors.get();
  void* args[] = {&bar, &slots_p, &phases, &base, &err_p};
  for (int launch = 0; launch < 3; ++launch) {
    base = launch * 1000;
    GPU_CHECK(cudaLaunchCooperativeKernel((void*)barrier_kernel, grid, 128, args, 0, nullptr));
  }
  GPU_CHECK(cudaDeviceSynchronize());
  // In a graph: capture one cooperative launch, replay it 5 times.
  cudaStream_t s;
  GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  base = 7000;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  GPU_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  GPU_CHECK(cudaLaunchCooperativeKernel((void*)barrier_kernel, grid, 128, args, 0, s));
  GPU_CHECK(cudaStreamEndCapture(s, &graph));
  GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 5; ++i) GPU_CHECK(cudaGraphLaunch(exec, s));
  GPU_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(errors.download()[0], 0);
  const auto st = state.download();
  EXPECT_EQ(st[0], 0u) << "count returns to 0";
  EXPECT_EQ(st[1], static_cast<unsigned>((3 + 5) * 2 * phases)) << "one epoch per barrier";
  GPU_CHECK(cudaGraphExecDestroy(exec));
  GPU_CHECK(cudaGraphDestroy(graph));
  GPU_CHECK(cudaStreamDestroy(s));
}


// ---- The device forms of the formats' roundings and conversions ------------------------------------
// The kernels' forms (fmt::e2m1_round and e4m3_round by a power-of-two add, round_bf16 and
// round_bf16x2 by cvt.rn.bf16x2, e4m3_encode and e4m3_decode by the E4M3 conversions) against the
// forms they stand for (decode of encode, the soft encoders and decoders, bf16_from_f32), on the
// device, on every float whose exponent field is 100..140, both signs (every decision point of E2M1,
// E4M3 and bf16 rounding within the quantisers' range, and its neighbours), and on the specials. The
// CPU tests check the host's compilation of the same code; this one checks what the device runs.
enum FormatCheck : int { kE2m1Round, kE4m3Round, kE4m3Encode, kRoundBf16, kRoundBf16x2, kE4m3Decode, kFormatChecks };
struct FormatMismatch {
  unsigned long long count[kFormatChecks];
  uint32_t first[kFormatChecks];  // the input's bits (kE4m3Decode: the byte)
};

__device__ bool same_or_both_nan(float a, float b) {
  return fmt::f32_bits(a) == fmt::f32_bits(b) || (fmt::is_nan(a) && fmt::is_nan(b));
}
__device__ void note_mismatch(FormatMismatch* m, int check, uint32_t input) {
  if (atomicAdd(&m->count[check], 1ull) == 0) m->first[check] = input;  // the first to count it
}
__device__ void check_float(uint32_t u, FormatMismatch* m) {
  const float x = fmt::bits_f32(u);
  if (fmt::f32_bits(fmt::e2m1_round(x)) != fmt::f32_bits(fmt::e2m1_decode(fmt::e2m1_encode(x))))
    note_mismatch(m, kE2m1Round, u);
  if (fmt::f32_bits(fmt::e4m3_round(x)) != fmt::f32_bits(fmt::e4m3_decode_soft(fmt::e4m3_encode_soft(x))))
    note_mismatch(m, kE4m3Round, u);
  if (fmt::e4m3_encode(x) != fmt::e4m3_encode_soft(x)) note_mismatch(m, kE4m3Encode, u);
  const float want = fmt::f32_from_bf16(fmt::bf16_from_f32(x));
  if (!same_or_both_nan(fmt::round_bf16(x), want)) note_mismatch(m, kRoundBf16, u);
  float a = x, b = -x;  // both halves of the pair conversion
  fmt::round_bf16x2(a, b);
  if (!same_or_both_nan(a, want) || !same_or_both_nan(b, fmt::f32_from_bf16(fmt::bf16_from_f32(-x))))
    note_mismatch(m, kRoundBf16x2, u);
}
__global__ void format_forms_kernel(uint32_t first_exp, uint32_t end_exp, FormatMismatch* m) {
  const uint64_t n = static_cast<uint64_t>(end_exp - first_exp) << 23;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < 2 * n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t mag = static_cast<uint32_t>((first_exp << 23) + i % n);
    check_float(i < n ? mag : mag | 0x80000000u, m);
  }
  if (blockIdx.x == 0) {
    const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007FFFFFu, 0x7F800000u,
                                 0xFF800000u, 0x7F800001u, 0x7FC00000u, 0xFFC00000u, 0xFFFFFFFFu, 0x7F7FFFFFu,
                                 0xFF7FFFFFu, 0x43E00000u, 0x43E80000u, 0xC3E80000u};  // 448, 464 (tie past 448)
    for (int k = threadIdx.x; k < static_cast<int>(sizeof(specials) / 4); k += blockDim.x) check_float(specials[k], m);
    const int byte = threadIdx.x;
    if (byte < 256 && !same_or_both_nan(fmt::e4m3_decode(static_cast<uint8_t>(byte)),
                                        fmt::e4m3_decode_soft(static_cast<uint8_t>(byte))))
      note_mismatch(m, kE4m3Decode, static_cast<uint32_t>(byte));
  }
}

TEST(GpuFormats, DeviceFormsEqualTheSoftForms) {
  REQUIRE_SM90();
  DeviceArray<FormatMismatch> m(1);
  GPU_CHECK(cudaMemset(m.get(), 0, sizeof(FormatMismatch)));
  int sms = 0;
  GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  format_forms_kernel<<<sms * 8, 256>>>(100, 141, m.get());
  GPU_CHECK(cudaGetLastError());
  GPU_CHECK(cudaDeviceSynchronize());
  const FormatMismatch h = m.download()[0];
  const char* names[kFormatChecks] = {"e2m1_round", "e4m3_round", "e4m3_encode", "round_bf16", "round_bf16x2",
                                      "e4m3_decode"};
  for (int c = 0; c < kFormatChecks; ++c)
    EXPECT_EQ(h.count[c], 0u) << names[c] << ": " << h.count[c] << " inputs differ, first 0x" << std::hex << h.first[c];
}
}  // namespace
}  // namespace fp4moe
