#!/usr/bin/env bash
# On the GPU machine, in one call: the issues' tables with a prebuilt `fp4moe` (scripts/carry_build.sh),
# each step under its own time limit, every step's log and rows packed into $OUT/all.tgz on exit
# (also when the call's `timeout` sends TERM), a line per step printed as it ends:
#   scripts/device_tables.sh BIN_DIR [STEP...]
# Steps, in the order given (default: decode prefill sweep):
#   decode   #4's table: every named shape, T = 1..64, a4 and a16, the cuBLAS peer (~70 s on an H100)
#   prefill  #5's table, a4 and a16, T = 128..16384 (~110 s)
#   sweep    kAuto's decode line: direct_micro and dynamic forced, T = 1..16 (~110 s)
#   bf16     prefill at T >= 2048 with a 32 GiB budget for dynamic's bf16 weight copy, taken from 512
#            routes per expert (below the default line, to see whether the copy wins anywhere; ~110 s on the H200)
# Render afterwards with bench/bars.py (decode / prefill) and bench/plot.py.
# E.g. (device tool, carry [".carry"]): timeout 570 bash scripts/device_tables.sh .carry/main decode prefill
set -u
cd "$(dirname "$0")/.."
bin=${1:?usage: scripts/device_tables.sh BIN_DIR [STEP...]}
shift
[ $# -gt 0 ] || set -- decode prefill sweep
[ -f "$bin/fp4moe.gz" ] && gunzip -f "$bin/fp4moe.gz"
B=$bin/fp4moe
R=${OUT:-build-device}/tables
mkdir -p "$R"
if [ -n "${OUT:-}" ]; then
  trap 'tar czf "$OUT/all.tgz" -C "$R" . ; ls -la "$OUT/all.tgz"' EXIT
  trap 'exit 143' TERM
fi
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$R/gpu.txt"
step() {
  local name=$1 lim=$2 t0
  shift 2
  t0=$(date +%s)
  timeout "$lim" "$B" bench "$@" --out-dir "$R/$name" --run-name "$name" > "$R/$name.log" 2>&1
  echo "$name rc=$? $(($(date +%s) - t0))s"
}
for s in "$@"; do
  case "$s" in
    decode) step decode 150 --model all --tokens 1,2,4,8,16,32,64 --mode a4,a16 --iters 20 --seed 18 ;;
    prefill) step prefill 170 --model all --tokens 128,256,512,1024,2048,4096,16384 --mode a4,a16 --iters 10 \
      --warmup 3 --seed 15 ;;
    sweep) step sweep 130 --model all --tokens 1,2,4,6,8,16 --mode a4,a16 --backend direct_micro,dynamic \
      --iters 10 --warmup 3 --no-peer --seed 18 ;;
    bf16) step bf16 150 --model all --tokens 2048,4096,16384 --mode a4,a16 --iters 10 --warmup 3 --seed 15 \
      --prefill-bf16-gib 32 --prefill-bf16-min-rows 512 ;;
    *) echo "device_tables.sh: unknown step '$s'" >&2 ;;
  esac
done
