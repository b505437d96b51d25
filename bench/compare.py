#!/usr/bin/env python3
"""Set the points of two or more `fp4moe bench` .jsonl files side by side: an A/B of source trees.

    python3 bench/compare.py BASE.jsonl NEW.jsonl [MORE.jsonl ...] [--names base,new,...] [-o out.md]

A point is (model, format, mode, T, bias, backend without its path annotation). Each file's last row
of a point is taken. Columns: the median time of each file (µs), its backend path where it differs
from the first file's, and each later file's ratio to the first (below 1: faster). Points missing
from a file show "—". The last lines give, per later file, how many common points got faster and the
median ratio. Prints Markdown; -o also writes it to a file.
"""
import argparse
import statistics

import benchjsonl


def points(path):
    """{point: row}, the last row of each point in the file."""
    out = {}
    for r in benchjsonl.read(path)[1]:
        if r.get("status", "ok") != "ok" or r.get("time_us") is None:
            continue
        key = benchjsonl.point(r) + (benchjsonl.backend_split(r)[0],)
        out[key] = r
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl", nargs="+")
    ap.add_argument("--names", help="comma-separated column names (default: the file names)")
    ap.add_argument("-o", "--out")
    args = ap.parse_args()
    if len(args.jsonl) < 2:
        ap.error("give at least two files")
    names = args.names.split(",") if args.names else [p.rsplit("/", 1)[-1].removesuffix(".jsonl") for p in args.jsonl]
    if len(names) != len(args.jsonl):
        ap.error(f"--names has {len(names)} names for {len(args.jsonl)} files")
    runs = [points(p) for p in args.jsonl]
    keys = sorted(set().union(*runs), key=lambda k: (k[0], k[1], k[2], k[4], k[5], k[3]))
    head = ["model", "format", "mode", "T", "backend"] + [f"{n} µs" for n in names] + [f"{n} / {names[0]}" for n in names[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios = [[] for _ in names[1:]]
    for k in keys:
        base = runs[0].get(k)
        cells = [k[0], k[1], k[2] + (" +bias" if k[4] else ""), str(k[3]), k[5]]
        for run in runs:
            r = run.get(k)
            if r is None:
                cells.append("—")
                continue
            path = benchjsonl.backend_split(r)[1]
            same = base is not None and base["backend"] == r["backend"]
            cells.append(f"{r['time_us']:.1f}" + ("" if same or not path else f" ({path})"))
        for i, run in enumerate(runs[1:]):
            r = run.get(k)
            if base is None or r is None:
                cells.append("—")
                continue
            q = r["time_us"] / base["time_us"]
            ratios[i].append(q)
            cells.append(f"{q:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for n, qs in zip(names[1:], ratios):
        if qs:
            lines.append(f"- {n}: faster than {names[0]} at {sum(q < 1 for q in qs)} of {len(qs)} common points, "
                         f"median ratio {statistics.median(qs):.3f} (min {min(qs):.3f}, max {max(qs):.3f})")
        else:
            lines.append(f"- {n}: no point in common with {names[0]}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
