"""How the ranks arrive at a collective, measured (the host's wall clock: each call's
``startTime_ns``) against predicted (the simulated schedule with the kept run's own calibration,
refitted), over the steady instances of one marker in every launch of one case of a kept run.

    python arrivals.py KEEP_DIR w4_tw_plain input_dist

Prints, in ms (means over the instances): the arrivals' spread (last - first call), each rank's wait
for the last arrival ('lead', mean over the ranks), the time from the last arrival to each rank's
done ('after'), their sum ('took'); then, for the block each rank left just before (its place in
leaving it against its compute from there to this call), the spread of the leaving times and the
correlation between a rank's leaving time and that compute, measured and predicted (session 30: W = 4
plain runs of FG, −0.23 to −0.30 measured, about 0 predicted)."""
import statistics
import sys
from pathlib import Path

import numpy as np

from neo_train.topology.calibrate import Calibration, fit_calibration
from neo_train.topology.trace_input import load_trace
from neo_train.topology.trace_sim import _phase, simulate_calibrated

WARMUP = 4


def instances(keep: Path, case: str, marker: str):
    """Per steady instance: {rank: (call start, done, leave before, compute before)}, measured and
    predicted (seconds; measured on the wall clock, predicted on the simulated one)."""
    mode = case.split("_")[2]
    c0 = Calibration.load(next(keep.glob(f"calibration_w{case[1]}_busy*_{mode}.json")))
    cal = fit_calibration(c0.samples, world_size=c0.world_size, transport=c0.transport, device=c0.device, meta=c0.meta)
    for d in sorted(keep.glob(case + "*")):
        tl, res, _ = simulate_calibrated(load_trace(d), cal)
        end = {p.name: p.end for p in res.phases}
        for key, by_rank in tl.colls.items():
            if _phase(by_rank[min(by_rank)]) != marker or key in tl.local:
                continue
            at = {}
            for r, e in by_rank.items():
                bl = tl.blocks[r]
                i = next(i for i, b in enumerate(bl) if b.kind == "call" and key in b.colls)
                call, prev = bl[i], (bl[i - 1] if i else None)
                wait = next((b for b in bl[i:] if b.kind == "wait" and key in b.colls), None)
                at[r] = (call, prev, wait, e)
            if any(c.step is None or c.step < WARMUP or p is None or e.get("duration_ns") is None
                   for c, p, w, e in at.values()):
                continue
            meas, pred = {}, {}
            for r, (c, p, w, e) in at.items():
                start = e["startTime_ns"] / 1e9
                meas[r] = (start, start + e["duration_ns"] / 1e9, start - c.compute, c.compute)
                done = tl.nodes[(r, (c if c.sync or w is None else w).order)][1]
                pred[r] = (end[tl.nodes[(r, c.order)][0]], end[done], end[tl.nodes[(r, p.order)][1]], c.compute)
            yield meas, pred


def main(keep: str, case: str, marker: str) -> None:
    figs: dict[str, list[float]] = {}
    centred: dict[str, list[float]] = {"leave m": [], "leave p": [], "compute": []}
    for meas, pred in instances(Path(keep), case, marker):
        for side, x in (("m", meas), ("p", pred)):
            last = max(v[0] for v in x.values())
            figs.setdefault(f"spread {side}", []).append(last - min(v[0] for v in x.values()))
            figs.setdefault(f"lead {side}", []).append(statistics.fmean(last - v[0] for v in x.values()))
            figs.setdefault(f"after {side}", []).append(statistics.fmean(v[1] - last for v in x.values()))
            figs.setdefault(f"took {side}", []).append(statistics.fmean(v[1] - v[0] for v in x.values()))
            leaves = np.array([x[r][2] for r in sorted(x)])
            figs.setdefault(f"leave spread {side}", []).append(float(np.ptp(leaves)))
            centred[f"leave {side}"] += list(leaves - leaves.mean())
        comp = np.array([meas[r][3] for r in sorted(meas)])
        centred["compute"] += list(comp - comp.mean())
    print(f"{Path(keep).parent.name} {case} {marker}, {len(figs.get('spread m', []))} instances, ms: "
          + "  ".join(f"{k} {statistics.fmean(v) * 1e3:.2f}" for k, v in figs.items()))
    print("  correlation of a rank's leaving time (the block before) with its compute up to the call: measured "
          f"{np.corrcoef(centred['leave m'], centred['compute'])[0, 1]:+.2f}, predicted "
          f"{np.corrcoef(centred['leave p'], centred['compute'])[0, 1]:+.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
