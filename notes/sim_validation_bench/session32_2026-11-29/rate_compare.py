"""Two rescorings of the same kept runs side by side (``sim_validation.py --rescore DIR --json F``):
per run the rows within +-25 % (the model and the free core tier), the steps within 15 %, each row
that crosses the line, and the mean error by (W, marker) where it moved.
Usage: python rate_compare.py BASE_PATTERN NEW_PATTERN [FA,FB,...]  (patterns with {} for the run;
session 31: the weighted sum against rates over FA-FI, rate_compare.txt)."""
import json, sys, statistics
from pathlib import Path
from collections import defaultdict
GOAL = 0.25
def steady(row):
    return [c for c in row["collectives"] if c["n"] >= row["steady_steps"]]
def load(p):
    return json.loads(Path(p).read_text())
base_pat, new_pat = sys.argv[1], sys.argv[2]
runs = sys.argv[3].split(",") if len(sys.argv) > 3 else ["FA","FB","FC","FD","FE","FF","FG","FH","FI"]
tot = defaultdict(int)
grp = defaultdict(lambda: defaultdict(list))
for r in runs:
    try:
        a, b = load(base_pat.format(r)), load(new_pat.format(r))
    except FileNotFoundError as e:
        print(r, "missing", e.filename); continue
    line = [r]
    for tier in ("rows", "free_core_rows"):
        for tag, rep in (("base", a), ("new", b)):
            rows = rep[tier]
            n = sum(abs(c["error"]) <= GOAL for x in rows for c in steady(x))
            tot[(tier, tag)] += n
            line.append(f"{tier[:4]} {tag} {n}")
    steps = [sum(bool(x["step_ok"]) for x in rep["rows"]) for rep in (a, b)]
    print("  ".join(line), " steps", steps)
    amap = {(x["W"], x["plan"], x["mode"], c["marker"], c["comms"]): c["error"] for x in a["rows"] for c in steady(x)}
    for x in b["rows"]:
        for c in steady(x):
            k = (x["W"], x["plan"], x["mode"], c["marker"], c["comms"])
            old = amap.get(k)
            if old is None: continue
            grp[(x["W"], c["marker"])][r].append((old, c["error"]))
            if (abs(old) <= GOAL) != (abs(c["error"]) <= GOAL):
                print(f"    {'GAIN' if abs(c['error'])<=GOAL else 'LOSS'} W{k[0]} {k[1]} {k[2]} {k[3]}: {old:+.1%} -> {c['error']:+.1%}")
print("totals", dict(tot))
print("mean error by (W, marker) over runs: base -> new (moved rows)")
for k in sorted(grp):
    pairs = [p for v in grp[k].values() for p in v]
    o = statistics.fmean(p[0] for p in pairs); n = statistics.fmean(p[1] for p in pairs)
    if abs(o - n) > 0.005:
        print(f"  W{k[0]} {k[1]:<24} {o:+.1%} -> {n:+.1%}  (n={len(pairs)})")
