import sys, json, dataclasses, statistics
sys.path.insert(0, "/work/main/benchmarks")
import sim_validation as sv
import neo_train.topology.trace_input as ti
from neo_train.topology.trace_input import Compute, Comm, Timeline, rank_timelines, concurrent_collectives, trace_world_size, _comm_name, _group, _coll_key, _phase, _resume, _first_phase
from neo_train.topology.calibrate import Calibration

ORIG = ti.timeline_phases
SERIAL_W = {2}

def serial_timeline(traces, factory, return_lags=None):
    tl = ORIG(traces, factory, return_lags)
    if trace_world_size(traces) not in SERIAL_W:
        return tl
    phases = list(tl.phases)
    by_name = {p.name: i for i, p in enumerate(phases)}
    extra = {}
    for rank, mine in tl.blocks.items():
        prev = None
        for b in mine:
            if b.kind != "call":
                continue
            k = b.colls[0]
            if k in tl.local:
                continue
            if prev is not None:
                first = "latency:" + tl.comm_end[k]
                extra.setdefault(first, set()).add(tl.comm_end[prev])
            prev = k
    for first, ends in extra.items():
        i = by_name[first]; p = phases[i]
        after = tuple(p.after) + tuple(sorted(ends - set(p.after)))
        phases[i] = Compute(p.name, p.seconds, after) if isinstance(p, Compute) else Comm(p.name, p.rounds, after, p.collective, p.algorithm, p.payload)
    return dataclasses.replace(tl, phases=phases)

def run(runs, variants):
    for run in runs:
        d = json.load(open(run + ".json"))
        cals = {k: Calibration.from_dict(v) for k, v in d["calibrations"].items()}
        res = {v: [] for v in variants}
        for row in d["rows"]:
            cal = cals[f"{row['W']}:busy:{row['mode']}"]
            for v in variants:
                c = cal
                if "noconc" in v and row["W"] in SERIAL_W:
                    c = dataclasses.replace(cal, async_kinds={k: dataclasses.replace(f, concurrent_s={}) for k, f in cal.async_kinds.items()})
                ti.timeline_phases = serial_timeline if "serial" in v else ORIG
                sv_tp = sys.modules["neo_train.topology.trace_input"].timeline_phases
                rows = [row | {k: rep[k] for k in ("repeat", "trace")} | sv.predict({"W": row["W"], "trace": rep["trace"]}, c, 4) for rep in row["repeats"]]
                m = sv.merge_repeats(rows)
                res[v].append((row["W"], row["plan"], row["mode"], m["step_mean_error"], m["collectives_within_goal"][0]))
        for v, rs in res.items():
            by = {W: [e for w, p, mo, e, _ in rs if w == W] for W in (2, 3, 4)}
            print(f"{run.split('/')[-1]} {v:<14} steps {sum(abs(e) <= .15 for *_, e, _ in rs)}/24 coll {sum(c for *_, c in rs)} " +
                  " ".join(f"W={W} {statistics.median(es):+.1%}" for W, es in by.items()) + "  W2: " +
                  " ".join(f"{p[:2]}{mo[:2]} {e:+.0%}" for w, p, mo, e, _ in rs if w == 2), flush=True)
ti.timeline_phases = ORIG
if __name__ == "__main__":
    run(sys.argv[2:], sys.argv[1].split(","))
