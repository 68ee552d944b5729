"""Resharding: a checkpoint is blocks of logical tables, whatever plan wrote it, and a rank of any
later plan assembles its shards from the blocks they overlap.

DCP holds plain tensors only (no DTensor or ShardedTensor), under keys that do not depend on
the plan that wrote them (a block is rows [r0, r1) x columns [c0, c1) of a logical table):

    tables/<t>/weight/<r0>-<r1>x<c0>-<c1>       (rows, cols)
    tables/<t>/<state>/<r0>-<r1>x<c0>-<c1>      optimizer state: (rows, cols) per element (AdaGrad
                                                sum, Adam moments), (rows,) for row-wise
                                                AdaGrad's momentum
    tables/<t>/fused_step/<r0>-<r1>x<c0>-<c1>   (1,) int64: the fused-update counter of the
                                                kernel that held the block
    dense/<name>, dense_optim/<param>/<key>     the DLRM's dense part and its optimizer (rank 0)

Blocks are the saving plan's shards cut into row chunks of at most ``max_block_bytes``; each is
written by the rank holding it (a replicated table by its lowest rank), so no rank holds more
than its own shards. To load, a rank reads only the blocks overlapping its new shards (DCP with
``no_dist``: no collective) and copies the overlaps in:

    weights, per-element state   exact, whatever the old and new plans
    row-wise AdaGrad momentum    row i of a new shard with columns [c, d) gets, over the old blocks
                                 holding row i, the sum of (overlap width / (d - c)) x their
                                 momentum. A column shard of width w accumulates the mean over its
                                 w columns of g^2, so this overlap-weighted mean is exact (up to
                                 rounding) whenever the new columns are a union of old column
                                 ranges: between non-column-wise types (a copy), between equal
                                 column splits, from column-wise to whole rows. Splitting an old
                                 column shard assumes its g^2 was spread evenly over its columns.
    fused-update counter         a kernel takes the largest counter among the blocks it read
                                 (every kernel counts one update per step, so they agree)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from ...kernels import FusedEmbeddingBag
from ...sharding.collection import HOT_SUFFIX, ShardedEmbeddingBagCollection
from ...planning.plan import Shard, ShardingPlan
from .files import CheckpointError

if TYPE_CHECKING:
    from ..trainer import Trainer

MAX_BLOCK_BYTES = 64 << 20  # a saved block's largest size: shards are cut into row chunks of at most this
Block = tuple[int, int, int, int]  # rows [r0, r1) x columns [c0, c1) of a logical table


# ---- what a rank holds ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _LocalShard:
    table: str
    shard: Shard
    kernel: FusedEmbeddingBag
    index: int  # the shard's table index inside its kernel

    @property
    def block(self) -> Block:
        s = self.shard
        return (s.row_start, s.row_end, s.col_start, s.col_end)


@dataclass(frozen=True)
class _View:
    plan: ShardingPlan
    shards: list[_LocalShard]
    dlrm: nn.Module


def _view(trainer: "Trainer") -> _View:
    """The trainer's plan, local shards and DLRM; an unsharded trainer is rank 0 holding every table."""
    emb = trainer.model.embeddings
    if isinstance(emb, ShardedEmbeddingBagCollection):
        # hot-row replicas are not saved: their rows are written back to the owners first
        # (save_checkpoint) and gathered from them again after a load
        emb.hot_write_back()
        shards = [_LocalShard(n, s, k, i) for g in emb.groups.values() for n, s, k, i in g.local_shards()
                  if not n.endswith(HOT_SUFFIX)]  # fmt: skip
        return _View(emb.plan, shards, trainer.model.module)
    plan = ShardingPlan.uniform(trainer.cfg.model, "table_wise", 1, 1)
    shards = [_LocalShard(t.name, plan[t.name].shards[0], emb.kernel, i) for i, t in enumerate(emb.tables)]
    return _View(plan, shards, trainer.model)


