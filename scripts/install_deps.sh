#!/usr/bin/env bash
# Installs what building fp4moe needs on a Debian/Ubuntu machine, skipping what is already there:
# ninja, GoogleTest, ccache (Debian), CMake >= 3.28 (PyPI; Debian 12's 3.25 does not know nvcc 13's
# C++20). The CUDA 13 toolkit (nvcc) must already be installed: it is not in Debian's archive.
set -euo pipefail
need_apt=()
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v ccache >/dev/null || need_apt+=(ccache)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
command -v python3 >/dev/null || need_apt+=(python3 python3-pip)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${need_apt[@]}"
fi
cmake_ok() { command -v cmake >/dev/null && python3 - "$(cmake --version | head -1 | awk '{print $3}')" <<'PY'
import sys
v = tuple(int(x) for x in sys.argv[1].split('.')[:2])
sys.exit(0 if v >= (3, 28) else 1)
PY
}
if ! cmake_ok; then
  python3 -m pip install -q "cmake>=3.28,<4.2"
  hash -r
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
command -v nvcc >/dev/null || { echo "install_deps: nvcc (CUDA 13 toolkit) not found; install it from NVIDIA first" >&2; exit 1; }
