"""Session 23's after_and_bucket.py at W = 3 and W = 4 (run from this folder): the node pairs' blocking
all-gather of 128 KB (W = 3: ranks {0, 1}; rank 2, alone on its "node", has no partner and goes straight to
its compute after, as W = 3 TWRW's rank 2 does), with compute after it and/or a 36 KB world all-reduce (DDP's
bucket) launched by every rank just before it. Does a live bucket slow the all-gather at W = 3 as at W = 4?

    python bucket_w3w4.py [iters]"""
import random
import statistics as st
import sys
import time

import torch

from neo_train.comm.spawn import run_ranks
from neo_train.topology.calibrate import _busy


def body(comm, variants, iters):
    W, r = comm.world_size, comm.rank
    p01 = comm.subgroup([0, 1], name="pair01")
    p23 = comm.subgroup([2, 3], name="pair23") if W == 4 else None
    pair = p01 if r < 2 else p23
    work = torch.randn(96, 96)
    x = torch.randn(32768)
    ddp = torch.randn(9009)
    rng = random.Random(r)
    out = {}
    for v in variants:
        after_ms, with_ddp = v
        rows = []
        for it in range(iters + 3):
            _busy(work, 2e-3 * rng.uniform(0.5, 1.5))
            h = comm.all_reduce(ddp, async_op=True, tag="ddp") if with_ddp else None
            t0 = time.time_ns()
            if pair is not None:
                pair.all_gather_v(x, [32768, 32768])
            t1 = time.time_ns()
            _busy(work, after_ms * 1e-3)
            if h is not None:
                h.wait()
            comm.barrier()
            if it >= 3:
                rows.append((t0, t1))
        out[v] = rows
    return out


if __name__ == "__main__":
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    variants = [(0, False), (2, False), (8, False), (0, True), (2, True), (8, True)]
    for W in (3, 4):
        res = run_ranks(body, W, variants, iters, timeout_s=600)
        for v in variants:
            nets = []
            for pr in ((0, 1), (2, 3))[: W // 2]:
                for it in range(iters):
                    calls = [res[q][v][it][0] for q in pr]
                    rets = [res[q][v][it][1] for q in pr]
                    nets.append((st.fmean(rets) - max(calls)) / 1e6)
            print(f"W={W} after {v[0]} ms bucket {v[1]!s:5s}: mean return after the pair's last call "
                  f"{st.fmean(nets):.2f} ms (median {st.median(nets):.2f})", flush=True)
