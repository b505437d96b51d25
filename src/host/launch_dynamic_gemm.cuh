// The register path's GEMM launch for one m-tile width BM (kernels/dynamic.cuh). Included by one
// translation unit per BM (launch_dynamic_bm{32,64,128}.cu), which instantiates it, so the three
// pairs of kernels build in parallel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "fp4moe/errors.h"
#include "host/launch.h"
#include "host/tensor_map.h"
#include "kernels/dynamic.cuh"

namespace fp4moe::gpu {

// The tensor maps of one register-path GEMM (kernels/dynamic.cuh TensorMaps) of m-tile bm: the
// activation boxes of bm rows, the weight boxes of a whole n-tile's row tiles, or of half of them for
// a gated FC1 (its gate and up rows lie apart). Host-only: may run during a stream capture.
inline kernels::dynamic::TensorMaps register_path_maps(const kernels::MoeGemmParams& p, int bm, bool fc1) {
  const int box = fc1 && p.gated ? kernels::dynamic::kRowTiles / 2 : kernels::dynamic::kRowTiles;
  return {activation_map(p, bm), weight_map(p, WeightPart::kCodes, box), weight_map(p, WeightPart::kScales, box)};
}

// Shared memory of one variant (f16: NVFP4-a4, no lookup tables), and the larger of the two (what
// the device must offer for the backend to run).
template <int BM>
size_t dynamic_gemm_smem(bool f16) {
  return f16 ? kernels::dynamic::smem_bytes<BM, true> : kernels::dynamic::smem_bytes<BM, false>;
}
template <int BM>
size_t dynamic_gemm_smem() {
  return std::max(dynamic_gemm_smem<BM>(true), dynamic_gemm_smem<BM>(false));
}

// The kernel instance of (FC1 or FC2, operand type, split): kF16 for p.f16, the NVFP4-a4 variant;
// split: the instance with the last wave's split (BM = kSplitTileM only).
template <int BM>
const void* dynamic_gemm_kernel(bool fc1, bool f16, bool split = false) {
  namespace dk = kernels::dynamic;
  if constexpr (BM == dk::kSplitTileM) {
    if (split) {
      if (fc1) return f16 ? reinterpret_cast<const void*>(dk::gemm_kernel<true, BM, true, true>)
                          : reinterpret_cast<const void*>(dk::gemm_kernel<true, BM, false, true>);
      return f16 ? reinterpret_cast<const void*>(dk::gemm_kernel<false, BM, true, true>)
                 : reinterpret_cast<const void*>(dk::gemm_kernel<false, BM, false, true>);
    }
  }
  FP4MOE_REQUIRE(!split, InvalidArgument, "split", "the last wave's split has 16-row kernels only, not ", BM);
  if (fc1) return f16 ? reinterpret_cast<const void*>(dk::gemm_kernel<true, BM, true>)
                      : reinterpret_cast<const void*>(dk::gemm_kernel<true, BM, false>);
  return f16 ? reinterpret_cast<const void*>(dk::gemm_kernel<false, BM, true>)
             : reinterpret_cast<const void*>(dk::gemm_kernel<false, BM, false>);
}

// CTAs per SM of the register path's kernels of m-tile BM and variant f16 (dynamic.cuh kCtasPerSm).
template <int BM>
int register_path_ctas_per_sm(bool f16) {
  return f16 ? kernels::dynamic::kCtasPerSm<BM, true> : kernels::dynamic::kCtasPerSm<BM, false>;
}

// A register-path kernel `k` (dynamic's gemm_kernel, static's static_kernel) of m-tile BM and
// variant f16, once per device (the caller has made it current): opts it into its shared memory
// (above 48 KB a kernel must) and checks its registers. Returns why it cannot run (empty: it can).
template <int BM>
std::string register_path_opt_in(const void* k, bool f16, const std::string& name, bool helpers = false) {
  namespace dk = kernels::dynamic;
  FP4MOE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(dynamic_gemm_smem<BM>(f16))));
  // The consumers' setmaxnreg.inc draws on the registers the CTA was launched with; had ptxas
  // given fewer than kLaunchRegs, it would wait forever. Refuse instead of hanging.
  cudaFuncAttributes attr{};
  FP4MOE_CUDA_CHECK(cudaFuncGetAttributes(&attr, k));
  const int want = helpers ? dk::kHelpLaunchRegs : f16 ? dk::kLaunchRegs<BM, true> : dk::kLaunchRegs<BM, false>;
  if (attr.numRegs != want)
    return name + " was built with " + std::to_string(attr.numRegs) +
           " registers per thread; its register hand-over assumes " + std::to_string(want);
  return {};
}

