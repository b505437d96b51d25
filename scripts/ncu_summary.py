#!/usr/bin/env python3
"""Short summaries of Nsight Compute CSV exports (used by scripts/device_run.sh on the GPU machine).

  ncu_summary.py RAW.csv SASS.csv   stall reasons of the profiled kernel (pc sampling, from the raw page)
                                    and the SASS instructions with the most stall samples (source page)
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


def hot_instructions(path, top=45):
    rows = csv_rows(path)
    head = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if head is None:
        print(f"{path}: no source table")
        return
    header = rows[head]
    col = next((i for i, h in enumerate(header) if h.startswith("Warp Stall Sampling (All")), None)
    if col is None:
        print(f"{path}: no stall-sampling column in {header[:8]}")
        return
    src, addr = header.index("Source"), header.index("Address") if "Address" in header else 0
    body = [r for r in rows[head + 1:] if len(r) == len(header) and number(r[col]) is not None]
    total = sum(number(r[col]) for r in body) or 1
    print(f"\nSASS lines with the most stall samples ({int(total)} samples, {len(body)} instructions):")
    for r in sorted(body, key=lambda r: -number(r[col]))[:top]:
        print(f"  {100 * number(r[col]) / total:5.1f} %  {r[addr]:>6}  {r[src][:110]}")


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
        hot_instructions(sys.argv[2])
    else:
        sys.exit(__doc__)
