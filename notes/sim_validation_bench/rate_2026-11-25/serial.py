"""Per step of a run's kept traces: DDP's bucket (dense_allreduce) and the collective launched just
before it that is still in flight at its issue (the backward's output_dist*): the bucket's
completion after its last issue (net), and after the later of that issue and the other's last
completion (after_other): does the bucket wait for the collective ahead of it?

    python serial.py RUN_DIR"""
import statistics
import sys
from pathlib import Path

import numpy as np

from neo_train.topology.trace_input import load_trace


def rows(traces):
    by = {}
    for r, es in traces.items():
        for e in es:
            if isinstance(e, dict) and e.get("async") and e.get("step") is not None and e["step"] >= 4 and e.get("duration_ns"):
                by.setdefault((e["step"], tuple(e.get("markers") or ()), e.get("pg_id"), e.get("seqnum")), {})[r] = e
    out = []
    for (step, mk, _, _), d in by.items():
        if "dense_allreduce" not in mk or len(d) < len(traces):
            continue
        iss = [e["startTime_ns"] + e.get("issue_ns", e["call_ns"]) for e in d.values()]
        done = [e["startTime_ns"] + e["duration_ns"] for e in d.values()]
        last = max(iss)
        # the others of this step in flight at the bucket's last issue
        ahead = []
        for (s2, mk2, _, _), d2 in by.items():
            if s2 != step or "dense_allreduce" in mk2 or len(d2) < len(traces):
                continue
            i2 = [e["startTime_ns"] + e.get("issue_ns", e["call_ns"]) for e in d2.values()]
            c2 = [e["startTime_ns"] + e["duration_ns"] for e in d2.values()]
            if min(i2) < last < max(c2) + 5e6:
                ahead.append((max(c2), mk2))
        other = max((c for c, _ in ahead), default=last)
        out.append(((statistics.fmean(done) - last) / 1e6, (statistics.fmean(done) - max(last, other)) / 1e6,
                    (other - last) / 1e6, "+".join(sorted({m[0] for _, m in ahead}))))
    return out


if __name__ == "__main__":
    for d in sorted(Path(sys.argv[1]).iterdir()):
        if not d.is_dir() or d.name[-3:-1] == "_r":
            continue
        rs = [x for r in ([d] + sorted(d.parent.glob(d.name + "_r*"))) for x in rows(load_trace(r))]
        if not rs:
            continue
        a = np.array([x[:3] for x in rs])
        names = sorted({x[3] for x in rs})
        print(f"{d.name:20s} n {len(rs):3d} net {np.median(a[:, 0]):5.2f} | other's last completion after the last issue "
              f"{np.median(a[:, 2]):+5.2f} | after both {np.median(a[:, 1]):5.2f} ms (medians)  ahead: {names}")
