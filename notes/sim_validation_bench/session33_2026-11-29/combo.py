"""Rows within +-25 % per run: session 32's model (its rescorings, FJ and FK their own runs), its free core tier,
the ordered return lags (session 32's ordered_over_few rescorings, /tmp/s32/ol_F?.json; FK /tmp/s33/ol_FK.json) and
both (that rescoring's free core tier); session 33."""
import json, sys
runs = "FA FB FC FD FE FF FG FH FI FJ FK".split()
base = lambda r: {"FJ": "/tmp/FJ/runFJ.json", "FK": "/tmp/FK/runFK.json"}.get(r, f"/tmp/s32/built_{r}.json")
ol = lambda r: "/tmp/s33/ol_FK.json" if r == "FK" else f"/tmp/s32/ol_{r}.json"
G = .25
def cnt(rep, tier):
    return sum(abs(c["error"]) <= G for x in rep[tier] for c in x["collectives"] if c["n"] >= x["steady_steps"])
def steps(rep, tier):
    return sum(abs(x["step_mean_error"]) <= .15 for x in rep[tier])
tot = [0]*4
for r in runs:
    try:
        a, b = json.load(open(base(r))), json.load(open(ol(r)))
    except FileNotFoundError as e:
        print(r, "missing", e.filename); continue
    v = [cnt(a, "rows"), cnt(a, "free_core_rows"), cnt(b, "rows"), cnt(b, "free_core_rows")]
    s = [steps(a, "rows"), steps(a, "free_core_rows"), steps(b, "rows"), steps(b, "free_core_rows")]
    tot = [t + x for t, x in zip(tot, v)]
    print(r, "model / free core / ordered / ordered+free:", v, "steps", s)
print("total", tot)
