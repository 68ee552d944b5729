import json, sys
names = sys.argv[1].split(",")
files = sys.argv[2:]
runs = [json.load(open(f)) for f in files]
def rows(d):
    return {(r["W"], r["plan"], r["mode"]): r for r in d["rows"] if "repeats" in r}
rs = [rows(d) for d in runs]
main = rs[-1]
hdr = f"| W | plan | mode | {names[-1]} measured ms | {names[-1]} predicted ms | " + " | ".join(names) + " |"
print(hdr); print("| " + " | ".join(["---"] * (5 + len(names))) + " |")
for key in main:
    W, p, m = key
    cells = []
    for r in rs:
        e = r[key]["step_mean_error"]
        s = f"{e*100:+.1f} %".replace("-", "−")
        cells.append(f"**{s}**" if abs(e) > 0.15 else s)
    print(f"| {W} | {p} | {m} | {main[key]['measured_step_mean_ms']:.2f} | {main[key]['predicted_step_mean_ms']:.2f} | " + " | ".join(cells) + " |")
for n, r in zip(names, rs):
    errs = sorted(x["step_mean_error"] for x in r.values())
    ok = sum(abs(e) <= 0.15 for e in errs)
    coll = sum(x["collectives_within_goal"][0] for x in r.values()), sum(x["collectives_within_goal"][1] for x in r.values())
    med = errs[len(errs)//2 - 1: len(errs)//2 + 1]
    print(f"{n}: {ok}/{len(errs)} median {sum(med)/2*100:+.1f}% worst {max(errs, key=abs)*100:+.1f}% coll {coll[0]}/{coll[1]}")
