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
import sys

import benchjsonl
from collections import defaultdict


def load(path, run=None):
    header, rows = benchjsonl.read(path)
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
    ap.add_argument("--title", help="the figure's title (default: the run, GPU and commit of its header)")
    args = ap.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    header, rows, run = load(args.jsonl, args.run)
    # A backend's rows may carry the path it took in parentheses ("dynamic (bf16 copy)"): one line per
    # backend, the annotated points drawn hollow.
    def backend(r):
        return benchjsonl.backend_split(r)[0]
    variants = sorted({(r["format"], r["mode"]) for r in rows})
    # Forced backends are compared on the same points; kAuto rows (whatever backend each point ran)
    # stay one line per model.
    forced = len({backend(r) for r in rows}) > 1 and "--backend" in header.get("command", "")
    backends = sorted({backend(r) for r in rows}) if forced else []
    series = defaultdict(list)  # (variant, label) -> [(tokens, efficiency, annotated)]
    for r in rows:
        if r.get("efficiency") is None:
            continue
        label = r["model"] + (f' [{backend(r)}]' if forced else "")
        series[((r["format"], r["mode"]), label)].append((r["tokens"], r["efficiency"], " (" in r["backend"]))
    if not series:
        sys.exit(f"{args.jsonl}: run '{run}' has no efficiency figures (a CPU run, or every point unsupported)")

    # One panel per (format, mode) when the run holds several.
    fig, axes = plt.subplots(1, len(variants), figsize=(4.2 * len(variants) + 3, 5), sharey=True, squeeze=False)
    styles = ["-", "--", ":", "-."]
    colours = {}
    top = max(100 * e for pts in series.values() for _, e, _ in pts)
    annotations = sorted({benchjsonl.backend_split(r)[1] for r in rows} - {""})
    for ax, variant in zip(axes[0], variants):
        for (v, label) in sorted(k for k in series if k[0] == variant):
            pts = sorted(series[(v, label)])
            base = label.split(" [")[0]
            colours.setdefault(base, f"C{len(colours) % 10}")
            style = styles[backends.index(label.split(" [")[1][:-1]) % len(styles)] if forced else "-"
            ax.plot([t for t, _, _ in pts], [100 * e for _, e, _ in pts], marker="o", label=label, color=colours[base],
                    linestyle=style)
            hollow = [(t, e) for t, e, a in pts if a]
            if hollow:
                ax.plot([t for t, _ in hollow], [100 * e for _, e in hollow], marker="o", linestyle="none",
                        markerfacecolor="white", color=colours[base])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens")
        if len(variants) > 1:
            ax.set_title(f"{variant[0]}-{variant[1]}", fontsize=10)
        ax.set_ylim(0, max(105, 1.1 * top))  # the 100 % line (the physical limit) stays in view
        ax.axhline(100, color="grey", linewidth=0.8, linestyle="--")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("efficiency = floor / time (%)")
    title = args.title or f"fp4moe {run}" + (f' — {header.get("gpu", "")}, commit {header.get("commit", "")}' if header else "")
    fig.suptitle(title, fontsize=10)
    if header.get("read_tbs"):
        g = header.get("gemm_tflops") or {}
        axes[0][0].text(0.01, 0.01, f'floors: read {header["read_tbs"]:.2f} TB/s, bf16 {g.get("bf16", 0):.0f} / fp8 '
                        f'{g.get("fp8", 0):.0f} TFLOP/s', transform=axes[0][0].transAxes, fontsize=8, color="grey")
    seen = {}  # one legend entry per line label over all panels
    for ax in axes[0]:
        hs, ls = ax.get_legend_handles_labels()
        for h, l in zip(hs, ls):
            seen.setdefault(l, h)
    note = f"hollow: {', '.join(annotations)}" if annotations else None
    fig.legend(list(seen.values()), list(seen.keys()), loc="center right", fontsize=8, title=note, title_fontsize=8)
    fig.tight_layout(rect=(0, 0, 1 - 2.6 / (4.2 * len(variants) + 3), 1))
    out = args.out or (args.jsonl[:-6] if args.jsonl.endswith(".jsonl") else args.jsonl) + ".png"
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
