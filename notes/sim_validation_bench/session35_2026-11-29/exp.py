"""Rescore kept runs with a patched model: python exp.py VARIANT DIR [sim_validation args...]

VARIANT base: the committed model.
VARIANT blockover: an asynchronous collective's compute over it (``_over``) also counts, at weight
BW (env, default 1), the time its ranks spent blocked in other collectives' blocking calls between
its launch and its join (WAITS=1: and in waits for other asynchronous collectives)."""
import os, sys
sys.path.insert(0, "/work/main/benchmarks")
import sim_validation as sv
from neo_train.topology import trace_input
variant, d, *rest = sys.argv[1:]
BW = float(os.environ.get("BW", "1"))
WAITS = os.environ.get("WAITS") == "1"
MIN_W = int(os.environ.get("MIN_W", "2"))


def compute_over(blocks):
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




def compute_over_smaller(blocks):
    """As trace_input.compute_over, plus BW x the time blocked in blocking calls of a smaller group
    than the asynchronous collective's, between its launch and its join."""
    seen = {}
    for mine in blocks.values():
        computed, at_launch, extra = 0.0, {}, {}
        for b in mine:
            computed += b.compute
            if b.kind == "call" and not b.sync:
                at_launch[b.colls[0]] = computed
                extra[b.colls[0]] = 0.0
            elif b.kind == "call" and b.sync:
                g = len(b.colls[0][0][1])
                for k in at_launch:
                    if len(k[0][1]) > g:
                        extra[k] += BW * b.blocked
            elif b.kind == "wait":
                for k in b.colls:
                    if k in at_launch:
                        seen.setdefault(k, []).append(computed - at_launch.pop(k) + extra.pop(k))
    return {k: sum(v) / len(v) for k, v in seen.items()}


if variant == "smaller":
    trace_input.compute_over = compute_over_smaller
if variant == "blockover":
    trace_input.compute_over = compute_over
sys.exit(sv.main(["--rescore", d] + rest))
