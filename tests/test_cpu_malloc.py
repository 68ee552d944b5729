"""The trainer's malloc tuning (neo_train/train/cpu_malloc.py): a large tensor comes from the
heap and its memory stays mapped when freed, so the next step's tensor does not fault its pages
in again; ``NEO_TRAIN_MALLOC=default`` opts out. Measured where it matters (b = 4096, D = 128, 2
gloo ranks, benchmarks/hot_rows.py's model): 8,700 -> 19 minor page faults a step without
replication and 99 -> 86 ms a step. Page-fault counts vary from run to run (where the heap can
grow), so the test reads glibc's own accounting (``mallinfo2``) instead."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Prints "<tuned> <mmapped while held> <heap growth while held> <free heap after>" in MiB for
# one 16.8 MB tensor (a (4096, 1024) float32 pooled output), allocated after the trainer set up.
_PROBE = r"""
import ctypes, sys, torch
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
if sys.argv[1] == "trainer":
    from neo_train.config import preset
    from neo_train.train.trainer import Trainer
    Trainer(preset("tiny"), progress=False)
from neo_train.train import cpu_malloc
tuned = bool(cpu_malloc._applied)  # what the trainer did
a = libc.mallinfo2()
x = torch.empty(4096 * 1024)
b = libc.mallinfo2()
del x
c = libc.mallinfo2()
print(int(tuned), (b.hblkhd - a.hblkhd) >> 20, (b.arena - a.arena) >> 20, c.fordblks >> 20)
"""


def _probe(mode: str, **env: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, **env}, timeout=120).stdout.split()  # fmt: skip
    return [int(x) for x in out]


def _has_mallinfo2() -> bool:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallinfo2  # noqa: B018 - glibc >= 2.33
        return True
    except (OSError, AttributeError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _has_mallinfo2(), reason="glibc >= 2.33 (mallinfo2)")
def test_the_trainer_keeps_large_tensors_in_the_heap_and_their_memory_mapped() -> None:
    tuned, mmapped, grew, free_after = _probe("trainer")
    assert tuned
    assert mmapped == 0, f"a 16 MiB tensor was mmapped ({mmapped} MiB) instead of taken from the heap"
    assert free_after >= 16, f"only {free_after} MiB free in the heap after freeing it: the memory went back"
    plain, mmapped, grew, _ = _probe("trainer", NEO_TRAIN_MALLOC="default")
    assert not plain
    assert mmapped >= 16 and grew == 0, "glibc's defaults no longer mmap a 16 MiB tensor: the probe shows nothing"


def _rank_allocation(comm):
    import torch

    x = torch.empty(1 << 20)  # 4 MiB
    return os.environ.get("THP_MEM_ALLOC_ENABLE"), x.data_ptr() % 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages: Linux")
def test_spawned_ranks_allocate_large_tensors_page_aligned_for_huge_pages() -> None:
    """The ranks ``run_ranks`` starts inherit THP_MEM_ALLOC_ENABLE=1 (``rank_environment``), and
    PyTorch honours it: a 4 MiB tensor is page-aligned (its default alignment is 64 bytes)."""
    from neo_train.testing import run_ranks

    opted_out = os.environ.get("NEO_TRAIN_MALLOC", "").strip().lower() == "default"
    if opted_out or os.environ.get("THP_MEM_ALLOC_ENABLE") not in (None, "1"):
        pytest.skip("this environment opts out")
    assert run_ranks(_rank_allocation, 1) == [("1", 0)]


def test_rank_environment_keeps_a_setting_and_honours_the_opt_out(monkeypatch) -> None:
    from neo_train.comm.spawn import rank_environment

    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    monkeypatch.setenv("NEO_TRAIN_MALLOC", "default")
    rank_environment()
    assert "THP_MEM_ALLOC_ENABLE" not in os.environ
    monkeypatch.delenv("NEO_TRAIN_MALLOC")
    rank_environment()
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "1"
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    rank_environment()
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "0"
