"""The sharded EmbeddingBagCollection: the model's tables spread over ranks by a ShardingPlan.

``forward(sparse)`` takes the rank's local batch (b samples, every feature) and returns pooled
(b, sum_f D_f) in the model's feature order, exactly what the unsharded collection returns for
those samples (as a LazyTensor: the output all-to-all is still in flight until first use).
``input_dist(sparse)`` starts the input dist alone and returns a ``Pending``: the train pipeline
starts the next batch's input dist early and hands ``forward`` the routed ids. Each sharding
type present in the plan is one group with its own three stages; every group's ids travel in
one exchange (``exchange_ids``).

Gradient-scaling convention: every rank's loss is the mean over its b samples; DDP averages dense
gradients over the W ranks, so dense parameters see the gradient of the global mean loss over
W*b samples. The pooled embeddings' gradient is multiplied by 1/W on its way back (ScaleGrad
on each group's lookup output, after the output dist's backward exchange), so the embedding rows see that same global-mean gradient: sharded training over W ranks
with local batch b matches unsharded training on the concatenated W*b batch.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..comm import Communicator, make_codec
from ..comm.awaitable import LazyTensor, Pending
from ..config import ModelConfig, StorageConfig
from ..data.batch import SparseFeatures
from ..kernels import SparseOptimizerSpec
from ..modules.embedding import check_sparse
from .column_wise import ColumnWiseSharding
from .common import EmbeddingSharding, GroupFeature, ShardingContext, exchange_ids
from .data_parallel import DataParallelSharding
from .plan import ShardingPlan, ShardingType
from .row_wise import RowWiseSharding
from .table_column_wise import TableColumnWiseSharding
from .table_row_wise import TableRowWiseSharding
from .table_wise import TableWiseSharding

__all__ = ["ShardedEmbeddingBagCollection", "DistributedSparse", "SHARDING_CLASSES", "config_hash"]

SHARDING_CLASSES: dict[ShardingType, type[EmbeddingSharding]] = {
    ShardingType.TABLE_WISE: TableWiseSharding,
    ShardingType.ROW_WISE: RowWiseSharding,
    ShardingType.COLUMN_WISE: ColumnWiseSharding,
    ShardingType.DATA_PARALLEL: DataParallelSharding,
    ShardingType.TABLE_ROW_WISE: TableRowWiseSharding,
    ShardingType.TABLE_COLUMN_WISE: TableColumnWiseSharding,
}


@dataclass
class DistributedSparse:
    """A local batch's sparse features after input dist: one routed input per sharding group."""

    routed: list[Any]
    batch_size: int


