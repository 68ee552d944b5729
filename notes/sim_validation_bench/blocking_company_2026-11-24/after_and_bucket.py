"""W = 4: the pairs' blocking all-gather of 128 KB, with compute after it and/or a world all-reduce (DDP's bucket) in flight (experiments.txt)."""
import time, random, statistics as st, sys
import numpy as np, torch
from neo_train.comm.spawn import run_ranks
from neo_train.topology.calibrate import _busy

def body(comm, variants, iters):
    W, r = comm.world_size, comm.rank
    p01 = comm.subgroup([0, 1], name="pair01"); p23 = comm.subgroup([2, 3], name="pair23")
    pair = p01 if r < 2 else p23
    work = torch.randn(96, 96)
    x = torch.randn(32768)  # 128 KB
    ddp = torch.randn(9009)
    rng = random.Random(r)
    out = {}
    for v in variants:
        after_ms, with_ddp = v
        rows = []
        for it in range(iters + 3):
            _busy(work, 2e-3 * rng.uniform(0.5, 1.5))
            h = comm.all_reduce(ddp, async_op=True, tag="ddp") if with_ddp else None
            t0 = time.time_ns(); pair.all_gather_v(x, [32768, 32768]); t1 = time.time_ns()
            _busy(work, after_ms * 1e-3)
            if h is not None: h.wait()
            comm.barrier()
            if it >= 3: rows.append((t0, t1))
        out[v] = rows
    return out

if __name__ == "__main__":
    variants = [(0, False), (2, False), (8, False), (0, True), (2, True), (8, True)]
    res = run_ranks(body, 4, variants, 60, timeout_s=600)
    for v in variants:
        nets, firsts = [], []
        for pr in ((0, 1), (2, 3)):
            for it in range(60):
                calls = [res[q][v][it][0] for q in pr]; rets = [res[q][v][it][1] for q in pr]
                nets.append((st.fmean(rets) - max(calls)) / 1e6); firsts.append((min(rets) - max(calls)) / 1e6)
        print(f"after {v[0]} ms ddp {v[1]!s:5s}: mean return after last call {st.fmean(nets):.2f} ms (median {st.median(nets):.2f}), first {st.fmean(firsts):.2f}")
