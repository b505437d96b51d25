// Diagnostics, not a test of speed (speed is judged by `fp4moe bench`): where one direct_micro
// launch spends its time, per phase, from %globaltimer stamps that every CTA writes (first CTA to
// start → the last CTA to reach each stamp). DISABLED_ so the suite skips it; run it with
//   fp4moe_gpu_tests --gtest_also_run_disabled_tests --gtest_filter='GpuDiagnostics.*'
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "gpu/gpu_util.h"
#include "host/gpu_backend.h"
#include "host/launch.h"
#include "testing/problem.h"

namespace fp4moe {
namespace {

using testgpu::DeviceArray;

TEST(GpuDiagnostics, DISABLED_DirectMicroPhases) {
  REQUIRE_GPU();
  constexpr int kStamps = gpu::kDirectMicroTraceStamps;
  const char* names[kStamps] = {"start", "setup", "phase0", "barrier1", "fc1", "barrier2", "fc2"};
  for (const char* model : {"qwen3-30b-a3b", "mixtral-8x7b"}) {
    const testkit::NamedShape* s = testkit::find_shape(model);
    ASSERT_NE(s, nullptr);
    MoeConfig c;
    c.num_experts = s->experts, c.hidden = s->hidden, c.intermediate = s->intermediate, c.top_k = s->top_k;
    c.activation = s->activation, c.swiglu = s->swiglu;
    const QuantizedCheckpoint layer = testkit::make_layer({c, 5});
    const auto w = gpu::upload_weights(c, canonicalize(c, layer.view()), 0);
    gpu::DirectMicroWorkspace ws(c, *w, 64);
    for (int64_t T : {int64_t{1}, int64_t{8}, int64_t{64}}) {
      const testkit::Inputs in = testkit::make_inputs(c, T, 77 + T);
      DeviceArray<uint16_t> x(in.x);
      DeviceArray<int32_t> ids(in.ids);
      DeviceArray<float> tw(in.topk_weights);
      DeviceArray<uint16_t> out(T * c.hidden);
      DeviceArray<unsigned long long> trace(static_cast<size_t>(ws.grid) * kStamps);
      gpu::RunArgs a{x.get(), ids.get(), IndexType::kInt32, tw.get(), out.get(), T, nullptr};
      for (int rep = 0; rep < 3; ++rep) gpu::launch_direct_micro(c, *w, ws, a);  // warm
      a.trace = trace.get();
      gpu::launch_direct_micro(c, *w, ws, a);
      GPU_CHECK(cudaDeviceSynchronize());
      const std::vector<unsigned long long> t = trace.download();
      unsigned long long t0 = ~0ull;
      for (int b = 0; b < ws.grid; ++b) t0 = std::min(t0, t[b * kStamps]);
      std::printf("%s T=%lld grid %d: last CTA at each stamp, µs after the first start (mean over CTAs)\n", model,
                  static_cast<long long>(T), ws.grid);
      for (int i = 0; i < kStamps; ++i) {
        unsigned long long mx = 0;
        double mean = 0;
        for (int b = 0; b < ws.grid; ++b) {
          mx = std::max(mx, t[b * kStamps + i] - t0);
          mean += static_cast<double>(t[b * kStamps + i] - t0);
        }
        std::printf("  %-9s %8.2f  (%8.2f)\n", names[i], mx / 1e3, mean / ws.grid / 1e3);
      }
    }
  }
}

}  // namespace
}  // namespace fp4moe
