#!/usr/bin/env bash
# On the GPU machine, in one call: configure, build with all cores, run every test (CPU and GPU),
# then `fp4moe check` and `fp4moe bench` as asked, and print a short summary table last.
#   scripts/device_run.sh [--no-tests] [--filter GTEST_FILTER] [--sanitize] [--diag] [--bin DIR]
#                         [--stop-on-fail] [--check "ARGS"]... [--bench "ARGS"]... [--ncu "REGEX::ARGS"]... [--ncu-times "ARGS"]...
#                         [--plot] [--python] [--step-timeout SECONDS]
# --check and --bench may be repeated; they run in the order given, their output appended to
# check.log / bench.log (bench results go to the log directory unless ARGS name an --out-dir). --stop-on-fail skips
# the remaining checks and benches after one exits non-zero. --bin DIR: use the fp4moe already built
# in DIR (e.g. from a clean worktree of a commit) instead of building; needs --no-tests. --no-tests
# skips the CPU and GPU suites; the GPU test binary is still built for --diag and --sanitize. --plot runs bench/plot.py on every .jsonl in the log directory at the end. --python
# installs the Python package (`pip install .`, all cores) and runs its pytest suite, GPU tests included.
# --ncu "REGEX[@SKIP]::ARGS" profiles one launch of the kernels matching REGEX (e.g. direct_micro_kernel,
# gemm_kernel) inside `fp4moe bench ARGS` with Nsight Compute (--set full, after SKIP (default 3) launches of it),
# its details page, the stall reasons and the SASS lines with most stall samples (scripts/ncu_summary.py)
# into ncu-N.txt; ARGS should name one point (e.g. --tokens 1 --iters 1 --no-peer). REGEX matches the
# function's name without its template arguments ("gemm_kernel<1" profiles nothing). At a dynamic point
# with --iters 1 --warmup 0, gemm_kernel@2 is FC1 and gemm_kernel@3 FC2 (session 34).
# --ncu-times "ARGS": every kernel's duration inside `fp4moe bench ARGS`, summed by kernel name
# (ncu-times-N.txt): where the time of a multi-kernel backend goes.
# --diag runs the DISABLED_ diagnostics (GpuDiagnostics.*: direct_micro's phase trace) into diag.log.
# The GPU test binary and each check/bench/ncu step run under a timeout (rc 124: a hang, e.g. a pipeline
# wait): 300 s, or --step-timeout SECONDS (a full table of every model and mode takes ~480 s).
# Logs and bench results go to build-device/logs; when $OUT is set (the device tool) they are also
# packed into $OUT/logs.tgz on exit, including an exit by SIGTERM (wrap the call in `timeout` below
# the tool's limit so a long run still returns its logs): the tool brings back only a few files.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=build-device/logs
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"  # a caller may name a folder under the tool's $OUT that does not exist yet
  trap 'tar czf "$OUT/logs.tgz" -C "$OUTDIR" .' EXIT
  trap 'exit 143' TERM
fi
STEPS=() STOP_ON_FAIL=0 SANITIZE=0 TESTS=1 GTEST_FILTER="*" BIN="" PLOT=0 PYTHON=0 DIAG=0 STEP_TIMEOUT=300
while [ $# -gt 0 ]; do
  case "$1" in
    --no-tests) TESTS=0 ;;
    --filter) GTEST_FILTER="$2"; shift ;;
    --sanitize) SANITIZE=1 ;;
    --diag) DIAG=1 ;;
    --check) STEPS+=("check" "$2"); shift ;;
    --bench) STEPS+=("bench" "$2"); shift ;;
    --ncu) STEPS+=("ncu" "$2"); shift ;;
    --ncu-times) STEPS+=("ncu-times" "$2"); shift ;;
    --stop-on-fail) STOP_ON_FAIL=1 ;;
    --bin) BIN="$2"; shift ;;
    --plot) PLOT=1 ;;
    --python) PYTHON=1 ;;
    --step-timeout) STEP_TIMEOUT="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ "$STEP_TIMEOUT" =~ ^[1-9][0-9]*$ ]] || { echo "--step-timeout: a positive number of seconds, got '$STEP_TIMEOUT'" >&2; exit 2; }
