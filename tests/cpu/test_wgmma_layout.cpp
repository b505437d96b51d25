// The dynamic backend's shared-memory layout (kernels/common/wgmma_layout.h) against the PTX ISA's
// definitions, written out again here independently of the header:
//   * descriptor bits (PTX ISA "Matrix Descriptor Format"): start >> 4 in [0,14), LBO >> 4 in
//     [16,30), SBO >> 4 in [32,46), base offset [49,52), swizzle mode [62,64) (0 = none);
//   * K-major operand without swizzle (PTX ISA "Shared Memory Matrix Layout"): element (i, j) of
//     the rows × 16 operand of one wgmma k-step lives at
//         start + (i / 8)·SBO + (j / 8)·LBO + (i % 8)·16 + (j % 8)·2;
//   * accumulator fragment of wgmma .m64nNk16 (PTX ISA, "Matrix fragments for wgmma .m64nNk16", D):
//     thread t, float i ↔ row 16·(t/32) + (t%32)/4 + 8·((i/2)%2), column 8·(i/4) + 2·(t%4) + i%2.
// The producer writes element (r, k) at kmajor_offset(rows, r, k); the consumer hands operand_desc()
// to wgmma. These tests check that the two agree for every element, k-step and row block the kernel
// uses, and that the producer's copies cover each tile exactly once without bank conflicts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "kernels/common/wgmma_layout.h"

namespace fp4moe {
namespace {

namespace wg = kernels::wgmma;

// The tile shapes of kernels/dynamic.cuh (BM = BN = 128 rows × 64 k) and the other row counts the
// layout supports.
constexpr int kTileRows[] = {64, 128, 256};

struct DecodedDesc {
  uint32_t start, lbo, sbo, base_offset, swizzle, reserved;
};
DecodedDesc decode(uint64_t d) {
  DecodedDesc r;
  r.start = static_cast<uint32_t>(d & 0x3FFF) << 4;
  r.lbo = static_cast<uint32_t>((d >> 16) & 0x3FFF) << 4;
  r.sbo = static_cast<uint32_t>((d >> 32) & 0x3FFF) << 4;
  r.base_offset = static_cast<uint32_t>((d >> 49) & 0x7);
  r.swizzle = static_cast<uint32_t>(d >> 62);
  // Bits the format leaves unused: [14,16), [30,32), [46,49), [52,62).
  r.reserved = static_cast<uint32_t>(((d >> 14) & 0x3) | (((d >> 30) & 0x3) << 2) | (((d >> 46) & 0x7) << 4) |
                                     (((d >> 52) & 0x3FF) << 7));
  return r;
}

// PTX's canonical address of element (i, j) of a K-major, no-swizzle operand.
uint32_t canonical_address(const DecodedDesc& d, int i, int j) {
  return d.start + (i / 8) * d.sbo + (j / 8) * d.lbo + (i % 8) * 16 + (j % 8) * 2;
}

TEST(WgmmaLayout, OffsetIsABijectionOntoTheTileWithContiguousCoreMatrices) {
  for (int rows : kTileRows) {
    std::set<uint32_t> seen;
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < wg::kTileK; ++k) {
        const uint32_t o = wg::kmajor_offset(rows, r, k);
        ASSERT_LT(o, wg::tile_bytes(rows)) << "rows " << rows << " (" << r << ", " << k << ")";
        ASSERT_EQ(o % 2, 0u);
        ASSERT_TRUE(seen.insert(o).second) << "rows " << rows << ": (" << r << ", " << k << ") collides";
        // 8 consecutive k of a row are one 16-byte vector; the 8 rows of a core matrix are 128
        // contiguous bytes (PTX: core matrix = 8 rows × 16 bytes, contiguous).
        EXPECT_EQ(o, wg::kmajor_offset(rows, r, k & ~7) + (k & 7) * 2);
        EXPECT_EQ(o, wg::kmajor_offset(rows, r & ~7, k & ~7) + (r & 7) * 16 + (k & 7) * 2);
        EXPECT_EQ(wg::kmajor_offset(rows, r & ~7, k & ~7) % 128, 0u);
      }
    EXPECT_EQ(seen.size() * 2, wg::tile_bytes(rows));
  }
}

TEST(WgmmaLayout, DescriptorFieldsFollowThePtxFormat) {
  for (uint32_t addr : {0x0u, 0x10u, 0x400u, 0x1F3F0u, 0x37FF0u})
    for (uint32_t lbo : {16u, 128u, 1024u, 2048u, 4096u})
      for (uint32_t sbo : {16u, 128u, 1024u, 2048u}) {
        const DecodedDesc d = decode(wg::make_desc(addr, lbo, sbo));
        EXPECT_EQ(d.start, addr);
        EXPECT_EQ(d.lbo, lbo);
        EXPECT_EQ(d.sbo, sbo);
        EXPECT_EQ(d.base_offset, 0u);
        EXPECT_EQ(d.swizzle, 0u) << "no swizzle (interleave) is mode 0";
        EXPECT_EQ(d.reserved, 0u);
      }
  // Only the shared-window offset (18 bits, 16-byte units) goes into the start address field.
  EXPECT_EQ(decode(wg::make_desc(0x40000u + 0x120u, 16, 16)).start, 0x120u);
}

// What the consumer warpgroups of kernels/dynamic.cuh read (A: rows [64c, 64c + 64) of a 128-row
// tile; B: all 128 rows), k-step by k-step, is exactly what the producer wrote there.
TEST(WgmmaLayout, DescriptorsAddressEveryElementWhereTheProducerWroteIt) {
  const uint32_t tile_addr = 0x2400;  // any 16-byte-aligned shared address
  for (int rows : kTileRows)
    for (int r0 = 0; r0 < rows; r0 += 64)
      for (int n : {64, 128, 256}) {
        if (r0 + n > rows) continue;
        for (int ks = 0; ks < wg::kTileK / 16; ++ks) {
          const DecodedDesc d = decode(wg::operand_desc(tile_addr, rows, r0, ks));
          ASSERT_EQ(d.start % 16, 0u);
          for (int i = 0; i < n; ++i)
            for (int j = 0; j < 16; ++j)
              ASSERT_EQ(canonical_address(d, i, j), tile_addr + wg::kmajor_offset(rows, r0 + i, 16 * ks + j))
                  << "tile rows " << rows << ", operand rows " << r0 << "+" << i << ", k-step " << ks << ", k " << j;
        }
      }
}

TEST(WgmmaLayout, AccumulatorFragmentCoversTheTileOnce) {
  for (int n : {8, 64, 128, 256}) {
    std::vector<int> hits(64 * n, 0);
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < n / 2; ++i) {
        const int r = wg::acc_row(t, i), c = wg::acc_col(t, i);
        ASSERT_TRUE(r >= 0 && r < 64 && c >= 0 && c < n) << "t " << t << " i " << i;
        ++hits[r * n + c];
        // The PTX figure, written out: the 4 floats of each n8 block are (g, 2q), (g, 2q+1),
        // (g+8, 2q), (g+8, 2q+1) with g = lane / 4 + 16 · warp, q = lane % 4.
        const int g = (t % 32) / 4 + 16 * (t / 32), q = t % 4, blk = i / 4, e = i % 4;
        EXPECT_EQ(r, g + (e >= 2 ? 8 : 0));
        EXPECT_EQ(c, 8 * blk + 2 * q + (e & 1));
      }
    EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; })) << "N = " << n;
  }
}

