"""The all-reduce fits' relative error and latency, every kept calibration refitted with and without
the few-element cells fitted apart (calibrate.few_elements patched to False for "together").
Usage: python fit_rms.py 'GLOB' (fit_rms.txt: FA-FI's 54 files)."""
import glob, statistics, sys
from collections import defaultdict
from neo_train.topology import calibrate
from neo_train.topology.calibrate import Calibration, fit_calibration

files = sorted(glob.glob(sys.argv[1]))
out = defaultdict(list)
real = calibrate.few_elements
for f in files:
    c = Calibration.load(f)
    for tag, rule in (("together", lambda *a: False), ("apart", real)):
        calibrate.few_elements = rule
        cal = fit_calibration(c.samples, world_size=c.world_size, transport=c.transport, device=c.device, meta=c.meta)
        for mode, fits in (("blocking", cal.kinds), ("async", cal.async_kinds)):
            fit = fits["all_reduce"]
            out[(mode, tag, "rms")].append(fit.rms_rel_err)
            out[(mode, tag, "lat%d" % c.world_size)].append(fit.latency_s[c.world_size])
    calibrate.few_elements = real
print(f"{len(files)} calibration files")
for k in sorted(out):
    v = out[k]
    print(k, f"{statistics.fmean(v) * (1e3 if k[2].startswith('lat') else 100):.2f}", "ms" if k[2].startswith("lat") else "%", f"n={len(v)}")
