import sys, time, os
import numpy as np
def body(comm, cfg, secs):
    import torch
    x = torch.ones(4096); sp = [2048, 2048]
    T = []; S = []
    t_end = time.time() + secs
    while True:
        t0 = time.perf_counter_ns()
        comm.all_to_all_v(x, sp, sp, tag="p")
        T.append((time.perf_counter_ns() - t0) / 1e6); S.append(time.time())
        if len(T) % 100 == 0:
            stop = torch.tensor([float(time.time() > t_end)])
            comm.all_reduce(stop, op="max")
            if stop.item() > 0: break
    return T, S
if __name__ == "__main__":
    from neo_train.testing import run_ranks
    r = run_ranks(body, 2, {}, float(sys.argv[1]), timeout_s=900)
    T, S = np.array(r[0][0]), np.array(r[0][1])
    sec = (S - S[0]).astype(int)
    out = []
    for s in range(sec.max() + 1):
        m = sec == s
        out.append((m.sum(), (T[m] > 1.5).sum()))
    print(" ".join(f"{b*100//max(a,1)}" for a, b in out))
    print("per-second % stalls; overall", (T > 1.5).mean())
