#!/usr/bin/env bash
# Recompiles the wgmma kernels' translation units of a configured build directory with ptxas's
# report (-Xptxas -v) and fails if ptxas serialised any wgmma (its "C7513"/"C7515"/"C7510" notes:
# a wait after every HGMMA, which cost the register path up to 20 % in session 12, bench/results/
# NOTES.md); it also prints each unit's spill-store bytes. It fails too if the direct_micro or the
# generic unit spills at all: in session 22 a few bytes of spills in direct_micro's bf16 kG = 1
# kernel (from extra phase-0 code) cost every a16 T = 1 row 2-5 us on an H100. No GPU needed; ~30 s
# a unit uncached.
#   scripts/ptxas_check.sh [BUILD_DIR]        (default: build, relative to the current directory)
set -uo pipefail
build=$(cd "${1:-build}" 2>/dev/null && pwd) || { echo "ptxas_check.sh: no directory ${1:-build}" >&2; exit 2; }
[ -f "$build/build.ninja" ] || { echo "ptxas_check.sh: $build is not a configured Ninja build" >&2; exit 2; }
export PATH=/usr/local/cuda/bin:$PATH
fail=0
# ptxas's report of one translation unit into $out, its spill-store bytes into $spill.
report() {
  local cmd
  cmd=$(cd "$build" && ninja -t commands | grep -E "nvcc.* -c .*/$1\.cu" | tail -1)
  [ -n "$cmd" ] || { echo "ptxas_check.sh: no compile command for $1.cu in $build" >&2; exit 2; }
  out=$(cd "$build" && eval "$cmd -Xptxas -v" 2>&1)
  spill=$(grep -E "bytes spill stores" <<< "$out" | awk '{s += $5} END {print s + 0}')
}
for tu in launch_dynamic_bm32 launch_dynamic_bm64 launch_dynamic_bm128 launch_dynamic_bf16 launch_static_moe_bm32 \
    launch_static_moe_bm64; do
  report "$tu"
  serial=$(grep -cE "\(C751[035]\)" <<< "$out")
  echo "$tu: serialised-wgmma notes $serial, spill-store bytes $spill"
  [ "$serial" -eq 0 ] || { grep -E "\(C751[035]\)" <<< "$out" | cut -c1-160; fail=1; }
done
# Units whose kernels must not spill: direct_micro (above), and the generic path's small kernels,
# among them the fused routing + gather of every dynamic decode call (64 registers at 1024 threads
# spilled its MX quantisation, session 25).
for tu in launch_direct_micro launch_generic; do
  report "$tu"
  echo "$tu: spill-store bytes $spill (must be 0)"
  [ "$spill" -eq 0 ] || fail=1
done
exit $fail
