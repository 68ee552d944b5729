"""Checkpoints that survive resharding: save under one world size and plan, load under another.

    save_checkpoint(trainer, checkpoint_dir("ckpt", 100), step=100)  # collective: every rank calls it
    start = load_checkpoint(trainer, find_latest("ckpt"))            # collective; the step to resume at
    start, data_batch = resume_from_latest(trainer, "ckpt")          # both, (0, 0) without a checkpoint

A checkpoint directory (one run's checkpoints sit side by side under a root, whose ``latest``
file names the newest complete one)::

    __<rank>_0.distcp    torch.distributed.checkpoint (DCP) data, one file per writing rank
    .metadata            DCP's own pickled index, kept for DCP's tools; never read here
    dcp_metadata.json    the same index as JSON: what load_checkpoint reads
    checkpoint.json      step, data position, config and model hash, plan, block list, the
                         dense optimizer's param groups and non-tensor state
    rng/rank-<r>.json    rank r's torch (and CUDA), numpy and python RNG states
    manifest.json        SHA-256 and size of every other file, and a digest of itself

Load first checks every file against manifest.json (the hashing split over the ranks) and raises
CheckpointError naming a missing, truncated or corrupted file; it unpickles nothing (DCP's index
comes from JSON, tensors through ``torch.load(weights_only=True)``). A checkpoint of another model
or other optimizer kinds is refused, naming the fields that differ; training settings (steps,
learning rates, batch size) may change on resume. Saving writes ``<dir>.tmp-<step>``, renames it,
then rewrites ``latest`` atomically: a crash mid-save leaves the last good checkpoint intact.
Every rank must see the same directory (a shared filesystem), as DCP's file writer requires.

The parts: ``files`` (names, manifest, DCP's index as JSON), ``reshard`` (blocks of logical
tables: what a rank writes, how a new shard is assembled), ``save_load`` (the entry points).
"""
from .files import CheckpointError, verify_checkpoint
from .save_load import (
    check_resumable,
    checkpoint_dir,
    data_start_batch,
    find_latest,
    load_checkpoint,
    load_history,
    resume_from_latest,
    save_checkpoint,
)

__all__ = [
    "CheckpointError",
    "check_resumable",
    "save_checkpoint",
    "load_checkpoint",
    "find_latest",
    "load_history",
    "resume_from_latest",
    "checkpoint_dir",
    "verify_checkpoint",
    "data_start_batch",
]
