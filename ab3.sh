#!/usr/bin/env bash
# session 12 third call (untracked; deleted after)
for f in .carry/*/*.gz; do gunzip -f "$f"; done
chmod +x .carry/*/fp4moe*
O=$OUT; W=$(mktemp -d)
OUT=$W/ab timeout 330 bash scripts/device_ab.sh --tests new base new -- --step-timeout 100 \
  --bench "--model qwen3-30b-a3b,gpt-oss-120b,mixtral-8x7b --tokens 128,512 --mode a4,a16 --backend dynamic --iters 10 --warmup 3 --no-peer --seed 13" 2>&1 | tail -25
T=new; grep -q "PASSED  \] 10[0-9] tests" $W/ab/gpu-new.log || T=base
echo "table tree: $T"
OUT=$W/table timeout 245 bash scripts/device_run.sh --no-tests --bin .carry/$T --step-timeout 240 \
  --bench "--model all --tokens 128,256,512,1024 --mode a4 --backend dynamic --iters 10 --warmup 3 --seed 15" 2>&1 | tail -4
tar czf $O/all.tgz -C $W .
