import sys, time, os
import numpy as np
def body(comm, cfg, iters):
    import torch
    W = comm.world_size
    gs = [comm] + [comm.subgroup(list(range(W)), name=f"g{i}") for i in range(4)]
    n = cfg["n"]; x = torch.ones(n); sp = [n // W] * W
    res = {}
    for label in ("1 same", "2 same", "3 same", "4 same", "3 diff", "4 diff"):
        k = int(label[0]); same = "same" in label
        T = []
        for it in range(iters):
            comm.barrier()
            t0 = time.perf_counter_ns()
            hs = [(gs[0] if same else gs[1 + j]).all_to_all_v(x, sp, sp, async_op=True, tag="q") for j in range(k)]
            for h in hs: h.wait()
            T.append((time.perf_counter_ns() - t0) / 1e6)
        res[label] = float(np.mean(T)), float(np.median(T))
    return res
if __name__ == "__main__":
    from neo_train.testing import run_ranks
    for n in (4096, 262144):
        r = run_ranks(body, 2, {"n": n}, 200, timeout_s=900)[0]
        print(f"{n*4} B:", "  ".join(f"{k}: mean {a:.3f} med {b:.3f}" for k, (a, b) in r.items()))
