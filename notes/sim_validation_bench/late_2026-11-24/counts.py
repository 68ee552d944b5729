import sys, collections
from neo_train.topology.trace_input import load_trace, concurrent_collectives, rank_timelines
for run in ("runS",):
    for W in (2, 3, 4):
        for plan in ("tw", "rw", "twrw", "mixed"):
            for mode in ("plain", "pipelined"):
                traces = load_trace(f"/tmp/s18/{run}/w{W}_{plan}_{mode}")
                blocks, colls = rank_timelines(traces)
                conc = concurrent_collectives(blocks)
                by = collections.Counter()
                for key, n in conc.items():
                    e = next(iter(colls[key].values()))
                    by[(tuple(e.get("markers") or []), n)] += 1
                steps = 24
                print(W, plan, mode, {f"{m[0] if m else '?'}:{n}": round(c / steps, 2) for (m, n), c in sorted(by.items())})
