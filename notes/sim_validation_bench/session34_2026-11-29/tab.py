import json, sys, glob, os, statistics
tag, variants = sys.argv[1], sys.argv[2].split()
runs = "FA FB FC FD FE FF FG FH FI FJ FK FL".split()
for v in variants:
    tot = 0; n = 0; steps = 0; nst = 0; errs = {}
    for r in runs:
        f = f"/tmp/s34/{tag}_{v}_{r}.json"
        if not os.path.exists(f): continue
        rep = json.load(open(f))
        for x in rep["rows"]:
            w, t = x["collectives_within_goal"]; tot += w; n += t
            steps += x["step_ok"]; nst += 1
            for c in x["collectives"]:
                if c["n"] >= x["steady_steps"]:
                    errs.setdefault((x["W"], x["plan"], x["mode"], c["marker"]), []).append(c["error"])
    print(f"{v:<22} rows {tot}/{n} steps {steps}/{nst}")
    for k, e in sorted(errs.items()):
        if len(sys.argv) > 3:
            print("   ", k, f"mean {statistics.fmean(e):+.1%} miss {sum(abs(x)>.25 for x in e)} [{min(e):+.1%},{max(e):+.1%}]")
