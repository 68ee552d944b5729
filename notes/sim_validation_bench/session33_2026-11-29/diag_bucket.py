"""Decompose the model's DDP bucket at W: per case, the final pass's mean idle share, compute over,
launch, latency pieces; and the measured/predicted bucket mean. usage: diag_bucket.py KEEPDIR W [marker]"""
import sys, statistics, json, re
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import sim_validation as sv
from neo_train.topology import trace_sim
from neo_train.topology.calibrate import Calibration, fit_calibration
from neo_train.topology.trace_input import load_trace
keep, W = Path(sys.argv[1]), int(sys.argv[2])
marker = sys.argv[3] if len(sys.argv) > 3 else "dense_allreduce"
rec = []
orig = trace_sim.calibrated_collectives
def patched(cal, free=None):
    make = orig(cal, free)
    def m(kind, group, by_rank, name, after):
        out = make(kind, group, by_rank, name, after)
        e0 = by_rank[min(by_rank)]
        if out is not None and marker in name:
            k = trace_sim._calibrated_kind(kind); g = len(group); asy = bool(e0.get("async"))
            launch = statistics.fmean(float(e.get("issue_ns", e.get("call_ns")) or 0) for e in by_rank.values()) / 1e9 if asy else 0
            over = float(e0.get("_over", 0.0)); idle = float(e0.get("_idle", 0.0))
            a = cal.latency(k, g, asy, concurrent=bool(e0.get("_concurrent")), idle=0.0, over_s=over)
            b = cal.latency(k, g, False)
            rec.append(dict(name=name, idle=idle, over=over, launch=launch, conc=bool(e0.get("_concurrent")), lat=out[0][0].seconds, a=a, b=b))
        return out
    return m
trace_sim.calibrated_collectives = patched
def refit(p):
    c = Calibration.load(p); cal = fit_calibration(c.samples, world_size=c.world_size, transport=c.transport, device=c.device, meta=c.meta); return cal
for d in sorted(keep.iterdir()):
    mm = re.fullmatch(rf"w{W}_(\w+?)_(plain|pipelined)(_r\d+)?", d.name)
    if not mm or mm.group(3): continue
    plan, mode = mm.group(1), mm.group(2)
    cf = next(keep.glob(f"calibration_w{W}_busy*_{mode}.json"))
    cal = refit(cf)
    rec.clear()
    case = {"W": W, "trace": str(d)}
    out = sv.predict(case, cal, 4)
    n = len(rec)
    last = rec[-n//trace_sim.IDLE_PASSES:] if False else rec  # all passes
    # take the last pass: records appended per pass; count per pass = number of bucket collectives
    per = {}
    for r in rec: per.setdefault(r["name"], []).append(r)
    fin = [v[-1] for v in per.values()]
    f = lambda k: statistics.fmean(r[k] for r in fin)
    c = [x for x in out["collectives"] if x["marker"] == marker][0]
    print(f"W{W} {plan:5} {mode:9} idle {f('idle'):.2f} over {f('over')*1e3:5.2f}ms launch {f('launch')*1e3:.2f} lat {f('lat')*1e3:.2f} (async {f('a')*1e3:.2f} block {f('b')*1e3:.2f}) | meas {c['measured_s']*1e3:.2f} pred {c['predicted_s']*1e3:.2f} net {c['measured_net_s']*1e3 if c.get('measured_net_s') else float('nan'):.2f}/{c['predicted_net_s']*1e3 if c.get('predicted_net_s') else float('nan'):.2f} err {c['error']:+.1%}")
    print("   cal async g%d: lat %.2f slope %.3f mean_over %.2f | block lat %.2f" % (W, cal.async_kinds['all_reduce'].latency_s[W]*1e3, cal.async_kinds['all_reduce'].overlap_slope.get(W,0), cal.async_kinds['all_reduce'].overlap_mean_s.get(W,0)*1e3, cal.kinds['all_reduce'].latency_s[W]*1e3))
