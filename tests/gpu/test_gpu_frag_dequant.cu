// The register dequantisation of mma-fragment-order weights (kernels/common/frag_dequant.cuh), the
// one that dynamic and direct_micro feed to the tensor cores, against code × scale computed on the
// host from fmt:: decoders and the layout's own index map (fragment_layout.h): every lane, every k16
// step, every register, both halves.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <random>
#include <vector>

#include "fp4moe/formats.h"
#include "gpu/gpu_util.h"
#include "kernels/common/frag_dequant.cuh"
#include "kernels/common/fragment_layout.h"

namespace fp4moe {
namespace {

using testgpu::DeviceArray;

constexpr int kRegs = 4 * 4;  // per lane and tile: 4 k16 steps × 4 A registers

// One warp per fragment tile (16 rows × 64 k). Writes, per lane, step t and register r, frag_a_bf16's
// bf16x2 and (NVFP4 only) frag_a_f16's f16x2 (of the word as f16 words store it) at ((tile·32 + lane)·4 + t)·4 + r.
__global__ void frag_dequant_kernel(const uint4* codes, const uint8_t* scales, int sb, bool nvfp4, uint32_t* bf16,
                                    uint32_t* f16) {
  __shared__ kernels::FragTables tables;
  kernels::fill_frag_tables(tables, nvfp4, threadIdx.x, blockDim.x);
  __syncthreads();
  const int lane = threadIdx.x, tile = blockIdx.x;
  const kernels::FragLut lut = kernels::frag_lut(tables);
  const uint4 v = codes[tile * 32 + lane];
  uint32_t slo, shi;
  kernels::frag_scales(scales + tile * 16 * sb, sb, slo, shi);
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  const int out = (tile * 32 + lane) * kRegs;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    uint32_t a[4];
    kernels::frag_a_bf16(lut, words[t], slo, shi, t, a);
    for (int r = 0; r < 4; ++r) bf16[out + 4 * t + r] = a[r];
    if (nvfp4) {
      // The f16 kernels read NVFP4-a4 weights stored as f16 words (DeviceWeights::f16_words).
      kernels::frag_a_f16(kernels::f16_word_from_standard(words[t]), kernels::frag_scales_f16(slo, shi), t, a);
      for (int r = 0; r < 4; ++r) f16[out + 4 * t + r] = a[r];
    }
  }
}

// IEEE binary16 bits → value (exact in double).
double f16_value(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double mag = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

// `tiles` fragment tiles of random code words and random scale bytes (block 16 E4M3 or block 32
// UE8M0), through the kernel; every half of every register equals code × scale (f16: × 2^6).
void check_format(bool nvfp4, uint64_t seed) {
  const int block = nvfp4 ? 16 : 32, sb = 64 / block, tiles = 64;
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> words(static_cast<size_t>(tiles) * 32 * 4);
  for (auto& w : words) w = static_cast<uint32_t>(rng());
  // Scale bytes [tile][row 0..15][k / block]. NaN bytes are excluded (prepare_weights rejects them),
  // and UE8M0 stays in [2, 252], where every code × scale is a finite normal bf16.
  std::vector<uint8_t> scales(static_cast<size_t>(tiles) * 16 * sb);
  for (auto& s : scales) {
    do s = static_cast<uint8_t>(rng());
    while (nvfp4 ? (s & 0x7F) == 0x7F : (s < 2 || s > 252));
  }
  DeviceArray<uint32_t> d_words(words), d_bf16(words.size() * 4), d_f16(words.size() * 4);
  DeviceArray<uint8_t> d_scales(scales);
  frag_dequant_kernel<<<tiles, 32>>>(reinterpret_cast<const uint4*>(d_words.get()), d_scales.get(), sb, nvfp4,
                                     d_bf16.get(), d_f16.get());
  GPU_CHECK(cudaGetLastError());
  GPU_CHECK(cudaDeviceSynchronize());
  const std::vector<uint32_t> bf16 = d_bf16.download(), f16 = d_f16.download();

  int bad = 0;
  for (int tile = 0; tile < tiles; ++tile)
    for (int lane = 0; lane < 32; ++lane)
      for (int t = 0; t < 4; ++t)
        for (int r = 0; r < 4; ++r) {
          const kernels::FragmentSource src = kernels::weight_fragment_source(lane, t, r);
          const uint32_t word = words[(static_cast<size_t>(tile) * 32 + lane) * 4 + t];
          const uint8_t byte = static_cast<uint8_t>(word >> (8 * r));
          const uint8_t sbyte = scales[(static_cast<size_t>(tile) * 16 + src.row) * sb + src.k / block];
          const double scale = nvfp4 ? fmt::e4m3_decode(sbyte) : fmt::ue8m0_decode(sbyte);
          const size_t at = (static_cast<size_t>(tile) * 32 + lane) * kRegs + 4 * t + r;
          for (int h = 0; h < 2; ++h) {  // h = 0: k (low nibble, low half), 1: k + 1
            const double expect = fmt::e2m1_decode(static_cast<uint8_t>((byte >> (4 * h)) & 0xF)) * scale;
            const double got = fmt::f32_from_bf16(static_cast<uint16_t>(bf16[at] >> (16 * h)));
            if (got != expect && bad++ < 8)
              ADD_FAILURE() << "bf16 " << (nvfp4 ? "nvfp4" : "mxfp4") << " tile " << tile << " lane " << lane
                            << " step " << t << " reg " << r << " half " << h << ": " << got << " != " << expect;
            if (!nvfp4) continue;
            const double got16 = std::ldexp(f16_value(static_cast<uint16_t>(f16[at] >> (16 * h))), 6);
            if (got16 != expect && bad++ < 8)
              ADD_FAILURE() << "f16 tile " << tile << " lane " << lane << " step " << t << " reg " << r << " half "
                            << h << ": " << got16 << " != " << expect;
          }
        }
  EXPECT_EQ(bad, 0) << (nvfp4 ? "nvfp4" : "mxfp4");
}

TEST(GpuFragDequant, TablesAndF16GiveCodeTimesScale) {
  REQUIRE_GPU();
  check_format(true, 0x5eed01);
  check_format(false, 0x5eed02);
}

// The bf16-word path (frag_a_bf16w, DeviceWeights::bf16_words): one warp per tile of bf16 words and
// canonical scales (positive, or zero on all-zero codes), out as in frag_dequant_kernel.
__global__ void frag_bf16w_kernel(const uint4* codes, const uint8_t* scales, uint32_t* out) {
  const int lane = threadIdx.x, tile = blockIdx.x;
  const uint4 v = codes[tile * 32 + lane];
  uint32_t slo, shi;
  kernels::frag_scales(scales + tile * 16 * 4, 4, slo, shi);
  const kernels::Bf16wScales sc = kernels::frag_scales_bf16w(slo, shi);
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  const int at = (tile * 32 + lane) * kRegs;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    uint32_t a[4];
    kernels::frag_a_bf16w(words[t], sc, t, a);
    for (int r = 0; r < 4; ++r) out[at + 4 * t + r] = a[r];
  }
}

// Random NVFP4 tiles with every kind of scale byte (negative, ±0, subnormal, the largest); the host
// folds them as the repack does (a negative scale's sign into its block's codes, a zero scale's codes
// to zero) and stores bf16 words. Every half of every register, × 2^8, equals code × scale of the
// original bytes: exact through bf16's subnormal codes (E2M1's 0.5 is 2^-127 before the HMUL2).
TEST(GpuFragDequant, Bf16WordsGiveCodeTimesScale) {
  REQUIRE_GPU();
  const int tiles = 64;
  std::mt19937_64 rng(0x5eed03);
  std::vector<uint32_t> words(static_cast<size_t>(tiles) * 32 * 4);
  for (auto& w : words) w = static_cast<uint32_t>(rng());
  std::vector<uint8_t> scales(static_cast<size_t>(tiles) * 16 * 4);
  for (size_t i = 0; i < scales.size(); ++i) {
    uint8_t s;
    do s = static_cast<uint8_t>(rng());
    while ((s & 0x7F) == 0x7F);
    if (i % 97 == 0) s = 0x7E;  // 448, the largest
    if (i % 89 == 0) s = static_cast<uint8_t>(i & 0x80);  // +0 / -0
    scales[i] = s;
  }
  // Fold as the repack does, nibble by nibble through the layout's index map.
  std::vector<uint32_t> folded(words.size());
  for (int tile = 0; tile < tiles; ++tile)
    for (int lane = 0; lane < 32; ++lane)
      for (int t = 0; t < 4; ++t) {
        const size_t wi = (static_cast<size_t>(tile) * 32 + lane) * 4 + t;
        uint32_t w = words[wi];
        for (int r = 0; r < 4; ++r) {
          const kernels::FragmentSource src = kernels::weight_fragment_source(lane, t, r);
          const uint8_t sbyte = scales[(static_cast<size_t>(tile) * 16 + src.row) * 4 + src.k / 16];
          for (int h = 0; h < 2; ++h) {
            const int sh = 8 * r + 4 * h;
            uint32_t n = (w >> sh) & 0xF;
            if ((sbyte & 0x7F) == 0) n = 0;
            else if (sbyte & 0x80) n ^= 8;
            w = (w & ~(0xFu << sh)) | (n << sh);
          }
        }
        folded[wi] = kernels::bf16_word_from_standard(w);
      }
  std::vector<uint8_t> canon(scales);
  for (auto& s : canon) s = (s & 0x7F) == 0 ? 0 : s & 0x7F;
  DeviceArray<uint32_t> d_words(folded), d_out(words.size() * 4);
  DeviceArray<uint8_t> d_scales(canon);
  frag_bf16w_kernel<<<tiles, 32>>>(reinterpret_cast<const uint4*>(d_words.get()), d_scales.get(), d_out.get());
  GPU_CHECK(cudaGetLastError());
  GPU_CHECK(cudaDeviceSynchronize());
  const std::vector<uint32_t> out = d_out.download();
  int bad = 0, subnormal_codes = 0;
  for (int tile = 0; tile < tiles; ++tile)
    for (int lane = 0; lane < 32; ++lane)
      for (int t = 0; t < 4; ++t)
        for (int r = 0; r < 4; ++r) {
          const kernels::FragmentSource src = kernels::weight_fragment_source(lane, t, r);
          const uint32_t word = words[(static_cast<size_t>(tile) * 32 + lane) * 4 + t];
          const uint8_t sbyte = scales[(static_cast<size_t>(tile) * 16 + src.row) * 4 + src.k / 16];
          const size_t at = (static_cast<size_t>(tile) * 32 + lane) * kRegs + 4 * t + r;
          for (int h = 0; h < 2; ++h) {
            const uint8_t code = static_cast<uint8_t>((word >> (8 * r + 4 * h)) & 0xF);
            subnormal_codes += (code & 7) == 1;
            const double expect = fmt::e2m1_decode(code) * static_cast<double>(fmt::e4m3_decode(sbyte));
            const double got = std::ldexp(fmt::f32_from_bf16(static_cast<uint16_t>(out[at] >> (16 * h))), 8);
            if (got != expect && bad++ < 8)
              ADD_FAILURE() << "bf16w tile " << tile << " lane " << lane << " step " << t << " reg " << r << " half "
                            << h << " code " << int(code) << " scale 0x" << std::hex << int(sbyte) << std::dec
                            << ": " << got << " != " << expect;
          }
        }
  EXPECT_GT(subnormal_codes, 1000);
  EXPECT_EQ(bad, 0);
}

// Diagnostic, not a test of speed (the benchmark is): SM clock cycles of the three register
// dequantisations per k16 step at full occupancy (every SM, 8 warps a block, 4 blocks per SM),
// each step's four registers folded into an accumulator so nothing is dead code. Prints cycles per
// step and warp-instructions issued per step per SM sub-partition (lower is better).
template <int kPath>  // 0: tables (frag_a_bf16), 1: f16 words, 2: bf16 words, 3: none (the loop's own cost)
__global__ void dequant_rate_kernel(const uint4* codes, const uint8_t* scales, int iters, uint32_t* sink,
                                    long long* cycles) {
  __shared__ kernels::FragTables tables;
  if constexpr (kPath == 0) kernels::fill_frag_tables(tables, true, threadIdx.x >> 5, blockDim.x >> 5);
  __syncthreads();
  const kernels::FragLut lut = kernels::frag_lut(tables);
  const int lane = threadIdx.x & 31;
  uint4 v = codes[lane];
  uint32_t slo, shi;
  kernels::frag_scales(scales, 4, slo, shi);
  uint32_t x = 0;
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    if constexpr (kPath == 1) {
      const kernels::F16Scales sc = kernels::frag_scales_f16(slo, shi);
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        uint32_t a[4];
        kernels::frag_a_f16(words[t], sc, t, a);
        x ^= a[0] ^ a[1] ^ a[2] ^ a[3];
      }
    } else if constexpr (kPath == 2) {
      const kernels::Bf16wScales sc = kernels::frag_scales_bf16w(slo, shi);
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        uint32_t a[4];
        kernels::frag_a_bf16w(words[t], sc, t, a);
        x ^= a[0] ^ a[1] ^ a[2] ^ a[3];
      }
    } else if constexpr (kPath == 3) {  // the loop and the fold alone
#pragma unroll
      for (int t = 0; t < 4; ++t) x ^= words[t] ^ (slo + t) ^ shi;
    } else {
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        uint32_t a[4];
        kernels::frag_a_bf16(lut, words[t], slo, shi, t, a);
        x ^= a[0] ^ a[1] ^ a[2] ^ a[3];
      }
    }
    // A new word and scales each iteration, dependent on nothing the compiler can hoist.
    v.x = __funnelshift_l(v.x, v.y, 1);
    v.y = __funnelshift_l(v.y, v.z, 1);
    v.z = __funnelshift_l(v.z, v.w, 1);
    v.w = __funnelshift_l(v.w, v.x, 1);
    slo = (slo & 0x3F3F3F3Fu) | 0x01010101u;
    shi = __byte_perm(shi, slo, 0x3210 + (i & 1));
    shi = (shi & 0x3F3F3F3Fu) | 0x01010101u;
  }
  const long long t1 = clock64();
  sink[blockIdx.x * blockDim.x + threadIdx.x] = x;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

