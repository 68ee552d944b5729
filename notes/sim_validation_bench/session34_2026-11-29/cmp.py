"""Compare a variant's rescoring with the built model, row by row: python cmp.py TAG VARIANT"""
import json, sys, os
tag, v = sys.argv[1], sys.argv[2]
runs = "FA FB FC FD FE FF FG FH FI FJ FK FL".split()
def base(r):
    return f"/tmp/FL/runFL.json" if r == "FL" else f"/tmp/s33/built_{r}.json"
def rows(f):
    rep = json.load(open(f)); out = {}; steps = 0
    for x in rep["rows"]:
        steps += x["step_ok"]
        for c in x["collectives"]:
            if c["n"] >= x["steady_steps"]:
                out[(x["W"], x["plan"], x["mode"], c["marker"])] = c["error"]
    return out, steps
tb = tv = 0
for r in runs:
    f = f"/tmp/s34/{tag}_{v}_{r}.json"
    if not os.path.exists(f): continue
    b, sb = rows(base(r)); x, sx = rows(f)
    nb = sum(abs(b[k]) <= .25 for k in x); nx = sum(abs(e) <= .25 for e in x.values())
    tb += nb; tv += nx
    moves = [(k, b[k], x[k]) for k in x if (abs(b[k]) <= .25) != (abs(x[k]) <= .25)]
    big = [(k, b[k], x[k]) for k in x if abs(x[k] - b[k]) > 0.03]
    print(f"{r}: base {nb} {v} {nx} steps {sb}->{sx}; crossings: " + "; ".join(f"{'+' if abs(n)<=.25 else '-'} W{k[0]} {k[1]} {k[2]} {k[3]} {o:+.1%}->{n:+.1%}" for k, o, n in moves))
    if len(sys.argv) > 3:
        for k, o, n in big: print(f"     moved W{k[0]} {k[1]} {k[2]} {k[3]} {o:+.1%}->{n:+.1%}")
print("total", tb, tv)
