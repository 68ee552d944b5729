import sys, time, random, os, pickle, json
import numpy as np

def body(comm, gaps, ovs, iters, nbytes):
    import torch
    from neo_train.topology.calibrate import _busy
    W, rank = comm.world_size, comm.rank
    work = torch.randn(96, 96)
    n = nbytes // 4
    x = torch.ones(n); sp = [n // W] * W
    rng = random.Random(rank + 7); rov = random.Random(3)
    T = np.full((4, iters), np.nan)
    for it in range(iters + 3):
        _busy(work, rng.choice(gaps))
        comm.all_to_all_v(x, sp, sp, async_op=False, tag="m")
        _busy(work, rng.choice(gaps))
        comm.barrier()
        o = rov.choice(ovs)
        h = comm.all_to_all_v(x, sp, sp, async_op=True, tag="m")
        t0 = time.time_ns()
        _busy(work, o)
        t1 = time.time_ns()
        h.wait()
        t2 = time.time_ns()
        if it >= 3:
            T[:, it - 3] = (t0, t1, t2, o * 1e9)
    mine = torch.tensor(T.reshape(-1), dtype=torch.float64)
    return comm.all_gather_v(mine, [mine.numel()] * W, tag="m").numpy().reshape(W, 4, iters)

if __name__ == "__main__":
    from neo_train.testing import run_ranks
    from neo_train.topology.trace_input import load_trace, trace_duty_samples
    run = sys.argv[1]; W = int(sys.argv[2]); mode = sys.argv[3]; iters = int(sys.argv[4])
    d = json.load(open(run + ".json"))
    gaps, ovs = [], []
    for r in d["rows"]:
        if r["calibration"] == "busy" and r["W"] == W and r["mode"] == mode:
            for rep in r["repeats"]:
                g, o = trace_duty_samples(load_trace(rep["trace"]), 4)
                gaps += g; ovs += o.get("all_to_allv", [])
    for nbytes in (32768, 131072):
        got = run_ranks(body, W, gaps, ovs, iters, nbytes, timeout_s=900)[0]
        pickle.dump(got, open(f"/tmp/s18/raw_w{W}_{mode}_{nbytes}.pkl", "wb"))
        print("done", nbytes, flush=True)
