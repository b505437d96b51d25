#!/usr/bin/env bash
# session 12 fourth call (untracked; deleted after)
gunzip -f .carry/main/fp4moe.gz; chmod +x .carry/main/fp4moe
mkdir -p $OUT/t
OUT=$OUT/t timeout 280 bash scripts/device_run.sh --no-tests --bin .carry/main --step-timeout 270 \
  --bench "--model all --tokens 128,256,512,1024 --mode a4 --backend dynamic --iters 10 --warmup 3 --seed 15" 2>&1 | tail -3
