#!/usr/bin/env bash
# On the GPU machine, in one call: build several source trees (e.g. git worktrees of branches, carried
# to the device), each into its own build directory, then run each one's GPU tests and `fp4moe
# bench`, and print one summary table last. One call instead of one per branch: every call costs about
# a minute of device time before its command starts.
#   scripts/device_branches.sh [--filter GTEST_FILTER] [--diag] [--no-tests] [--bench "ARGS"]... NAME=DIR...
# Locally, before the device call (worktrees under wt/, which .git/info/exclude should list, carried
# with carry: ["wt"]):
#   git worktree add wt/rs next/dynamic-rs && git worktree add wt/copy next/one-weight-copy
#   device: timeout 560 bash scripts/device_branches.sh --filter 'GpuDynamic*' --bench "…" rs=wt/rs copy=wt/copy
# Logs: build-branches/<NAME>/logs (configure, build, gpu_tests, diag, bench), packed (every tree's,
# without the builds) into $OUT/branches.tgz on exit when $OUT is set (the device tool), also on
# SIGTERM. Run the script several times in one device command to give trees different tests or
# benches; each run keeps the other trees' logs.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUTDIR=build-branches  # one directory per tree, replaced when that tree is run again
mkdir -p "$OUTDIR"
if [ -n "${OUT:-}" ]; then
  trap 'tar czf "$OUT/branches.tgz" -C "$OUTDIR" --exclude="*/build" .' EXIT
  trap 'exit 143' TERM
fi
FILTER="*" DIAG=0 TESTS=1 BENCHES=() TREES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --filter) FILTER="$2"; shift ;;
    --diag) DIAG=1 ;;
    --no-tests) TESTS=0 ;;
    --bench) BENCHES+=("$2"); shift ;;
    *=*) TREES+=("$1") ;;
    *) echo "unknown argument $1 (trees are NAME=DIR)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#TREES[@]} -gt 0 ] || { echo "no NAME=DIR given" >&2; exit 2; }
for tree in "${TREES[@]}"; do
  dir=${tree#*=}
  [ -f "$dir/CMakeLists.txt" ] || { echo "$dir: no CMakeLists.txt" >&2; exit 2; }
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader 2>/dev/null || echo "no nvidia-smi here"
summary=()
targets="fp4moe_cli $([ $TESTS -eq 1 ] && echo fp4moe_gpu_tests)"
for tree in "${TREES[@]}"; do
  name=${tree%%=*} dir=$(cd "${tree#*=}" && pwd)
  b="$ROOT/$OUTDIR/$name/build" logs="$ROOT/$OUTDIR/$name/logs"
  rm -rf "$logs" && mkdir -p "$logs"
  t0=$(date +%s)
  cmake -S "$dir" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$logs/configure.log" 2>&1 \
    && cmake --build "$b" -j"$(nproc)" --target $targets > "$logs/build.log" 2>&1
  rc=$?
  summary+=("$name|build|rc=$rc|$(( $(date +%s) - t0 ))s")
  if [ $rc -ne 0 ]; then tail -20 "$logs/build.log"; continue; fi
  if [ $TESTS -eq 1 ]; then
    t0=$(date +%s)
    timeout 300 "$b/fp4moe_gpu_tests" --gtest_filter="$FILTER" > "$logs/gpu_tests.log" 2>&1
    rc=$?
    grep -E "^\[  FAILED|Failure" "$logs/gpu_tests.log" | head -20
    summary+=("$name|gpu tests|rc=$rc|$(( $(date +%s) - t0 ))s|$(grep -E '^\[  (PASSED|FAILED) ' "$logs/gpu_tests.log" | tr '\n' ' ')")
    if [ $DIAG -eq 1 ]; then
      timeout 120 "$b/fp4moe_gpu_tests" --gtest_also_run_disabled_tests --gtest_filter='GpuDiagnostics.*' \
        > "$logs/diag.log" 2>&1
      summary+=("$name|diagnostics|rc=$?")
    fi
  fi
  for args in "${BENCHES[@]}"; do
    t0=$(date +%s)
    timeout 300 "$b/fp4moe" bench $args --out-dir "$logs" --run-name "$name-bench" >> "$logs/bench.log" 2>&1
    rc=$?
    grep -E "^[|] " "$logs/bench.log" | grep -v "^| model " | sed "s/^/$name /" | tail -40
    summary+=("$name|bench $args|rc=$rc|$(( $(date +%s) - t0 ))s")
  done
done
echo
echo "| tree | step | result |"
echo "|---|---|---|"
for s in "${summary[@]}"; do echo "| ${s//|/ | } |"; done