// Returns why the kernels cannot run here (empty: they can).
template <int BM>
std::string dynamic_gemm_opt_in() {
  for (const bool split : {false, true}) {
    if (split && BM != kernels::dynamic::kSplitTileM) continue;
    for (const bool fc1 : {true, false})
      for (const bool f16 : {true, false}) {
        const std::string why = register_path_opt_in<BM>(
            dynamic_gemm_kernel<BM>(fc1, f16, split), f16,
            "gemm_kernel (BM " + std::to_string(BM) + (fc1 ? ", fc1" : ", fc2") + (f16 ? ", f16" : ", bf16") +
                (split ? ", split)" : ")"),
            kernels::dynamic::kHelpOf<BM> && !split);
        if (!why.empty()) return why;
      }
  }
  return {};
}

template <int BM>
void launch_dynamic_gemm_bm(const DynamicWorkspace& ws, const kernels::MoeGemmParams& p, bool fc1, int64_t tiles,
                            int* watchdog, cudaStream_t s) {
  const int n_tiles = dynamic_n_tiles(p, fc1);
  const int64_t work = tiles * n_tiles;
  if (work == 0) return;
  // Persistent CTAs, at most as many as are resident at once (kCtasPerSm per SM) and no more than the
  // most items the call can have; all of them where the last wave's split may follow (kSplitTileM-row
  // tiles, items of at least kSplitMinItemStages stages, at most half the resident grid's items: the
  // split shares them among every CTA), and only there the kernel instance with the split's code
  // (kSplit). Session 31 (dynamic.cuh kSplitTileM): the whole resident grid launched where nothing
  // split measured +2 to +5 %. The split's plan counts in 32 bits (dynamic.cuh SplitPlan):
  // stages · CTAs < ktiles · grid² must stay below 2^31.
  namespace dk = kernels::dynamic;
  const int per_sm = register_path_ctas_per_sm<BM>(p.f16);
  const int64_t resident = int64_t{ws.sms} * per_sm;
  const int64_t ktiles = p.k_pad / dk::BK;
  dk::Split split{};
  // (Not with FC2's scatter-add, p.out_acc: only the kSplit = false instances have its code.)
  if (BM == dk::kSplitTileM && ws.split_partials.get() && !p.out_acc && ktiles >= dk::kSplitMinItemStages &&
      ktiles * resident * resident < (int64_t{1} << 31))
    split = {ws.split_partials.get<float>(), ws.split_flags.get<unsigned>()};
  const unsigned grid = static_cast<unsigned>(split.partials && 2 * work <= resident ? resident : std::min(resident, work));
  const size_t smem = dynamic_gemm_smem<BM>(p.f16);
  FP4MOE_REQUIRE(!p.f16 || (p.nvfp4 && p.block == 16), InvalidArgument, "f16",
                 "dynamic's f16 register path reads NVFP4 weights (block 16), got ", p.nvfp4 ? "NVFP4" : "MX",
                 " with block ", p.block);
  kernels::MoeGemmParams args = p;
  kernels::dynamic::TensorMaps maps = register_path_maps(p, BM, fc1);
  int n = n_tiles;
  void* argv[] = {&args, &maps, &n, &split, &watchdog};
  // A programmatic dependent of the kernel before (the gather, or FC1): the CTAs' set-up overlaps its
  // tail (gemm_kernel waits for it after start_cta).
  const unsigned threads = split.partials ? dk::kThreads : dk::kGemmThreads<BM>;  // the split's instance has no helpers
  const DependentLaunch l(dim3(grid), dim3(threads), smem, s);
  FP4MOE_CUDA_CHECK(cudaLaunchKernelExC(&l.config, dynamic_gemm_kernel<BM>(fc1, p.f16, split.partials != nullptr), argv));
}

// One translation unit's instantiations for BM.
#define FP4MOE_INSTANTIATE_DYNAMIC_GEMM(BM)                                                                      \
  template size_t dynamic_gemm_smem<BM>();                                                                      \
  template std::string dynamic_gemm_opt_in<BM>();                                                                      \
  template void launch_dynamic_gemm_bm<BM>(const DynamicWorkspace&, const kernels::MoeGemmParams&, bool, int64_t, \
                                           int*, cudaStream_t);

}  // namespace fp4moe::gpu