summary=()
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,memory.total --format=csv,noheader | tee "$OUTDIR/gpu.txt"
FP4MOE=./build-device/fp4moe
if [ -n "$BIN" ]; then
  FP4MOE="$BIN/fp4moe"
  # Carried gzipped (the carry is 64 MiB; scripts/carry_build.sh): unpack here, since each device call
  # gets a fresh copy of the tree (session 33's second call lost its step to a still-packed binary).
  [ -f "$FP4MOE.gz" ] && gunzip -f "$FP4MOE.gz" && chmod +x "$FP4MOE"
  [ -x "$FP4MOE" ] || { echo "--bin: no executable $FP4MOE" >&2; exit 2; }
  [ $TESTS -eq 0 ] || { echo "--bin needs --no-tests (the tests are not prebuilt)" >&2; exit 2; }
  rc=0; summary+=("build|prebuilt $FP4MOE")
else
  # --diag and --sanitize run the GPU test binary, so they build it even with --no-tests.
  targets="$([ $TESTS -eq 1 ] && echo fp4moe_tests) $([ $((TESTS + DIAG + SANITIZE)) -gt 0 ] && echo fp4moe_gpu_tests)"
  targets+=" $([ ${#STEPS[@]} -gt 0 ] && echo fp4moe_cli)"
  rc=0
  if [ -n "${targets// /}" ]; then  # nothing to build when only --python is asked (pip builds its own)
    cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUTDIR/configure.log" 2>&1 \
      && cmake --build build-device -j16 --target $targets > "$OUTDIR/build.log" 2>&1
    rc=$?
  fi
  summary+=("build|rc=$rc|$(( $(date +%s) - t0 ))s")
  if [ $rc -ne 0 ]; then tail -40 "$OUTDIR/build.log"; printf '%s\n' "${summary[@]}"; exit 1; fi
fi

if [ $TESTS -eq 1 ]; then
  t1=$(date +%s)
  ./build-device/fp4moe_tests > "$OUTDIR/cpu_tests.log" 2>&1; rc=$?
  summary+=("cpu tests|rc=$rc|$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUTDIR/cpu_tests.log" | tr '\n' ' ')")
  timeout "$STEP_TIMEOUT" ./build-device/fp4moe_gpu_tests --gtest_filter="$GTEST_FILTER" > "$OUTDIR/gpu_tests.log" 2>&1; rc=$?
  grep -E "FAILED|Failure|error" "$OUTDIR/gpu_tests.log" | head -40
  summary+=("gpu tests|rc=$rc|$(( $(date +%s) - t1 ))s|$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUTDIR/gpu_tests.log" | tr '\n' ' ')")
fi
if [ $DIAG -eq 1 ]; then
  timeout 120 ./build-device/fp4moe_gpu_tests --gtest_also_run_disabled_tests --gtest_filter='GpuDiagnostics.*' \
    > "$OUTDIR/diag.log" 2>&1
  summary+=("diagnostics|rc=$?")
fi
if [ $SANITIZE -eq 1 ]; then
  # racecheck leaves out the dynamic GEMM: under it a pipeline wait of GpuDynamicGemm took over the
  # tests' 60 s watchdog (2026-12-03, step 52 of a 3-expert case) and the next case never finished,
  # so the call lost its remaining minutes. memcheck runs it. Each tool has a time limit.
  small='GpuEdge.SingleToken*:GpuEdge.Experts512*:GpuEdge.LocalExpertRange:All/GpuMatrix.MatchesReference/nvfp4_a4_silu_bias:All/GpuMatrix.MatchesReference/mxfp4_a8_relu2'
  for tool in memcheck racecheck; do
    filter=$small
    [ $tool = memcheck ] && filter+=':GpuDynamicGemm.*'
    timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 ./build-device/fp4moe_gpu_tests \
      --gtest_filter="$filter" > "$OUTDIR/sanitize_$tool.log" 2>&1
    rc=$?; summary+=("sanitizer $tool|rc=$rc|$(grep -E 'ERROR SUMMARY' "$OUTDIR/sanitize_$tool.log" | tail -1)")
  done