def config_hash(model: ModelConfig, plan: ShardingPlan, extra: dict | None = None) -> str:
    blob = json.dumps({"model": repr(model), "plan": plan.to_dict(), "extra": extra or {}}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class ShardedEmbeddingBagCollection(nn.Module):
    def __init__(
        self,
        model: ModelConfig,
        plan: ShardingPlan,
        comm: Communicator,
        optimizer: SparseOptimizerSpec,
        *,
        local_world_size: int | None = None,
        backend: str | None = "auto",
        device: torch.device | str = "cpu",
        seed: int = 0,
        fwd_codec: str | None = None,
        bwd_codec: str | None = None,
        id_mode: str = "strict",
        timer=None,
        storage: StorageConfig | None = None,
    ) -> None:
        super().__init__()
        L = local_world_size or plan.local_world_size
        plan.validate(model, comm.world_size, L)
        self.model_cfg, self.plan, self.comm = model, plan, comm
        self.id_mode = id_mode
        # False when the caller (the trainer) validates batches on the host before the device copy
        self.validate_in_forward = True
        self.ctx = ShardingContext(
            comm, L, optimizer, backend, torch.device(device), seed, make_codec(fwd_codec), make_codec(bwd_codec), timer,
            storage=storage, plan_cache_factors={tp.table: tp.cache_load_factor for tp in plan.tables},
        )
        if comm.world_size > 1:
            # the input dist gets a process group of its own: the train pipeline runs the next
            # batch's input dist in the background while this batch's collectives use `comm`
            self.ctx.input_comm = comm.subgroup(list(range(comm.world_size)), name="input_dist")  # type: ignore[attr-defined]
        self.check_peers(config_hash(model, plan, {"optimizer": repr(optimizer), "seed": seed, "codecs": [fwd_codec, bwd_codec],
                                                   **({"table_dtype": storage.table_dtype} if storage else {})}))
        self.feature_names = model.feature_names
        feats_by_type: dict[ShardingType, list[GroupFeature]] = {}
        for ti, t in enumerate(model.tables):
            tp = plan[t.name]
            for fname in t.feature_names:
                feats_by_type.setdefault(tp.sharding, []).append(GroupFeature(fname, ti, t, tp))
        self.groups = nn.ModuleDict()
        order: list[str] = []
        for st in ShardingType:  # fixed order: every rank builds the groups (and their comms) alike
            if st in feats_by_type:
                self.groups[st.value] = SHARDING_CLASSES[st](self.ctx, feats_by_type[st])
                order.extend(f.name for f in feats_by_type[st])
        dims = {f: t.dim for t in model.tables for f in t.feature_names}
        offsets, off = {}, 0
        for f in order:
            offsets[f] = off
            off += dims[f]
        perm = [c for f in self.feature_names for c in range(offsets[f], offsets[f] + dims[f])]
        self.register_buffer("_perm", torch.tensor(perm, dtype=torch.int64), persistent=False)
        self.feature_dims = tuple(dims[f] for f in self.feature_names)
        rows = {f: t.num_rows for t in model.tables for f in t.feature_names}
        self._rows = [rows[f] for f in self.feature_names]
        self.backend_name = next(
            (g.kernel.backend_name for g in self.groups.values() if getattr(g, "kernel", None) is not None), "none"
        )

    def check_peers(self, digest: str) -> None:
        """Every rank must hold the same model, plan and optimizer: compare config hashes."""
        mine = torch.tensor(list(bytes.fromhex(digest)), dtype=torch.int64, device=getattr(self.comm, "device", "cpu"))
        everyone = self.comm.all_gather_v(mine, [mine.numel()] * self.comm.world_size, tag="config_check").cpu()
        hashes = [bytes(everyone[i * 8 : (i + 1) * 8].tolist()).hex() for i in range(self.comm.world_size)]
        bad = [r for r, h in enumerate(hashes) if h != hashes[0]]
        if bad:
            raise ValueError(
                f"rank(s) {bad} were given a different model/plan/optimizer config than rank 0 "
                f"(config hashes {hashes}); every rank must start from the same config"
            )

    def validate(self, sparse: SparseFeatures, check: bool = True) -> SparseFeatures:
        """Checks before any collective (errors name the rank): feature names; with ``check``
        lengths and id ranges; the modulo id mapping (``check_sparse``)."""
        return check_sparse(sparse, self.feature_names, self._rows, check=check, id_mode=self.id_mode,
                            where=f"rank {self.comm.rank}: ")

    def input_dist(self, sparse: SparseFeatures) -> "Pending[DistributedSparse]":
        """Validate and start sending every group's ids to their owners (no autograd: ids have
        no grad). Issues the split-size exchange and starts the payload all-to-all on the input
        dist's process group; ``wait()`` gives the routed ids. The train pipeline starts batch
        i+1's input dist right after batch i's forward, from the same thread."""
        if self.validate_in_forward:
            sparse = self.validate(sparse)
        b = sparse.batch_size
        parts = sparse.by_feature()
        sends = [g.input_sends(parts, b) for g in self.groups.values()]
        exchanged = [s for s in sends if s is not None]
        pending = exchange_ids(self.ctx.in_comm, exchanged, b) if exchanged else Pending.ready([])

        def finish() -> DistributedSparse:
            routed = iter(pending.wait())
            return DistributedSparse(
                [next(routed) if s is not None else g.local_input(parts, b) for g, s in zip(self.groups.values(), sends)], b
            )

        return Pending(finish)

    def forward(self, sparse: "SparseFeatures | DistributedSparse") -> LazyTensor:
        """pooled (b, sum D_f) in model feature order, from a local batch or a distributed one.

        Lookups run now; the output dists are left in flight and the result is a LazyTensor:
        the caller's next computation (the DLRM's bottom MLP) overlaps the pooled all-to-all,
        and the first use of the result waits for it."""
        if isinstance(sparse, DistributedSparse):
            dist = sparse
        else:
            with self.ctx.phase("input_dist"):
                dist = self.input_dist(sparse).wait()
        pend = [g.compute_async(r, dist.batch_size) for g, r in zip(self.groups.values(), dist.routed)]

        def finish() -> torch.Tensor:
            return torch.cat([p.wait() for p in pend], dim=1).index_select(1, self._perm)  # (b, sum D_f)

        return LazyTensor(finish)

    def prefetch(self, dist: DistributedSparse) -> None:
        """Bring the rows ``dist`` will look up into the cached kernels (no collective: the
        train pipeline runs it on a worker thread while the previous batch's backward runs)."""
        for g, r in zip(self.groups.values(), dist.routed):
            g.prefetch(r)

    # ---- export: gather full logical tables -----------------------------------------------------
    def gather_tables(self) -> dict[str, dict[str, torch.Tensor]]:
        """{table: {"weight": (R, D), <state>: ...}} on every rank (collective).

        Optimizer state is gathered in the unsharded shape, except row-wise AdaGrad's
        accumulator under column-wise sharding: one row accumulator per column shard, as
        (num_column_shards, R), in column order.
        """
        kind = self.ctx.optimizer.kind
        out: dict[str, dict[str, torch.Tensor]] = {}
        for t in self.model_cfg.tables:
            tp = self.plan[t.name]
            cw = tp.sharding in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE)
            entry = {"weight": torch.zeros(t.num_rows, t.dim)}
            if kind == "adagrad":
                entry["sum"] = torch.zeros(t.num_rows, t.dim)
            elif kind == "rowwise_adagrad":
                entry["momentum"] = torch.zeros(len(tp.shards), t.num_rows) if cw else torch.zeros(t.num_rows)
            elif kind == "adam":
                entry["exp_avg"] = torch.zeros(t.num_rows, t.dim)
                entry["exp_avg_sq"] = torch.zeros(t.num_rows, t.dim)
            out[t.name] = entry
        for g in self.groups.values():
            dp = isinstance(g, DataParallelSharding)
            for name, s, kernel, i in g.local_shards():
                if dp and self.comm.rank != 0:
                    continue  # replicas are identical: rank 0 contributes
                e = out[name]
                tp = self.plan[name]
                e["weight"][s.row_start : s.row_end, s.col_start : s.col_end] = kernel.get_table(i)
                for k, v in kernel.get_state(i).items():
                    if k == "momentum":
                        if e[k].dim() == 2:  # column-wise: one accumulator per column shard
                            col_order = sorted(sh.col_start for sh in tp.shards)
                            e[k][col_order.index(s.col_start), s.row_start : s.row_end] = v
                        else:
                            e[k][s.row_start : s.row_end] = v
                    else:
                        e[k][s.row_start : s.row_end, s.col_start : s.col_end] = v
        names = [(t, k) for t in out for k in out[t]]
        flat = torch.cat([out[t][k].reshape(-1) for t, k in names]).to(getattr(self.comm, "device", "cpu"))
        flat = self.comm.all_reduce(flat, tag="state_dict_gather").cpu()
        for (t, k), part in zip(names, flat.split([out[t][k].numel() for t, k in names])):
            out[t][k] = part.view_as(out[t][k]).clone()
        return out
