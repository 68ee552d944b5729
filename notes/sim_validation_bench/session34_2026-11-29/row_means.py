"""W = 2, 3 TWRW's rows reached by the live company, per run: the committed model (session 33's
rescorings /tmp/s33/built_F?.json, FL's own run), the company gated to larger groups for every kind
(all_gated_*) and for the all-reduce only (t23_gatear_*, the rule built) (session 34)."""
import json, statistics as s
runs = "FA FB FC FD FE FF FG FH FI FJ FK FL".split()
def base(r): return "/tmp/FL/runFL.json" if r == "FL" else f"/tmp/s33/built_{r}.json"
def err(f, key):
    for x in json.load(open(f))["rows"]:
        if (x["W"], x["plan"], x["mode"]) == key[:3]:
            for c in x["collectives"]:
                if c["marker"] == key[3]:
                    return c["error"]
keys = [(w, "twrw", m, k) for w in (2, 3) for m in ("pipelined", "plain") for k in ("output_dist_intra", "output_dist_intra_bwd")]
for key in keys:
    for name, f in (("session 33", base), ("gated, all kinds", lambda r: f"/tmp/s34/all_gated_{r}.json"),
                    ("gated, all-reduce (built)", lambda r: f"/tmp/s34/t23_gatear_{r}.json")):
        e = [err(f(r), key) for r in runs]
        print(f"W{key[0]} {key[2]:<9} {key[3]:<22} {name:<26} mean {s.fmean(e):+6.1%} misses {sum(abs(x) > .25 for x in e)}  "
              + " ".join(f"{100 * x:+.0f}" for x in e))
