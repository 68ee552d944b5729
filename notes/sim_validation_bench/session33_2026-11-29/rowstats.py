"""Every collective row over FA-FJ under session 32's model (its rescorings /tmp/s32/built_F?.json, FJ's own run):
misses, mean error, spread over the runs, range; the top 40 by misses and |mean| (session 33)."""
import json, statistics, sys
from collections import defaultdict
runs = "FA FB FC FD FE FF FG FH FI".split()
files = {r: f"/tmp/s32/built_{r}.json" for r in runs}
files["FJ"] = "/tmp/FJ/runFJ.json"
d = defaultdict(list)
for r, f in files.items():
    rep = json.load(open(f))
    for x in rep["rows"]:
        for c in x["collectives"]:
            if c["n"] >= x["steady_steps"]:
                d[(x["W"], x["plan"], x["mode"], c["marker"], c["comms"])].append(c["error"])
out = []
for k, v in d.items():
    m = statistics.fmean(v); s = statistics.pstdev(v); miss = sum(abs(e) > .25 for e in v)
    out.append((miss, abs(m), k, m, s, min(v), max(v), len(v)))
out.sort(reverse=True)
for miss, am, k, m, s, lo, hi, n in out[:40]:
    print(f"{miss:2d} W{k[0]} {k[1]:<6} {k[2]:<9} {k[3]:<24} {str(k[4]):<10} mean {m:+6.1%} sd {s:5.1%} [{lo:+.1%},{hi:+.1%}] n={n}")
print(len(d), "rows")
