#!/usr/bin/env python3
"""Plot efficiency (floor / measured time) against tokens from an `fp4moe bench` .jsonl file.

    python3 bench/plot.py bench/results/<run>.jsonl [-o out.png] [--run NAME]

One line per model (and per format/mode, and per backend, when the run holds several: a run with
`--backend a,b` draws each backend with its own line style), x = tokens on a log2 axis,
y = efficiency (1.0 is the physical limit of bench-protocol.md). Rows without an efficiency (CPU
runs, unsupported points) are skipped; when nothing is left the script says so and exits 1.
A .jsonl may hold several runs (appended); by default the last run in the file is plotted.
"""
import argparse
import json
import sys
from collections import defaultdict


def load(path, run=None):
    header, rows = {}, []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON ({e})")
            if obj.get("type") == "run":
                header.setdefault(obj["run"], obj)
            elif obj.get("type") == "row":
                rows.append(obj)
    if not rows:
        sys.exit(f"{path}: no rows")
    if run is None:
        run = rows[-1]["run"]
    rows = [r for r in rows if r["run"] == run]
    if not rows:
        sys.exit(f"{path}: no rows of run '{run}'")
    return header.get(run, {}), rows, run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl")
    ap.add_argument("-o", "--out", help="PNG path (default: the .jsonl path with .png)")
    ap.add_argument("--run", help="which run of the file (default: the last)")
    args = ap.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    header, rows, run = load(args.jsonl, args.run)
    variants = {(r["format"], r["mode"]) for r in rows}
    # Forced backends are compared on the same points; kAuto rows (whatever backend each point ran)
    # stay one line per model.
    forced = len({r["backend"] for r in rows}) > 1 and "--backend" in header.get("command", "")
    backends = sorted({r["backend"] for r in rows}) if forced else []
    series = defaultdict(list)
    for r in rows:
        if r.get("efficiency") is None:
            continue
        label = r["model"] if len(variants) == 1 else f'{r["model"]} {r["format"]}-{r["mode"]}'
        if forced:
            label += f' [{r["backend"]}]'
        series[label].append((r["tokens"], r["efficiency"]))
    if not series:
        sys.exit(f"{args.jsonl}: run '{run}' has no efficiency figures (a CPU run, or every point unsupported)")

    fig, ax = plt.subplots(figsize=(9, 5.5))
    styles = ["-", "--", ":", "-."]
    colours = {}
    for label in sorted(series):
        pts = sorted(series[label])
        base = label.split(" [")[0]
        colours.setdefault(base, f"C{len(colours) % 10}")
        style = styles[backends.index(label.split(" [")[1][:-1]) % len(styles)] if forced else "-"
        ax.plot([t for t, _ in pts], [100 * e for _, e in pts], marker="o", label=label, color=colours[base],
                linestyle=style)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens")
    ax.set_ylabel("efficiency = floor / time (%)")
    top = max(100 * e for pts in series.values() for _, e in pts)
    ax.set_ylim(0, max(105, 1.1 * top))  # the 100 % line (the physical limit) stays in view
    ax.axhline(100, color="grey", linewidth=0.8, linestyle="--")
    ax.grid(True, which="both", alpha=0.3)
    title = f"fp4moe {run}"
    if header:
        title += f' — {header.get("gpu", "")}, commit {header.get("commit", "")}'
    ax.set_title(title, fontsize=10)
    if header.get("read_tbs"):
        g = header.get("gemm_tflops") or {}
        ax.text(0.01, 0.01, f'floors: read {header["read_tbs"]:.2f} TB/s, bf16 {g.get("bf16", 0):.0f} / fp8 '
                f'{g.get("fp8", 0):.0f} TFLOP/s', transform=ax.transAxes, fontsize=8, color="grey")
    ax.legend(fontsize=8)
    out = args.out or (args.jsonl[:-6] if args.jsonl.endswith(".jsonl") else args.jsonl) + ".png"
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
