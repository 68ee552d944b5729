"""When a Future.then callback of an async all-reduce runs, by what the main thread does meanwhile (experiments.txt)."""
import time, statistics as st
import torch
from neo_train.comm.spawn import run_ranks

def body(comm, iters):
    x = torch.randn(9009)
    work = torch.randn(96, 96)
    out = {}
    for mode in ("sleep", "matmul", "python"):
        lat = []
        for it in range(iters):
            comm.barrier()
            got = []
            t0 = time.perf_counter_ns()
            h = comm.all_reduce(x, async_op=True)
            fut = h._future() if hasattr(h, "_future") and h._future else None
            fut.then(lambda f: got.append(time.perf_counter_ns()))
            t_end = time.perf_counter() + 0.010
            if mode == "sleep":
                time.sleep(0.010)
            elif mode == "matmul":
                while time.perf_counter() < t_end:
                    work @ work
            else:
                n = 0
                while time.perf_counter() < t_end:
                    for i in range(200):
                        n += i
            h.wait()
            lat.append((got[0] - t0) / 1e6 if got else float("nan"))
        out[mode] = lat
    return out

if __name__ == "__main__":
    for W in (2, 4):
        res = run_ranks(body, W, 40, timeout_s=300)
        for mode in ("sleep", "matmul", "python"):
            v = [x for r in res for x in r[mode][2:]]
            print(f"W={W} main thread {mode:6s}: callback {st.fmean(v):.2f} ms after launch (median {st.median(v):.2f})")
