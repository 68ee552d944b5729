"""Per case of a kept run (``--keep``) matching PREFIX: DDP's bucket (KIND, default all_reduce) measured
vs predicted net time (last issue to the mean completion), with its idle share, compute over it and
company, and the calibration's fits (session 28).

    python diag.py RUN_DIR w4     (results: w4_findings.txt)"""
import os, re, sys, statistics
from pathlib import Path
sys.path[:0] = ["/work/main", "/work/main/benchmarks"]
from neo_train.topology.calibrate import Calibration, fit_calibration
from neo_train.topology.trace_input import load_trace
from neo_train.topology import trace_sim as ts

run = Path(sys.argv[1]); pat = sys.argv[2] if len(sys.argv) > 2 else "w4"
KIND = os.environ.get("KIND", "all_reduce")
cals = {}
for f in run.glob("calibration_w*_busy*.json"):
    m = re.match(r"calibration_w(\d+)_busy[\d.]+ms_(\w+)\.json", f.name)
    c = Calibration.load(f)
    cals[(int(m.group(1)), m.group(2))] = fit_calibration(c.samples, world_size=c.world_size, transport=c.transport, device=c.device, meta=c.meta)
for d in sorted(run.iterdir()):
    if not d.is_dir() or not d.name.startswith(pat): continue
    W, mode = int(d.name[1]), ("pipelined" if "pipelined" in d.name else "plain")
    cal = cals[(W, mode)]
    traces = load_trace(str(d))
    tl, res, n = ts.simulate_calibrated(traces, cal)
    end = {p.name: p.end for p in res.phases}; start = {p.name: p.start for p in res.phases}
    from neo_train.topology.trace_input import rank_timelines, concurrent_collectives, compute_over
    blocks, colls = rank_timelines(traces)
    CONC = concurrent_collectives(blocks); OVER = compute_over(blocks, colls)
    IDLE = ts.idle_shares(tl, res, ts.BLOCKED_IDLE if cal.core_per_rank else 0.0)
    rows = []
    for key, by_rank in tl.colls.items():
        e0 = by_rank[min(by_rank)]
        if key in tl.local or not e0.get("async") or ts._comm_name(e0) != KIND: continue
        if e0.get("joined_by") != "backward": continue
        # measured net: last issue to mean completion
        st = [e["startTime_ns"] + (e.get("issue_ns") or e.get("call_ns") or 0) for e in by_rank.values()]
        dn = [e["startTime_ns"] + e["duration_ns"] for e in by_rank.values()]
        mnet = (statistics.fmean(dn) - max(st)) / 1e6
        pnet = (end[tl.comm_end[key]] - start[tl.comm_start[key]]) * 1e3
        rows.append((mnet, pnet, IDLE.get(key, 0), OVER.get(key, 0)*1e3, CONC.get(key, 0), ts._phase(e0)))
    rows = rows[len(rows)//4:]
    mm = statistics.fmean(r[0] for r in rows); pm = statistics.fmean(r[1] for r in rows)
    print(f"{d.name:24s} n={len(rows)} meas net {mm:6.2f} pred {pm:6.2f} err {pm/mm-1:+.0%} idle {statistics.fmean(r[2] for r in rows):.2f} over {statistics.fmean(r[3] for r in rows):.2f}ms conc {statistics.fmean(r[4] for r in rows):.2f} burst {cal.busy_s*1e3:.2f} omean {cal.fit_for(KIND, True).overlap_mean_s.get(W,0)*1e3:.2f} slope {cal.fit_for(KIND, True).overlap_slope.get(W,0):.2f} cs {cal.fit_for(KIND, True).concurrent_s.get(W,0)*1e3:.2f} lat {cal.kinds[KIND].latency_s[W]*1e3:.2f} alat {cal.fit_for(KIND, True).latency_s[W]*1e3:.2f}", flush=True)
