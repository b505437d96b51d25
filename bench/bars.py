#!/usr/bin/env python3
"""Set `fp4moe bench` rows against an issue's bars and write the table as Markdown.

    python3 bench/bars.py prefill A.jsonl [B.jsonl ...] -o table.md [--title T] [--note LINE ...]
    python3 bench/bars.py decode  A.jsonl [B.jsonl ...] -o table.md [--jsonl-out rows.jsonl]

Every row of every run in the files is read; a point (model, format, mode, T, bias) measured in
several files takes the row of the *last* file that has it, so a later run overrides an earlier one
point by point. Each row says which file it came from. With --same-path, a later row overrides only
a row of the same backend and path ("dynamic" does not replace "dynamic (bf16 copy)"): for a later
run made with other runner options (e.g. no bf16-copy budget) that should update only the points
where both runs took the same path.

Bars (the issues' texts), each in three parts:
  prefill (#5)  T >= 2048: efficiency >= 0.70 for a4 and a16, >= 0.55 for a8; T <= 1024: >= 0.6;
                faster than the cuBLAS bf16 peer of the same run; and faster than the peers of the
                same tensor-core precision measured on this H200 (bench/protocol_peers.json, from
                bench-protocol.md: torch bf16 and triton_kernels MXFP4 for a4 and a16, torch fp8 and
                vLLM fp8 for a8), at the (model, T) points that list them.
  decode (#4)   floor >= 40 us: efficiency >= 0.75; below: time <= floor + 10 us; faster than the
                peer of the same run; and faster than every peer in bench/protocol_peers.json at that
                point ("in decode, where bytes decide, every mode must beat every peer").
A row without a same-run peer time says so and does not meet the whole bar (it cannot be shown
faster); a point the protocol lists no figure for has no protocol condition.
"""
import argparse
import json
import os
import sys

import benchjsonl
from collections import Counter

MODELS = ["qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b", "llama4-scout", "mixtral-8x7b"]
MODES = ["a4", "a16", "a8"]


def protocol_peers(kind, r, table):
    """(name, µs) of the protocol's peers that row r must beat: every one in decode, those of the
    mode's tensor-core precision in prefill (a8: fp8; a4, a16: bf16)."""
    figures = table["us"].get(r["model"], {}).get(str(r["tokens"]), {})
    want = "fp8" if r["mode"] == "a8" else "bf16"
    return [(n, us) for n, us in figures.items() if kind == "decode" or table["math"][n] == want]


def read_rows(path):
    """The rows of every run in the file that have an efficiency."""
    return [r for r in benchjsonl.read(path)[1] if r.get("status", "ok") == "ok" and r.get("efficiency") is not None]


