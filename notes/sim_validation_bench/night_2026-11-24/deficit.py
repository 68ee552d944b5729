import sys, json, glob, os, statistics
from collections import defaultdict
sys.path.insert(0, "/work/main/benchmarks")
import sim_validation as sv
from neo_train.topology.calibrate import Calibration
import functools, neo_train.topology.trace_input as ti
if os.environ.get("SERIAL") == "1":
    ti.timeline_phases = functools.partial(ti.timeline_phases, serial=True)
if os.environ.get("PS") == "1":
    import neo_train.topology.trace_sim as ts
    from neo_train.topology.simulator import Comm, Transfer
    from neo_train.topology.trace_sim import _calibrated_kind, entry_sizes
    def ps_collectives(cal):
        off = cal.world_size if cal.fabric == "per_rank" else 1
        def make(kind, group, by_rank, name, after):
            if len(group) < 2:
                return None
            k = _calibrated_kind(kind)
            asy = bool(by_rank[min(by_rank)].get("async"))
            a = cal.latency(k, len(group), asy)
            lat = Comm(f"latency:{name}", (Transfer([off + r for r in group], [off + r for r in group], [a * cal.bandwidth] * len(group)),), after, "latency", "ps", 0.0)
            comm = cal.comm(k, group, entry_sizes(k, group, by_rank), name=name, after=(lat.name,), async_op=asy)
            return [lat, comm], comm.name
        return make
    ts.calibrated_collectives = ps_collectives
    from neo_train.topology.flat import FlatNetwork
    def network(self):
        W, C = self.world_size, self.bandwidth
        if self.fabric == "per_rank":
            return FlatNetwork(2 * W, host_bandwidth=C, hop_latency=0.0, devices_per_host=1, intra_bandwidth=C)
        return FlatNetwork(1 + W, host_bandwidth=C, hop_latency=0.0, devices_per_host=W, intra_bandwidth=C / W)
    Calibration.network = network
runs = sys.argv[1:]
agg = defaultdict(lambda: [0.0, 0.0, 0])
for run in runs:
    d = json.load(open(run + ".json"))
    cals = {}
    for f in glob.glob(run + "/calibration_w*_busy*"):
        W = int(os.path.basename(f).split("_")[1][1:]); mode = "plain" if "plain" in f else "pipelined"
        cals[(W, mode)] = Calibration.load(f)
    for row in d["rows"]:
        if row["calibration"] != "busy": continue
        for rep in row["repeats"]:
            case = {"W": row["W"], "trace": rep["trace"].replace("/tmp/s17/", "/tmp/s17/")}
            if not os.path.exists(case["trace"]): continue
            p = sv.predict(case, cals[(row["W"], row["mode"])], 4)
            steps = p["steady_steps"]
            for c in p["collectives"]:
                k = (row["W"], row["plan"], row["mode"], c["marker"], c["comms"], c["mode"])
                a = agg[k]
                # per-step blocked total: mean blocked x instances / steps / ranks  (n counts rank-instances)
                a[0] += c["measured_blocked_mean_s"] * c["n"] / steps / row["W"]
                a[1] += c["predicted_blocked_mean_s"] * c["n"] / steps / row["W"]
                a[2] += 1
            ak = (row["W"], row["plan"], row["mode"], "STEP", "", "")
            a = agg[ak]; a[0] += p["measured_step_mean_ms"]/1e3; a[1] += p["predicted_step_mean_ms"]/1e3; a[2] += 1
for k in sorted(agg):
    m, pr, n = agg[k]
    print(f"W={k[0]} {k[1]:<5} {k[2]:<9} {k[3]:<22} {k[4]:<12} {k[5]:<5} per step: meas {m/n*1e3:6.3f} pred {pr/n*1e3:6.3f} diff {(pr-m)/n*1e3:+6.3f} ms")
