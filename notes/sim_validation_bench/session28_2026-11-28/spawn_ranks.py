"""What the session's micro-benchmarks (behind.py, follow.py) share: W gloo ranks spawned on this host,
one torch thread each, and the calibration's compute burst (96 x 96 products until the time is up)."""
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def busy(a, seconds):
    t = time.perf_counter() + seconds
    while time.perf_counter() < t:
        a @ a


def init(rank, W, port):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=W)


def setup(rank, W, port):
    """``init``, then what both benchmarks use: a second group of every rank (DDP's own), the burst's
    matrix, the skew's draws (each rank its own) and the overlap's (alike on every rank), a 128 KB
    all-to-all's input and output and DDP's 36 KB bucket."""
    import random

    init(rank, W, port)
    g2 = dist.new_group(list(range(W)))
    x = torch.randn(128 * 1024 // 4)
    return g2, torch.randn(96, 96), random.Random(rank), random.Random(0), x, torch.empty_like(x), torch.randn(36000 // 4)


def _wrap(body, rank, W, q):
    q.put((rank, body(rank, W)))
    dist.destroy_process_group()


def run(body, W):
    """{rank: body(rank, W)} from W spawned processes (``body`` at a module's top level)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_wrap, args=(body, r, W, q)) for r in range(W)]
    for p in ps:
        p.start()
    out = dict(q.get() for _ in ps)
    for p in ps:
        p.join()
    return out