fi
stop=0
for ((i = 0; i < ${#STEPS[@]}; i += 2)); do
  cmd=${STEPS[i]} args=${STEPS[i + 1]}
  if [ $stop -eq 1 ]; then summary+=("fp4moe $cmd $args|skipped (--stop-on-fail)"); continue; fi
  extra=""
  [ "$cmd" != check ] && [[ " $args " != *" --out-dir "* ]] && extra="--out-dir $OUTDIR"
  log="$OUTDIR/$cmd.log"; t1=$(date +%s)
  if [ "$cmd" = ncu ]; then  # REGEX::ARGS → Nsight Compute around one fp4moe bench point
    regex=${args%%::*} args=${args#*::} skip=3
    [[ "$regex" == *@* ]] && skip=${regex##*@} regex=${regex%@*}
    log="$OUTDIR/ncu-$((i / 2)).txt"
    echo "==== ncu -k regex:$regex fp4moe bench $args $extra" > "$log"
    rep="$OUTDIR/ncu-$((i / 2))"
    timeout "$STEP_TIMEOUT" ncu --clock-control none --set full -k "regex:$regex" -s $skip -c 1 -f -o "$rep" "$FP4MOE" bench $args $extra \
      --run-name ncu-$((i / 2)) > "$log.part" 2>&1; rc=$?
    if [ -f "$rep.ncu-rep" ]; then  # details page, raw metrics and per-SASS-line stall samples, then a summary
      ncu -i "$rep.ncu-rep" --page details >> "$log.part" 2>&1
      ncu -i "$rep.ncu-rep" --page raw --csv > "$rep-raw.csv" 2>&1
      ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep-sass.csv" 2>&1
      python3 scripts/ncu_summary.py "$rep-raw.csv" "$rep-sass.csv" >> "$log.part" 2>&1
      rm -f "$rep.ncu-rep"
    fi
  elif [ "$cmd" = ncu-times ]; then  # ARGS → every kernel's duration inside fp4moe bench ARGS, summed by name
    log="$OUTDIR/ncu-times-$((i / 2)).txt"
    echo "==== ncu --metrics gpu__time_duration.sum fp4moe bench $args $extra" > "$log"
    timeout "$STEP_TIMEOUT" ncu --clock-control none --metrics gpu__time_duration.sum --csv "$FP4MOE" bench $args $extra \
      --run-name ncu-times-$((i / 2)) > "$OUTDIR/ncu-times-$((i / 2)).csv" 2> "$log.part"; rc=$?
    python3 scripts/ncu_summary.py --times "$OUTDIR/ncu-times-$((i / 2)).csv" >> "$log.part" 2>&1
  else
    echo "==== fp4moe $cmd $args $extra" >> "$log"
    timeout "$STEP_TIMEOUT" "$FP4MOE" $cmd $args $extra > "$log.part" 2>&1; rc=$?
  fi
  cat "$log.part" >> "$log"
  [ "$cmd" = bench ] && grep -m1 '^ceilings' "$log.part"
  tail -4 "$log.part"; rm -f "$log.part"
  summary+=("$cmd $args|rc=$rc|$(( $(date +%s) - t1 ))s|$(tail -1 "$log")")
  [ $rc -ne 0 ] && [ $STOP_ON_FAIL -eq 1 ] && stop=1
done
if [ $PLOT -eq 1 ]; then
  for f in "$OUTDIR"/*.jsonl; do
    [ -e "$f" ] || continue
    python3 bench/plot.py "$f" >> "$OUTDIR/bench.log" 2>&1; rc=$?
    summary+=("plot $(basename "$f")|rc=$rc")
  done
fi
if [ $PYTHON -eq 1 ]; then
  t1=$(date +%s)
  # The GPU and torch files first, in their own process, so a crash elsewhere cannot hide them.
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-build-isolation . > "$OUTDIR/python.log" 2>&1
  rc=$?
  # How the extension links the C++ runtime (a private libstdc++ next to torch's broke error messages once).
  python3 -c 'import fp4moe._ext as e; print(e.__file__)' 2>/dev/null | xargs -r readelf -d 2>/dev/null \
    | grep NEEDED >> "$OUTDIR/python.log"
  if [ $rc -eq 0 ]; then
    (cd python/tests && python3 -m pytest -q -rs -p no:cacheprovider test_gpu.py test_torch.py) >> "$OUTDIR/python.log" 2>&1
    rc=$?
    summary+=("pytest gpu+torch|rc=$rc|$(tail -1 "$OUTDIR/python.log")")
    (cd python/tests && python3 -m pytest -q -rs -p no:cacheprovider --ignore=test_gpu.py --ignore=test_torch.py .) >> "$OUTDIR/python.log" 2>&1
    rc=$?
  fi
  tail -25 "$OUTDIR/python.log"
  summary+=("python|rc=$rc|$(( $(date +%s) - t1 ))s|$(tail -1 "$OUTDIR/python.log")")
fi
echo
echo "| step | result |"
echo "|---|---|"
for s in "${summary[@]}"; do echo "| ${s//|/ | } |"; done
