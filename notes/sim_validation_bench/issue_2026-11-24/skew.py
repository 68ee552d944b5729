"""W = 4: does a collective's return after the last arrival shrink when the others arrived early?
all_to_allv 64 KB (blocking, and async waited at once), arrival skew controlled per variant."""
import time, random, statistics as st, sys
import numpy as np, torch
from neo_train.comm.spawn import run_ranks
from neo_train.topology.calibrate import _busy

def body(comm, variants, iters, nbytes):
    W, r = comm.world_size, comm.rank
    work = torch.randn(96, 96)
    n = nbytes // 4 // W * W
    x = torch.ones(n); sp = [n // W] * W
    rng = random.Random(r)
    out = {}
    for v in variants:
        width_ms, asyn = v
        rows = []
        for it in range(iters + 3):
            comm.barrier()
            _busy(work, 2e-3 + width_ms * 1e-3 * rng.uniform(0, 1))
            t0 = time.time_ns()
            if asyn:
                h = comm.all_to_all_v(x, sp, sp, async_op=True, tag="x"); h.wait()
            else:
                comm.all_to_all_v(x, sp, sp, tag="x")
            t1 = time.time_ns()
            _busy(work, 2e-3)
            if it >= 3: rows.append((t0, t1))
        out[v] = rows
    return out

if __name__ == "__main__":
    W = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    nbytes = int(sys.argv[2]) if len(sys.argv) > 2 else 65536
    iters = 80
    variants = [(w, a) for a in (False, True) for w in (0.0, 2.4, 6.0)]
    res = run_ranks(body, W, variants, iters, nbytes, timeout_s=900)
    for v in variants:
        leads, rets, firsts = [], [], []
        for it in range(iters):
            calls = np.array([res[q][v][it][0] for q in range(W)]); ret = np.array([res[q][v][it][1] for q in range(W)])
            last = calls.max()
            leads.append((last - calls).mean() / 1e6); rets.append((ret.mean() - last) / 1e6); firsts.append((ret.min() - last) / 1e6)
        leads, rets = np.array(leads), np.array(rets)
        b = np.polyfit(leads, rets, 1)
        q = np.quantile(leads, [0.25, 0.75])
        lo, hi = rets[leads <= q[0]].mean(), rets[leads >= q[1]].mean()
        print(f"W={W} {nbytes}B width {v[0]:.1f} ms {'async' if v[1] else 'block'}: mean lead {leads.mean():.2f} ms, "
              f"return after last {rets.mean():.2f} (first {np.mean(firsts):.2f}); slope {b[0]:+.3f} ms/ms; "
              f"lowest-lead quarter {lo:.2f}, highest {hi:.2f}", flush=True)
