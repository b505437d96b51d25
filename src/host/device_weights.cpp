// upload_weights: repack the canonical host form into the padded device layouts, once.
#include "host/device_weights.h"

#include <cstring>
#include <vector>

#include "common/parallel_for.h"
#include "fp4moe/errors.h"
#include "host/gpu_backend.h"
#include "host/launch.h"
#include "kernels/common/fragment_layout.h"

namespace fp4moe::gpu {
namespace {

// Copy one canonical projection into [E][rows_pad][k_pad/2] codes and [E][rows_pad][k_pad/bs]
// scales, experts on up to `threads` host threads. row_of(r) maps a padded row to its canonical row,
// or -1 for a padding row.
// Every byte is written here (padding rows and columns as zeros), by the expert's task: the staging
// buffers come uninitialised (StagingBytes).
// fold_signs: fold_scale_signs on each row (NVFP4 on bf16 words, DeviceWeights::bf16_words).
void pad_projection(const QuantizedProjection& p, int rows_pad, int k_pad, const auto& row_of, StagingBytes& codes,
                    StagingBytes& scales, bool fold_signs, int threads) {
  const int bs = p.block();
  const int64_t src_cb = p.cols / 2, dst_cb = k_pad / 2, src_sc = p.cols / bs, dst_sc = k_pad / bs;
  codes.resize(static_cast<size_t>(p.experts) * rows_pad * dst_cb);
  scales.resize(static_cast<size_t>(p.experts) * rows_pad * dst_sc);
  parallel_for(p.experts, threads, [&](int64_t e) {
    for (int r = 0; r < rows_pad; ++r) {
      const int s = row_of(r);
      const int64_t dst = e * rows_pad + r;
      uint8_t* dc = &codes[dst * dst_cb];
      uint8_t* ds = &scales[dst * dst_sc];
      if (s < 0) {
        std::memset(dc, 0, dst_cb);
        std::memset(ds, 0, dst_sc);
        continue;
      }
      const int64_t src = e * p.rows + s;
      std::memcpy(dc, &p.packed[src * src_cb], src_cb);
      std::memset(dc + src_cb, 0, dst_cb - src_cb);
      std::memcpy(ds, &p.scales[src * src_sc], src_sc);
      std::memset(ds + src_sc, 0, dst_sc - src_sc);
      if (fold_signs) fold_scale_signs(dc, ds, 1, k_pad, bs);
    }
  });
}

DeviceBuffer upload(const void* host, size_t bytes, const char* what) {
  DeviceBuffer b(bytes, what);
  if (bytes) FP4MOE_CUDA_CHECK(cudaMemcpy(b.get(), host, bytes, cudaMemcpyHostToDevice));
  return b;
}

}  // namespace

void fold_scale_signs(uint8_t* codes, uint8_t* scales, int64_t rows, int k, int bs) {
  const int64_t blocks = rows * (k / bs);
  for (int64_t j = 0; j < blocks; ++j) {
    uint8_t* block = codes + j * (bs / 2);
    if ((scales[j] & 0x7F) == 0) {
      std::memset(block, 0, bs / 2);
      scales[j] = 0;
    } else if (scales[j] & 0x80) {
      for (int b = 0; b < bs / 2; ++b) block[b] ^= 0x88;  // both codes' sign bits
      scales[j] &= 0x7F;
    }
  }
}

namespace {

// Both overloads: every byte of fcodes and fscales is written (a permutation of the tiles' bytes),
// so resize's value-initialisation (std::vector) or its absence (StagingBytes) does not show.
template <class Bytes>
void fragment_order(const Bytes& codes, const Bytes& scales, int experts, int rows, int k, int bs, Bytes& fcodes,
                    Bytes& fscales, kernels::WordLayout words, int threads) {
  const int RT = rows / 16, KT = k / 64, sb = 64 / bs;
  const int64_t row_bytes = k / 2;
  fcodes.resize(codes.size());
  fscales.resize(scales.size());
  // Byte i of a tile (lane i / 16, word (i / 4) % 4, byte i % 4) comes from row src.row and code byte
  // src.k / 2 of the tile's 16 × 64 block: one table of source offsets for every tile.
  int32_t from[512];
  for (int lane = 0; lane < 32; ++lane)
    for (int t = 0; t < 4; ++t)
      for (int b = 0; b < 4; ++b) {
        const kernels::FragmentSource src = kernels::weight_fragment_source(lane, t, b);  // src.k even
        from[lane * 16 + t * 4 + b] = static_cast<int32_t>(src.row * row_bytes + src.k / 2);
      }
  // One task per (expert, row tile): its KT tiles of codes and scales.
  parallel_for(static_cast<int64_t>(experts) * RT, threads, [&](int64_t task) {
    const int64_t e = task / RT, rt = task % RT;
    const uint8_t* block_rows = &codes[(e * rows + rt * 16) * row_bytes];  // row 16·rt of expert e
    for (int kt = 0; kt < KT; ++kt) {
      const int64_t tile = task * KT + kt;
      const uint8_t* src = block_rows + kt * 32;  // k = 64·kt: code byte 32·kt
      uint8_t* dst = &fcodes[tile * 512];
      for (int i = 0; i < 512; ++i) dst[i] = src[from[i]];
      if (words != kernels::WordLayout::kStandard)  // little-endian words, as the kernels load them
        for (int w = 0; w < 128; ++w) {
          uint32_t v;
          std::memcpy(&v, dst + 4 * w, 4);
          v = kernels::word_from_standard(v, words);
          std::memcpy(dst + 4 * w, &v, 4);
        }
      for (int r = 0; r < 16; ++r)
        for (int j = 0; j < sb; ++j)
          fscales[tile * 16 * sb + r * sb + j] = scales[(e * rows + rt * 16 + r) * (k / bs) + kt * sb + j];
    }
  });
}

}  // namespace

void to_fragment_order(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales, int experts, int rows,
                       int k, int bs, std::vector<uint8_t>& fcodes, std::vector<uint8_t>& fscales,
                       kernels::WordLayout words, int threads) {
  fragment_order(codes, scales, experts, rows, k, bs, fcodes, fscales, words, threads);
}
void to_fragment_order(const StagingBytes& codes, const StagingBytes& scales, int experts, int rows, int k, int bs,
                       StagingBytes& fcodes, StagingBytes& fscales, kernels::WordLayout words, int threads) {
  fragment_order(codes, scales, experts, rows, k, bs, fcodes, fscales, words, threads);
}

std::shared_ptr<const DeviceWeights> upload_weights(const MoeConfig& c, const QuantizedCheckpoint& w, int device, int threads) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    count = 0;
  }
  FP4MOE_REQUIRE(device < count, InvalidArgument, "options.device", "CUDA device ", device, " does not exist (",
                 count, " device(s) visible)");
  FP4MOE_REQUIRE(w.w13.scale_layout == ScaleLayout::kLinear && w.w2.scale_layout == ScaleLayout::kLinear &&
                     w.gate_up == GateUpLayout::kUpGate,
                 InvalidArgument, "weights", "upload_weights takes the canonical form (canonicalize())");
  DeviceGuard guard(device);
  auto d = std::make_shared<DeviceWeights>();
  d->config = c;
  d->device = device;
  const int EL = c.local_count(), I = c.intermediate;
  const PaddedDims dims = padded_dims(c);
  d->h_pad = dims.h_pad, d->i_pad = dims.i_pad, d->n1_pad = dims.n1_pad;
  const int ip = d->i_pad;

  StagingBytes codes, scales;
  // W13: up rows [0, I) → [0, I); gate rows [I, 2I) → [i_pad, i_pad + I).
  auto w13_row = [&](int r) -> int {
    const int half = r / ip, i = r % ip;
    if (i >= I) return -1;
    return half * I + i;
  };
  StagingBytes fcodes, fscales;
  const int bs = w.w13.block();
  pad_projection(w.w13, d->n1_pad, d->h_pad, w13_row, codes, scales, bf16_word_operands(c), threads);
  d->f16_words = f16_operands(c);
  d->bf16_words = bf16_word_operands(c);
  const kernels::WordLayout words = d->f16_words    ? kernels::WordLayout::kF16
                                    : d->bf16_words ? kernels::WordLayout::kBf16
                                                    : kernels::WordLayout::kStandard;
  to_fragment_order(codes, scales, EL, d->n1_pad, d->h_pad, bs, fcodes, fscales, words, threads);
  d->w13_frag = upload(fcodes.data(), fcodes.size(), "w13.frag");
  d->w13_frag_scales = upload(fscales.data(), fscales.size(), "w13.frag_scales");
  pad_projection(w.w2, d->h_pad, d->i_pad, [&](int r) { return r < c.hidden ? r : -1; }, codes, scales,
                 bf16_word_operands(c), threads);
  to_fragment_order(codes, scales, EL, d->h_pad, d->i_pad, bs, fcodes, fscales, words, threads);
  d->w2_frag = upload(fcodes.data(), fcodes.size(), "w2.frag");
  d->w2_frag_scales = upload(fscales.data(), fscales.size(), "w2.frag_scales");

  std::vector<float> a1(EL, 1.0f), a2(EL, 1.0f), g1(EL, 1.0f), g2(EL, 1.0f);
  for (int e = 0; e < EL; ++e) {
    if (c.format == WeightFormat::kNVFP4) {
      a1[e] = w.w13.global_scale[e];
      a2[e] = w.w2.global_scale[e];
    }
    if (c.needs_input_scales()) {
      g1[e] = w.fc1_input_scale[e];
      g2[e] = w.fc2_input_scale[e];
      a1[e] *= g1[e];
      a2[e] *= g2[e];
    }
  }
  d->alpha1 = upload(a1.data(), EL * sizeof(float), "alpha1");
  d->alpha2 = upload(a2.data(), EL * sizeof(float), "alpha2");
  d->fc1_input_scale = upload(g1.data(), EL * sizeof(float), "fc1_input_scale");
  d->fc2_input_scale = upload(g2.data(), EL * sizeof(float), "fc2_input_scale");
  if (c.has_bias) {
    const int N1 = c.fc1_rows();
    std::vector<float> b13(static_cast<size_t>(EL) * d->n1_pad, 0.0f), b2(static_cast<size_t>(EL) * d->h_pad, 0.0f);
    for (int e = 0; e < EL; ++e) {
      for (int r = 0; r < d->n1_pad; ++r) {
        const int s = w13_row(r);
        if (s >= 0) b13[static_cast<size_t>(e) * d->n1_pad + r] = w.b13[static_cast<size_t>(e) * N1 + s];
      }
      for (int h = 0; h < c.hidden; ++h) b2[static_cast<size_t>(e) * d->h_pad + h] = w.b2[static_cast<size_t>(e) * c.hidden + h];
    }
    d->b13 = upload(b13.data(), b13.size() * sizeof(float), "b13");
    d->b2 = upload(b2.data(), b2.size() * sizeof(float), "b2");
  }
  d->bytes = d->w13_frag.bytes() + d->w13_frag_scales.bytes() + d->w2_frag.bytes() + d->w2_frag_scales.bytes() +
             d->b13.bytes() + d->b2.bytes() + 4 * EL * sizeof(float);
  return d;
}

}  // namespace fp4moe::gpu
