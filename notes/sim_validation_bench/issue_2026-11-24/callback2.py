"""W = 4: how late a collective's completion callback runs on ranks that compute while it is in
flight (DDP's buckets are seen through one), against a rank that waits for it idle.
Rank 0 launches and waits at once; ranks 1..3 launch, register a callback, compute COMPUTE ms
(matrix products, or a pure-Python loop), then wait. The all-reduce ends on every rank within
a ring step of the others; rank 0's wait return marks it."""
import time, random, sys
import numpy as np, torch
from neo_train.comm.spawn import run_ranks
from neo_train.topology.calibrate import _busy

def py_loop(seconds):
    t_end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < t_end:
        for i in range(200):
            x += i * i
    return x

def body(comm, iters, nbytes, kind, compute_ms, idle0):
    W, r = comm.world_size, comm.rank
    work = torch.randn(96, 96)
    x = torch.ones(nbytes // 4)
    rng = random.Random(r)
    rows = []
    for it in range(iters + 3):
        comm.barrier()
        _busy(work, 1e-3 * rng.uniform(0.5, 1.5))
        seen = []
        t0 = time.time_ns()
        h = comm.all_reduce(x.clone(), async_op=True, tag="b")
        if r == 0 and idle0:
            h.wait(); t1 = time.time_ns(); tcb = t1
        else:
            fut = h.future().then(lambda f: seen.append(time.time_ns()))
            if kind == "busy":
                _busy(work, compute_ms * 1e-3)
            else:
                py_loop(compute_ms * 1e-3)
            fut.wait(); t1 = time.time_ns(); tcb = seen[0]
        if it >= 3: rows.append((t0, tcb, t1))
    return rows

if __name__ == "__main__":
    W = 4; iters = 40
    for idle0 in (True, False):
        for ms in (2.5, 5.0, 10.0, 20.0):
            res = run_ranks(body, W, iters, 36036, "busy", ms, idle0, timeout_s=900)
            t = np.array([res[q] for q in range(W)], dtype=np.float64) / 1e6
            last_launch = t[:, :, 0].max(axis=0)
            done = t[:, :, 1]  # completion as each rank saw it (callback, or rank 0's wait when idle)
            first = done.min(axis=0) - last_launch
            print(f"W=4 36 KB all_reduce, {'rank 0 idle, ' if idle0 else 'all '}ranks computing {ms:4.1f} ms after launching: "
                  f"first completion {np.mean(first):.2f} ms after the last launch (median {np.median(first):.2f}), mean {np.mean(done.mean(axis=0) - last_launch):.2f}", flush=True)
