import sys, time, os
import numpy as np
def body(comm, cfg, iters):
    import torch
    x = torch.ones(4096); sp = [2048, 2048]
    T = np.zeros(iters)
    for it in range(iters):
        t0 = time.perf_counter_ns()
        comm.all_to_all_v(x, sp, sp, tag="p")
        T[it] = (time.perf_counter_ns() - t0) / 1e6
    return T.tolist()
if __name__ == "__main__":
    from neo_train.testing import run_ranks
    r = run_ranks(body, 2, {}, int(os.environ.get("N", 5000)), timeout_s=900)
    T = np.array(r[0])
    big = T[T > 1.0]
    print(len(big), "of", len(T), "> 1 ms; p50", np.median(T))
    print(np.histogram(big, bins=np.arange(1, 9, 0.5)))
