#!/usr/bin/env bash
# session 12 second call (untracked; deleted after)
for f in .carry/*/*.gz; do gunzip -f "$f"; done
chmod +x .carry/*/fp4moe*
O=$OUT; mkdir -p $O/run
timeout 120 .carry/main/fp4moe_gpu_tests --gtest_filter='GpuDynamic*' > build-device-gpu.log 2>&1; echo "gpu tests rc=$?"; tail -3 build-device-gpu.log
B="--model qwen3-30b-a3b,gpt-oss-120b,deepseek-v3,mixtral-8x7b --tokens 256,512,1024 --mode a4 --backend dynamic --iters 10 --warmup 3 --no-peer --seed 14"
OUT=$O/run timeout 440 bash scripts/device_run.sh --no-tests --bin .carry/main --step-timeout 160 \
  --bench "$B --dynamic-tile-m 32" --bench "$B --dynamic-tile-m 64" \
  --ncu "direct_micro_kernel@3::--model qwen3-30b-a3b --tokens 1 --backend direct_micro --iters 1 --no-peer" \
  --ncu "gemm_kernel::--model qwen3-30b-a3b --tokens 128 --backend dynamic --iters 1 --no-peer" \
  --ncu-times "--model qwen3-30b-a3b --tokens 128 --backend dynamic --iters 3 --warmup 1 --no-peer" 2>&1 | tail -15
cp build-device-gpu.log $O/run/
grep -h "dynamic" build-device/logs/bench-*-gpu.md 2>/dev/null | head -40
