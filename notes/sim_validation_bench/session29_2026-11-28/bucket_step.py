"""One iteration of the bucket micro-benchmarks (``bucket_groups.py``, ``bucket_w3w4.py``): a burst of
2 ms +- 50 %, DDP's bucket (a 36 KB world all-reduce) launched asynchronously or not, the blocking call
timed, ``after_ms`` of compute, the bucket's wait, a barrier. Returns the call's (start, end) in ns."""
import time

import torch

from neo_train.topology.calibrate import _busy

BUCKET = 9009  # floats: 36 KB
GATHER = 32768  # floats per rank: 128 KB


def step(comm, work: torch.Tensor, rng, call, after_ms: float, with_bucket: bool) -> tuple[int, int]:
    _busy(work, 2e-3 * rng.uniform(0.5, 1.5))
    h = comm.all_reduce(torch.ones(BUCKET), async_op=True, tag="ddp") if with_bucket else None
    t0 = time.time_ns()
    call()
    t1 = time.time_ns()
    _busy(work, after_ms * 1e-3)
    if h is not None:
        h.wait()
    comm.barrier()
    return t0, t1
