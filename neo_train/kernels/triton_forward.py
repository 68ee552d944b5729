"""Triton table-batched pooled lookup: every feature of every local table in ONE launch.

    out (B, sum_f D_f) float32  =  pool(values (N,), offsets (F*B+1,), psw (N,) | None)

Imports triton at module level: only ``triton_backend.py`` imports this file, lazily, once it has
checked that triton runs here (CUDA, or TRITON_INTERPRET=1 set before the first import).

Storage (see ``triton_backend.py``): one flat weight buffer; table t's row r starts at element
``E_t + r*S_t`` with the row stride ``S_t`` = D_t rounded up to 16 bytes, so every row start is
16-byte aligned and loads can be vectorised. Per-feature metadata is one int64 (F, 8) table:

    FEAT_META[f] = (E, S, D, C, cls, R, rows, P)   E elem base of f's table, S its row stride,
                                                   D its dim, C f's first output column, cls the
                                                   dim class, R the table's first global row,
                                                   P bags per program

Dim classes. Dims differ per feature but a Triton tile has constexpr sizes, so the kernel holds
one code path per power-of-two column width COLS = MIN_COLS << c (c = 0 .. NUM_CLASSES-1); a
feature runs the narrowest class with COLS >= D (dims above the widest class loop over column
chunks). Each path pools BAGS = BLOCK_N // (BLOCK_L*COLS) bags of one feature per program, so a
dim-4 feature packs 128 bags into the same 2048-lane tile that holds one bag of a dim-512 one,
and no lane is spent on another class's padding. Only the classes present are compiled
(CLASS_MASK), and the grid is a precomputed work list of (feature, first bag) items.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import triton
import triton.language as tl

__all__ = [
    "pool",
    "pool_reference",
    "pool_work_list",
    "work_list",
    "column_alignment",
    "bags_per_program",
    "dim_class",
    "MIN_COLS",
    "NUM_CLASSES",
]

MIN_COLS = 4
NUM_CLASSES = 8  # column widths 4, 8, ..., 512
FEAT_META_WIDTH = 8
BLOCK_N = 2048  # lanes per tile; >= BLOCK_L * (widest class)
BLOCK_L = 4  # ids per bag loaded per loop iteration (more loads in flight)
NUM_WARPS = 4


def dim_class(dim: int) -> int:
    """The narrowest class whose width MIN_COLS << c holds ``dim`` (the widest class for big dims)."""
    c = max(0, (dim - 1).bit_length() - (MIN_COLS.bit_length() - 1))
    return min(c, NUM_CLASSES - 1)


def column_alignment(col_values: Sequence[int], row_stride: int, vector: int) -> int:
    """Largest power of two <= vector dividing the row stride and every feature's first column and
    dim: a hint that lets accesses to (B, total_dim) rows use vector loads and stores."""
    g = math.gcd(row_stride, *col_values)
    a = 1
    while a < vector and g % (2 * a) == 0:
        a *= 2
    return a


def bags_per_program(cls: int) -> int:
    return BLOCK_N // (BLOCK_L * (MIN_COLS << cls))


# ---- kernel ----------------------------------------------------------------------------------
@triton.jit
def _pool_tile(
    values_ptr, offsets_ptr, psw_ptr,  # the batch
    weights_ptr,  # flat storage
    out_ptr, out_stride,  # (B, total_dim)
    f, b0, B, E, S, D, C, c0,  # this program: feature, first bag, its table and output columns
    COLS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr,
    OUT_ALIGN: tl.constexpr, HAS_PSW: tl.constexpr,
):
    """Pool columns [c0, c0+COLS) of bags b0 .. b0+BAGS-1 of feature f into out."""
    BAGS: tl.constexpr = BLOCK_N // (BLOCK_L * COLS)
    bags = b0 + tl.arange(0, BAGS)
    bag_ok = bags < B
    slot = f * B + bags
    start = tl.load(offsets_ptr + slot, mask=bag_ok, other=0).to(tl.int64)
    length = (tl.load(offsets_ptr + slot + 1, mask=bag_ok, other=0).to(tl.int64) - start).to(tl.int32)
    max_len = tl.max(length, axis=0)
    cols = tl.arange(0, COLS)
    load_cols = (c0 + cols) < S  # the 16-byte padding is read too: it keeps masks vector-wide
    acc = tl.zeros((BAGS, COLS), dtype=tl.float32)
    for l0 in range(0, max_len, BLOCK_L):
        l = l0 + tl.arange(0, BLOCK_L)
        id_ok = l[None, :] < length[:, None]  # (BAGS, BLOCK_L)
        pos = start[:, None] + l[None, :]
        ids = tl.load(values_ptr + pos, mask=id_ok, other=0).to(tl.int64)
        row = E + ids * S + c0  # (BAGS, BLOCK_L) first element of each row's column chunk
        row = tl.multiple_of(row, [ALIGN, ALIGN])
        vals = tl.load(
            weights_ptr + row[:, :, None] + cols[None, None, :],
            mask=id_ok[:, :, None] & load_cols[None, None, :],
            other=0.0,
        ).to(tl.float32)  # (BAGS, BLOCK_L, COLS)
        if HAS_PSW:
            w = tl.load(psw_ptr + pos, mask=id_ok, other=0.0)
            vals = vals * w[:, :, None]
        acc += tl.sum(vals, axis=1)  # fixed-shape tree, then a fixed loop order: deterministic
    out_row = tl.multiple_of(bags.to(tl.int64) * out_stride + C + c0, OUT_ALIGN)
    out = out_ptr + out_row[:, None] + cols[None, :]
    tl.store(out, acc, mask=bag_ok[:, None] & ((c0 + cols) < D)[None, :])


@triton.jit
def _pool_kernel(
    values_ptr, offsets_ptr, psw_ptr,  # batch: (N,) ids, (F*B+1,) offsets, (N,) weights
    weights_ptr,  # flat weight storage
    out_ptr, out_stride,  # (B, total_dim) float32
    feat_meta_ptr,  # (F, 8) int64, see module docstring
    work_feat_ptr, work_b0_ptr,  # (programs,) int32 work list
    B,
    CLASS_MASK: tl.constexpr, LOOP_CLASS: tl.constexpr,  # classes present; the class (or -1) looping over D
    MIN_COLS: tl.constexpr, NUM_CLASSES: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr,
    OUT_ALIGN: tl.constexpr,  # divides out_stride and every feature's first column and dim
    HAS_PSW: tl.constexpr,
):
    pid = tl.program_id(0)
    f = tl.load(work_feat_ptr + pid).to(tl.int64)
    b0 = tl.load(work_b0_ptr + pid)
    meta = feat_meta_ptr + f * 8
    E = tl.multiple_of(tl.load(meta + 0), ALIGN)
    S = tl.multiple_of(tl.load(meta + 1), ALIGN)
    D = tl.multiple_of(tl.load(meta + 2), OUT_ALIGN)
    C = tl.load(meta + 3)
    cls = tl.load(meta + 4)
    for c in tl.static_range(NUM_CLASSES):
        if (CLASS_MASK >> c) & 1:
            if cls == c:
                if c == LOOP_CLASS:
                    for c0 in range(0, D, MIN_COLS << c):
                        _pool_tile(values_ptr, offsets_ptr, psw_ptr, weights_ptr, out_ptr, out_stride,
                                   f, b0, B, E, S, D, C, c0,
                                   MIN_COLS << c, BLOCK_L, BLOCK_N, ALIGN, OUT_ALIGN, HAS_PSW)  # fmt: skip
                else:
                    _pool_tile(values_ptr, offsets_ptr, psw_ptr, weights_ptr, out_ptr, out_stride,
                               f, b0, B, E, S, D, C, 0,
                               MIN_COLS << c, BLOCK_L, BLOCK_N, ALIGN, OUT_ALIGN, HAS_PSW)  # fmt: skip


# ---- launcher --------------------------------------------------------------------------------
def pool(
    values: torch.Tensor,
    offsets: torch.Tensor,
    psw: torch.Tensor | None,
    weights: torch.Tensor,
    feat_meta: torch.Tensor,
    work: tuple[torch.Tensor, torch.Tensor],
    B: int,
    total_dim: int,
    class_mask: int,
    loop_top: bool,
    col_values: Sequence[int],
) -> torch.Tensor:
    """values (N,) int32/int64, offsets (F*B+1,) int32/int64, psw (N,) float32 | None,
    weights flat (E_total,), feat_meta (F, 8) int64, work = (feature, first bag) per program,
    class_mask / loop_top the dim classes present and whether dims exceed the widest, col_values
    every feature's first output column and dim (host ints) -> pooled (B, total_dim) float32."""
    F = feat_meta.shape[0]
    assert values.dim() == 1 and values.is_contiguous() and values.dtype in (torch.int32, torch.int64)
    assert offsets.shape == (F * B + 1,) and offsets.is_contiguous() and offsets.dtype in (torch.int32, torch.int64)
    assert psw is None or (psw.shape == values.shape and psw.dtype == torch.float32 and psw.is_contiguous())
    assert weights.dim() == 1 and weights.dtype in (torch.float32, torch.float16, torch.bfloat16)
    assert feat_meta.shape == (F, FEAT_META_WIDTH) and feat_meta.dtype == torch.int64
    work_feat, work_b0 = work
    assert work_feat.shape == work_b0.shape and work_feat.dtype == work_b0.dtype == torch.int32
    devices = {t.device for t in (values, offsets, weights, feat_meta, work_feat)}
    assert len(devices) == 1, f"pool: tensors on several devices {devices}"
    out = torch.empty(B, total_dim, dtype=torch.float32, device=weights.device)
    if B == 0 or work_feat.numel() == 0:
        return out
    _pool_kernel[(work_feat.numel(),)](
        values, offsets, values if psw is None else psw,
        weights,
        out, out.stride(0),
        feat_meta,
        work_feat, work_b0,
        B,
        CLASS_MASK=class_mask, LOOP_CLASS=NUM_CLASSES - 1 if loop_top else -1,
        MIN_COLS=MIN_COLS, NUM_CLASSES=NUM_CLASSES,
        BLOCK_L=BLOCK_L, BLOCK_N=BLOCK_N, ALIGN=16 // weights.element_size(),
        OUT_ALIGN=column_alignment(col_values, out.stride(0), 4), HAS_PSW=psw is not None,
        num_warps=NUM_WARPS,
    )  # fmt: skip
    return out


def work_list(
    starts: torch.Tensor, n_items: torch.Tensor, per_program: torch.Tensor, total: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Programs over G groups of items, on the device: group g's items [starts[g], starts[g] +
    n_items[g]) in runs of per_program[g]; total = the number of programs (known on the host,
    so nothing here waits for the GPU). Returns (group, first item) per program, int32."""
    dev = starts.device
    counts = (n_items + per_program - 1) // per_program
    ends = torch.cumsum(counts, 0)
    program = torch.arange(total, device=dev)
    # searchsorted, not repeat_interleave: the latter gives each group one CUDA warp, slow for a
    # few groups of many programs
    group = torch.searchsorted(ends, program, right=True)
    first = ends - counts
    start = starts.index_select(0, group) + (program - first.index_select(0, group)) * per_program.index_select(0, group)
    return group.to(torch.int32), start.to(torch.int32)


def pool_work_list(feat_meta: torch.Tensor, feat_classes: list[int], B: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(feature, first bag) of every program: feature f takes ceil(B / bags_per_program) of them."""
    F = len(feat_classes)
    total = sum(-(-B // bags_per_program(c)) for c in feat_classes)
    zeros = torch.zeros(F, dtype=torch.int64, device=feat_meta.device)
    return work_list(zeros, zeros + B, feat_meta[:, 7], total)


# ---- reference -------------------------------------------------------------------------------
def pool_reference(
    values: torch.Tensor,
    offsets: torch.Tensor,
    psw: torch.Tensor | None,
    weights: torch.Tensor,
    feat_meta: torch.Tensor,
    B: int,
    total_dim: int,
) -> torch.Tensor:
    """What ``pool`` computes, in PyTorch over the same storage (float32 accumulation)."""
    out = torch.zeros(B, total_dim, dtype=torch.float32, device=weights.device)
    for f, (E, S, D, C, _cls, _R, rows, _P) in enumerate(feat_meta.tolist()):
        lo, hi = int(offsets[f * B]), int(offsets[(f + 1) * B])
        table = weights.as_strided((rows, D), (S, 1), weights.storage_offset() + E)
        ids = values[lo:hi].to(torch.int64)
        bag_offsets = (offsets[f * B : (f + 1) * B + 1] - lo).to(torch.int64)
        w = None if psw is None else psw[lo:hi]
        gathered = table.index_select(0, ids).to(torch.float32)
        out[:, C : C + D] = torch.nn.functional.embedding_bag(
            torch.arange(hi - lo, device=ids.device), gathered, bag_offsets, mode="sum",
            per_sample_weights=w, include_last_offset=True,
        )  # fmt: skip
    return out
