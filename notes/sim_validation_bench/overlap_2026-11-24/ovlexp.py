"""Does an async collective's D depend on how long the ranks compute while it is in flight?"""
import sys, json
from neo_train.comm.spawn import run_ranks
from neo_train.topology.calibrate import measure_collectives

def body(comm, busy, ovl, kinds, sizes, iters):
    return measure_collectives(comm, sizes=sizes, kinds=kinds, groups=[comm.world_size], iters=iters, busy_s=busy,
                               overlap_s=ovl, concurrent=False)

if __name__ == "__main__":
    W = int(sys.argv[1]); busy = float(sys.argv[2]) / 1e3
    kinds = sys.argv[3].split(","); sizes = [int(s) for s in sys.argv[4].split(",")]
    out = {}
    for ovl_ms in [float(x) for x in sys.argv[5].split(",")]:
        res = run_ranks(body, W, busy, ovl_ms / 1e3, kinds, sizes, 40, timeout_s=600)[0]
        for s in res:
            tag = "async" if s.get("async") else "sync "
            print(f"ovl {ovl_ms:4.1f} ms {s['kind']:12s} {tag} g={s['group']} {s['bytes']:8d} B  D/mean {s['seconds']*1e3:6.3f}  first {s['first_s']*1e3:6.3f} spread {s['spread_s']*1e3:6.3f}", flush=True)
