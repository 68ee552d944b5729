import sys, time, random, os
import numpy as np

def body(comm, cfg, iters):
    import torch
    from neo_train.topology.calibrate import _busy, _async_seconds
    W, rank = comm.world_size, comm.rank
    pg_a = comm.subgroup(list(range(W)), name="a2a")
    pg_b = comm.subgroup(list(range(W)), name="ar")
    extra = [comm.subgroup(list(range(W)), name=f"x{i}") for i in range(int(cfg.get("extra", 0)))]
    work = torch.randn(96, 96)
    n = 32768
    x = torch.ones(n); sp = [n // W] * W
    y = torch.ones(9009)
    rng = random.Random(rank + 7); rov = random.Random(3)
    T = np.full((3, iters), np.nan)
    for it in range(iters + 3):
        if cfg.get("barrier"):
            _busy(work, cfg["X"] * rng.uniform(0.5, 1.5)); comm.barrier()
        else:
            _busy(work, cfg["X"] * rng.uniform(0.5, 1.5))
        if cfg.get("sync"):
            t0 = time.time_ns(); pg_a.all_to_all_v(x, sp, sp, async_op=False, tag="m"); t2 = time.time_ns()
            if it >= 3:
                T[:, it - 3] = (t0, t0, t2)
            continue
        h = pg_a.all_to_all_v(x, sp, sp, async_op=True, tag="m")
        t0 = time.time_ns()
        h2 = None
        if cfg.get("second"):
            _busy(work, 0.0003)
            h2 = pg_b.all_reduce(y.clone(), async_op=True, tag="m")
        _busy(work, cfg["Y"] * (1 if cfg.get("fixed") else rov.uniform(0, 2)))
        t1 = time.time_ns()
        h.wait()
        t2 = time.time_ns()
        if h2 is not None:
            _busy(work, 0.001)
            h2.wait()
        if it >= 3:
            T[:, it - 3] = (t0, t1, t2)
    mine = torch.tensor(T.reshape(-1), dtype=torch.float64)
    got = comm.all_gather_v(mine, [mine.numel()] * W, tag="m").numpy().reshape(W, 3, iters)
    D, first, spread = _async_seconds(got[:, 0], got[:, 1], got[:, 2])
    return D, float((got[:, 2] - got[:, 1]).mean() / 1e6), float(np.median(got[:, 2] - got[:, 1]) / 1e6)

if __name__ == "__main__":
    from neo_train.testing import run_ranks
    cfgs = {f"barrier, Y {y} ms fixed": dict(barrier=1, X=0.0007, Y=y / 1e3, fixed=1) for y in (0, 0.25, 0.5, 1, 2, 4)}
    for rep in range(2):
        for name, cfg in cfgs.items():
            D, mb, medb = run_ranks(body, 2, cfg, int(os.environ.get("ITERS", 60)), timeout_s=900)[0]
            print(f"{name:<32} D {D*1e3:6.3f} ms  mean blocked {mb:.3f}  median blocked {medb:.3f}", flush=True)
