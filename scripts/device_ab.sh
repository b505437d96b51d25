#!/usr/bin/env bash
# On the GPU machine, in one call: GPU tests and benches of trees prebuilt by scripts/carry_build.sh
# (binaries in .carry/NAME/), then the A/B table of their bench rows (bench/compare.py, the first tree
# the base) printed last:
#   scripts/device_ab.sh [--tests NAME[:GTEST_FILTER]]... NAME [NAME...] -- [device_run.sh arguments]
# --tests runs .carry/NAME/fp4moe_gpu_tests (built with carry_build.sh --tests) under a 200 s limit
# into gpu-NAME.log, before any bench. Then, per NAME in order, scripts/device_run.sh --no-tests
# --bin .carry/NAME with the arguments after "--" (--bench, --ncu, --step-timeout, ...); its logs
# come back as $OUT/NAME/logs.tgz. Give the benches a --seed so every tree draws the same inputs.
# Wrap the call in `timeout` below the tool's limit: a TERM still packs the logs of the running tree.
# Binaries carried gzipped (.carry/NAME/*.gz: the carry is 64 MiB) are unpacked first. With $OUT set
# (the device tool, which brings back at most 8 files), the logs go to $OUT/r and are packed into
# $OUT/all.tgz at the end, the A/B table included (compare.txt).
# E.g. (device tool, carry [".carry"]):
#   timeout 580 bash scripts/device_ab.sh --tests new new main new2 -- --step-timeout 150 \
#     --bench "--model qwen3-30b-a3b --tokens 1,8,64 --backend direct_micro --iters 20 --no-peer --seed 11"
set -uo pipefail
cd "$(dirname "$0")/.."
tests=() trees=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --tests) tests+=("$2"); shift ;;
    *) trees+=("$1") ;;
  esac
  shift
done
[ $# -gt 0 ] && shift  # the "--"
# Each tree's logs and rows are kept under its name: a name given twice would overwrite its first
# run (session 20 lost one that way), so run a tree twice as two copies (cp -r .carry/a .carry/a2).
dups=$(printf '%s\n' "${trees[@]}" | sort | uniq -d)
[ -z "$dups" ] || { echo "device_ab.sh: tree named twice: $dups (copy it under a second name)" >&2; exit 2; }
for f in .carry/*/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .carry/*/fp4moe* 2>/dev/null
for t in "${trees[@]}" "${tests[@]%%:*}"; do
  [ -x ".carry/$t/fp4moe" ] || { echo "device_ab.sh: no .carry/$t/fp4moe (scripts/carry_build.sh builds it)" >&2; exit 2; }
done
out=build-device/ab
[ -n "${OUT:-}" ] && out=$OUT/r  # the tool returns a few of $OUT's files: all.tgz first, then these
mkdir -p "$out"
pack() { [ -n "${OUT:-}" ] && tar czf "$OUT/all.tgz" -C "$out" . 2>/dev/null; }
child=0
trap '[ $child -ne 0 ] && kill -TERM $child && wait $child; pack; exit 143' TERM
summary=()
for spec in "${tests[@]}"; do
  name=${spec%%:*} filter='*'
  [[ "$spec" == *:* ]] && filter=${spec#*:}
  [ -x ".carry/$name/fp4moe_gpu_tests" ] || { echo "device_ab.sh: no .carry/$name/fp4moe_gpu_tests (carry_build.sh --tests)" >&2; exit 2; }
  t0=$(date +%s)
  timeout 200 ".carry/$name/fp4moe_gpu_tests" --gtest_filter="$filter" > "$out/gpu-$name.log" 2>&1 &
  child=$!; wait $child; rc=$?; child=0
  grep -E "Failure|FAILED" "$out/gpu-$name.log" | head -20
  summary+=("gpu tests $name ($filter)|rc=$rc|$(( $(date +%s) - t0 ))s|$(grep -E '^\[  (PASSED|FAILED) ' "$out/gpu-$name.log" | tr '\n' ' ')")
done
jsonls=() benched=()
for name in "${trees[@]}"; do
  mkdir -p "$out/$name"
  echo "==== $name ($(cat ".carry/$name/commit" 2>/dev/null || echo '?'))"
  OUT="$out/$name" bash scripts/device_run.sh --no-tests --bin ".carry/$name" "$@" > "$out/$name/run.txt" 2>&1 &
  child=$!; wait $child; rc=$?; child=0
  tail -3 "$out/$name/run.txt"
  # This tree's bench rows, for the A/B (device_run.sh clears build-device/logs at its start).
  if cat build-device/logs/*.jsonl > "$out/$name.jsonl" 2>/dev/null; then
    jsonls+=("$out/$name.jsonl") benched+=("$name")
  fi
  summary+=("tree $name|rc=$rc")
done
echo
printf '%s\n' "${summary[@]}"
if [ ${#jsonls[@]} -ge 2 ]; then
  echo
  names=$(IFS=,; echo "${benched[*]}")
  python3 bench/compare.py "${jsonls[@]}" --names "$names" | tee "$out/compare.txt"
fi
pack
