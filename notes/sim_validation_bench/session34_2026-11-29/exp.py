"""Rescore kept runs with patches: python exp.py VARIANT DIR [sim_validation args...]"""
import sys, json
sys.path.insert(0, "/work/main/benchmarks")
import sim_validation as sv
from neo_train.topology import calibrate
variant, d, *rest = sys.argv[1:]
if "nocompany" in variant:
    calibrate.Calibration.company = lambda self, kind, g: 0.0
if "noafter" in variant:
    calibrate.Calibration.lag_after = lambda self, kind, g, a: 0.0
if "halfcompany" in variant:
    orig = calibrate.Calibration.company
    calibrate.Calibration.company = lambda self, kind, g: 0.5 * orig(self, kind, g)
if "gated" in variant:
    from neo_train.topology import trace_input
    _lc = trace_input.live_company
    def gated(blocks, colls):
        return {k: v for k, v in _lc(blocks, colls).items() if v[1] > len(colls[k])}
    trace_input.live_company = gated
if "gatear" in variant:
    from neo_train.topology import trace_input
    _lc2 = trace_input.live_company
    def gatear(blocks, colls):
        return {k: v for k, v in _lc2(blocks, colls).items() if v[0] != "all_reduce" or v[1] > len(colls[k])}
    trace_input.live_company = gatear
sys.exit(sv.main(["--rescore", d] + rest))
