"""Triton backward of the pooled lookup, fused with the sparse optimizer: no dense gradient, no atomics.

    fused_update(grad_out (B, sum_f D_f), segments)  ->  weights and optimizer state updated in place

Imports triton at module level: only ``triton_backend.py`` imports this file, lazily.

Row gradient. Row u of a table receives psw_i * grad_out[b_i, C_f_i : C_f_i + D] from every id i
of the batch that names it. ``plan_segments`` (host side, torch ops) turns the batch into a
segment list: ids keyed by global row (table row base + id), stably sorted, cut into runs of one
row (torch.sort + unique_consecutive). The sort is stable and every sum below has a fixed shape
and order, so a step gives the same bits on every run.

One launch applies the optimizer. Its grid is a work list of (table, first unique row) items;
a program takes ROWS = BLOCK_N // (BLOCK_J * COLS) consecutive unique rows of one table (the
same dim classes as ``triton_forward.py``: a tile of (ROWS, BLOCK_J, COLS) lanes, COLS the
narrowest power of two >= D), sums each row's contributions BLOCK_J at a time, then reads the
rows' weights and state, updates them and writes them back in the same pass:

    sgd              w -= lr*g
    adagrad          s += g*g;  w -= lr*g/(sqrt(s)+eps)
    rowwise_adagrad  m += sum(g*g)/D;  w -= g * lr/(sqrt(m)+eps)   (the whole row is in one
                     program: rows wider than the widest class take two passes over D)
    adam             m1, m2 moved; w -= lr*(m1/bc1)/(sqrt(m2/bc2)+eps), bc = 1-beta^t (host)

with g += weight_decay*w first when weight_decay > 0 (base.py's L2 rule).

Hot rows. With power-law ids one row can take ~10 % of a table's ids; summing that inside one
program would serialise the whole launch behind it. Rows with more than ``hot_threshold``
contributions are pre-summed by a second, small launch into partial sums of ``chunk``
contributions each (one program per chunk and column block); the update kernel then sums the
row's partials, in chunk order, instead of its ids. Still no atomics, still a fixed order.

Stochastic rounding (optional, float16/bfloat16 weights): before the store, uniform random bits
from Philox(seed, element index) are added below the kept mantissa and truncated, so the rounding
is unbiased; the same seed and step give the same bits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import triton
import triton.language as tl

from .triton_forward import MIN_COLS, NUM_CLASSES, column_alignment, work_list

__all__ = ["Segments", "plan_segments", "fused_update", "OPTIMIZER_CODES", "TAB_META_WIDTH"]

OPTIMIZER_CODES: dict[str, int] = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 2, "adam": 3}
TAB_META_WIDTH = 8  # TAB_META[t] = (E, S, D, cls, R, rows, rows per update program, 0)
BLOCK_N = 1024  # lanes per update tile; >= BLOCK_J * widest class
BLOCK_J = 2  # contributions per row loaded per loop iteration
NUM_WARPS = 4
HOT_BLOCK_J = 16  # hot-row partial kernel: contributions per iteration ...
HOT_COLS = 128  # ... and columns per program
HOT_UPDATE_BLOCK_J = 8  # update kernel, hot rows (one per program): partials per iteration ...
HOT_UPDATE_COLS = 128  # ... and columns per chunk
# Keep-masks of stochastic rounding: float32 bits that survive in float16 / bfloat16.
_SR_KEEP: dict[torch.dtype, int] = {torch.float16: -(1 << 13), torch.bfloat16: -(1 << 16)}


def rows_per_program(cls: int) -> int:
    return BLOCK_N // (BLOCK_J * (MIN_COLS << cls))


# ---- kernels ---------------------------------------------------------------------------------
@triton.jit
def _ids_grad(
    c0, cols, col_ok,  # column chunk [c0, c0+COLS) and its mask (< D)
    sb, cnt, max_cnt,  # (ROWS,) first sorted contribution, count; max count in the tile
    bag_ptr, psw_ptr, feat_col_ptr, grad_ptr, grad_stride, B,
    ROWS: tl.constexpr, BLOCK_J: tl.constexpr, COLS: tl.constexpr, GRAD_ALIGN: tl.constexpr, HAS_PSW: tl.constexpr,
):
    """(ROWS, COLS) float32: each row's sum of psw_i * grad_out[b_i, C_f_i + c0 + cols]."""
    acc = tl.zeros((ROWS, COLS), dtype=tl.float32)
    gcols = c0 + cols
    for j0 in range(0, max_cnt, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        ok = j[None, :] < cnt[:, None]  # (ROWS, BLOCK_J)
        pos = sb[:, None] + j[None, :]
        bag = tl.load(bag_ptr + pos, mask=ok, other=0)
        f = bag // B
        col = tl.load(feat_col_ptr + f, mask=ok, other=0)
        src = (bag - f * B).to(tl.int64) * grad_stride + col  # (ROWS, BLOCK_J) grad row start
        src = tl.multiple_of(src, [GRAD_ALIGN, GRAD_ALIGN])
        g = tl.load(
            grad_ptr + src[:, :, None] + gcols[None, None, :], mask=ok[:, :, None] & col_ok[None, None, :], other=0.0
        ).to(tl.float32)
        if HAS_PSW:
            g = g * tl.load(psw_ptr + pos, mask=ok, other=0.0)[:, :, None]
        acc += tl.sum(g, axis=1)  # fixed-shape tree, then a fixed loop order: deterministic
    return acc


@triton.jit
def _parts_grad(
    c0, cols, col_ok, pb, pc, max_pc,  # (ROWS,) first partial sum, count; max count
    part_ptr, part_stride,
    ROWS: tl.constexpr, BLOCK_J: tl.constexpr, COLS: tl.constexpr,
):
    """(ROWS, COLS) float32: each hot row's sum of its partial sums, in chunk order."""
    acc = tl.zeros((ROWS, COLS), dtype=tl.float32)
    for p0 in range(0, max_pc, BLOCK_J):
        p = p0 + tl.arange(0, BLOCK_J)
        ok = p[None, :] < pc[:, None]
        src = (pb[:, None] + p[None, :]) * part_stride
        acc += tl.sum(
            tl.load(part_ptr + src[:, :, None] + (c0 + cols)[None, None, :],
                    mask=ok[:, :, None] & col_ok[None, None, :], other=0.0),
            axis=1,
        )  # fmt: skip
    return acc


@triton.jit
def _stochastic_round(w, seed, offs, KEEP: tl.constexpr):
    """float32 w -> float32 holding a value of the narrower type, rounded stochastically."""
    bits = w.to(tl.int32, bitcast=True)
    noise = tl.randint(seed, offs).to(tl.int32, bitcast=True) & (-KEEP - 1)
    return ((bits + noise) & KEEP).to(tl.float32, bitcast=True)


@triton.jit
def _round_nearest_bf16(w):
    """float32 -> float32 holding the nearest bfloat16 (ties to even). The cast alone would do on
    the GPU, but Triton's interpreter truncates float32 -> bfloat16: rounding here keeps both exact."""
    bits = w.to(tl.int32, bitcast=True)
    bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _row_grad(
    c0, sb, cnt, max_cnt, D,
    bag_ptr, psw_ptr, feat_col_ptr, grad_ptr, grad_stride, B, part_ptr, part_stride,
    ROWS: tl.constexpr, BLOCK_J: tl.constexpr, COLS: tl.constexpr, GRAD_ALIGN: tl.constexpr, HAS_PSW: tl.constexpr,
    FROM_PARTS: tl.constexpr,
):
    """(ROWS, COLS) summed gradient of columns [c0, c0+COLS); FROM_PARTS: (sb, cnt) index partials."""
    cols = tl.arange(0, COLS)
    if FROM_PARTS:
        g = _parts_grad(c0, cols, (c0 + cols) < D, sb, cnt, max_cnt, part_ptr, part_stride, ROWS, BLOCK_J, COLS)
    else:
        g = _ids_grad(c0, cols, (c0 + cols) < D, sb, cnt, max_cnt, bag_ptr, psw_ptr, feat_col_ptr, grad_ptr,
                      grad_stride, B, ROWS, BLOCK_J, COLS, GRAD_ALIGN, HAS_PSW)  # fmt: skip
    return g


@triton.jit
def _update_chunk(
    c0, scale,  # column chunk; rowwise_adagrad's per-row lr/(sqrt(m)+eps) when already known
    base, key, row_ok, D, S,  # (ROWS,) first element, global row, mask; table dim and stride
    sb, cnt, max_cnt,
    bag_ptr, psw_ptr, feat_col_ptr, grad_ptr, grad_stride, B, part_ptr, part_stride,
    weights_ptr, st1_ptr, st2_ptr,
    lr, eps, wd, b1, b2, omb1, omb2, bc1, bc2, seed,
    OPT: tl.constexpr, SUMSQ_HERE: tl.constexpr, HAS_WD: tl.constexpr, SR_KEEP: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_J: tl.constexpr, COLS: tl.constexpr, ALIGN: tl.constexpr, GRAD_ALIGN: tl.constexpr,
    HAS_PSW: tl.constexpr, FROM_PARTS: tl.constexpr,
):
    """Sum, update and store columns [c0, c0+COLS) of ROWS rows."""
    g = _row_grad(c0, sb, cnt, max_cnt, D, bag_ptr, psw_ptr, feat_col_ptr, grad_ptr, grad_stride, B,
                  part_ptr, part_stride, ROWS, BLOCK_J, COLS, GRAD_ALIGN, HAS_PSW, FROM_PARTS)  # fmt: skip
    cols = tl.arange(0, COLS)
    row0 = tl.multiple_of(base + c0, ALIGN)
    offs = row0[:, None] + cols[None, :]  # (ROWS, COLS) element index
    ok = row_ok[:, None] & ((c0 + cols) < S)[None, :]  # padding columns have g = 0: left as they are
    # Every load of this chunk comes before the barrier, every store after it. A value held by
    # several threads (a (ROWS,) row state, a tile narrower than the program's threads) is loaded
    # by each of them and stored by one: without the barrier a slower warp could load what a
    # faster one already stored and update the row twice (seen on an H100: hot rows moved by
    # lr/sqrt(2m) instead of lr/sqrt(m) in some column chunks).
    w = tl.load(weights_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    if OPT == 1:
        s_old = tl.load(st1_ptr + offs, mask=ok, other=0.0)
    elif OPT == 2:
        if SUMSQ_HERE:
            m_old = tl.load(st1_ptr + key, mask=row_ok, other=0.0)
    elif OPT == 3:
        m1_old = tl.load(st1_ptr + offs, mask=ok, other=0.0)
        m2_old = tl.load(st2_ptr + offs, mask=ok, other=0.0)
    tl.debug_barrier()
    if HAS_WD:
        g = g + wd * w
    if OPT == 0:  # sgd
        w = w - lr * g
    elif OPT == 1:  # adagrad
        s = s_old + g * g
        tl.store(st1_ptr + offs, s, mask=ok)
        w = w - lr * g / (tl.sqrt_rn(s) + eps)
    elif OPT == 2:  # rowwise_adagrad
        if SUMSQ_HERE:  # the whole row is this chunk
            m = m_old + tl.sum(g * g, axis=1) / D.to(tl.float32)
            tl.store(st1_ptr + key, m, mask=row_ok)
            scale = lr / (tl.sqrt_rn(m) + eps)
        w = w - g * scale[:, None]
    else:  # adam
        m1 = b1 * m1_old + omb1 * g
        m2 = b2 * m2_old + omb2 * g * g
        tl.store(st1_ptr + offs, m1, mask=ok)
        tl.store(st2_ptr + offs, m2, mask=ok)
        w = w - lr * (m1 / bc1) / (tl.sqrt_rn(m2 / bc2) + eps)
    if SR_KEEP != 0:
        w = _stochastic_round(w, seed, offs, SR_KEEP)
    elif weights_ptr.dtype.element_ty == tl.bfloat16:
        w = _round_nearest_bf16(w)
    tl.store(weights_ptr + offs, w.to(weights_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _update_rows(
    u0, u1, E, S, D, R,  # this program's unique rows [u0, min(u0+ROWS, u1)) of one table
    uniq_ptr, seg_ptr, part_index_ptr,
    bag_ptr, psw_ptr, feat_col_ptr, grad_ptr, grad_stride, B, part_ptr, part_stride,
    weights_ptr, st1_ptr, st2_ptr,
    lr, eps, wd, b1, b2, omb1, omb2, bc1, bc2, seed,
    OPT: tl.constexpr, HAS_WD: tl.constexpr, SR_KEEP: tl.constexpr, LOOP_D: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_J: tl.constexpr, COLS: tl.constexpr, ALIGN: tl.constexpr, GRAD_ALIGN: tl.constexpr,
    HAS_PSW: tl.constexpr, HAS_HOT: tl.constexpr, FROM_PARTS: tl.constexpr,
):
    """Update ROWS rows: their ids' gradients (FROM_PARTS=False; hot rows are skipped) or, for
    hot rows, their partial sums (FROM_PARTS=True)."""
    u = u0 + tl.arange(0, ROWS)
    row_ok = u < u1
    key = tl.load(uniq_ptr + u, mask=row_ok, other=0).to(tl.int64)  # global row
    base = tl.multiple_of(E + (key - R) * S, ALIGN)
    if FROM_PARTS:
        sb = tl.load(part_index_ptr + u, mask=row_ok, other=0)
        cnt = (tl.load(part_index_ptr + u + 1, mask=row_ok, other=0) - sb).to(tl.int32)
    else:
        sb = tl.load(seg_ptr + u, mask=row_ok, other=0)
        cnt = (tl.load(seg_ptr + u + 1, mask=row_ok, other=0) - sb).to(tl.int32)
        if HAS_HOT:  # hot rows have their own programs
            pc = tl.load(part_index_ptr + u + 1, mask=row_ok, other=0)
            pc -= tl.load(part_index_ptr + u, mask=row_ok, other=0)
            row_ok = row_ok & (pc == 0)
            cnt = tl.where(row_ok, cnt, 0)
    max_cnt = tl.max(cnt, axis=0)
    if LOOP_D:  # D may exceed COLS: walk the row in column chunks
        scale = tl.zeros((ROWS,), dtype=tl.float32)
        if OPT == 2:  # rowwise_adagrad: a first pass for mean(g*g) over the whole row
            cols = tl.arange(0, COLS)
            m_old = tl.load(st1_ptr + key, mask=row_ok, other=0.0)
            sumsq = tl.zeros((ROWS,), dtype=tl.float32)
            for c0 in range(0, D, COLS):
                g = _row_grad(c0, sb, cnt, max_cnt, D, bag_ptr, psw_ptr, feat_col_ptr, grad_ptr, grad_stride, B,
                              part_ptr, part_stride, ROWS, BLOCK_J, COLS, GRAD_ALIGN, HAS_PSW, FROM_PARTS)  # fmt: skip
                if HAS_WD:
                    w_ok = row_ok[:, None] & ((c0 + cols) < D)[None, :]
                    w = tl.load(weights_ptr + base[:, None] + c0 + cols[None, :], mask=w_ok, other=0.0)
                    g = g + wd * w.to(tl.float32)
                sumsq += tl.sum(g * g, axis=1)
            m = m_old + sumsq / D.to(tl.float32)
            tl.debug_barrier()  # every thread has read m_old (see _update_chunk)
            tl.store(st1_ptr + key, m, mask=row_ok)
            scale = lr / (tl.sqrt_rn(m) + eps)
        for c0 in range(0, D, COLS):
            _update_chunk(c0, scale, base, key, row_ok, D, S, sb, cnt, max_cnt,
                          bag_ptr, psw_ptr, feat_col_ptr, grad_ptr, grad_stride, B, part_ptr, part_stride,
                          weights_ptr, st1_ptr, st2_ptr, lr, eps, wd, b1, b2, omb1, omb2, bc1, bc2, seed,
                          OPT, False, HAS_WD, SR_KEEP, ROWS, BLOCK_J, COLS, ALIGN, GRAD_ALIGN,
                          HAS_PSW, FROM_PARTS)  # fmt: skip
    else:
        _update_chunk(0, lr, base, key, row_ok, D, S, sb, cnt, max_cnt,
                      bag_ptr, psw_ptr, feat_col_ptr, grad_ptr, grad_stride, B, part_ptr, part_stride,
                      weights_ptr, st1_ptr, st2_ptr, lr, eps, wd, b1, b2, omb1, omb2, bc1, bc2, seed,
                      OPT, True, HAS_WD, SR_KEEP, ROWS, BLOCK_J, COLS, ALIGN, GRAD_ALIGN,
                      HAS_PSW, FROM_PARTS)  # fmt: skip


@triton.jit
def _update_kernel(
    uniq_ptr, seg_ptr, part_index_ptr,  # (U,) global rows; (U+1,) contribution runs; (U+1,) partial runs
    bag_ptr, psw_ptr,  # (N,) bag of each sorted contribution, its weight
    grad_ptr, grad_stride, B, feat_col_ptr,  # (B, total_dim) output gradient; (F,) first column of f
    part_ptr, part_stride,  # (P, PW) hot-row partial sums
    weights_ptr, st1_ptr, st2_ptr,  # storage: weights; state (sum | momentum | exp_avg), (exp_avg_sq)
    tab_meta_ptr, tab_u_ptr,  # (T, 8) table metadata; (T+1,) unique-row range of each table
    work_tab_ptr, work_u0_ptr, n_tiles,  # work list: n_tiles row tiles, then one program per hot row
    lr, eps, wd, b1, b2, omb1, omb2, bc1, bc2, seed,  # optimizer scalars (omb = 1 - beta)
    OPT: tl.constexpr, HAS_WD: tl.constexpr, SR_KEEP: tl.constexpr,  # SR_KEEP 0: round to nearest
    CLASS_MASK: tl.constexpr, LOOP_CLASS: tl.constexpr, MIN_COLS: tl.constexpr, NUM_CLASSES: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr, ALIGN: tl.constexpr,
    GRAD_ALIGN: tl.constexpr,  # divides grad_stride and every feature's first column and dim
    HOT_BLOCK_J: tl.constexpr, HOT_COLS: tl.constexpr,
    HAS_PSW: tl.constexpr, HAS_HOT: tl.constexpr,
):
    pid = tl.program_id(0)
    t = tl.load(work_tab_ptr + pid).to(tl.int64)
    u0 = tl.load(work_u0_ptr + pid)
    meta = tab_meta_ptr + t * 8
    E = tl.multiple_of(tl.load(meta + 0), ALIGN)
    S = tl.multiple_of(tl.load(meta + 1), ALIGN)
    D = tl.multiple_of(tl.load(meta + 2), GRAD_ALIGN)
    cls = tl.load(meta + 3)
    R = tl.load(meta + 4)
    if pid < n_tiles:
        u1 = tl.load(tab_u_ptr + t + 1)
        for c in tl.static_range(NUM_CLASSES):
            if (CLASS_MASK >> c) & 1:
                if cls == c:
                    _update_rows(u0, u1, E, S, D, R, uniq_ptr, seg_ptr, part_index_ptr,
                                 bag_ptr, psw_ptr, feat_col_ptr, grad_ptr, grad_stride, B, part_ptr, part_stride,
                                 weights_ptr, st1_ptr, st2_ptr, lr, eps, wd, b1, b2, omb1, omb2, bc1, bc2, seed,
                                 OPT, HAS_WD, SR_KEEP, c == LOOP_CLASS, BLOCK_N // (BLOCK_J * (MIN_COLS << c)),
                                 BLOCK_J, MIN_COLS << c, ALIGN, GRAD_ALIGN, HAS_PSW, HAS_HOT, False)  # fmt: skip
    else:
        if HAS_HOT:  # one hot row: sum its partials
            _update_rows(u0, u0 + 1, E, S, D, R, uniq_ptr, seg_ptr, part_index_ptr,
                         bag_ptr, psw_ptr, feat_col_ptr, grad_ptr, grad_stride, B, part_ptr, part_stride,
                         weights_ptr, st1_ptr, st2_ptr, lr, eps, wd, b1, b2, omb1, omb2, bc1, bc2, seed,
                         OPT, HAS_WD, SR_KEEP, True, 1, HOT_BLOCK_J, HOT_COLS, ALIGN, GRAD_ALIGN,
                         HAS_PSW, HAS_HOT, True)  # fmt: skip


@triton.jit
def _hot_partial_kernel(
    chunk_u_ptr, chunk_j0_ptr, chunk_dim_ptr,  # (P,) row, first contribution, dim of each chunk
    seg_ptr, bag_ptr, psw_ptr, feat_col_ptr, grad_ptr, grad_stride, B,
    part_ptr, part_stride,  # (P, PW) out
    CHUNK,
    BLOCK_J: tl.constexpr, COLS: tl.constexpr, GRAD_ALIGN: tl.constexpr, HAS_PSW: tl.constexpr,
):
    """Partial sum of one chunk of one hot row's contributions, columns [pid1*COLS, +COLS)."""
    p = tl.program_id(0)
    c0 = tl.program_id(1) * COLS
    D = tl.multiple_of(tl.load(chunk_dim_ptr + p), GRAD_ALIGN)
    if c0 < D:
        u = tl.load(chunk_u_ptr + p).to(tl.int64)
        sb = tl.load(seg_ptr + u) + tl.load(chunk_j0_ptr + p)
        cnt = tl.minimum(tl.load(seg_ptr + u + 1) - sb, CHUNK).to(tl.int32)
        cols = c0 + tl.arange(0, COLS)
        col_ok = cols < D
        acc = tl.zeros((BLOCK_J, COLS), dtype=tl.float32)
        for j0 in range(0, cnt, BLOCK_J):
            j = j0 + tl.arange(0, BLOCK_J)
            ok = j < cnt
            bag = tl.load(bag_ptr + sb + j, mask=ok, other=0)
            f = bag // B
            col = tl.load(feat_col_ptr + f, mask=ok, other=0)
            src = tl.multiple_of((bag - f * B).to(tl.int64) * grad_stride + col, GRAD_ALIGN)
            g = tl.load(grad_ptr + src[:, None] + cols[None, :], mask=ok[:, None] & col_ok[None, :], other=0.0)
            g = g.to(tl.float32)
            if HAS_PSW:
                g = g * tl.load(psw_ptr + sb + j, mask=ok, other=0.0)[:, None]
            acc += g
        tl.store(part_ptr + p.to(tl.int64) * part_stride + cols, tl.sum(acc, axis=0), mask=col_ok)


# ---- host side: segments and launch -----------------------------------------------------------
@dataclass
class Segments:
    """A batch's contributions grouped by row (see the module docstring)."""

    uniq: torch.Tensor  # (U,) int32/int64 global row of each touched row, ascending
    seg: torch.Tensor  # (U+1,) int64 contributions of row u: [seg[u], seg[u+1]) of the sorted order
    bag: torch.Tensor  # (N,) int32 bag (f*B + b) of each sorted contribution
    psw: torch.Tensor | None  # (N,) float32 its weight
    tab_u: torch.Tensor  # (T+1,) int64 table t's rows are uniq[tab_u[t]:tab_u[t+1]]
    tab_u_host: list[int]
    # hot rows (None when there are none)
    part_index: torch.Tensor | None = None  # (U+1,) int64 partials of row u: [part_index[u], part_index[u+1])
    hot_rows: torch.Tensor | None = None  # (H,) int64 the hot rows (indices into uniq) ...
    hot_tab: torch.Tensor | None = None  # (H,) int64 ... and their tables
    chunk_u: torch.Tensor | None = None  # (P,) int64 row of partial p
    chunk_j0: torch.Tensor | None = None  # (P,) int64 its first contribution, relative to seg[u]
    chunk_dim: torch.Tensor | None = None  # (P,) int64 its table's dim
    chunk: int = 0  # contributions per partial


def _scatter_firsts(flag: torch.Tensor, rank: torch.Tensor, size: int, fill: int) -> torch.Tensor:
    """(size,) int64: out[rank[i] - 1] = i for every i with flag[i] (rank = cumsum(flag)), ``fill``
    elsewhere. Like ``nonzero`` but sized by the caller, so nothing waits for the GPU; one
    scatter with distinct targets (unflagged entries land in a scratch half), so no write races."""
    n = flag.numel()
    idx = torch.arange(n, device=flag.device)
    buf = torch.empty(size + n, dtype=torch.int64, device=flag.device)
    buf[:size].fill_(fill)
    buf.index_put_((torch.where(flag, rank - 1, idx + size),), idx)
    return buf[:size]


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


@torch.no_grad()
def plan_segments(
    values: torch.Tensor,
    offsets: torch.Tensor,
    psw: torch.Tensor | None,
    B: int,
    feat_row_base: torch.Tensor,
    tab_row_base: torch.Tensor,
    tab_dim: torch.Tensor,
    total_rows: int,
    hot_threshold: int,
    hot_chunk: int,
) -> Segments:
    """Group a feature-major batch's ids by global row. feat_row_base (F,) int64 first global row
    of each feature's table; tab_row_base (T+1,) int64 table row ranges; tab_dim (T,) int64.

    One host sync: a single read of (U, each table's first unique row, the largest count, the
    number of hot rows), all computed over the sorted ids before any tensor of size U exists;
    the rest is sized from it (``_scatter_firsts``) or bounded (the hot partial list, below)."""
    F, N = feat_row_base.numel(), values.numel()
    T = tab_dim.numel()
    dev = values.device
    lengths = offsets[1:] - offsets[:-1]  # (F*B,)
    bag = torch.repeat_interleave(torch.arange(F * B, dtype=torch.int32, device=dev), lengths, output_size=N)
    # each id's feature from its bag (bag // B), not repeat_interleave over F features: torch's CUDA
    # repeat_interleave gives each group one warp, so F groups of ~N/F ids ran ~1 ms on an H100
    keys = values.to(torch.int64) + feat_row_base.index_select(0, bag // B)
    if total_rows < 2**31:
        keys = keys.to(torch.int32)  # half the sort's key bytes
    sorted_keys, order = torch.sort(keys, stable=True)  # stable: a fixed summation order per row
    if N == 0:
        z = torch.zeros(T + 1, dtype=torch.int64, device=dev)
        return Segments(sorted_keys, z[:1], bag, psw, z, [0] * (T + 1))
    new = torch.ones(N, dtype=torch.bool, device=dev)  # first id of its row's run
    torch.ne(sorted_keys[1:], sorted_keys[:-1], out=new[1:])
    run_of = torch.cumsum(new, 0)  # 1-based run (unique row) of each sorted id
    # starts[r] = first sorted position of run r; N for r >= U (so starts[U] closes the last run)
    starts = _scatter_firsts(new, run_of, N + 1, N)
    counts_all = starts[1:] - starts[:-1]  # (N,) each run's count; 0 past U
    # table t's first unique row = the number of runs before its first sorted id
    first_pos = torch.searchsorted(sorted_keys, tab_row_base.to(sorted_keys.dtype))
    tab_u = torch.where(first_pos > 0, run_of.index_select(0, (first_pos - 1).clamp(min=0)), 0)
    stats = torch.cat([run_of[-1:], tab_u, counts_all.max().view(1), (counts_all > hot_threshold).sum().view(1)])
    stats = stats.tolist()  # the one host sync
    U, tab_u_host, max_count, H = stats[0], stats[1 : T + 2], stats[T + 2], stats[T + 3]
    seg = starts[: U + 1]
    counts = counts_all[:U]
    uniq = sorted_keys.index_select(0, seg[:-1])
    s = Segments(uniq, seg, bag.index_select(0, order), None if psw is None else psw.index_select(0, order),
                 tab_u, tab_u_host)  # fmt: skip
    if H:
        hot_flag = counts > hot_threshold
        hot = _scatter_firsts(hot_flag, torch.cumsum(hot_flag, 0), H, 0)
        hot_counts = counts.index_select(0, hot)
        # ~sqrt(count) partials of ~sqrt(count) ids: neither launch waits long on the hottest row.
        s.chunk = max(hot_chunk, _next_pow2(math.isqrt(4 * max_count)))
        n_chunks = (hot_counts + s.chunk - 1) // s.chunk
        per_row = torch.zeros(U, dtype=torch.int64, device=dev)
        per_row[hot] = n_chunks
        s.part_index = torch.zeros(U + 1, dtype=torch.int64, device=dev)
        torch.cumsum(per_row, 0, out=s.part_index[1:])
        # The partial count P = sum ceil(count / chunk) is not read back: it is at most
        # N // chunk + H, and the partials past P get dim 0 (their programs do nothing).
        P_max = N // s.chunk + H
        hot_end = torch.cumsum(n_chunks, 0)  # (H,) one past each hot row's last partial
        p = torch.arange(P_max, device=dev)
        k = torch.searchsorted(hot_end, p, right=True)  # hot row of partial p; H past the end
        valid = k < H
        k = k.clamp(max=H - 1)
        s.chunk_u = hot.index_select(0, k)
        s.chunk_j0 = (p - (hot_end - n_chunks).index_select(0, k)) * s.chunk
        s.hot_rows = hot
        s.hot_tab = torch.searchsorted(tab_u, hot, right=True) - 1
        s.chunk_dim = torch.where(valid, tab_dim.index_select(0, s.hot_tab.index_select(0, k)), 0)
    return s


def update_work_list(
    s: Segments, tab_meta: torch.Tensor, tab_classes: list[int]
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(table, first unique row) of every update program: the row tiles, then one per hot row;
    and the number of row tiles. Built on the device: no host sync."""
    per = [rows_per_program(c) for c in tab_classes]
    n_tiles = sum(-(-(b - a) // p) for a, b, p in zip(s.tab_u_host[:-1], s.tab_u_host[1:], per))
    tab, u0 = work_list(s.tab_u[:-1], s.tab_u[1:] - s.tab_u[:-1], tab_meta[:, 6], n_tiles)
    if s.hot_rows is not None:
        assert s.hot_tab is not None
        tab = torch.cat([tab, s.hot_tab.to(torch.int32)])
        u0 = torch.cat([u0, s.hot_rows.to(torch.int32)])
    return tab, u0, n_tiles


def fused_update(
    grad_out: torch.Tensor,
    s: Segments,
    B: int,
    feat_col: torch.Tensor,
    col_values: Sequence[int],
    weights: torch.Tensor,
    state: tuple[torch.Tensor | None, torch.Tensor | None],
    tab_meta: torch.Tensor,
    tab_classes: list[int],
    max_dim: int,
    kind: str,
    lr: float,
    eps: float,
    weight_decay: float,
    betas: tuple[float, float],
    step: int,
    sr_seed: int | None,
) -> None:
    """grad_out (B, total_dim) float; s the batch's segments; feat_col (F,) int64 first output
    column per feature; col_values every feature's first column and dim (host ints, for the
    vector-width hint); weights flat; state (st1, st2) flat float32, None where the optimizer has
    none; tab_meta (T, 8) int64; tab_classes the tables' dim classes; max_dim the widest table.
    Updates weights and state in place."""
    T = tab_meta.shape[0]
    assert grad_out.dim() == 2 and grad_out.shape[0] == B and grad_out.stride(1) == 1
    assert grad_out.dtype in (torch.float32, torch.float16, torch.bfloat16)
    assert tab_meta.shape == (T, TAB_META_WIDTH) and tab_meta.dtype == torch.int64 and len(tab_classes) == T
    assert feat_col.dtype == torch.int64 and weights.dim() == 1
    assert s.seg.dtype == torch.int64 and s.bag.dtype == torch.int32 and s.tab_u.shape == (T + 1,)
    assert s.psw is None or (s.psw.dtype == torch.float32 and s.psw.shape == s.bag.shape)
    st1, st2 = state
    code = OPTIMIZER_CODES[kind]
    assert (st1 is None) == (code == 0) and (st2 is None) == (code != 3), f"{kind}: wrong state buffers"
    for x in (grad_out, s.uniq, s.bag, feat_col, weights, tab_meta):
        assert x.device == weights.device, f"fused_update: {x.device} vs {weights.device}"
    if s.uniq.numel() == 0:
        return
    sr_keep = 0
    if sr_seed is not None:
        assert weights.dtype in _SR_KEEP, f"stochastic rounding needs float16/bfloat16 weights, not {weights.dtype}"
        sr_keep = _SR_KEEP[weights.dtype]
    grad_align = column_alignment(col_values, grad_out.stride(0), 16 // grad_out.element_size())
    part = grad_out  # any pointer when there are no hot rows
    if s.part_index is not None:
        assert s.chunk_u is not None and s.chunk_j0 is not None and s.chunk_dim is not None
        part = torch.empty(s.chunk_u.numel(), max_dim, dtype=torch.float32, device=weights.device)
        cols = min(HOT_COLS, _next_pow2(max_dim))
        _hot_partial_kernel[(s.chunk_u.numel(), triton.cdiv(max_dim, cols))](
            s.chunk_u, s.chunk_j0, s.chunk_dim,
            s.seg, s.bag, s.bag if s.psw is None else s.psw, feat_col, grad_out, grad_out.stride(0), B,
            part, part.stride(0),
            s.chunk,
            BLOCK_J=HOT_BLOCK_J, COLS=cols, GRAD_ALIGN=grad_align, HAS_PSW=s.psw is not None,
            num_warps=NUM_WARPS,
        )  # fmt: skip
    work_tab, work_u0, n_tiles = update_work_list(s, tab_meta, tab_classes)
    class_mask = sum(1 << c for c in set(tab_classes))
    b1, b2 = betas
    _update_kernel[(work_tab.numel(),)](
        s.uniq, s.seg, s.seg if s.part_index is None else s.part_index,
        s.bag, s.bag if s.psw is None else s.psw,
        grad_out, grad_out.stride(0), B, feat_col,
        part, part.stride(0),
        weights, weights if st1 is None else st1, weights if st2 is None else st2,
        tab_meta, s.tab_u,
        work_tab, work_u0, n_tiles,
        lr, eps, weight_decay, b1, b2, 1.0 - b1, 1.0 - b2, 1.0 - b1**step, 1.0 - b2**step, sr_seed or 0,
        OPT=code, HAS_WD=weight_decay > 0, SR_KEEP=sr_keep,
        CLASS_MASK=class_mask, LOOP_CLASS=NUM_CLASSES - 1 if max_dim > (MIN_COLS << (NUM_CLASSES - 1)) else -1,
        MIN_COLS=MIN_COLS, NUM_CLASSES=NUM_CLASSES,
        BLOCK_N=BLOCK_N, BLOCK_J=BLOCK_J, ALIGN=16 // weights.element_size(),
        GRAD_ALIGN=grad_align, HOT_BLOCK_J=HOT_UPDATE_BLOCK_J, HOT_COLS=HOT_UPDATE_COLS,
        HAS_PSW=s.psw is not None, HAS_HOT=s.part_index is not None,
        num_warps=NUM_WARPS,
    )  # fmt: skip