def _blocks(plan: ShardingPlan, table: str, max_bytes: int) -> dict[Block, tuple[int, Block]]:
    """The saved blocks of a table -> (the rank writing it, the shard it is cut from)."""
    out: dict[Block, tuple[int, Block]] = {}
    for s in plan[table].shards:
        chunk = max(1, max_bytes // (4 * s.cols))  # rows per block (float32)
        for r0 in range(s.row_start, s.row_end, chunk):
            b = (r0, min(r0 + chunk, s.row_end), s.col_start, s.col_end)
            if b not in out or s.rank < out[b][0]:
                out[b] = (s.rank, (s.row_start, s.row_end, s.col_start, s.col_end))
    return out


def _key(table: str, field: str, b: Block) -> str:
    return f"tables/{table}/{field}/{b[0]}-{b[1]}x{b[2]}-{b[3]}"


def _dense_state(dlrm: nn.Module) -> dict[str, torch.Tensor]:
    """The dense parameters and persistent buffers (views: copying into them restores them)."""
    return {k: v for k, v in dlrm.state_dict().items() if not k.startswith("embeddings.")}


# ---- save: the blocks a rank writes ---------------------------------------------------------------
def _local_tensors(trainer: "Trainer", view: _View, max_bytes: int) -> dict[str, torch.Tensor]:
    """This rank's DCP entries: the blocks it writes; rank 0 adds the dense part and optimizer."""
    out: dict[str, torch.Tensor] = {}
    for ls in view.shards:
        blocks = _blocks(view.plan, ls.table, max_bytes)
        mine = [b for b, (r, parent) in blocks.items() if parent == ls.block and r == trainer.rank]
        if not mine:
            continue  # a replica another rank writes
        weight = ls.kernel.get_table(ls.index).cpu()
        state = {k: v.cpu() for k, v in ls.kernel.get_state(ls.index).items()}
        step = torch.tensor([ls.kernel.optimizer_step], dtype=torch.int64)
        for b in mine:
            rows = slice(b[0] - ls.block[0], b[1] - ls.block[0])
            for name, v in (("weight", weight), *state.items()):
                out[_key(ls.table, name, b)] = v if b == ls.block else v[rows].clone()  # no view of a bigger storage
            out[_key(ls.table, "fused_step", b)] = step
    if trainer.rank == 0:
        for k, v in _dense_state(view.dlrm).items():
            out[f"dense/{k}"] = v.detach().cpu().clone()
        for idx, st in trainer.optimizer.state_dict()["state"].items():
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    out[f"dense_optim/{idx}/{k}"] = v.detach().cpu().clone()
    return out


# ---- load: a new shard from the blocks it overlaps ------------------------------------------------
def _intersect(a: Block, b: Block) -> Block | None:
    r0, r1, c0, c1 = max(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), min(a[3], b[3])
    return (r0, r1, c0, c1) if r0 < r1 and c0 < c1 else None


def _assemble(
    ls: _LocalShard, blocks: list[Block], states: list[str], loaded: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """A new shard's weight (rows, cols), optimizer state and fused-update counter from the saved
    blocks overlapping it (the momentum rule of the module docstring)."""
    n = ls.block
    rows, cols = n[1] - n[0], n[3] - n[2]
    weight = torch.empty(rows, cols)
    covered = torch.zeros(rows, cols, dtype=torch.bool)
    elem = {s: torch.empty(rows, cols) for s in states if s != "momentum"}
    momentum = torch.zeros(rows, dtype=torch.float64) if "momentum" in states else None
    step = 0
    for b in blocks:
        o = _intersect(n, b)
        if o is None:
            continue
        dst = (slice(o[0] - n[0], o[1] - n[0]), slice(o[2] - n[2], o[3] - n[2]))
        src = (slice(o[0] - b[0], o[1] - b[0]), slice(o[2] - b[2], o[3] - b[2]))
        weight[dst] = loaded[_key(ls.table, "weight", b)][src]
        covered[dst] = True
        for s, t in elem.items():
            t[dst] = loaded[_key(ls.table, s, b)][src]
        if momentum is not None:  # this block's share of the new shard's columns
            momentum[dst[0]] += (o[3] - o[2]) / cols * loaded[_key(ls.table, "momentum", b)][src[0]].double()
        step = max(step, int(loaded[_key(ls.table, "fused_step", b)][0]))
    if not bool(covered.all()):
        raise CheckpointError(f"table '{ls.table}': the checkpoint's blocks do not cover the shard {n}")
    if momentum is not None:
        elem["momentum"] = momentum.float()
    return weight, elem, step

