"""Model parallelism for a DLRM: tables sharded by a plan, the dense part replicated under DDP.

    model = DistributedModelParallel(cfg, plan, comm)
    logits = model(dense, sparse)          # this rank's b samples
    loss.backward()                        # embedding rows updated inside; dense grads averaged
    dense_opt.step()
    tables = model.gather_state_dict()     # full logical tables on every rank (collective)

Gradient-scaling convention (what makes sharded training equal unsharded training on the
concatenated W*b batch): each rank's loss is the mean over its b samples; DDP averages dense
gradients over the W ranks; the pooled embeddings' gradient is scaled by 1/W in the sharded
collection, so embedding rows receive the gradient of the global mean loss too.

DDP's gradient buckets are all-reduced through our comm layer (a communication hook) on a group
of their own, asynchronously, so they never block the embedding collectives of the backward.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ..comm import CollectiveError, Communicator
from ..config import Config
from ..data.batch import SparseFeatures
from ..modules import DLRM
from ..sharding.collection import ShardedEmbeddingBagCollection
from ..sharding.plan import ShardingPlan

__all__ = ["DistributedModelParallel"]


def _is_backend_error(e: BaseException) -> bool:
    text = str(e)
    return isinstance(e, getattr(torch.distributed, "DistError", ())) or "gloo" in text or "NCCL" in text


def _allreduce_hook(comm: Communicator, bucket):  # -> Future[Tensor] (DDP rejects string annotations)
    """DDP communication hook: average a gradient bucket through the comm layer, asynchronously."""
    buf = bucket.buffer()
    handle = comm.all_reduce(buf, op="avg", async_op=True, tag="dense_allreduce")
    return handle.future()


class DistributedModelParallel(nn.Module):
    def __init__(
        self,
        cfg: Config,
        plan: ShardingPlan,
        comm: Communicator,
        *,
        device: torch.device | str = "cpu",
        backend: str | None = None,
        timer=None,
        hot_rows: dict[str, int] | None = None,
    ) -> None:
        super().__init__()
        from ..train.trainer import sparse_optimizer_spec

        self.comm = comm
        torch.manual_seed(cfg.train.seed)  # dense init as in the unsharded model, on every rank
        ebc = ShardedEmbeddingBagCollection(
            cfg.model,
            plan,
            comm,
            sparse_optimizer_spec(cfg.train),
            backend=backend or cfg.train.kernel_backend,
            device=device,
            seed=cfg.train.seed,
            fwd_codec=cfg.dist.forward_comm_dtype,
            bwd_codec=cfg.dist.backward_comm_dtype,
            id_mode=cfg.data.id_mode,
            timer=timer,
            storage=cfg.storage,
            hot_rows=hot_rows,
        )
        self.module = DLRM(cfg.model, ebc, ebc.feature_dims).to(device)
        self.embeddings = ebc
        if comm.world_size > 1:
            # the sharded tables are buffers DDP must neither broadcast nor sync
            ignore = [f"embeddings.{n}" for n, _ in [*ebc.named_buffers(), *ebc.named_parameters()]]
            DDP._set_params_and_buffers_to_ignore_for_model(self.module, ignore)
            dense_comm = comm.subgroup(list(range(comm.world_size)), name="dense")  # type: ignore[attr-defined]
            with warnings.catch_warnings():
                # torch 2.13 deprecates broadcast_buffers but says to keep it for rank-local buffers
                warnings.simplefilter("ignore", FutureWarning)
                self.ddp: nn.Module = DDP(
                    self.module,
                    process_group=dense_comm.group,  # type: ignore[union-attr]
                    broadcast_buffers=False,
                    gradient_as_bucket_view=True,
                    # small buckets: the top MLP's gradients start their all-reduce while the
                    # rest of the backward (embedding exchanges included) still runs
                    bucket_cap_mb=1,
                    device_ids=None if torch.device(device).type == "cpu" else [torch.device(device).index or 0],
                )
            self.ddp.register_comm_hook(dense_comm, _allreduce_hook)  # type: ignore[operator]
        else:
            self.ddp = self.module

    @property
    def backend_name(self) -> str:
        return self.embeddings.backend_name

    def dense_parameters(self) -> list[nn.Parameter]:
        return self.module.dense_parameters()

    def forward(self, dense: torch.Tensor, sparse: SparseFeatures) -> torch.Tensor:
        try:
            return self.ddp(dense, sparse)
        except RuntimeError as e:
            # DDP's own bookkeeping collectives (bucket rebuild after the first step) bypass the
            # comm layer; name them like the comm layer names its own failures
            if isinstance(e, CollectiveError) or not _is_backend_error(e):
                raise
            raise CollectiveError(
                f"DDP bookkeeping collective (bucket rebuild) on rank {self.comm.rank} failed or timed out; "
                f"a peer may have died: {e}"
            ) from e

    def gather_state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """{"dense": {param name: tensor}, "tables": {table: {"weight", <state>...}}} (collective)."""
        dense = {n: p.detach().clone() for n, p in self.module.named_parameters() if not n.startswith("embeddings.")}
        return {"dense": dense, "tables": self.embeddings.gather_tables()}
