"""combo.py's runs row by row: rows crossing the line, session 32's model -> ordered lags + free core, and the
mean error of every row that moved over 2 points (session 33)."""
import json, statistics
from collections import defaultdict
runs = "FA FB FC FD FE FF FG FH FI FJ FK".split()
base = lambda r: {"FJ": "/tmp/FJ/runFJ.json", "FK": "/tmp/FK/runFK.json"}.get(r, f"/tmp/s32/built_{r}.json")
ol = lambda r: "/tmp/s33/ol_FK.json" if r == "FK" else f"/tmp/s32/ol_{r}.json"
G = .25
def m(rep, tier):
    return {(x["W"], x["plan"], x["mode"], c["marker"]): c["error"] for x in rep[tier] for c in x["collectives"] if c["n"] >= x["steady_steps"]}
mv = defaultdict(list)
for r in runs:
    a, b = m(json.load(open(base(r))), "rows"), m(json.load(open(ol(r))), "free_core_rows")
    for k in a:
        mv[k].append((a[k], b[k]))
        if (abs(a[k]) <= G) != (abs(b[k]) <= G):
            print(r, "GAIN" if abs(b[k]) <= G else "LOSS", k, f"{a[k]:+.1%} -> {b[k]:+.1%}")
print("mean error by row where it moved > 2 points:")
for k, v in sorted(mv.items()):
    o, n = statistics.fmean(x[0] for x in v), statistics.fmean(x[1] for x in v)
    if abs(o - n) > .02:
        print(f"  W{k[0]} {k[1]:5} {k[2]:9} {k[3]:24} {o:+.1%} -> {n:+.1%}  worst |e| {max(abs(x[0]) for x in v):.1%} -> {max(abs(x[1]) for x in v):.1%}")
