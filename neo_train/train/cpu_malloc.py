"""Keep freed host memory for reuse: glibc's malloc tuned for a training process on CPU.

A training step allocates the same large tensors every step (pooled embeddings, their gradients,
the all-to-all buffers: megabytes each at b = 4096). glibc serves a request at or above its
mmap threshold with a fresh ``mmap`` and gives it back with ``munmap`` when freed, and returns
the top of its heap to the system once more than the trim threshold is free there. Either way
the next step's tensor touches pages the kernel must fault in and zero again: on the project's
2-vCPU VM a fresh 32 MB zero fill takes ~10 ms against 1.2 ms for refilling memory already
mapped. The default thresholds adapt (the mmap threshold grows to the largest chunk freed so
far), but a step's mix of sizes keeps them low.

``tune_cpu_malloc()`` fixes the mmap threshold at glibc's largest (32 MiB on 64-bit: requests
below it come from the heap) and the trim threshold at 1 GiB (freed heap memory stays mapped),
so from the second step on a step reuses its pages. The cost is memory: the process keeps its
peak heap mapped. Requests of 32 MiB and more are still mapped and unmapped each time.

The trainer calls it for CPU training (``Trainer``); ``NEO_TRAIN_MALLOC=default`` in the
environment leaves glibc as it is. It changes nothing on systems without glibc's ``mallopt``.
On GPUs the tensors that matter live in the CUDA caching allocator, which already keeps them.

Even so the heap fragments: a freed 16 MiB chunk is split for smaller requests, the next step's
16 MiB tensor no longer fits, and the heap grows by fresh pages (hot-row replication at b = 4096,
D = 128 on this VM: 4,097 faults in a third of the steps, the process growing 16 MiB at a time,
those steps ~60 ms slower). PyTorch's own remedy is ``THP_MEM_ALLOC_ENABLE=1``: its CPU allocator
then page-aligns every tensor and asks for transparent huge pages for those of 2 MiB and more, so
new memory comes 2 MiB a fault and large tensors stop carving each other's pages. PyTorch reads
the variable once, at the process's first allocation, so it must be in the environment before
the process starts: ``neo_train.comm.spawn.rank_environment()`` puts it there (unless it is set,
or ``NEO_TRAIN_MALLOC=default``) for the rank processes ``run_ranks`` and ``neo-train train
--nproc`` start; under torchrun set it yourself.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["tune_cpu_malloc", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's upper limit for M_MMAP_THRESHOLD on 64-bit (4 MiB * sizeof(long))
TRIM_THRESHOLD = 1 << 30

_applied: bool | None = None


def tune_cpu_malloc() -> bool:
    """Apply the thresholds above once per process; True when they are in force (glibc, not
    opted out with ``NEO_TRAIN_MALLOC=default``)."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get("NEO_TRAIN_MALLOC", "").strip().lower() == "default":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied
