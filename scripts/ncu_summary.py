#!/usr/bin/env python3
"""Short summaries of Nsight Compute CSV exports (used by scripts/device_run.sh on the GPU machine).

  ncu_summary.py RAW.csv SASS.csv   stall reasons of the profiled kernel (pc sampling, from the raw page),
                                    the SASS instructions with the most stall samples and each one's
                                    reasons, and the memory instructions with the most excessive shared
                                    wavefronts or global sectors against Nsight Compute's ideal (source
                                    page; session 15 found the register path's copy conflicts there)
  ncu_summary.py --times TIMES.csv  per kernel name: launches, total and mean gpu__time_duration
"""
import csv
import sys
from collections import defaultdict


def csv_rows(path):
    """The CSV rows of an ncu export; lines the profiled program printed (not starting with '"') are dropped."""
    with open(path, newline="", errors="replace") as f:
        return list(csv.reader(line for line in f if line.startswith('"')))


def number(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def stall_reasons(path):
    rows = csv_rows(path)
    if len(rows) < 3:
        print(f"{path}: no kernel rows")
        return
    header, data = rows[0], rows[2:]
    for row in data:
        name = row[header.index("Kernel Name")] if "Kernel Name" in header else "?"
        reasons = []
        for col, val in zip(header, row):
            v = number(val)
            if col.startswith("smsp__pcsamp_warps_issue_stalled_") and not col.endswith("_not_issued") and v:
                reasons.append((v, col[len("smsp__pcsamp_warps_issue_stalled_"):]))
        total = sum(v for v, _ in reasons)
        print(f"\nstall reasons (pc samples) of {name}: {int(total)} samples")
        for v, r in sorted(reasons, reverse=True)[:14]:
            print(f"  {r:28s} {100 * v / total:5.1f} %")


def source_table(path):
    """(header, body) of the source page's per-SASS-line table, or None."""
    rows = csv_rows(path)
    head = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if head is None:
        print(f"{path}: no source table")
        return None
    header = rows[head]
    return header, [r for r in rows[head + 1:] if len(r) == len(header)]


def hot_instructions(table, top=45, explain=6):
    header, body = table
    col = next((i for i, h in enumerate(header) if h.startswith("Warp Stall Sampling (All")), None)
    if col is None:
        print(f"no stall-sampling column in {header[:8]}")
        return
    src, addr = header.index("Source"), header.index("Address") if "Address" in header else 0
    execd = header.index("Instructions Executed") if "Instructions Executed" in header else None
    body = [r for r in body if number(r[col]) is not None]
    total = sum(number(r[col]) for r in body) or 1
    print(f"\nSASS lines with the most stall samples ({int(total)} samples, {len(body)} instructions):")
    hot = sorted(body, key=lambda r: -number(r[col]))[:top]
    for r in hot:
        ex = f"{number(r[execd]) or 0:>11.0f}x" if execd is not None else ""
        print(f"  {100 * number(r[col]) / total:5.1f} %  {r[addr]:>6} {ex}  {r[src][:100]}")
    reasons = [(i, h[len("stall_"):]) for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    print(f"\nstall reasons of the {explain} hottest lines (samples):")
    for r in hot[:explain]:
        parts = sorted(((number(r[i]) or 0, name) for i, name in reasons), reverse=True)
        print(f"  {r[addr]:>6} {r[src][:48]:48s} " + ", ".join(f"{n} {int(v)}" for v, n in parts[:4] if v))


def memory_excess(table, top=12):
    """Memory instructions by excessive shared wavefronts and global sectors (actual against ideal)."""
    header, body = table
    src, addr = header.index("Source"), header.index("Address") if "Address" in header else 0
    for kind, actual, ideal in (("shared wavefronts", "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal"),
                                ("global sectors", "L2 Theoretical Sectors Global", "L2 Theoretical Sectors Global Ideal")):
        if actual not in header or ideal not in header:
            continue
        a, i = header.index(actual), header.index(ideal)
        lines = [(number(r[a]) or 0, number(r[i]) or 0, r) for r in body]
        excess = sum(x - y for x, y, _ in lines if x > y)
        total = sum(x for x, _, _ in lines) or 1
        print(f"\n{kind}: {int(total)} in all, {100 * excess / total:.0f} % above the ideal; lines with the most excess:")
        for x, y, r in sorted(lines, key=lambda t: -(t[0] - t[1]))[:top]:
            if x <= y:
                break
            print(f"  {int(x - y):>11d} over ({x / y if y else float('inf'):5.1f}x ideal)  {r[addr]:>6}  {r[src][:90]}")


def kernel_times(path):
    rows = csv_rows(path)
    if not rows:
        print(f"{path}: no rows")
        return
    header = rows[0]
    kn, mv, unit = header.index("Kernel Name"), header.index("Metric Value"), header.index("Metric Unit")
    agg = defaultdict(lambda: [0, 0.0])
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "ms": 1e3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}
    for r in rows[1:]:
        v = number(r[mv])
        if v is None:
            continue
        a = agg[r[kn][:90]]
        a[0] += 1
        a[1] += v * scale.get(r[unit], 1.0)
    print(f"{'kernel':90s} {'launches':>8s} {'total us':>12s} {'mean us':>10s}")
    for name, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:90s} {n:8d} {t:12.1f} {t / n:10.1f}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--times":
        kernel_times(sys.argv[2])
    elif len(sys.argv) == 3:
        stall_reasons(sys.argv[1])
        table = source_table(sys.argv[2])  # the per-SASS-line table, read once for both summaries
        if table is not None:
            hot_instructions(table)
            memory_excess(table)
    else:
        sys.exit(__doc__)
