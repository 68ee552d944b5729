"""W = 4: the pairs' blocking all-gather of 128 KB with companions launched right before it, no compute after (experiments.txt)."""
import time, random, statistics as st
import torch
from neo_train.comm.spawn import run_ranks
from neo_train.topology.calibrate import _busy

def body(comm, variants, iters):
    r = comm.rank
    p01 = comm.subgroup([0, 1], name="pair01"); p23 = comm.subgroup([2, 3], name="pair23")
    t01 = comm.subgroup([0, 1], name="tpair01"); t23 = comm.subgroup([2, 3], name="tpair23")
    wt = comm.subgroup([0, 1, 2, 3], name="worldtwin")
    pair, tpair = (p01, t01) if r < 2 else (p23, t23)
    work = torch.randn(96, 96)
    x = torch.randn(32768)
    xw = torch.randn(32768)
    ddp = torch.randn(9009)
    rng = random.Random(r)
    out = {}
    for v in variants:
        rows = []
        for it in range(iters + 3):
            _busy(work, 2e-3 * rng.uniform(0.5, 1.5))
            comm.barrier()
            h = None
            if v == "ddp": h = wt.all_reduce(ddp, async_op=True)
            elif v == "world_ag": h = wt.all_gather_v(xw, [32768] * 4, async_op=True)
            elif v == "pair_ag": h = tpair.all_gather_v(x, [32768, 32768], async_op=True)
            t0 = time.time_ns(); pair.all_gather_v(x, [32768, 32768]); t1 = time.time_ns()
            if h is not None: h.wait()
            if it >= 3: rows.append((t0, t1))
        out[v] = rows
    return out

if __name__ == "__main__":
    variants = ["none", "ddp", "world_ag", "pair_ag"] * 2
    variants = list(dict.fromkeys(variants))
    for rep in range(2):
        res = run_ranks(body, 4, variants, 80, timeout_s=600)
        for v in variants:
            nets = []
            for pr in ((0, 1), (2, 3)):
                for it in range(80):
                    calls = [res[q][v][it][0] for q in pr]; rets = [res[q][v][it][1] for q in pr]
                    nets.append((st.fmean(rets) - max(calls)) / 1e6)
            print(f"{v:9s}: mean return after last call {st.fmean(nets):.2f} ms (median {st.median(nets):.2f})")
