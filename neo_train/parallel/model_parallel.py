"""Model parallelism for a DLRM: a transform applied to a plain model — its embedding collection
is swapped for one sharded by a plan, its dense part replicated under DDP.

    model = DLRM(cfg.model, EmbeddingBagCollection(cfg.model.tables, spec, device="meta"))  # plain
    model = shard_model(model, plan, comm, cfg)   # or DistributedModelParallel(cfg, plan, comm)
    logits = model(dense, sparse)          # this rank's b samples
    loss.backward()                        # embedding rows updated inside; dense grads averaged
    dense_opt.step()
    tables = model.gather_state_dict()     # full logical tables on every rank (collective)

The model (``modules.DLRM``) knows nothing of distribution: the sharded collection's forward
returns pooled embeddings still in flight (a tensor-like awaitable that waits on first use), so
the all-to-all overlaps the bottom MLP; the pipeline resolves the rest. The plain model's own
collection only gives the shapes (build it on the meta device: no table is allocated); the
sharded one is initialised from ``cfg.train.seed`` exactly as the unsharded model's tables.

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
from ..kernels import SparseOptimizerSpec
from ..modules import DLRM
from ..modules.embedding import EmbeddingBagCollection
from ..sharding.collection import ShardedEmbeddingBagCollection
from ..planning.plan import ShardingPlan

__all__ = ["DistributedModelParallel", "shard_model", "plain_dlrm"]


def _is_backend_error(e: BaseException) -> bool:
    text = str(e)
    return isinstance(e, getattr(torch.distributed, "DistError", ())) or "gloo" in text or "NCCL" in text


def _allreduce_hook(comm: Communicator, bucket):  # -> Future[Tensor] (DDP rejects string annotations)
    """DDP communication hook: average a gradient bucket through the comm layer, asynchronously."""
    buf = bucket.buffer()
    handle = comm.all_reduce(buf, op="avg", async_op=True, tag="dense_allreduce")
    return handle.future()


def plain_dlrm(cfg: Config) -> DLRM:
    """The unsharded DLRM of ``cfg.model`` with its embedding collection on the meta device (shapes
    only), dense parameters drawn from ``cfg.train.seed`` as ``train.build_model`` draws them."""
    torch.manual_seed(cfg.train.seed)
    ebc = EmbeddingBagCollection(cfg.model.tables, SparseOptimizerSpec.from_train(cfg.train), backend="reference",
                                 device="meta", seed=cfg.train.seed, id_mode=cfg.data.id_mode)
    return DLRM(cfg.model, ebc, ebc.feature_dims)


def shard_model(model: DLRM, plan: ShardingPlan, comm: Communicator, cfg: Config, **kw) -> "DistributedModelParallel":
    """``model`` (a plain DLRM) with its embeddings sharded by ``plan`` and its dense part under
    DDP; ``cfg`` gives the sparse optimizer, kernel backend, seed, exchange codecs, id mode and
    storage; ``kw``: device, backend, timer, hot_rows (see ``DistributedModelParallel``)."""
    return DistributedModelParallel(cfg, plan, comm, model=model, **kw)


class DistributedModelParallel(nn.Module):
    def __init__(
        self,
        cfg: Config,
        plan: ShardingPlan,
        comm: Communicator,
        *,
        model: DLRM | None = None,
        device: torch.device | str = "cpu",
        backend: str | None = None,
        timer=None,
        hot_rows: dict[str, int] | None = None,
    ) -> None:
        """Shard ``model`` (default: ``plain_dlrm(cfg)``) by ``plan`` over ``comm``: its embedding
        collection is replaced by a ``ShardedEmbeddingBagCollection`` (tables initialised from
        ``cfg.train.seed``), its dense part moved to ``device`` and wrapped in DDP."""
        super().__init__()
        self.comm = comm
        if model is None:
            model = plain_dlrm(cfg)
        ebc = ShardedEmbeddingBagCollection(
            cfg.model,
            plan,
            comm,
            SparseOptimizerSpec.from_train(cfg.train),
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
        if tuple(ebc.feature_dims) != tuple(model.feature_dims):
            raise ValueError(f"the model's interaction expects feature widths {tuple(model.feature_dims)}, the plan's "
                             f"sharded collection gives {tuple(ebc.feature_dims)} (features {ebc.feature_names})")
        model.embeddings = ebc
        self.module = model.to(device)
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
