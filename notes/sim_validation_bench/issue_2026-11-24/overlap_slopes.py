"""How a collective in flight slows with the compute over it, from a busy calibration's first-pass
asynchronous cells (their iters_overlap_s / iters_done_s): per kind and group size, the slope of
the completion on the compute drawn over it, within each cell (each cell's own means taken off;
not on the draw cut at the completion, which has a slope of 1 wherever the draw outlasts it), and
the cells' mean compute actually over it (the draw cut at the completion).

    python overlap_slopes.py RUN_DIR/calibration_w4_busy*.json"""
import sys
from collections import defaultdict

import numpy as np

from neo_train.topology.calibrate import Calibration


def slopes(cal: Calibration) -> dict[tuple[str, int], tuple[float, float, int, float]]:
    """{(kind, g): (slope, mean compute over it in s, iterations, mean compute drawn in s)}"""
    xs, ys, means, drawn = defaultdict(list), defaultdict(list), defaultdict(list), defaultdict(list)
    for s in cal.samples:
        if not s.get("async") or s.get("pass") or "iters_done_s" not in s:
            continue
        ov, done = np.array(s["iters_overlap_s"]), np.array(s["iters_done_s"])
        key = (s["kind"], int(s["group"]))
        xs[key].extend(ov - ov.mean()); ys[key].extend(done - done.mean()); means[key].append(np.minimum(ov, done).mean())
        drawn[key].append(ov.mean())
    out = {}
    for key in xs:
        x, y = np.array(xs[key]), np.array(ys[key])
        out[key] = (float((x * y).sum() / (x * x).sum()) if (x * x).sum() > 0 else 0.0, float(np.mean(means[key])), len(x),
                    float(np.mean(drawn[key])))
    return out


if __name__ == "__main__":
    for f in sys.argv[1:]:
        print(f)
        for (k, g), (sl, m, n, _) in sorted(slopes(Calibration.load(f)).items()):
            print(f"  {k:15s} g={g}: {sl:+.3f} ms per ms of compute over it (mean compute over it {m * 1e3:.2f} ms, {n} iterations)")
