#!/usr/bin/env python3
"""Backends forced on the same points, side by side: the table a dispatcher's cutover is read from.

    python3 bench/sweep.py SWEEP.jsonl [MORE.jsonl ...] [-o out.md]

Rows are points (model, mode, T); columns the median time (µs) of each backend found in the files, the
routes per touched expert (T·K over min(E, T·K), from the row's E and K), the fastest
backend and the floor where the run had one. A point's last row per backend is taken.

    python3 bench/sweep.py SWEEP.jsonl --line direct_micro,dynamic

adds what a routes line costs (kAuto's form in src/host/gpu_runner.cpp: the first backend while
T·K <= L routes, the second above): for each L in 0, 1, 2, 4, 8, 16, 32, 64, the points it gives
the slower backend, their mean and largest excess over the faster one, and the mean over all
points that have both backends (the line to pick is the lowest mean; name the misses where the
line is written).

    python3 bench/sweep.py SWEEP.jsonl --line direct_micro,dynamic --rule "T == 2 and K == 2"

adds the same costs for rules of any form (repeatable): a Python expression of T, K, E, routes
(T·K), model and mode, true where the first backend is taken. Session 32's line was read this way.
"""
import argparse
import sys

import benchjsonl


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--out")
    ap.add_argument("--line", metavar="LOW,HIGH",
                    help="two backends: the cost of each routes line (LOW while T·K <= L, HIGH above)")
    ap.add_argument("--rule", action="append", default=[], metavar="EXPR",
                    help="with --line: the cost of taking LOW where EXPR (of T, K, E, routes, model, mode) holds")
    a = ap.parse_args()
    if a.rule and not a.line:
        ap.error("--rule needs --line LOW,HIGH")
    cells, floors, per_expert, shape_of, backends = {}, {}, {}, {}, []
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
            if k:
                shape_of[key] = {"T": r["tokens"], "K": k, "E": e, "routes": r["tokens"] * k, "model": r["model"],
                                 "mode": r["mode"]}
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
    if a.line:
        rules = [(str(n), lambda k, n=n: shape_of[k]["routes"] <= n) for n in (0, 1, 2, 4, 8, 16, 32, 64)]
        for expr in a.rule:
            code = compile(expr, "--rule", "eval")
            rules.append((f"`{expr}`", lambda k, c=code: bool(eval(c, {"__builtins__": {}}, dict(shape_of[k])))))
        lines += line_costs(a.line, keys, cells, shape_of, rules)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


def line_costs(spec, keys, cells, shape_of, rules):
    """The table of --line: per rule (a routes line L, or a --rule), the points it gives the slower backend."""
    low, high = spec.split(",")
    both = [k for k in keys if (k, low) in cells and (k, high) in cells and k in shape_of]
    if not both:
        sys.exit(f"sweep.py: no point has both {low} and {high} and a K")
    out = ["", f"Lines: {low} while T·K <= L routes (or where a rule holds), {high} elsewhere "
           f"({len(both)} points with both):", "",
           "| L | points on the slower | mean excess there | largest (point) | mean over all points |",
           "|---|---|---|---|---|"]
    for label, takes_low in rules:
        excess = []
        for k in both:
            taken = cells[k, low] if takes_low(k) else cells[k, high]
            excess.append((taken / min(cells[k, low], cells[k, high]) - 1, k))
        missed = [(x, k) for x, k in excess if x > 0]
        worst = max(missed) if missed else None
        mean_missed = sum(x for x, _ in missed) / len(missed) if missed else 0.0
        worst_text = f"{worst[0] * 100:.1f} % ({worst[1][0]} {worst[1][1]} T = {worst[1][2]})" if worst else "—"
        out.append(f"| {label} | {len(missed)} | {mean_missed * 100:.1f} % | {worst_text} | "
                   f"{sum(x for x, _ in excess) / len(excess) * 100:.2f} % |")
    return out


if __name__ == "__main__":
    main()
