"""Is a blocking all-gather slowed by a world all-reduce (DDP's bucket, 36 KB) launched just before it on
every rank, where the all-gather's group is the whole world (W = 2, 3 TWRW's node-local group: one node) or a
strict subgroup (W = 4 TWRW's pairs, side by side)? Each iteration: a burst, the bucket launched (or not),
the blocking all-gather of 128 KB per rank, AFTER ms of compute (TWRW's embedding backward: 6 - 7 ms),
the bucket's wait, a barrier. Run from this folder.

    python bucket_groups.py [iters] [after_ms]"""
import random
import statistics as st
import sys
import torch

from neo_train.comm.spawn import run_ranks

from bucket_step import GATHER, step


def body(comm, iters, after_ms, pairs):
    W, r = comm.world_size, comm.rank
    if pairs:
        groups = [comm.subgroup([0, 1], name="pair01"), comm.subgroup([2, 3], name="pair23")]
        grp, g = groups[r // 2], 2
    else:
        grp, g = comm.subgroup(list(range(W)), name="all"), W
    work = torch.randn(96, 96)
    x = torch.randn(GATHER)
    rng = random.Random(r)
    out = {}
    for with_ddp in (False, True, False, True):
        rows = out.setdefault(with_ddp, [])
        for it in range(iters + 3):
            t = step(comm, work, rng, lambda: grp.all_gather_v(x, [GATHER] * g), after_ms, with_ddp)
            if it >= 3:
                rows.append(t)
    return out


if __name__ == "__main__":
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 80
    after_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 6.0
    for W, pairs in ((2, False), (3, False), (4, True), (4, False)):
        res = run_ranks(body, W, iters, after_ms, pairs, timeout_s=600)
        groups = ((0, 1), (2, 3)) if pairs else (tuple(range(W)),)
        means = {}
        for with_ddp in (False, True):
            nets = []
            for grp in groups:
                for it in range(len(res[0][with_ddp])):
                    calls = [res[q][with_ddp][it][0] for q in grp]
                    rets = [res[q][with_ddp][it][1] for q in grp]
                    nets.append((st.fmean(rets) - max(calls)) / 1e6)
            means[with_ddp] = st.fmean(nets)
        print(f"W={W} all-gather group {'pairs' if pairs else 'world'}, {after_ms:g} ms after: mean return after the "
              f"last call {means[False]:.2f} ms alone, {means[True]:.2f} ms with the bucket live "
              f"({means[True] - means[False]:+.2f})", flush=True)
