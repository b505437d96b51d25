#!/usr/bin/env bash
# Installs what is needed, builds, and runs every test through ctest. GPU tests report SKIPPED
# (with the reason) on a machine without a GPU; on the H200 they run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install_deps.sh
export PATH=/usr/local/cuda/bin:$PATH
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
