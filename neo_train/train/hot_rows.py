"""The trainer's side of hot-row replication: profile, pick, switch.

Every rank profiles the ids of its own local batches (``IdFrequencyProfiler``, on the thread that
checks the batches: the pipeline's loader thread, or the training thread). At the end of every
profiling window (``window`` batches, counted by batch index, so every rank ends its windows at the
same step) the profiling thread snapshots its top-k per table. After that step's optimizer step the
training thread takes rank 0's snapshot to every rank (one all-reduce) and calls
``ShardedEmbeddingBagCollection.set_hot_rows``: the same sets, at the same step, on every rank, from
the one thread that issues collectives. Rank 0's local batches are a 1/W sample of the global batch,
which is what its profile estimates; which rows are hot changes only the speed, never the result.

A table whose window saw fewer than k distinct ids keeps its k slots filled with the smallest ids
not among them (replicating a row nobody reads is harmless).
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from ..data.batch import SparseFeatures
from ..sharding.hot_rows import IdFrequencyProfiler

__all__ = ["HotRowSchedule"]


class HotRowSchedule:
    def __init__(self, emb: Any, window: int) -> None:
        if window < 1:
            raise ValueError(f"hot-row profiling window must be >= 1 steps, got {window}")
        self.emb, self.window = emb, window
        self.k: dict[str, int] = {t: ids.numel() for t, ids in emb.hot_rows.items()}
        cfg = emb.model_cfg
        self.rows = {t: cfg.table(t).num_rows for t in self.k}
        self.features = {t: cfg.table(t).feature_names for t in self.k}
        self.profiler = IdFrequencyProfiler([(t, self.rows[t]) for t in self.k])
        self._lock = threading.Lock()
        self._snapshots: dict[int, dict[str, torch.Tensor]] = {}  # window end (steps done) -> top-k
        self.switches = 0

    def observe(self, sparse: SparseFeatures, step: int | None) -> None:
        """Count batch ``step``'s ids (a host batch); snapshot the top-k at a window's end."""
        if step is None:
            return
        parts = sparse.by_feature()
        with self._lock:
            for t, feats in self.features.items():
                for f in feats:
                    self.profiler.observe(t, parts[f][0].to(torch.int64))
            if (step + 1) % self.window == 0:
                self._snapshots[step + 1] = {t: self._top(t) for t in self.k}
                self.profiler.end_window()
            else:
                self.profiler.step()

    def _top(self, t: str) -> torch.Tensor:
        k = self.k[t]
        ids, _ = self.profiler.top_k(t, k)
        ids = ids.to(torch.int64).cpu()
        if ids.numel() < k:  # fill the remaining slots with the smallest unused ids
            used = torch.zeros(self.rows[t], dtype=torch.bool)
            used[ids] = True
            ids = torch.cat([ids, torch.nonzero(~used).flatten()[: k - ids.numel()]])
        return ids

    def after_step(self, steps_done: int, comm: Any) -> bool:
        """Training thread, after step ``steps_done - 1``: at a window's end, switch every rank
        to rank 0's top-k (collective). Returns whether it switched."""
        if steps_done % self.window != 0:
            return False
        with self._lock:
            mine = self._snapshots.pop(steps_done, None)
            for old in [s for s in self._snapshots if s < steps_done]:
                del self._snapshots[old]
        if mine is None:  # this rank profiled no batch of the window (resumed mid-window): skip alike
            mine = {}
        names = sorted(self.k)
        have = torch.tensor([float(bool(mine))], dtype=torch.float64, device=getattr(comm, "device", "cpu"))
        have = comm.all_reduce(have, op="min", tag="hot_rows_pick")
        if float(have[0]) < 1:
            return False  # some rank had no complete window: every rank keeps its sets
        flat = torch.cat([mine[t] for t in names]).to(torch.float64)
        if comm.rank != 0:
            flat.zero_()
        flat = comm.all_reduce(flat.to(getattr(comm, "device", "cpu")), tag="hot_rows_pick").cpu()
        new = dict(zip(names, flat.to(torch.int64).split([self.k[t] for t in names])))
        self.emb.set_hot_rows(new)
        self.switches += 1
        return True


def hot_row_counts(cfg: Any, plan: Any, device_type: str = "cpu") -> dict[str, int]:
    """{table: k} from ``cfg.dist.hot_rows`` ("off", "auto" or K; see ``choose_hot_rows``);
    ``auto`` prices them on the job's cluster (``dist.topology``, else ``cpu_local`` for CPU ranks
    and ``zionex`` for GPUs: the auto planner's)."""
    from ..planning.hot_rows import choose_hot_rows
    from ..topology.networks import job_cluster

    setting = cfg.dist.hot_rows
    cluster = None
    if setting == "auto" and plan.world_size > 1:
        cluster = job_cluster(cfg.dist.topology, plan.world_size, plan.local_world_size, device_type)
    return {t: c.k for t, c in choose_hot_rows(cfg, plan, plan.world_size, setting, cluster).items()}
