#!/usr/bin/env bash
# On the GPU machine, in one call: configure, build with all cores, run every test (CPU and GPU),
# then `fp4moe check` and `fp4moe bench` as asked, and print a short summary table last.
#   scripts/device_run.sh [--tests-only] [--sanitize] [--check "ARGS"] [--bench "ARGS"]
# Logs go to $OUT (or build-device/logs) so they come back with the device tool.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-build-device/logs}
mkdir -p "$OUTDIR"
CHECK_ARGS="" BENCH_ARGS="" SANITIZE=0 TESTS=1 GTEST_FILTER="*"
while [ $# -gt 0 ]; do
  case "$1" in
    --no-tests) TESTS=0 ;;
    --filter) GTEST_FILTER="$2"; shift ;;
    --sanitize) SANITIZE=1 ;;
    --check) CHECK_ARGS="$2"; shift ;;
    --bench) BENCH_ARGS="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
summary=()
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,memory.total --format=csv,noheader | tee "$OUTDIR/gpu.txt"
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUTDIR/configure.log" 2>&1 \
  && cmake --build build-device -j16 --target fp4moe_tests fp4moe_gpu_tests \
       $([ -n "$CHECK_ARGS$BENCH_ARGS" ] && echo fp4moe_cli) > "$OUTDIR/build.log" 2>&1
rc=$?; summary+=("build|rc=$rc|$(( $(date +%s) - t0 ))s")
if [ $rc -ne 0 ]; then tail -40 "$OUTDIR/build.log"; printf '%s\n' "${summary[@]}"; exit 1; fi

if [ $TESTS -eq 1 ]; then
  t1=$(date +%s)
  ./build-device/fp4moe_tests > "$OUTDIR/cpu_tests.log" 2>&1; rc=$?
  summary+=("cpu tests|rc=$rc|$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUTDIR/cpu_tests.log" | tr '\n' ' ')")
  ./build-device/fp4moe_gpu_tests --gtest_filter="$GTEST_FILTER" > "$OUTDIR/gpu_tests.log" 2>&1; rc=$?
  grep -E "FAILED|Failure|error" "$OUTDIR/gpu_tests.log" | head -40
  summary+=("gpu tests|rc=$rc|$(( $(date +%s) - t1 ))s|$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUTDIR/gpu_tests.log" | tr '\n' ' ')")
fi
if [ $SANITIZE -eq 1 ]; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 ./build-device/fp4moe_gpu_tests \
      --gtest_filter='GpuEdge.SingleToken*:GpuEdge.Experts512*:GpuEdge.LocalExpertRange:All/GpuMatrix.MatchesReference/nvfp4_a4_silu_bias:All/GpuMatrix.MatchesReference/mxfp4_a8_relu2' \
      > "$OUTDIR/sanitize_$tool.log" 2>&1
    rc=$?; summary+=("sanitizer $tool|rc=$rc|$(grep -E 'ERROR SUMMARY' "$OUTDIR/sanitize_$tool.log" | tail -1)")
  done
fi
if [ -n "$CHECK_ARGS" ]; then
  ./build-device/fp4moe check $CHECK_ARGS > "$OUTDIR/check.log" 2>&1; rc=$?
  tail -60 "$OUTDIR/check.log"
  summary+=("fp4moe check|rc=$rc")
fi
if [ -n "$BENCH_ARGS" ]; then
  ./build-device/fp4moe bench $BENCH_ARGS --out-dir "$OUTDIR" > "$OUTDIR/bench.log" 2>&1; rc=$?
  tail -80 "$OUTDIR/bench.log"
  summary+=("fp4moe bench|rc=$rc")
fi
echo
echo "| step | result |"
echo "|---|---|"
for s in "${summary[@]}"; do echo "| ${s//|/ | } |"; done