TEST(GpuDiagnostics, DISABLED_DequantRate) {
  REQUIRE_GPU();
  int sms = 0;
  GPU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = sms * 4, threads = 256, iters = 4096;
  std::vector<uint32_t> w(128);
  std::mt19937 rng(5);
  for (auto& x : w) x = rng();
  std::vector<uint8_t> s(64, 0x38);
  DeviceArray<uint32_t> d_w(w), d_sink(static_cast<size_t>(blocks) * threads);
  DeviceArray<uint8_t> d_s(s);
  DeviceArray<long long> d_cycles(blocks);
  const char* names[4] = {"tables (frag_a_bf16)", "f16 words (frag_a_f16)", "bf16 words (frag_a_bf16w)",
                          "none (loop and fold)"};
  for (int path = 0; path < 4; ++path) {
    auto k = path == 0   ? dequant_rate_kernel<0>
             : path == 1 ? dequant_rate_kernel<1>
             : path == 2 ? dequant_rate_kernel<2>
                         : dequant_rate_kernel<3>;
    for (int rep = 0; rep < 2; ++rep) {  // the first launch warms up
      k<<<blocks, threads>>>(reinterpret_cast<const uint4*>(d_w.get()), d_s.get(), iters, d_sink.get(),
                             d_cycles.get());
      GPU_CHECK(cudaGetLastError());
      GPU_CHECK(cudaDeviceSynchronize());
    }
    const std::vector<long long> c = d_cycles.download();
    double mean = 0;
    for (long long x : c) mean += static_cast<double>(x);
    mean /= static_cast<double>(c.size());
    // Per SM: 4 blocks × 8 warps × iters × 4 steps, over `mean` cycles.
    const double steps_per_sm = 4.0 * 8 * iters * 4;
    std::printf("[dequant rate] %-28s %8.3f SM cycles per warp k16 step (%.2f per sub-partition)\n", names[path],
                mean / steps_per_sm, 4.0 * mean / steps_per_sm);
  }
}

}  // namespace
}  // namespace fp4moe
