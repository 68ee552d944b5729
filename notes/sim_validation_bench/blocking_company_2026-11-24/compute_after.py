import sys, statistics as st
from pathlib import Path
from collections import defaultdict
from neo_train.topology.trace_input import load_trace, rank_timelines
for case in sys.argv[1:]:
    case = Path(case)
    blocks, colls = rank_timelines(load_trace(case))
    nxt = {}
    for r, bl in blocks.items():
        for a, b in zip(bl, bl[1:]):
            nxt[(r, a.colls[0] if a.kind == "call" else None, a.kind)] = b.compute
    acc = defaultdict(list)
    for key, by_rank in colls.items():
        e0 = by_rank[min(by_rank)]
        if e0.get("async") or e0.get("step") is None or e0["step"] < 4: continue
        mk = e0["markers"][-1]
        acc[mk].append(st.fmean(nxt.get((r, key, "call"), 0) for r in by_rank) * 1e3)
    print(case.name, "  ".join(f"{mk} after {st.fmean(v):.2f} ms" for mk, v in acc.items()))
