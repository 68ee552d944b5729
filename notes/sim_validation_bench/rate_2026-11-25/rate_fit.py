"""Fit a progress-rate model of a collective in flight under compute to a busy calibration's
first-pass asynchronous cells: while the ranks compute the collective progresses at 1 / (1 + k) of
its rate, so with d the completion alone and ov the compute drawn over it,
done = min(d + ov k / (1 + k), d (1 + k)). Per (kind, g): one k, one d per cell (size).

    python rate_fit.py RUN_DIR/calibration_w4_busy*.json"""
import sys
from collections import defaultdict

import numpy as np

from neo_train.topology.calibrate import Calibration

KS = np.linspace(0.0, 3.0, 121)


def model(d, ov, k):
    return np.minimum(d + ov * k / (1 + k), d * (1 + k))


def fit_cell(ov, done, k):
    """best d for one cell at rate k (grid about the alone estimate), and its squared error"""
    lo = max(1e-6, float(np.percentile(done, 5)) / (1 + k) * 0.5)
    grid = np.linspace(lo, float(done.max()) * 1.2, 240)
    err = ((model(grid[:, None], ov[None, :], k) - done[None, :]) ** 2).sum(axis=1)
    i = int(err.argmin())
    return grid[i], err[i]


def rates(cal: Calibration) -> dict:
    """{(kind, g): (k, rms of the fit s, rms of a flat fit s, iterations, {bytes: d})}"""
    cells = defaultdict(list)
    for s in cal.samples:
        if s.get("async") and not s.get("pass") and "iters_done_s" in s:
            cells[(s["kind"], int(s["group"]))].append((s["bytes"], np.array(s["iters_overlap_s"]), np.array(s["iters_done_s"])))
    out = {}
    for key, cs in cells.items():
        best = None
        for k in KS:
            fits = [fit_cell(ov, done, k) for _, ov, done in cs]
            tot = sum(e for _, e in fits)
            if best is None or tot < best[1]:
                best = (k, tot, {b: d for (b, _, _), (d, _) in zip(cs, fits)})
        n = sum(len(done) for _, _, done in cs)
        flat = sum(((done - done.mean()) ** 2).sum() for _, _, done in cs)
        out[key] = (best[0], (best[1] / n) ** 0.5, (flat / n) ** 0.5, n, best[2])
    return out


if __name__ == "__main__":
    for f in sys.argv[1:]:
        print(f)
        for (kind, g), (k, rms, flat, n, ds) in sorted(rates(Calibration.load(f)).items()):
            print(f"  {kind:15s} g={g}: k {k:.3f} (rate {1 / (1 + k):.2f} under compute); rms {rms * 1e3:.3f} ms vs flat {flat * 1e3:.3f}; "
                  f"{n} iterations; d " + ", ".join(f"{d * 1e3:.2f}" for _, d in sorted(ds.items())) + " ms")
