"""The sharded EmbeddingBagCollection: the model's tables spread over ranks by a ShardingPlan.

``forward(sparse)`` takes the rank's local batch (b samples, every feature) and returns pooled
(b, sum_f D_f) in the model's feature order, exactly what the unsharded collection returns for
those samples (as a LazyTensor: the output all-to-all is still in flight until first use).
``input_dist(sparse)`` starts the input dist alone and returns a ``Pending``: the train pipeline
starts the next batch's input dist early and hands ``forward`` the routed ids. Each sharding
type present in the plan is one group with its own three stages; every group's ids travel in
one exchange (``IdExchange``: one all-to-all, sized from the counts of earlier batches).

Gradient-scaling convention: every rank's loss is the mean over its b samples; DDP averages dense
gradients over the W ranks, so dense parameters see the gradient of the global mean loss over
W*b samples. The pooled embeddings' gradient is multiplied by 1/W on its way back (ScaleGrad
on each group's lookup output, after the output dist's backward exchange), so the embedding rows see that same global-mean gradient: sharded training over W ranks
with local batch b matches unsharded training on the concatenated W*b batch.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..comm import Communicator, make_codec
from ..comm.awaitable import LazyTensor, Pending
from ..config import ModelConfig, StorageConfig, TableConfig
from ..data.batch import SparseFeatures
from ..kernels import SparseOptimizerSpec
from ..modules.embedding import check_sparse
from .column_wise import ColumnWiseSharding
from .common import ColumnAssembly, EmbeddingSharding, GroupFeature, ShardingContext, IdExchange, positions_where
from .data_parallel import DataParallelSharding
from ..planning.hot_rows import hot_row_refusal
from ..planning.plan import Shard, ShardingPlan, ShardingType, TablePlan
from .row_wise import RowWiseSharding
from .table_column_wise import TableColumnWiseSharding
from .table_row_wise import TableRowWiseSharding
from .table_wise import TableWiseSharding

__all__ = ["ShardedEmbeddingBagCollection", "DistributedSparse", "SHARDING_CLASSES", "config_hash", "HOT_SUFFIX"]

HOT_MAP_MAX_ROWS = 1 << 22  # the hot tables' rows up to which the id split uses a key -> slot map (16 MiB)
HOT_SUFFIX = "#hot"  # the replicated hot part of table t is the data-parallel table t#hot

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
    hot_version: int = 0  # which hot-row sets split this batch's ids (ShardedEmbeddingBagCollection.set_hot_rows)


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
        hot_rows: dict[str, int] | None = None,
    ) -> None:
        super().__init__()
        L = local_world_size or plan.local_world_size
        plan.validate(model, comm.world_size, L)
        hot_rows = {k: int(v) for k, v in (hot_rows or {}).items()}
        _check_hot_rows(model, plan, hot_rows, storage)
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
        self._id_exchange = IdExchange(self.ctx.in_comm)
        self.check_peers(config_hash(model, plan, {"optimizer": repr(optimizer), "seed": seed, "codecs": [fwd_codec, bwd_codec],
                                                   **({"table_dtype": storage.table_dtype} if storage else {}),
                                                   **({"hot_rows": sorted(hot_rows.items())} if hot_rows else {})}))
        self.feature_names = model.feature_names
        feats_by_type: dict[ShardingType, list[GroupFeature]] = {}
        for ti, t in enumerate(model.tables):
            tp = plan[t.name]
            for fname in t.feature_names:
                feats_by_type.setdefault(tp.sharding, []).append(GroupFeature(fname, ti, t, tp))
        # hot-row replication: table t's k hot rows are also the data-parallel table t#hot
        hot_tables = [t for t in model.tables if t.name in hot_rows]
        W = comm.world_size
        for j, t in enumerate(hot_tables):
            k = hot_rows[t.name]
            ht = TableConfig(t.name + HOT_SUFFIX, k, t.dim, t.pooling, feature_names=tuple(f + HOT_SUFFIX for f in t.feature_names))
            htp = TablePlan(ht.name, ShardingType.DATA_PARALLEL, tuple(Shard(r, 0, k, 0, t.dim) for r in range(W)))
            for fname in ht.feature_names:
                feats_by_type.setdefault(ShardingType.DATA_PARALLEL, []).append(
                    GroupFeature(fname, len(model.tables) + j, ht, htp)
                )
        self.groups = nn.ModuleDict()
        for st in ShardingType:  # fixed order: every rank builds the groups (and their comms) alike
            if st in feats_by_type:
                self.groups[st.value] = SHARDING_CLASSES[st](self.ctx, feats_by_type[st])
        dims = {f: t.dim for t in model.tables for f in t.feature_names}
        dims.update({f + HOT_SUFFIX: t.dim for t in hot_tables for f in t.feature_names})
        # the groups' pooled outputs go straight into (b, sum D_f) in model feature order; a hot
        # feature's pooled columns (its replica's) are added to its feature's columns
        out_col = dict(zip(self.feature_names, itertools.accumulate((dims[f] for f in self.feature_names), initial=0)))
        col_of = {**out_col, **{f + HOT_SUFFIX: out_col[f] for t in hot_tables for f in t.feature_names}}
        by_group = [g.feature_names for g in self.groups.values()]  # each group's output: its features in order
        self._assemble = ColumnAssembly([sum(dims[f] for f in fs) for fs in by_group],
                                        [[c for f in fs for c in range(col_of[f], col_of[f] + dims[f])] for fs in by_group],
                                        sum(dims[f] for f in self.feature_names))  # fmt: skip
        self._hot_k = {t.name: hot_rows[t.name] for t in hot_tables}
        self._hot_features = {f: t.name for t in hot_tables for f in t.feature_names}
        for g in self.groups.values():  # table-wise: bags with no cold id skip the output exchange
            if hasattr(g, "set_hot_features"):
                g.set_hot_features(self._hot_features)
        # every feature of a table-wise plan replicated: the table-wise group's output and the
        # replicas' are both laid out like the collection's, so the received cold rows are added
        # straight onto the replicas' output (no zeros to scatter into, no assembly after)
        groups = list(self.groups.values())
        self._scatter_onto: tuple[int, int] | None = None
        if len(groups) == 2 and self._assemble.whole == {0, 1} and getattr(groups[0], "sparse_output", False) \
                and isinstance(groups[1], DataParallelSharding):
            self._scatter_onto = (0, 1)
        self._hot_ids: dict[str, torch.Tensor] = {}  # routing: the hot set that splits new batches
        # the split's lookup (set_hot_rows): every hot table's ids keyed row_off[t] + id, sorted, with
        # each key's replica slot (the binary search's; None with the map), the key offset of each hot
        # feature (_hot_features order), and the key -> slot map (None for tables too big for one)
        self._hot_sorted: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor, torch.Tensor | None] | None = None
        self._hot_version = 0
        self._replica_ids: dict[str, torch.Tensor] = {}  # what the replicas hold now
        self._replica_version = -1
        self._pending_hot: dict[int, dict[str, torch.Tensor]] = {}
        self.feature_dims = tuple(dims[f] for f in self.feature_names)
        rows = {f: t.num_rows for t in model.tables for f in t.feature_names}
        self._rows = [rows[f] for f in self.feature_names]
        self.backend_name = next(
            (g.kernel.backend_name for g in self.groups.values() if getattr(g, "kernel", None) is not None), "none"
        )
        if hot_tables:  # start with rows 0..k-1 hot; the caller's profile replaces them (set_hot_rows)
            self.set_hot_rows({t.name: torch.arange(self._hot_k[t.name]) for t in hot_tables}, check=False)
            self._sync_replicas(self._hot_version)

    def _digests_differ(self, digest: str, tag: str) -> tuple[list[int], list[str]]:
        """Gather every rank's 8-byte hex ``digest`` (collective): (the ranks whose digest is not
        rank 0's, every rank's digest)."""
        mine = torch.tensor(list(bytes.fromhex(digest)), dtype=torch.int64, device=getattr(self.comm, "device", "cpu"))
        everyone = self.comm.all_gather_v(mine, [mine.numel()] * self.comm.world_size, tag=tag).cpu()
        hashes = [bytes(everyone[i * 8 : (i + 1) * 8].tolist()).hex() for i in range(self.comm.world_size)]
        return [r for r, h in enumerate(hashes) if h != hashes[0]], hashes

    def check_peers(self, digest: str) -> None:
        """Every rank must hold the same model, plan and optimizer: compare config hashes."""
        bad, hashes = self._digests_differ(digest, "config_check")
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
        no grad): the id all-to-all on the input dist's process group (``IdExchange``) starts
        now; ``advance()`` reads its headers (and starts a second round if a peer's ids
        outgrew the space reserved for them), ``wait()`` gives the routed ids. The train
        pipeline starts batch i+1's input dist before batch i's forward and advances it after,
        from the same thread."""
        if self.validate_in_forward:
            sparse = self.validate(sparse)
        b = sparse.batch_size
        parts = sparse.by_feature()
        if self._hot_k:
            parts = self._split_hot(parts, b)
        sends = [g.input_sends(parts, b) for g in self.groups.values()]
        exchanged = [s for s in sends if s is not None]
        # separate count histories for training and evaluation batches, and per batch size
        pending = self._id_exchange(exchanged, b, key=(self.training, b)) if exchanged else Pending.ready([])

        version = self._hot_version

        def finish() -> DistributedSparse:
            routed = iter(pending.wait())
            return DistributedSparse(
                [next(routed) if s is not None else g.local_input(parts, b) for g, s in zip(self.groups.values(), sends)], b,
                version,
            )

        return Pending(finish, advance=pending.advance)

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
        if self._hot_k:
            self._sync_replicas(dist.hot_version)
        pend: list[Pending] = []
        onto = self._scatter_onto
        for i, (g, r) in enumerate(zip(self.groups.values(), dist.routed)):
            if onto is not None and i == onto[0]:  # its rows go onto the replicas' output, waited then
                pend.append(g.compute_async(r, dist.batch_size, onto=lambda: pend[onto[1]].wait()))
            else:
                pend.append(g.compute_async(r, dist.batch_size))

        def finish() -> torch.Tensor:
            # (b, sum D_f): cold part (through its plan) + hot part (the local replica)
            if onto is not None:
                return pend[onto[0]].wait()
            return self._assemble([p.wait() for p in pend])

        return LazyTensor(finish)

    def prefetch(self, dist: DistributedSparse) -> None:
        """Bring the rows ``dist`` will look up into the cached kernels (no collective: the
        train pipeline runs it on a worker thread while the previous batch's backward runs)."""
        for g, r in zip(self.groups.values(), dist.routed):
            g.prefetch(r)

    # ---- hot-row replication (issue 13; notes/hot_rows.md) ------------------------------------
    # Table t's k hot rows are replicated as the data-parallel table t#hot: each rank pools its
    # hot ids locally and adds the result to the cold part's pooled rows, which travel through
    # t's plan as before (table-wise: only the bags with a cold id, table_wise.py); the replicas'
    # gradients are all-reduced and every replica applies the same fused update (data_parallel.py).
    # The owner's copy of a hot row is stale while the row is hot: rows and optimizer state are
    # written back when the hot set changes (and before an export), and the new hot rows are
    # gathered from their owners.
    @property
    def hot_rows(self) -> dict[str, torch.Tensor]:
        """{table: its hot ids (k,), in replica-slot order} of the set splitting new batches."""
        return {t: ids.clone() for t, ids in self._hot_ids.items()}

    def set_hot_rows(self, ids_by_table: dict[str, torch.Tensor], check: bool = True) -> None:
        """Replace the hot sets (k distinct ids per table, k fixed at construction). Collective
        when ``check``: every rank must pass the same sets (compared by hash). Batches whose input
        dist starts after this call are split by the new sets; the replicas switch (write-back,
        then gather from the owners: collectives) at the first such batch's forward, so a batch
        already in flight (the train pipeline's next batch) is served by the sets it was split by."""
        new = dict(self._hot_ids)
        for t, ids in ids_by_table.items():
            if t not in self._hot_k:
                raise ValueError(f"set_hot_rows: table '{t}' has no hot-row replication (tables with it: {sorted(self._hot_k)})")
            ids = torch.as_tensor(ids).to(torch.int64).flatten().cpu()
            k, rows = self._hot_k[t], self.model_cfg.table(t).num_rows
            if ids.numel() != k:
                raise ValueError(f"set_hot_rows: table '{t}' replicates {k} rows, got {ids.numel()} ids")
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= rows):
                raise ValueError(f"set_hot_rows: table '{t}': hot ids must be in [0, {rows}), got {int(ids.min())}..{int(ids.max())}")
            if torch.unique(ids).numel() != k:
                raise ValueError(f"set_hot_rows: table '{t}': hot ids must be distinct")
            new[t] = ids
        if check:
            digest = hashlib.sha256(b"".join(new[t].numpy().tobytes() for t in sorted(new))).hexdigest()[:16]
            bad, hashes = self._digests_differ(digest, "hot_rows_check")
            if bad:
                raise ValueError(f"rank(s) {bad} were given different hot-row sets than rank 0 (hashes {hashes})")
        self._hot_version += 1
        self._hot_ids = new
        dev = self.ctx.device
        # keys row_off[t] + id never collide across tables: ids are in [0, rows) (validate / the trainer's check)
        offs = list(itertools.accumulate((self.model_cfg.table(t).num_rows for t in self._hot_k), initial=0))
        row_off = dict(zip(self._hot_k, offs))
        keys, order = torch.sort(torch.cat([new[t] + row_off[t] for t in self._hot_k]))  # (sum k,)
        slots = torch.cat([torch.arange(self._hot_k[t]) for t in self._hot_k]).index_select(0, order)
        feat_off = torch.tensor([row_off[t] for t in self._hot_features.values()], dtype=torch.int64).to(dev)
        if offs[-1] <= HOT_MAP_MAX_ROWS:
            # a key -> slot map (-1: cold): one gather per id instead of a binary search (which
            # alone needs the sorted keys and their slots); int32 (sum k < 2^31)
            slot_map = torch.full((offs[-1],), -1, dtype=torch.int32).index_copy_(0, keys, slots.to(torch.int32))
            self._hot_sorted = (None, None, feat_off, slot_map.to(dev))
        else:
            self._hot_sorted = (keys.to(dev), slots.to(dev), feat_off, None)
        self._pending_hot[self._hot_version] = new

    def hot_write_back(self) -> None:
        """Make the owners' copies of hot rows current (local; before a checkpoint or export)."""
        self._write_back_hot()

    def hot_reload(self) -> None:
        """Gather the replicas again from the owners (collective; after the owners were loaded)."""
        if self._hot_k:
            self._pending_hot[self._hot_version] = self._hot_ids
            self._replica_ids = {}  # nothing to write back: the owners hold the truth now
            self._replica_version = -1
            self._sync_replicas(self._hot_version)

    def _split_hot(self, parts: dict, b: int) -> dict:
        """Each hot table's features split into the cold ids (the feature itself) and the hot ids
        as slots of the replica (feature#hot), bag by bag; per-id weights follow their ids.

        One pass over the F hot features (``parts`` is ``SparseFeatures.by_feature()``: one dtype
        for every feature's values, one for lengths, weights all or none): every id keyed
        row_off[t] + id in int64, one searchsorted in the sorted keys of every hot table
        (set_hot_rows), one selection of the cold ids and one of the hot slots (in feature, bag,
        id order, as a split feature by feature gives), the per-bag hot counts by one index_add
        over the F b bags. One device-to-host read (the F hot counts) cuts the results back into
        features (a split feature by feature with boolean indexing read 2 per feature)."""
        keys_sorted, key_slots, feat_off, slot_map = self._hot_sorted
        feats = list(self._hot_features)
        F = len(feats)
        values, lengths, weights = zip(*(parts[f] for f in feats))
        n = [v.numel() for v in values]
        N = sum(n)
        vals = torch.cat(values)  # (N,)
        lens = torch.cat(lengths)  # (F b,)
        bag = torch.repeat_interleave(lens.to(torch.int64), output_size=N)  # each id's bag f b + j
        keys = vals.to(torch.int64) + feat_off.view(F, 1).expand(F, b).reshape(-1).index_select(0, bag)
        if slot_map is not None:
            slot = slot_map.index_select(0, keys)  # (N,) the replica slot, -1 for a cold id
            hot = slot >= 0
        else:  # int32 positions (sum k < 2^31): the CPU search runs faster with them
            pos = torch.searchsorted(keys_sorted, keys, out_int32=True).clamp_(max=keys_sorted.numel() - 1)
            hot = keys_sorted.index_select(0, pos) == keys
        hot_len = torch.zeros_like(lens).index_add_(0, bag, hot.to(lens.dtype)).view(F, b)
        cold_len = lens.view(F, b) - hot_len
        n_hot = hot_len.sum(1).tolist()  # the one device-to-host read
        n_cold = [m - h for m, h in zip(n, n_hot)]
        cold = ~hot
        at_cold, at_hot = positions_where(cold, N - sum(n_hot)), positions_where(hot, sum(n_hot))
        cold_vals = vals.index_select(0, at_cold).split(n_cold)
        hot_slot = (slot.index_select(0, at_hot) if slot_map is not None
                    else key_slots.index_select(0, pos.index_select(0, at_hot)))
        hot_slots = hot_slot.to(vals.dtype).split(n_hot)
        if weights[0] is None:
            cold_w = hot_w = (None,) * F
        else:
            w = torch.cat(weights)
            cold_w, hot_w = w.index_select(0, at_cold).split(n_cold), w.index_select(0, at_hot).split(n_hot)
        out = dict(parts)
        out.update(zip(feats, zip(cold_vals, cold_len.unbind(0), cold_w)))
        out.update(zip((f + HOT_SUFFIX for f in feats), zip(hot_slots, hot_len.unbind(0), hot_w)))
        return out

    def _hot_shards(self, t: str) -> tuple[list, tuple]:
        """(this rank's owner shards of table t: (shard, kernel, index)), (replica kernel, index))."""
        owners, replica = [], None
        for g in self.groups.values():
            for name, sh, kernel, i in g.local_shards():
                if name == t:
                    owners.append((sh, kernel, i))
                elif name == t + HOT_SUFFIX:
                    replica = (kernel, i)
        assert replica is not None, t
        return owners, replica

    @staticmethod
    def _rows_of(kernel, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], bool]:
        """(weights, state, live): live views when the backend exposes them, else copies."""
        try:
            w, st = kernel.rows_views(i)
            return w, st, True
        except NotImplementedError:
            return kernel.get_table(i), kernel.get_state(i), False

    @staticmethod
    def _owned(owners: list, ids: torch.Tensor, device: torch.device):
        """For each owner shard holding some of ``ids``: (their rows in the shard, their replica
        slots, the shard's kernel, its table index)."""
        for sh, kernel, i in owners:
            sel = (ids >= sh.row_start) & (ids < sh.row_end)
            if bool(sel.any()):
                yield (ids[sel] - sh.row_start).to(device), torch.nonzero(sel).flatten().to(device), kernel, i

    def _write_back_hot(self) -> None:
        """Copy every replica's rows and optimizer state into the owners' shards (local: the
        replicas are identical on every rank, each owner writes its own rows)."""
        for t, ids in self._replica_ids.items():
            owners, (rk, ri) = self._hot_shards(t)
            rw, rst, _ = self._rows_of(rk, ri)
            for local, slot, kernel, i in self._owned(owners, ids, rw.device):
                w, st, live = self._rows_of(kernel, i)
                w[local] = rw.index_select(0, slot).to(w.dtype)
                for name, v in st.items():
                    v[local] = rst[name].index_select(0, slot).to(v.dtype)
                if not live:
                    kernel.set_table(i, w)
                    kernel.set_state(i, st)

    @staticmethod
    def _carried(old: torch.Tensor | None, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The slots of ``new`` (a table's next hot ids) whose ids the replica holds now (``old``),
        their slots in ``old``, and the rest of ``new``'s slots (the promoted rows)."""
        if old is None or old.numel() == 0:
            nothing = torch.zeros(0, dtype=torch.int64)
            return nothing, nothing, torch.arange(new.numel())
        o_sorted, o_slot = torch.sort(old)
        at = torch.searchsorted(o_sorted, new).clamp_(max=old.numel() - 1)
        hit = o_sorted[at] == new
        return hit.nonzero().flatten(), o_slot[at[hit]], (~hit).nonzero().flatten()

    def _sync_replicas(self, version: int) -> None:
        """Make the replicas hold the hot sets of ``version`` (collective: one all-reduce). Rows
        that stay hot move to their new slots locally (every replica holds the same values); only
        the promoted rows come from their owners, each owner adding its rows (zeros elsewhere)."""
        if version == self._replica_version:
            return
        if version not in self._pending_hot:
            raise RuntimeError(f"hot-row set version {version} is no longer known (now {self._hot_version})")
        self._write_back_hot()
        target = self._pending_hot[version]
        flats, layout, moves = [], [], {}
        for t in sorted(target):
            ids = target[t]
            owners, (rk, ri) = self._hot_shards(t)
            rw, rst, _ = self._rows_of(rk, ri)
            dev = rw.device
            to_slot, from_slot, fresh = self._carried(self._replica_ids.get(t), ids)
            promoted = ids[fresh]
            to_slot, from_slot, fresh = to_slot.to(dev), from_slot.to(dev), fresh.to(dev)
            kept = {name: v.index_select(0, from_slot) for name, v in [("weight", rw), *rst.items()]}
            moves[t] = (to_slot, kept, fresh)
            n = fresh.numel()
            bufs = {"weight": rw.new_zeros((n, *rw.shape[1:]), dtype=torch.float32)}
            bufs.update({name: v.new_zeros((n, *v.shape[1:]), dtype=torch.float32) for name, v in rst.items()})
            for local, slot, kernel, i in self._owned(owners, promoted, dev):
                w, st, _ = self._rows_of(kernel, i)
                bufs["weight"].index_copy_(0, slot, w.index_select(0, local).float())
                for name, v in st.items():
                    bufs[name].index_copy_(0, slot, v.index_select(0, local).float())
            for name, buf in bufs.items():
                flats.append(buf.reshape(-1))
                layout.append((t, name, buf.shape))
        got: dict[str, dict[str, torch.Tensor]] = {}
        if sum(x.numel() for x in flats):  # the same on every rank: the sets are (set_hot_rows checks)
            # each hot row has exactly one owner (TW / RW / TWRW): the sum is that owner's row
            flat = self.comm.all_reduce(torch.cat(flats).to(getattr(self.comm, "device", "cpu")), tag="hot_rows_sync")
            parts = flat.to(self.ctx.device).split([math.prod(shape) for _, _, shape in layout])
            for (t, name, shape), part in zip(layout, parts):
                got.setdefault(t, {})[name] = part.view(shape)
        for t, (to_slot, kept, fresh) in moves.items():
            _, (rk, ri) = self._hot_shards(t)
            rw, rst, live = self._rows_of(rk, ri)
            for name, v in [("weight", rw), *rst.items()]:
                v.index_copy_(0, to_slot, kept[name])
                if name in got.get(t, {}):
                    v.index_copy_(0, fresh, got[t][name].to(v.dtype))
            if not live:
                rk.set_table(ri, rw)
                rk.set_state(ri, rst)
        self._replica_ids = dict(target)
        self._replica_version = version
        for v in [v for v in self._pending_hot if v < version]:
            del self._pending_hot[v]

    # ---- export: gather full logical tables -----------------------------------------------------
    def gather_tables(self) -> dict[str, dict[str, torch.Tensor]]:
        """{table: {"weight": (R, D), <state>: ...}} on every rank (collective).

        Optimizer state is gathered in the unsharded shape, except row-wise AdaGrad's
        accumulator under column-wise sharding: one row accumulator per column shard, as
        (num_column_shards, R), in column order.
        """
        kind = self.ctx.optimizer.kind
        self._write_back_hot()  # the owners' copies of hot rows are stale while the rows are hot
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
                if (dp and self.comm.rank != 0) or name.endswith(HOT_SUFFIX):
                    continue  # replicas are identical: rank 0 contributes; hot replicas were written back
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


def _check_hot_rows(model: ModelConfig, plan: ShardingPlan, hot_rows: dict[str, int], storage: StorageConfig | None) -> None:
    """Hot-row replication's limits, each refusal naming the table."""
    names = {t.name for t in model.tables}
    for name, k in hot_rows.items():
        if name not in names:
            raise ValueError(f"hot_rows: unknown table '{name}' (tables: {sorted(names)})")
        t = model.table(name)
        if not 1 <= k < t.num_rows:
            raise ValueError(
                f"hot_rows: table '{name}': k must be in [1, {t.num_rows}), got {k} "
                "(to replicate the whole table, shard it data_parallel)"
            )
        why = hot_row_refusal(t, plan[name], storage)
        if why:
            raise ValueError(f"hot_rows: {why}")
