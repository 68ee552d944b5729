import sys, time, os
import numpy as np

def body(comm, cfg, iters):
    import torch
    W = comm.world_size
    groups = [comm] + [comm.subgroup(list(range(W)), name=f"g{i}") for i in range(3)]
    x = torch.ones(4096); sp = [2048, 2048]
    res = []
    for gi, g in enumerate(groups):
        T = np.zeros(iters)
        for it in range(iters):
            t0 = time.perf_counter_ns()
            g.all_to_all_v(x, sp, sp, tag="p")
            T[it] = (time.perf_counter_ns() - t0) / 1e6
        res.append((gi, float(np.median(T)), float(np.percentile(T, 99)), float(T.max()), int((T > 1.5).sum())))
    return res

if __name__ == "__main__":
    from neo_train.testing import run_ranks
    for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
        r = run_ranks(body, 2, {}, 2000, timeout_s=900)
        print(f"launch {rep}: " + " | ".join(f"g{gi} p50 {a:.3f} p99 {b:.3f} max {c:.2f} n>1.5ms {n}" for gi, a, b, c, n in r[0]), flush=True)
