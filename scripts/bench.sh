#!/usr/bin/env bash
# Installs what is needed, builds the `fp4moe` command and runs the main job: `fp4moe bench` on a
# named model shape (on the GPU when there is one, else on the CPU backend, which it says).
#   scripts/bench.sh [fp4moe bench arguments…]   (default: --model qwen3-30b-a3b --tokens 1,4)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install_deps.sh
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP4MOE_BUILD_TESTS=OFF > /dev/null
cmake --build build -j"$(nproc)" --target fp4moe_cli
if [ $# -eq 0 ]; then set -- --model qwen3-30b-a3b --tokens 1,4; fi
./build/fp4moe bench "$@"
