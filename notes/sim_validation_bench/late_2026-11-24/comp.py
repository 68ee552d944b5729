import sys, time, random, os
import numpy as np

def body(comm, cfg, iters):
    import torch
    from neo_train.topology.calibrate import _busy, _async_seconds
    W, rank = comm.world_size, comm.rank
    gs = [comm.subgroup(list(range(W)), name=f"c{i}") for i in range(3)]
    work = torch.randn(96, 96)
    n = 8192 // W * W
    x = torch.ones(n); sp = [n // W] * W
    rng = random.Random(rank + 7); rov = random.Random(3)
    res = {}
    T = np.full((3, 3, iters), np.nan)
    for it in range(iters + 3):
        for k in range(3):
            _busy(work, cfg["X"] * rng.uniform(0.5, 1.5))
            comm.barrier()
            ov = cfg["Y"] * rov.uniform(0, 2)
            h = gs[0].all_to_all_v(x, sp, sp, async_op=True, tag="m")
            t0 = time.time_ns()
            others = [gs[1 + j].all_to_all_v(x, sp, sp, async_op=True, tag="m") for j in range(k)]
            _busy(work, ov)
            t1 = time.time_ns()
            h.wait()
            t2 = time.time_ns()
            for o in others: o.wait()
            if it >= 3:
                T[k, :, it - 3] = (t0, t1, t2)
    mine = torch.tensor(T.reshape(-1), dtype=torch.float64)
    got = comm.all_gather_v(mine, [mine.numel()] * W, tag="m").numpy().reshape(W, 3, 3, iters)
    return [_async_seconds(got[:, k, 0], got[:, k, 1], got[:, k, 2])[0] for k in range(3)]

if __name__ == "__main__":
    from neo_train.testing import run_ranks
    for rep in range(2):
        for W in (2, 3, 4):
            Ds = run_ranks(body, W, dict(X=0.0006, Y=0.0003), int(240 / W ** 1.5), timeout_s=900)[0]
            print(f"W={W}: D alone {Ds[0]*1e3:.3f}, +1 {Ds[1]*1e3:.3f} (+{(Ds[1]-Ds[0])*1e3:.3f}), +2 {Ds[2]*1e3:.3f} (+{(Ds[2]-Ds[0])*1e3:.3f})", flush=True)
