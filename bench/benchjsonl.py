"""Reading `fp4moe bench` .jsonl files (bench/plot.py, bench/bars.py): a file holds runs, each a
"run" header object, then its "row" objects, one JSON object per line."""
import json
import sys


def read(path):
    """(headers by run name (the first header of each run), rows in file order); exits on bad JSON."""
    headers, rows = {}, []
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
                headers.setdefault(obj["run"], obj)
            elif obj.get("type") == "row":
                rows.append(obj)
    return headers, rows


def point(r):
    """A row's point: (model, format, mode, T, bias); runs of other trees or days are compared by it."""
    return (r["model"], r["format"], r["mode"], r["tokens"], bool(r.get("bias")))


def backend_split(r):
    """(backend, path): a row's backend may carry the path it took in parentheses ("dynamic (bf16 copy)");
    path is "" without one."""
    name, _, path = r["backend"].partition(" (")
    return name, path[:-1] if path else ""