def bar(kind, r):
    """(met, the bar in words) for row r."""
    t, eff = r["tokens"], r["efficiency"]
    if kind == "prefill":
        need = 0.6 if t <= 1024 else (0.55 if r["mode"] == "a8" else 0.70)
        return eff >= need, f"≥ {need:.2f}"
    if r["floor_us"] >= 40:
        return eff >= 0.75, "≥ 0.75"
    return r["time_us"] <= r["floor_us"] + 10, f"≤ {r['floor_us'] + 10:.1f} µs"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["prefill", "decode"])
    ap.add_argument("jsonl", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--title", default=None)
    ap.add_argument("--note", action="append", default=[], help="a line of text under the title (repeatable)")
    ap.add_argument("--jsonl-out", help="also write the chosen rows as one run (for bench/plot.py)")
    ap.add_argument("--same-path", action="store_true",
                    help="a later row overrides an earlier one only where both took the same backend and path")
    args = ap.parse_args()

    chosen = {}
    for i, path in enumerate(args.jsonl):
        for r in read_rows(path):
            key = benchjsonl.point(r)
            if args.same_path and key in chosen and chosen[key][0]["backend"] != r["backend"]:
                continue
            chosen[key] = (r, i)
    if not chosen:
        sys.exit("no rows with an efficiency in " + ", ".join(args.jsonl))

    def order(key):
        m, fmt, mode, t, bias = key
        return (MODELS.index(m) if m in MODELS else len(MODELS), m, fmt, MODES.index(mode) if mode in MODES else 9,
                bias, t)

    lines = [f"# {args.title or 'fp4moe bench against the ' + args.kind + ' bars'}", ""]
    lines += [*args.note, ""] if args.note else []
    lines.append("Sources (a point measured in several takes the last):")
    for i, path in enumerate(args.jsonl):
        lines.append(f"- [{i + 1}] `{path}`")
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol_peers.json")) as f:
        ptable = json.load(f)
    lines += ["", "Columns: *efficiency* against *bar*; *run peer*: the fastest peer of the same run; *protocol peer*:",
              "the fastest of the peers measured on this H200 that the row must beat (bench/protocol_peers.json);",
              "*met*: all three parts of the bar.", ""]
    lines += ["| model | format | mode | T | backend | time µs | floor µs | efficiency | bar | run peer µs | vs run peer | "
              "protocol peer µs | vs protocol | met | src |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    eff_met, all_met = Counter(), Counter()
    vs_by_t, vsp_by_t = Counter(), Counter()
    for key in sorted(chosen, key=order):
        r, src = chosen[key]
        ok, need = bar(args.kind, r)
        peers = r.get("peers") or {}
        peer = min(peers.values()) if peers else None
        vs = "—" if peer is None else ("faster" if r["time_us"] < peer else "slower")
        pp = protocol_peers(args.kind, r, ptable)
        best = min(pp, key=lambda x: x[1]) if pp else None
        vsp = "—" if best is None else ("faster" if r["time_us"] < best[1] else "slower")
        whole = ok and vs == "faster" and vsp != "slower"
        eff_met[ok] += 1
        all_met[whole] += 1
        vs_by_t[(r["tokens"], vs)] += 1
        vsp_by_t[(r["tokens"], vsp)] += 1
        mode = r["mode"] + (" +bias" if r.get("bias") else "")
        lines.append(f"| {r['model']} | {r['format']} | {mode} | {r['tokens']} | {r['backend']} | {r['time_us']:.1f} | "
                     f"{r['floor_us']:.1f} | {100 * r['efficiency']:.1f} % | {need} | "
                     f"{'—' if peer is None else f'{peer:.1f}'} | {vs} | "
                     f"{'—' if best is None else f'{best[1]:g} ({best[0]})'} | {vsp} | {'yes' if whole else 'no'} | {src + 1} |")
    total = eff_met[True] + eff_met[False]
    lines += ["", f"Rows: {total}. Efficiency bar met: {eff_met[True]}. Whole bar met (efficiency, the run's peer, "
              f"the protocol's peers): {all_met[True]}.", "",
              "By T: faster / slower / no figure, against the run's peer; then against the protocol's peers:"]
    for t in sorted({k[0] for k in vs_by_t}):
        lines.append(f"- T = {t}: run peer {vs_by_t[(t, 'faster')]} / {vs_by_t[(t, 'slower')]} / {vs_by_t[(t, '—')]}; "
                     f"protocol {vsp_by_t[(t, 'faster')]} / {vsp_by_t[(t, 'slower')]} / {vsp_by_t[(t, '—')]}")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    if args.jsonl_out:
        run = "table"
        with open(args.jsonl_out, "w") as f:
            f.write(json.dumps({"type": "run", "run": run, "command": "bench/bars.py " + " ".join(sys.argv[1:])}) + "\n")
            for key in sorted(chosen, key=order):
                f.write(json.dumps({**chosen[key][0], "run": run}) + "\n")
    print(f"wrote {args.out}: {total} rows, {eff_met[True]} meet the efficiency bar, {all_met[True]} the whole bar")


if __name__ == "__main__":
    main()
