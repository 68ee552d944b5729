"""The sharded EmbeddingBagCollection: the model's tables spread over ranks by a ShardingPlan.

``forward(sparse)`` takes the rank's local batch (b samples, every feature) and returns pooled
(b, sum_f D_f) in the model's feature order, exactly what the unsharded collection returns for
those samples. Each sharding type present in the plan is one group with its own three stages.

Gradient-scaling convention: every rank's loss is the mean over its b samples; DDP averages dense
gradients over the W ranks, so dense parameters see the gradient of the global mean loss over
W*b samples. The pooled embeddings' gradient is multiplied by 1/W on its way back (ScaleGrad
below), so the embedding rows see that same global-mean gradient: sharded training over W ranks
with local batch b matches unsharded training on the concatenated W*b batch.
"""
from __future__ import annotations

import hashlib
import json
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..comm import Communicator, make_codec
from ..comm.autograd import Pending
from ..config import ModelConfig
from ..data.batch import SparseFeatures
from ..kernels import SparseOptimizerSpec
from .column_wise import ColumnWiseSharding
from .common import EmbeddingSharding, GroupFeature, ScaleGrad, ShardingContext
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
    ) -> None:
        super().__init__()
        L = local_world_size or plan.local_world_size
        plan.validate(model, comm.world_size, L)
        self.model_cfg, self.plan, self.comm = model, plan, comm
        self.id_mode = id_mode
        self.ctx = ShardingContext(
            comm, L, optimizer, backend, torch.device(device), seed, make_codec(fwd_codec), make_codec(bwd_codec), timer
        )
        if comm.world_size > 1:
            # the input dist gets a process group of its own: the train pipeline runs the next
            # batch's input dist in the background while this batch's collectives use `comm`
            self.ctx.input_comm = comm.subgroup(list(range(comm.world_size)), name="input_dist")  # type: ignore[attr-defined]
        self.check_peers(config_hash(model, plan, {"optimizer": repr(optimizer), "seed": seed, "codecs": [fwd_codec, bwd_codec]}))
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
        self._rows = {f: t.num_rows for t in model.tables for f in t.feature_names}
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

    def validate(self, sparse: SparseFeatures) -> SparseFeatures:
        """Local checks before any collective: feature names, lengths, id ranges (naming the rank)."""
        r = self.comm.rank
        if sparse.keys != self.feature_names:
            raise ValueError(
                f"rank {r}: sparse features {list(sparse.keys)} do not match the model's {list(self.feature_names)}"
            )
        sparse.validate()
        counts = sparse.feature_value_counts()
        rows = torch.tensor([self._rows[f] for f in sparse.keys], dtype=torch.int64)
        per_id = torch.repeat_interleave(rows, torch.tensor(counts), output_size=sparse.values.numel()).to(sparse.values.device)
        if self.id_mode == "modulo":
            return SparseFeatures(sparse.keys, torch.remainder(sparse.values, per_id), sparse.lengths, sparse.weights)
        bad = (sparse.values < 0) | (sparse.values >= per_id)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            f = 0
            while i >= sum(counts[: f + 1]):
                f += 1
            name = sparse.keys[f]
            raise ValueError(
                f"rank {r}: feature '{name}': id {int(sparse.values[i])} out of range [0, {self._rows[name]})"
            )
        return sparse

    def input_dist(self, sparse: SparseFeatures) -> "DistributedSparse":
        """Validate and send every group's ids to their owners (no autograd: ids have no grad).

        Uses only the input-dist process group, so it may run in a background thread (the
        train pipeline) while another batch's lookup / output dist / backward run."""
        sparse = self.validate(sparse)
        t = self.ctx.timer or (lambda _phase: nullcontext())
        with t("input_dist"):
            routed = [g.input_dist(sparse.select(g.feature_names)) for g in self.groups.values()]
        return DistributedSparse(routed, sparse.batch_size)

    def forward_async(self, sparse: "SparseFeatures | DistributedSparse") -> Pending:
        """Lookups now, output dists in flight; ``wait()`` gives what ``forward`` returns. The
        DLRM runs its bottom MLP in between (Neo's overlap of the pooled all-to-all)."""
        dist = sparse if isinstance(sparse, DistributedSparse) else self.input_dist(sparse)
        pend = [g.compute_async(r, dist.batch_size) for g, r in zip(self.groups.values(), dist.routed)]

        def finish() -> torch.Tensor:
            pooled = torch.cat([p.wait() for p in pend], dim=1).index_select(1, self._perm)
            return ScaleGrad.apply(pooled, 1.0 / self.comm.world_size)

        return Pending(finish)

    def forward(self, sparse: "SparseFeatures | DistributedSparse") -> torch.Tensor:
        """pooled (b, sum D_f) in model feature order, from a local batch or a distributed one."""
        dist = sparse if isinstance(sparse, DistributedSparse) else self.input_dist(sparse)
        outs = [g.compute(r, dist.batch_size) for g, r in zip(self.groups.values(), dist.routed)]
        pooled = torch.cat(outs, dim=1).index_select(1, self._perm)  # (b, sum D_f), model order
        return ScaleGrad.apply(pooled, 1.0 / self.comm.world_size)

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
