"""Rescore kept runs with a patched model: python exp.py VARIANT DIR [sim_validation args...]

VARIANT base: the model as checked out (since c541c18 with the rule built from ``smaller``; the
tables' "before" tags, w4b and allb, were rescored on 36715ac, before it).
VARIANT smaller: ``trace_input.OVER_BLOCKED_SMALLER`` set to BW (env, default 1): the share of the
time blocked in calls of a smaller group, between an asynchronous collective's launch and its join,
that counts as compute over it (BW=0: the model before session 35; built at 0.5). The session's
variant, before it was built, also counted one-rank calls; at W = 4 TWRW that makes no difference.
VARIANT blockover: every blocking call's time (any group) counts at BW, and with WAITS=1 the waits
for other asynchronous collectives too; MIN_W: only at that many ranks or more."""
import os, sys
sys.path.insert(0, "/work/main/benchmarks")
import sim_validation as sv
from neo_train.topology import trace_input
variant, d, *rest = sys.argv[1:]
BW = float(os.environ.get("BW", "1"))
WAITS = os.environ.get("WAITS") == "1"
MIN_W = int(os.environ.get("MIN_W", "2"))


def compute_over_all_calls(blocks, colls=None):
    """trace_input.compute_over before session 35, plus BW x every blocking call's time (and the
    other waits' with WAITS) counted as compute, for every collective open on the rank."""
    seen = {}
    W = len(blocks)
    for mine in blocks.values():
        computed, at_launch = 0.0, {}
        for b in mine:
            computed += b.compute
            if b.kind == "call" and not b.sync:
                at_launch[b.colls[0]] = computed
            elif b.kind == "wait":
                own = [k for k in b.colls if k in at_launch]
                for k in own:
                    seen.setdefault(k, []).append(computed - at_launch.pop(k))
                if WAITS and not own and W >= MIN_W:
                    computed += BW * b.blocked
                    continue
            if b.kind == "call" and b.sync and W >= MIN_W:
                computed += BW * b.blocked
    return {k: sum(v) / len(v) for k, v in seen.items()}


if variant == "smaller":
    trace_input.OVER_BLOCKED_SMALLER = BW
elif variant == "blockover":
    trace_input.OVER_BLOCKED_SMALLER = 0.0
    trace_input.compute_over = compute_over_all_calls
sys.exit(sv.main(["--rescore", d] + rest))