// The producer's dequantised weight stores: thread t owns tile row t; for each 8-k chunk a warp
// writes 32 consecutive rows = 512 contiguous bytes.
TEST(WgmmaLayout, ProducerBStoresOfAWarpAreContiguous) {
  const int rows = 128;
  for (int warp = 0; warp < 4; ++warp)
    for (int kc = 0; kc < 8; ++kc) {
      const uint32_t first = wg::kmajor_offset(rows, 32 * warp, 8 * kc);
      EXPECT_EQ(first % 512, 0u);
      for (int l = 0; l < 32; ++l) EXPECT_EQ(wg::kmajor_offset(rows, 32 * warp + l, 8 * kc), first + 16 * l);
    }
}

// The 128B swizzle (PTX ISA swizzling modes, written out again): in an atom of 8 rows × 128 bytes the
// 16-byte chunk c of row i sits at chunk c ^ i, i.e. address bits [4, 7) ^= bits [7, 10).
TEST(WgmmaLayout, Swizzle128IsTheAddressXorOfTheRowMajorTile) {
  std::set<uint32_t> seen;
  for (int r = 0; r < 256; ++r)  // the bf16 path's activation tile
    for (int k = 0; k < wg::kTileK; ++k) {
      const uint32_t plain = r * 128 + k * 2;  // the row-major tile: 128 bytes per row
      const uint32_t swizzled = plain ^ (((plain >> 7) & 7) << 4);
      ASSERT_EQ(wg::sw128_offset(r, k), swizzled) << "(" << r << ", " << k << ")";
      ASSERT_TRUE(seen.insert(swizzled).second);
      // Rows v0.. with v0 % 8 == 0 start at byte 128·v0 and keep their pattern (the bf16 pre-pass
      // builds 16-row units at offset 0 and copies them there).
      const int v0 = r & ~15;
      ASSERT_EQ(wg::sw128_offset(r, k), 128u * v0 + wg::sw128_offset(r - v0, k));
    }
  EXPECT_EQ(seen.size() * 2, wg::tile_bytes(256));
}

TEST(WgmmaLayout, Swizzle128DescriptorStartsAtTheAtomRowAndStepsK) {
  for (uint32_t tile : {0x0u, 0x400u, 0x8000u, 0x30000u})
    for (int r0 : {0, 64})
      for (int ks = 0; ks < 4; ++ks) {
        const DecodedDesc d = decode(wg::operand_desc_sw128(tile, r0, ks));
        // Unswizzled address of the operand's element (0, 0): the hardware applies the XOR itself.
        EXPECT_EQ(d.start, tile + r0 * 128 + 32 * ks);
        EXPECT_EQ(d.sbo, 1024u) << "8-row groups are one atom apart";
        EXPECT_EQ(d.swizzle, 1u) << "mode 1 is the 128-byte swizzle";
        EXPECT_EQ(d.base_offset, 0u) << "tiles are 1024-byte aligned";
        EXPECT_EQ(d.reserved, 0u);
      }
}

}  // namespace
}  // namespace fp4moe
