"""Async all_to_all launched, then X ms of compute, then wait: the wait after compute, per X,
with the peer doing the same; and a variant where the launcher yields (sleeps) instead of computing."""
import sys, time, statistics
from neo_train.testing import run_ranks

def body(comm, mode):
    import torch
    torch.set_num_threads(1)
    x = torch.ones(4096)
    a = torch.randn(256, 256)
    out = {}
    def burn(ms):
        t = time.perf_counter()
        while (time.perf_counter() - t) * 1e3 < ms:
            a @ a if mode == "compute" else time.sleep(0.0002)
    for X in (0.0, 0.25, 0.5, 1.0, 2.0, 4.0):
        waits, tot = [], []
        for i in range(60):
            comm.barrier()
            t0 = time.perf_counter()
            h = comm.all_to_all_v(x, [x.numel() // comm.world_size] * comm.world_size, [x.numel() // comm.world_size] * comm.world_size, async_op=True)
            burn(X)
            t1 = time.perf_counter()
            h.wait()
            t2 = time.perf_counter()
            if i >= 10:
                waits.append((t2 - t1) * 1e3); tot.append((t2 - t0) * 1e3)
        out[X] = (round(statistics.median(waits), 3), round(statistics.median(tot), 3))
    return out

if __name__ == "__main__":
    W = int(sys.argv[1]); mode = sys.argv[2]
    print(W, mode, run_ranks(body, W, mode)[0])
