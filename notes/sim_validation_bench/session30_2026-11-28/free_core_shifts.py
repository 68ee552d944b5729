"""Per kept run rescored (``sim_validation.py --rescore DIR --json F``): the rows the goal counts
that miss +-25 % in the model and in the "busy, free core" tier, and W = 2's DDP bucket error in
both (what ``--free-core`` moves). Usage: python free_core_shifts.py FA.json FB.json ...
(session 30: the seven AMD runs FA-FG rescored at ff5f34b; free_core_shifts.txt)."""
import json
import sys
from pathlib import Path

GOAL = 0.25


def steady(row):
    """The collectives the summary counts: those every steady step runs (``steady_collectives``)."""
    return [c for c in row["collectives"] if c["n"] >= row["steady_steps"]]


def main(paths):
    for p in paths:
        rep = json.loads(Path(p).read_text())
        name = Path(p).stem
        tiers = {"model": rep["rows"], "free core": rep["free_core_rows"]}
        for tier, rows in tiers.items():
            miss = [f"W{r['W']} {r['plan']} {r['mode']} {c['marker']} {c['error']:+.0%}"
                    for r in rows for c in steady(r) if abs(c["error"]) > GOAL]
            counted = sum(len(steady(r)) for r in rows)
            print(f"{name} {tier}: {counted - len(miss)}/{counted}; misses: {'; '.join(miss) or 'none'}")
        free = {(r["W"], r["plan"], r["mode"]): r for r in rep["free_core_rows"]}
        bucket = []
        for r in rep["rows"]:
            if r["W"] != 2:
                continue
            a = next(c for c in r["collectives"] if c["marker"] == "dense_allreduce")
            b = next(c for c in free[(r["W"], r["plan"], r["mode"])]["collectives"] if c["marker"] == "dense_allreduce")
            bucket.append(f"{r['plan']} {r['mode']} {a['error']:+.0%} -> {b['error']:+.0%}")
        print(f"{name} W = 2 buckets, model -> free core: " + ", ".join(bucket))


if __name__ == "__main__":
    main(sys.argv[1:])
