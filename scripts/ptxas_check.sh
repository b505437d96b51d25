#!/usr/bin/env bash
# Recompiles the wgmma kernels' translation units of a configured build directory with ptxas's
# report (-Xptxas -v) and fails if ptxas serialised any wgmma (any of its C7510-C7519 notes, e.g.
# C7513 "pipeline crosses ..." or C7511 / C7512 "insufficient register resources", the latter two
# seen in session 35 with two stage loops in one kernel: a wait after every HGMMA, which cost the
# register path up to 20 % in session 12, bench/results/NOTES.md); it also prints each unit's spill-store bytes. It fails too if the direct_micro or the
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
# ptxas can also serialise without a note (session 26: a third A-fragment set with wgmma_wait<2> gave a
# `WARPGROUP.DEPBAR.LE gsb0, 0x0` after every HGMMA of the f16 kernels and no C751x): where a cuobjdump
# is at hand (scripts/sass_mix.py's cuobjdump_path: the toolkit's, or the pip packages
# nvidia-cuda-cuobjdump or triton's), each register-path kernel's SASS must hold fewer full waits than
# half its HGMMAs (the pipelined loops: one after the loop).
cuobjdump=$(python3 -c "import sys; sys.path.insert(0, '$(dirname "$0")'); import sass_mix; print(sass_mix.cuobjdump_path() or '')")
[ -n "$cuobjdump" ] || echo "ptxas_check.sh: no cuobjdump found: the SASS wait count is skipped (pip install nvidia-cuda-cuobjdump)"
# Register-path kernels of one unit's object whose full waits reach half their HGMMAs.
serialised_sass() {
  local obj
  obj=$(find "$build" -name "$1.cu.o" | head -1)
  [ -n "$obj" ] && [ -n "$cuobjdump" ] || return 0
  "$cuobjdump" -sass "$obj" | awk '
    /Function :/ { f = $3 }
    /HGMMA/ { h[f]++ }
    /WARPGROUP\.DEPBAR\.LE gsb0, 0x0/ { z[f]++ }
    END { for (k in h) if ((k ~ /gemm_kernel|static_kernel/) && 2 * z[k] >= h[k]) print k, z[k] " full waits, " h[k] " HGMMA" }'
}
for tu in launch_dynamic_bm16 launch_dynamic_bm32 launch_dynamic_bm64 launch_dynamic_bm128 launch_dynamic_bf16 launch_static_moe_bm32 \
    launch_static_moe_bm64; do
  report "$tu"
  serial=$(grep -cE "\(C751[0-9]\)" <<< "$out")
  sass=$(serialised_sass "$tu")
  echo "$tu: serialised-wgmma notes $serial, spill-store bytes $spill${cuobjdump:+, serialised in SASS $(grep -c . <<< "$sass")}"
  [ "$serial" -eq 0 ] || { grep -E "\(C751[0-9]\)" <<< "$out" | cut -c1-160; fail=1; }
  [ -z "$sass" ] || { echo "$sass" | cut -c1-160; fail=1; }
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
