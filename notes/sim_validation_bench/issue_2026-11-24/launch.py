"""W = 4: what a long asynchronous launch is. Each rank computes, launches an all_to_allv of 64 KB
asynchronously (times before the native call, after it returns), then waits at once. For the
iterations whose last launcher (by launch return) took long, when did the peers' waits return?"""
import time, random, sys
import numpy as np, torch
import torch.distributed as dist
from neo_train.comm.spawn import run_ranks
from neo_train.topology.calibrate import _busy

def body(comm, iters, nbytes, mode):
    W, r = comm.world_size, comm.rank
    work = torch.randn(96, 96)
    n = nbytes // 4 // W * W
    x = torch.ones(n); sp = [n // W] * W
    out = torch.empty(n)
    rng = random.Random(r)
    g = comm.group if hasattr(comm, "group") else None
    rows = []
    for it in range(iters + 3):
        _busy(work, 2e-3 * rng.uniform(0.5, 1.5))
        ta = time.time_ns()
        if mode == "native":
            h = dist.all_to_all_single(out, x, sp, sp, group=g, async_op=True)
        else:
            h = comm.all_to_all_v(x, sp, sp, async_op=True, tag="x")
        tb = time.time_ns()
        h.wait()
        tw = time.time_ns()
        _busy(work, 2e-3 * rng.uniform(0.5, 1.5))
        if it >= 3: rows.append((ta, tb, tw))
    return rows

if __name__ == "__main__":
    W = int(sys.argv[1]); mode = sys.argv[2] if len(sys.argv) > 2 else "comm"
    iters = 300
    res = run_ranks(body, W, iters, 65536, mode, timeout_s=900)
    t = np.array([res[q] for q in range(W)], dtype=np.float64) / 1e6  # (W, iters, 3) ms
    ta, tb, tw = t[..., 0], t[..., 1], t[..., 2]
    launch = tb - ta
    last = tb.argmax(axis=0)
    it = np.arange(iters)
    lastlaunch = launch[last, it]
    others = np.array([[tw[q, i] for q in range(W) if q != last[i]] for i in range(iters)])
    first_other_vs_tb = others.min(axis=1) - tb[last, it]
    first_other_vs_ta = others.min(axis=1) - ta[last, it]
    print(f"W={W} {mode}: launch median {np.median(launch):.3f} p90 {np.quantile(launch,.9):.3f} ms; last launcher's launch mean {lastlaunch.mean():.3f}")
    for lo, hi in ((0, 0.4), (0.4, 1.0), (1.0, 100)):
        m = (lastlaunch >= lo) & (lastlaunch < hi)
        if m.any():
            print(f"  last launch {lo}-{hi} ms (n={m.sum()}): first peer's wait returns {first_other_vs_tb[m].mean():+.3f} ms after its launch returned, "
                  f"{first_other_vs_ta[m].mean():+.3f} after it began; mean peer return after its launch return {(others[m].mean(axis=1) - tb[last[m], it[m]]).mean():+.3f}")
