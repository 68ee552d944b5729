"""Compare two rescorings row by row over the kept runs: python cmp.py BASE_TAG VARIANT_TAG [-v]
(files /tmp/s35/TAG_RUN.json written by sweep.sh)"""
import json, os, statistics, sys
bt, vt = sys.argv[1], sys.argv[2]
runs = "FA FB FC FD FE FF FG FH FI FJ FK FL FM".split()


def rows(f):
    rep = json.load(open(f)); out = {}; steps = 0
    for x in rep["rows"]:
        steps += x["step_ok"]
        out[(x["W"], x["plan"], x["mode"], "step")] = x.get("step_error", x.get("error"))
        for c in x["collectives"]:
            if c["n"] >= x["steady_steps"]:
                out[(x["W"], x["plan"], x["mode"], c["marker"])] = c["error"]
    return out, steps


tb = tv = 0
per = {}
for r in runs:
    fb, fv = f"/tmp/s35/{bt}_{r}.json", f"/tmp/s35/{vt}_{r}.json"
    if not (os.path.exists(fb) and os.path.exists(fv)):
        continue
    (b, sb), (x, sx) = rows(fb), rows(fv)
    keys = [k for k in x if k[3] != "step"]
    nb = sum(abs(b[k]) <= .25 for k in keys); nx = sum(abs(x[k]) <= .25 for k in keys)
    tb += nb; tv += nx
    for k in x:
        per.setdefault(k, []).append((b[k], x[k]))
    moves = [(k, b[k], x[k]) for k in keys if (abs(b[k]) <= .25) != (abs(x[k]) <= .25)]
    print(f"{r}: {bt} {nb} {vt} {nx} steps {sb}->{sx}; crossings: " + "; ".join(
        f"{'+' if abs(n) <= .25 else '-'} W{k[0]} {k[1]} {k[2]} {k[3]} {o:+.1%}->{n:+.1%}" for k, o, n in moves))
print("total", tb, tv)
print("row means over the runs (base -> variant), rows that moved more than 1 point on average:")
for k, v in sorted(per.items()):
    mb, mv = statistics.fmean(a for a, _ in v), statistics.fmean(b for _, b in v)
    if abs(mv - mb) > 0.01 or "-v" in sys.argv:
        print(f"  W{k[0]} {k[1]:5} {k[2]:9} {k[3]:22} {mb:+6.1%} -> {mv:+6.1%}   range {min(b for _, b in v):+.1%}..{max(b for _, b in v):+.1%}")
