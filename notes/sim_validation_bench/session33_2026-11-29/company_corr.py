"""Per run, the W = 2, 3, 4 busy calibrations' asynchronous all-reduce company figure (concurrent_s, ms, by group size)
beside TWRW's node-local backward dist error under session 32's model (session 33; keeps extracted to /tmp)."""
import json, glob
from neo_train.topology.calibrate import Calibration, fit_calibration
runs = "FA FB FC FD FE FF FG FH FI FJ FK".split()
keep = lambda r: {"FI": "/tmp/FI/keep", "FJ": "/tmp/FJ/keep", "FK": "/tmp/FK/keep"}.get(r, f"/tmp/keeps/{r}/keep")
res = lambda r: {"FJ": "/tmp/FJ/runFJ.json", "FK": "/tmp/FK/runFK.json"}.get(r, f"/tmp/s32/built_{r}.json")
for W in (3, 4, 2):
  for mode in ("pipelined", "plain"):
    for r in runs:
        f = glob.glob(f"{keep(r)}/calibration_w{W}_busy*_{mode}.json")[0]
        c = Calibration.load(f); cal = fit_calibration(c.samples, world_size=c.world_size, transport=c.transport, device=c.device, meta=c.meta)
        conc = cal.async_kinds["all_reduce"].concurrent_s
        rep = json.load(open(res(r)))
        err = [cc["error"] for x in rep["rows"] if x["W"] == W and x["plan"] == "twrw" and x["mode"] == mode for cc in x["collectives"] if cc["marker"] == "output_dist_intra_bwd"]
        print(W, mode, r, {g: round(v*1e3, 2) for g, v in conc.items()}, f"{err[0]:+.1%}" if err else "")
