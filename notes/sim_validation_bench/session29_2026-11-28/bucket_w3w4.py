"""Session 23's after_and_bucket.py at W = 3 and W = 4 (run from this folder): the node pairs' blocking
all-gather of 128 KB (W = 3: ranks {0, 1}; rank 2, alone on its "node", has no partner and goes straight to
its compute after, as W = 3 TWRW's rank 2 does), with compute after it and/or a 36 KB world all-reduce (DDP's
bucket) launched by every rank just before it. Does a live bucket slow the all-gather at W = 3 as at W = 4?

    python bucket_w3w4.py [iters] [worlds, default 3,4]"""
import random
import statistics as st
import sys
import torch

from neo_train.comm.spawn import run_ranks

from bucket_step import GATHER, step


def body(comm, variants, iters):
    W, r = comm.world_size, comm.rank
    p01 = comm.subgroup([0, 1], name="pair01")
    p23 = comm.subgroup([2, 3], name="pair23") if W == 4 else None
    pair = p01 if r < 2 else p23
    work = torch.randn(96, 96)
    x = torch.randn(GATHER)
    rng = random.Random(r)
    out = {}
    for v in variants:
        after_ms, with_ddp = v
        rows = []
        for it in range(iters + 3):
            call = (lambda: pair.all_gather_v(x, [GATHER, GATHER])) if pair is not None else (lambda: None)
            t = step(comm, work, rng, call, after_ms, with_ddp)
            if it >= 3:
                rows.append(t)
        out[v] = rows
    return out


if __name__ == "__main__":
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    variants = [(0, False), (2, False), (8, False), (0, True), (2, True), (8, True)]
    worlds = [int(w) for w in (sys.argv[2] if len(sys.argv) > 2 else "3,4").split(",")]
    for W in worlds:
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
