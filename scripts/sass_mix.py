#!/usr/bin/env python3
"""Instruction mix of the innermost MMA loops of each kernel, from the compiled SASS, without a GPU.

    python3 scripts/sass_mix.py build/CMakeFiles/fp4moe.dir/src/host/launch_direct_micro.cu.o [NAME_SUBSTRING]

For every kernel (optionally only those whose mangled name contains NAME_SUBSTRING) it finds the
innermost loops (backward branches) that contain HMMA or HGMMA instructions and prints their length,
instructions per MMA and the most frequent opcodes. The decode and prefill kernels are bound by
their dequantisation instruction streams (bench/results/NOTES.md, session 5), so instructions per
MMA is a useful local measure of a change before it reaches the H200. It counts static
instructions: a cold path inside the loop (e.g. dynamic's watchdog) is counted although it rarely
runs.

cuobjdump (and the nvdisasm it calls) come with the CUDA toolkit. Where the toolkit lacks them (as
on the 2-core development machine), the PyPI wheels provide both:
`python3 -m pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`.
"""
import collections
import glob
import os
import re
import shutil
import subprocess
import sys


def cuobjdump_path():
    """cuobjdump on PATH, else one of an installed nvidia-cuda-cuobjdump or triton wheel; None if none
    (scripts/ptxas_check.sh asks here too)."""
    path = shutil.which("cuobjdump")
    if path:
        return path
    for base in sys.path:
        for hit in glob.glob(os.path.join(base, "nvidia", "cu*", "bin", "cuobjdump")) + \
                glob.glob(os.path.join(base, "triton", "backends", "nvidia", "bin", "cuobjdump")):
            if os.access(hit, os.X_OK):
                return hit
    return None


def find_cuobjdump():
    return cuobjdump_path() or sys.exit(
        "sass_mix: no cuobjdump on PATH or in an installed nvidia-cuda-cuobjdump wheel")


def opcode(ins):
    return re.split(r"[ .]", re.sub(r"^@!?U?P[T0-9]+\s+", "", ins))[0]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    obj, want = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
    # cuobjdump can exit non-zero after printing every kernel (the host part of an object file).
    tool = find_cuobjdump()
    env = dict(os.environ, PATH=os.path.dirname(tool) + os.pathsep + os.environ.get("PATH", ""))  # its nvdisasm
    run = subprocess.run([tool, "-sass", obj], capture_output=True, text=True, env=env)
    sass = run.stdout
    if "Function : " not in sass:
        sys.exit(f"sass_mix: no kernels in {obj}: {run.stderr.strip()}")
    for func in re.split(r"\n\s+Function : ", sass)[1:]:
        name = func.split("\n")[0].strip()
        if want not in name:
            continue
        ins = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", func)
        addr = [int(a, 16) for a, _ in ins]
        index = {a: i for i, a in enumerate(addr)}
        loops = []
        for i, (_, text) in enumerate(ins):
            m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
            if not m:
                continue
            j = index.get(int(m.group(1), 16))
            if j is None or j > i:
                continue
            body = [t for _, t in ins[j:i + 1]]
            mma = sum(op in ("HMMA", "HGMMA") for op in map(opcode, body))
            if mma:
                loops.append((j, i, body, mma))
        for j, i, body, mma in sorted(loops, key=lambda l: l[1] - l[0]):
            if any(j <= a and b <= i and (a, b) != (j, i) for a, b, _, _ in loops):
                continue  # not innermost
            mix = collections.Counter(map(opcode, body)).most_common(12)
            print(f"{name[:90]}\n  loop of {len(body)} instructions, {mma} MMA: {len(body) / mma:.1f} per MMA")
            print("  " + ", ".join(f"{k} {v}" for k, v in mix))


if __name__ == "__main__":
    main()
