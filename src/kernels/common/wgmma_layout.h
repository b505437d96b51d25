// Shared-memory operand layouts and matrix descriptors of Hopper's warpgroup MMA (wgmma): 16-bit
// operands, K-major, without swizzle (below; the GPU probes of tests/gpu/test_gpu_dynamic.cu check the
// descriptor fields on it) and with the 128-byte swizzle (further down; every kernel's tiles since
// session 15: the register path's activation tiles, the bf16 path's both operands, all written by
// tensor or bulk copies). Plain integer functions,
// callable on host and device, so the CPU tests (tests/cpu/test_wgmma_layout.cpp) check that what
// the producer writes and what the descriptor tells the tensor cores to read agree.
//
// PTX ISA (9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions"):
//   * 9.7.15.5.1 "Shared Memory Matrix Layout": an operand in shared memory is made of *core
//     matrices* of 8 rows × 16 bytes (8 × 8 bf16), each stored as 128 contiguous bytes, row i at
//     byte 16·i. For a K-major operand without swizzling ("interleave" mode) one wgmma k16 step
//     reads, for every 8-row group g and the two 8-wide k halves h:
//         core matrix (g, h) at  start + g·SBO + h·LBO
//     LBO ("leading dimension byte offset") = distance between the core matrices adjacent in K,
//     SBO ("stride dimension byte offset")  = distance between the core matrices adjacent in M/N.
//     (CUTLASS writes the same canonical form as Swizzle<0,4,3> o ((8,m),(T,2)):((1T,SBO),(1,LBO)).)
//   * 9.7.15.5.1.1 "Matrix Descriptor Format" (64 bits):
//         bits  0–13  start address >> 4 (shared-window address, 16-byte aligned)
//         bits 16–29  LBO >> 4
//         bits 32–45  SBO >> 4
//         bits 49–51  matrix base offset (only for the swizzled modes; 0 here)
//         bits 62–63  swizzle mode: 0 none/interleave, 1 = 128B, 2 = 64B, 3 = 32B
//
// Our tile: R rows (M or N) × 64 k (one pipeline stage), bf16. Core matrix (g, c) — 8-row group g,
// 8-wide k chunk c = k/8 — at byte (c·(R/8) + g)·128, i.e. the R/8 row groups of a k chunk are
// contiguous (2 KB for R = 128), then the next k chunk. Hence SBO = 128 and LBO = R·16, and the
// k16 step s starts at byte s·2·R·16 (+ 16 per row for a sub-tile starting at row r0, r0 % 8 = 0).
//
// Writers: element (r, k..k+7) is one 16-byte vector at kmajor_offset(R, r, k) (k % 8 == 0); a warp
// writing 32 consecutive rows of one chunk writes 512 contiguous bytes (no bank conflicts).
#pragma once

#include <cstdint>

#include "fp4moe/formats.h"  // FP4MOE_HD

namespace fp4moe::kernels::wgmma {

inline constexpr int kTileK = 64;         // k per tile (one pipeline stage), bf16
inline constexpr int kCoreBytes = 128;    // 8 rows × 16 bytes
inline constexpr uint32_t kSbo = 128;     // between core matrices adjacent in M/N (next 8 rows)

// Byte offset of bf16 element (r, k) in a K-major, no-swizzle tile of `rows` rows × 64 k.
FP4MOE_HD uint32_t kmajor_offset(int rows, int r, int k) {
  return static_cast<uint32_t>(((k >> 3) * (rows >> 3) + (r >> 3)) * kCoreBytes + (r & 7) * 16 + (k & 7) * 2);
}
// Between core matrices adjacent in K (the next 8 k) of such a tile.
FP4MOE_HD uint32_t kmajor_lbo(int rows) { return static_cast<uint32_t>(rows) * 16; }
FP4MOE_HD uint32_t tile_bytes(int rows) { return static_cast<uint32_t>(rows) * kTileK * 2; }

// The 64-bit matrix descriptor (PTX ISA "Matrix Descriptor Format"), no swizzle, base offset 0.
FP4MOE_HD uint64_t make_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32);
}

// Descriptor of the operand that one wgmma k16 step reads from a tile at shared address
// `tile_addr`: rows [r0, r0 + 64 or N) (r0 % 8 == 0), k [16·ks, 16·ks + 16).
FP4MOE_HD uint64_t operand_desc(uint32_t tile_addr, int rows, int r0, int ks) {
  return make_desc(tile_addr + kmajor_offset(rows, r0, 16 * ks), kmajor_lbo(rows), kSbo);
}

// ---- the 128-byte swizzle (K-major, bf16, 64 k per row: one swizzle atom wide) -----------------------
// PTX ISA "Shared Memory Matrix Layout", swizzling modes: a 128B-swizzled K-major tile is rows of 128
// bytes (64 bf16 k), in atoms of 8 rows = 1024 bytes; inside an atom the 16-byte chunk c of row i is
// stored at chunk c ^ i. The XOR is applied to address bits [4, 7) from bits [7, 10), so a tile must
// start 1024-byte aligned. wgmma reads a k16 step at start + 32·ks (the hardware swizzles the
// addresses it forms), 8-row groups SBO = 1024 bytes apart; LBO is unused in this mode (encoded 1).
inline constexpr uint32_t kSw128Atom = 1024;
FP4MOE_HD uint32_t sw128_offset(int r, int k) {
  return static_cast<uint32_t>((r >> 3) * kSw128Atom + (r & 7) * 128 + ((((k >> 3) ^ r) & 7) << 4) + (k & 7) * 2);
}
FP4MOE_HD uint64_t operand_desc_sw128(uint32_t tile_addr, int r0, int ks) {
  return make_desc(tile_addr + (r0 >> 3) * kSw128Atom + 32 * ks, 16, kSw128Atom) | (uint64_t{1} << 62);
}

// The fp32 accumulator of wgmma .m64nNk16 (PTX ISA "Register Fragments and Shared Memory Matrix
// Layouts", matrix D): thread t of the warpgroup (warp w = t / 32, lane l) holds N/2 floats; float i
// is at row 16·w + l/4 + 8·((i/2) % 2), column 8·(i/4) + 2·(l % 4) + i % 2.
FP4MOE_HD int acc_row(int t, int i) { return 16 * (t >> 5) + ((t & 31) >> 2) + 8 * ((i >> 1) & 1); }
FP4MOE_HD int acc_col(int t, int i) { return 8 * (i >> 2) + 2 * (t & 3) + (i & 1); }

}  // namespace fp4moe::kernels::wgmma
