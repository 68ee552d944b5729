"""The rows outside +-25 % over the twelve runs under the built model: session 33's rescorings with
W = 2, 3 TWRW's replaced by the built rule's (session 34)."""
import json
runs = "FA FB FC FD FE FF FG FH FI FJ FK FL".split()
def base(r): return "/tmp/FL/runFL.json" if r == "FL" else f"/tmp/s33/built_{r}.json"
total = 0
for r in runs:
    rows = {}
    for f in (base(r), f"/tmp/s34/t23_gatear_{r}.json"):
        for x in json.load(open(f))["rows"]:
            for c in x["collectives"]:
                if c["n"] >= x["steady_steps"]:
                    rows[(x["W"], x["plan"], x["mode"], c["marker"])] = (c["error"], c.get("launch_error"))
    ok = sum(abs(e) <= .25 for e, _ in rows.values()); total += ok
    miss = [f"W{k[0]} {k[1]} {k[2]} {k[3]} {e:+.1%}" + (f" (launches +-{le:.1%})" if le else "")
            for k, (e, le) in sorted(rows.items()) if abs(e) > .25]
    print(f"{r}: {ok}/{len(rows)}  " + "; ".join(miss))
print("total", total)
