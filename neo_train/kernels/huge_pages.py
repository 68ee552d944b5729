"""Embedding tables in host memory on transparent huge pages (Linux).

A lookup or a sparse update touches rows scattered over the whole table, so on 4 KiB pages nearly
every row costs a TLB miss and a page walk. On 2 MiB pages (transparent huge pages, THP) the
walks mostly vanish: a 13 x 1M x 64 float32 table (3.3 GB) summed over 400k Zipf ids took 16.5 ms
on 4 KiB pages and 10.9 ms on huge pages on the project's 2-vCPU Intel VM.

Most kernels leave THP to ``madvise`` (``/sys/kernel/mm/transparent_hugepage/enabled``), and
torch's CPU allocator advises only when ``THP_MEM_ALLOC_ENABLE=1`` is set before it first runs.
So tables of at least ``MIN_BYTES`` are given memory here: an untouched allocation (above glibc's
largest mmap threshold, 32 MiB, ``malloc`` maps fresh zero pages), advised with
``madvise(MADV_HUGEPAGE)`` before anything touches it, so its first writes fault in huge pages
where the kernel has them. Nothing changes but the page size: the tensor is an ordinary torch
tensor. ``NEO_TRAIN_HUGE_PAGES=0`` turns it off; where THP is ``never`` or the OS is not Linux it
is a no-op.
"""
from __future__ import annotations

import ctypes
import os
import sys

import torch

__all__ = ["MIN_BYTES", "enabled", "huge_page_empty", "huge_page_zeros", "advised", "smaps_mappings"]

MIN_BYTES = 64 << 20  # smaller tables gain little, and may come from glibc's heap (already touched)
_MADV_HUGEPAGE = 14
_HUGE = 2 << 20


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "never"
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else "never"


def enabled() -> bool:
    """Whether tables get huge-page memory here (Linux, THP not ``never``, not turned off)."""
    return sys.platform == "linux" and os.environ.get("NEO_TRAIN_HUGE_PAGES", "1") != "0" and _thp_mode() != "never"


def _huge_span(t: torch.Tensor) -> tuple[int, int]:
    """The whole 2 MiB pages inside t's memory: (first address, end address); empty if none."""
    start = t.data_ptr()
    first = (start + _HUGE - 1) // _HUGE * _HUGE
    return first, max(first, (start + t.numel() * t.element_size()) // _HUGE * _HUGE)


def _advise(t: torch.Tensor) -> None:
    first, end = _huge_span(t)
    if end > first:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(end - first), _MADV_HUGEPAGE)  # best effort


def huge_page_empty(shape: int | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor of ``shape``; advised for huge pages when it is large enough and
    ``enabled()``. Write it before reading it, as any ``torch.empty``."""
    t = torch.empty(shape, dtype=dtype)
    if t.numel() * t.element_size() >= MIN_BYTES and enabled():
        _advise(t)
    return t


def huge_page_zeros(shape: int | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``huge_page_empty`` filled with zeros (the first write, so on huge pages where advised)."""
    return huge_page_empty(shape, dtype).zero_()


def smaps_mappings() -> list[tuple[int, int, str, list[str]]]:
    """This process's memory mappings from /proc/self/smaps: (start, end, path or "", VmFlags);
    empty where there is no such file (not Linux)."""
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return []
    out: list[tuple[int, int, str, list[str]]] = []
    for line in lines:
        head, _, rest = line.partition(" ")
        if "-" in head and ":" not in head:  # a mapping's header: "lo-hi perms offset dev inode [path]"
            lo, hi = (int(x, 16) for x in head.split("-"))
            fields = rest.split(None, 4)
            out.append((lo, hi, fields[4] if len(fields) > 4 else "", []))
        elif line.startswith("VmFlags:") and out:
            out[-1][3].extend(line.split()[1:])
    return out


def advised(t: torch.Tensor) -> bool:
    """Whether the mapping holding ``t``'s first whole 2 MiB page is advised for huge pages (``hg``
    in its VmFlags, /proc/self/smaps; False where there is no such page or file). madvise splits
    the mapping: the bytes before that page are a mapping of their own, never advised."""
    addr, end = _huge_span(t)
    return end > addr and any(lo <= addr < hi and "hg" in flags for lo, hi, _, flags in smaps_mappings())
