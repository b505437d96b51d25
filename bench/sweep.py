#!/usr/bin/env python3
"""Backends forced on the same points, side by side: the table a dispatcher's cutover is read from.

    python3 bench/sweep.py SWEEP.jsonl [MORE.jsonl ...] [-o out.md]

Rows are points (model, mode, T); columns the median time (µs) of each backend found in the files, the
routes per touched expert (T·K over min(E, T·K), from the row's E and K), the fastest
backend and the floor where the run had one. A point's last row per backend is taken.
"""
import argparse
import sys

import benchjsonl


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--out")
    a = ap.parse_args()
    cells, floors, per_expert, backends = {}, {}, {}, []
    for path in a.files:
        for r in benchjsonl.read(path)[1]:
            if r.get("status", "ok") != "ok" or r.get("time_us") is None:
                continue
            b = benchjsonl.backend_split(r)[0]
            if b not in backends:
                backends.append(b)
            key = (r["model"], r["mode"], r["tokens"])
            cells[key, b] = r["time_us"]
            if r.get("floor_us") is not None:
                floors[key] = r["floor_us"]
            e, k = r.get("E"), r.get("K")
            if e and k:
                routes = r["tokens"] * k
                per_expert[key] = routes / min(e, routes)
    keys = sorted({k for k, _ in cells})
    if not keys:
        sys.exit("sweep.py: no rows")
    lines = ["| model | mode | T | per expert | " + " | ".join(backends) + " | fastest | floor |",
             "|---|---|---|---|" + "---|" * len(backends) + "---|---|"]
    wins = {b: 0 for b in backends}
    for key in keys:
        times = {b: cells.get((key, b)) for b in backends}
        have = {b: t for b, t in times.items() if t is not None}
        best = min(have, key=have.get)
        wins[best] += 1
        pe, fl = per_expert.get(key), floors.get(key)
        cells_of_row = [key[0], key[1], str(key[2]), f"{pe:.3g}" if pe is not None else "?"]
        cells_of_row += [f"{times[b]:.1f}" if times[b] is not None else "—" for b in backends]
        cells_of_row += [best, f"{fl:.1f}" if fl is not None else "—"]
        lines.append("| " + " | ".join(cells_of_row) + " |")
    lines.append("")
    lines.append("Fastest: " + ", ".join(f"{b} {n}" for b, n in wins.items()) + f" of {len(keys)} points.")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
