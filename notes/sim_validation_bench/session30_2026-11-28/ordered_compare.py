"""Two rescorings of the same kept runs (``sim_validation.py --rescore DIR --json F``: before and
after a model change), BEFORE_DIR/NAME.json against AFTER_DIR/NAME.json for each NAME: per run, the
rows within +-25 % per tier, the step medians and worst, and every collective row that crossed the
goal (``ordered_lags.txt``); then over all the runs, per W, mode and collective, the mean error before
and how far the change moved it (``ordered_lags_moves.txt``).

    python ordered_compare.py BEFORE_DIR AFTER_DIR FA FB FC ...

Session 30: the return lags in the run's order of leaving (``ordered_lags.patch``, applied, with
``NEO_ORDERED_LAGS=1`` after and ``0`` before)."""
import collections
import json
import statistics
import sys
from pathlib import Path

GOAL = 0.25


def table(rep, tier):
    return {(r["W"], r["plan"], r["mode"]): r for r in rep[tier]}


def counted(r):
    """The collective rows the goal counts: those every steady step runs (``steady_collectives``)."""
    return {c["marker"]: c for c in r["collectives"] if c["n"] >= r["steady_steps"]}


def per_run(name, a, b):
    for tier in ("rows", "free_core_rows"):
        ta, tb = table(a, tier), table(b, tier)
        ins = [sum(abs(c["error"]) <= GOAL for r in t.values() for c in counted(r).values()) for t in (ta, tb)]
        steps = [statistics.median(r["step_mean_error"] for r in t.values()) for t in (ta, tb)]
        worst = [max(abs(r["step_mean_error"]) for r in t.values()) for t in (ta, tb)]
        crossed = [f"W{k[0]} {k[1]} {k[2]} {m} {c['error']:+.0%} -> {counted(tb[k])[m]['error']:+.0%}"
                   for k in sorted(ta) for m, c in counted(ta[k]).items()
                   if (abs(c["error"]) <= GOAL) != (abs(counted(tb[k])[m]["error"]) <= GOAL)]
        print(f"{name} {'model' if tier == 'rows' else 'free core'}: rows {ins[0]} -> {ins[1]}; step median "
              f"{steps[0]:+.1%} -> {steps[1]:+.1%}, worst {worst[0]:.1%} -> {worst[1]:.1%}; crossed: {'; '.join(crossed) or 'none'}")


def moves(pairs):
    base, moved = collections.defaultdict(list), collections.defaultdict(list)
    for a, b in pairs:
        ta, tb = table(a, "rows"), table(b, "rows")
        for k, r in ta.items():
            cb = counted(tb[k])
            for m, c in counted(r).items():
                base[(k[0], k[2], m)].append(c["error"])
                moved[(k[0], k[2], m)].append(cb[m]["error"] - c["error"])
            base[(k[0], k[2], "STEP")].append(r["step_mean_error"])
            moved[(k[0], k[2], "STEP")].append(tb[k]["step_mean_error"] - r["step_mean_error"])
    for g in sorted(base):
        print(f"W{g[0]} {g[1]:9} {g[2]:24} mean before {statistics.fmean(base[g]):+6.1%}, moved "
              f"{statistics.fmean(moved[g]) * 100:+5.1f} points (n = {len(base[g])})")


def main(before, after, *names):
    pairs = []
    for n in names:
        a, b = (json.loads((Path(d) / f"{n}.json").read_text()) for d in (before, after))
        per_run(n, a, b)
        pairs.append((a, b))
    print()
    moves(pairs)


if __name__ == "__main__":
    main(*sys.argv[1:])
