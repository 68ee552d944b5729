"""Bad inputs: a table of malformed inputs across Criteo data, TOML configs, plan files, CLI flags,
checkpoints, collective traces and the simulator. For each, ``neo-train`` must answer with its
documented exit code (2 for an input error), exactly one non-empty stderr line that says "error",
names the input (file, flag, field, table or feature) and says what is wrong; no traceback (no
--verbose is given), and quickly.

Every case runs in this process through ``neo_train.cli.main`` (what ``python -m neo_train`` runs,
whose uncaught exception would be a traceback and exit code 1: the harness reproduces that), with
``--nproc 1`` or with an error the launcher finds before any rank starts, so the whole table takes
seconds. The few that train (damaged Criteo lines, damaged checkpoints) run the `tiny` or a
1e-3-scaled `criteo_kaggle` model for a step or two.

Cases the product gets wrong today stay in the table as strict xfails saying what is wrong.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Union

import pytest

from neo_train.cli import main
from neo_train.config import preset
from neo_train.sharding import ShardingPlan

TIME_BOUND_S = 20.0  # per case; the slowest (a damaged checkpoint found on resume) take ~3 s
MAX_LINE_CHARS = 2000  # "one line" that is also readable (a 64 KB field must not be echoed whole)

# ---- the inputs ----------------------------------------------------------------------------------

TRAIN = ["train", "--nproc", "1", "--log-dir", "none", "--no-progress"]
TINY = [*TRAIN, "--preset", "tiny", "--steps", "2", "--batch-size", "8"]
# errors about plans are found by the launcher's preflight, which checks plans for multi-rank jobs
TINY_2 = ["train", "--nproc", "2", "--log-dir", "none", "--no-progress", "--preset", "tiny", "--steps", "2"]
CRITEO = [*TRAIN, "--preset", "criteo_kaggle", "--row-scale", "1e-3", "--batch-size", "4", "--steps", "1",
          "--data", "criteo", "--data-path"]
RESUME = [*TRAIN, "--preset", "tiny", "--steps", "3", "--batch-size", "8", "--checkpoint-dir", "{tmp}/ck"]
PLAN = ["plan", "--preset", "tiny", "--topology", "cpu_local", "--gpus-per-node", "2"]
SIM_TRACE = ["simulate", "--nodes", "2", "--gpus-per-node", "1", "--network", "flat", "--trace", "{tmp}/tr"]
SIM = ["simulate", "--nodes", "2", "--gpus-per-node", "1", "--network", "flat", "--model", "tiny"]


def _criteo_line(k: int = 0, *, label: str | None = None, col: int | None = None, value: str = "") -> str:
    """A valid Criteo line (label, I1..I13, C1..C26), with column ``col`` (0-based) replaced."""
    fields = [str(k % 2) if label is None else label, *(str(k + j) for j in range(13)),
              *(f"{k * 1000 + j:08x}" for j in range(26))]
    if col is not None:
        fields[col] = value
    return "\t".join(fields) + "\n"


def criteo(bad: str | None = None, n: int = 4) -> str:
    """``n`` lines (one batch of 4), line 2 replaced by ``bad``."""
    lines = [_criteo_line(k) for k in range(n)]
    if bad is not None:
        lines[1] = bad
    return "".join(lines)


def truncated_gzip() -> bytes:
    data = gzip.compress(criteo(n=8).encode())
    return data[: len(data) // 2]


TINY_TOML = preset("tiny").dumps()


def toml(old: str, new: str) -> str:
    """The `tiny` preset's TOML with one piece of text replaced (it must be there)."""
    assert old in TINY_TOML, old
    return TINY_TOML.replace(old, new, 1)


_TINY_MODEL = preset("tiny").model
PLAN_4 = ShardingPlan.uniform(_TINY_MODEL, "table_wise", 4).to_json()
PLAN_SMALL = ShardingPlan.uniform(preset("small").model, "table_wise", 2).to_json()
_plan2 = ShardingPlan.uniform(_TINY_MODEL, "table_wise", 2).to_dict()
_plan2["tables"][0]["shards"][0][0] = 7  # t0 on rank 7 of 2
PLAN_RANK_7 = json.dumps(_plan2)
_plan2 = ShardingPlan.uniform(_TINY_MODEL, "table_wise", 2).to_dict()
_plan2["tables"][1]["sharding"] = "rowwise"
PLAN_BAD_TYPE = json.dumps(_plan2)


def a2a(**over) -> dict:
    """One all_to_allv entry of a 2-rank param comms trace (both for simulate and replay)."""
    e = {"comms": "all_to_allv", "in_msg_size": 8, "out_msg_size": 8, "in_split": [4, 4], "out_split": [4, 4],
         "dtype": "float", "world_size": 2, "pg_id": 0, "global_ranks": [0, 1], "startTime_ns": 1000,
         "duration_ns": 500, "markers": ["fwd"]}
    e.update(over)
    return {k: v for k, v in e.items() if v is not None}


def trace(entry0: object, name: str = "rank{r}.json") -> dict[str, str]:
    """Two rank files in ``tr/``: rank 0's first entry is ``entry0``, rank 1's a good one."""
    return {f"tr/{name.format(r=0)}": json.dumps([entry0]), f"tr/{name.format(r=1)}": json.dumps([a2a()])}


def replay_trace(entry0: object) -> dict[str, str]:
    return trace(entry0, "trace_rank{r}.json")


# ---- damaged checkpoints (copies of one real checkpoint of `tiny`, made once) ----------------------

def _step_dir(ck: Path) -> Path:
    (d,) = [p for p in ck.iterdir() if p.name.startswith("step_")]
    return d


def _latest_outside(ck: Path) -> None:
    (ck / "latest").write_text(json.dumps({"checkpoint": "../elsewhere", "step": 2}))


def _no_manifest(ck: Path) -> None:
    (_step_dir(ck) / "manifest.json").unlink()


def _no_meta(ck: Path) -> None:
    (_step_dir(ck) / "checkpoint.json").unlink()


def _truncated_shard(ck: Path) -> None:
    p = _step_dir(ck) / "__0_0.distcp"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _flipped_byte(ck: Path) -> None:
    p = _step_dir(ck) / "__0_0.distcp"
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0xFF
    p.write_bytes(bytes(b))


def _tampered_manifest(ck: Path) -> None:
    p = _step_dir(ck) / "manifest.json"
    m = json.loads(p.read_text())
    m["files"]["checkpoint.json"]["bytes"] += 1
    p.write_text(json.dumps(m))


def _manifest_not_json(ck: Path) -> None:
    (_step_dir(ck) / "manifest.json").write_text("{ this is not json")


# ---- the table -----------------------------------------------------------------------------------

Content = Union[str, bytes, None]  # None: make a directory


@dataclass
class Case:
    argv: list[str]
    """The command line; ``{tmp}`` is the case's temporary directory."""
    names: tuple[str, ...]
    """The error line names the input: at least one of these (``{tmp}`` formatted) appears in it."""
    what: tuple[str, ...]
    """What is wrong: every one of these appears in the error line."""
    files: dict[str, Content] = field(default_factory=dict)
    """Files to create under ``{tmp}`` first (None: a directory)."""
    checkpoint: Callable[[Path], None] | None = None
    """Copy the real checkpoint to ``{tmp}/ck`` and damage it with this."""
    rc: int = 2
    prepare: Callable[[Path], None] | None = None
    """Anything else to do to ``{tmp}`` before the run."""


def C(argv, names, what, files=None, *, checkpoint=None, rc=2, prepare=None, xfail: str = "", marks=(),
      id: str):  # noqa: A002
    case = Case(list(argv), (names,) if isinstance(names, str) else tuple(names),
                (what,) if isinstance(what, str) else tuple(what), files or {}, checkpoint, rc, prepare)
    marks = [*marks, *([pytest.mark.xfail(reason=xfail, strict=True)] if xfail else [])]
    return pytest.param(case, id=id, marks=marks)


def _read_only(rel: str) -> Callable[[Path], None]:
    return lambda tmp: os.chmod(tmp / rel, 0o555)


_NOT_AS_ROOT = pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                                  reason="root may write to a read-only directory")


# A damaged or foreign checkpoint is found by the launcher (cli.preflight -> check_resumable),
# before any rank starts; a hash mismatch only when the run loads it (it hashes every file).

D = "{tmp}/d.tsv"
CASES = [
    # -- Criteo TSV (--data criteo --data-path FILE) --------------------------------------------
    C([*CRITEO, D], f"{D}, line 2", ("expected 40 tab-separated columns", "got 39"),
      {"d.tsv": criteo(_criteo_line(1).split("\t", 1)[1])}, id="criteo-39-columns"),
    C([*CRITEO, D], f"{D}, line 2", ("expected 40 tab-separated columns", "got 41"),
      {"d.tsv": criteo(_criteo_line(1).rstrip("\n") + "\t\n")}, id="criteo-41-columns"),
    C([*CRITEO, D], f"{D}, line 2", ("column 1 (label)", "label must be 0 or 1", "'x'"),
      {"d.tsv": criteo(_criteo_line(1, label="x"))}, id="criteo-label-not-numeric"),
    C([*CRITEO, D], f"{D}, line 2", ("column 1 (label)", "label must be 0 or 1", "'2'"),
      {"d.tsv": criteo(_criteo_line(1, label="2"))}, id="criteo-label-2"),
    C([*CRITEO, D], f"{D}, line 2", ("column 4 (I3)", "not a decimal integer"),
      {"d.tsv": criteo(_criteo_line(1, col=3, value="1.5"))}, id="criteo-dense-not-integer"),
    C([*CRITEO, D], f"{D}, line 2", ("column 20 (C6)", "not a hex string", "'zz0000g1'"),
      {"d.tsv": criteo(_criteo_line(1, col=19, value="zz0000g1"))}, id="criteo-bad-hex"),
    C([*CRITEO, D], f"{D}, line 2", ("column 18 (C4)", "hex value longer than 16 digits", "65,536 bytes"),
      {"d.tsv": criteo(_criteo_line(1, col=17, value="a" * 65536))}, id="criteo-64KB-field"),
    C([*CRITEO, D], D, ("cannot be read", "truncated or damaged gzip"),
      {"d.tsv": truncated_gzip()}, id="criteo-truncated-gzip"),
    C([*CRITEO, D], D, ("cannot be read", "gzip"),
      {"d.tsv": b"\x1f\x8b" + b"not a gzip stream at all" * 10}, id="criteo-gzip-magic-then-garbage"),
    C([*CRITEO, D], ("--data-path", D), "less than one global batch",
      {"d.tsv": ""}, id="criteo-empty-file"),
    C([*CRITEO, D], ("--data-path", D), "less than one global batch",
      {"d.tsv": criteo(n=3)}, id="criteo-shorter-than-a-batch"),
    C([*CRITEO, "{tmp}/missing.tsv"], "--data-path {tmp}/missing.tsv", "no such file", id="criteo-missing-file"),
    C([*CRITEO, "{tmp}/dir"], "--data-path {tmp}/dir", "is a directory", {"dir": None},
      id="criteo-directory"),
    C([*CRITEO, D, "--eval-path", "{tmp}/missing.tsv"], "--eval-path {tmp}/missing.tsv", "no such file",
      {"d.tsv": criteo()}, id="criteo-missing-eval-file"),
    C([*TRAIN, "--preset", "tiny", "--data", "criteo"], "data.path", "needs a path", id="criteo-without-path"),
    C([*TRAIN, "--preset", "tiny", "--steps", "1", "--batch-size", "4", "--data", "criteo", "--data-path", D],
      "model", ("26 categorical features", "4 sparse features"), {"d.tsv": criteo()}, id="criteo-model-not-26-features"),
    C([*CRITEO, D, "--holdout-every", "1"], "data.holdout_every", "must be 0 (no hold-out) or >= 2",
      {"d.tsv": criteo()}, id="criteo-holdout-every-1"),
    C([*CRITEO, D, "--epochs", "-1"], "data.epochs", "must be >= 0", {"d.tsv": criteo()}, id="criteo-epochs-negative"),

    # -- TOML configs (train --config FILE) ------------------------------------------------------
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", ("config.train", "unknown field(s) ['stepz']"),
      {"c.toml": toml("steps = 20", "stepz = 20")}, id="toml-unknown-key"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", "unknown field(s) ['trainer']",
      {"c.toml": TINY_TOML + "\n[trainer]\nsteps = 3\n"}, id="toml-unknown-section"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", ("config.train.steps", "expected int", "'ten'"),
      {"c.toml": toml("steps = 20", 'steps = "ten"')}, id="toml-wrong-type"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", ("config.model.tables[0].num_rows", "expected int"),
      {"c.toml": toml("num_rows = 100", "num_rows = 1.5")}, id="toml-float-for-int"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", ("train.batch_size", "must be >= 1, got -8"),
      {"c.toml": toml("batch_size = 32", "batch_size = -8")}, id="toml-negative-batch-size"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", ("train.steps", "must be >= 1, got 0"),
      {"c.toml": toml("steps = 20", "steps = 0")}, id="toml-steps-0"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", ("train.dense_lr", "must be a finite number", "inf"),
      {"c.toml": toml("dense_lr = 0.05", "dense_lr = inf")}, id="toml-inf"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", ("train.sparse_lr", "must be a finite number", "nan"),
      {"c.toml": toml("sparse_lr = 0.05", "sparse_lr = nan")}, id="toml-nan"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", ("dist.sharding", "must be one of", "'rowwise'"),
      {"c.toml": toml('sharding = "auto"', 'sharding = "rowwise"')}, id="toml-bad-sharding"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", ("train.sparse_optimizer", "must be one of", "'adagard'"),
      {"c.toml": toml('sparse_optimizer = "rowwise_adagrad"', 'sparse_optimizer = "adagard"')}, id="toml-bad-optimizer"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "train.kernel_backend", "unknown backend 'fbgem'",
      {"c.toml": toml('kernel_backend = "auto"', 'kernel_backend = "fbgem"')}, id="toml-bad-backend"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", ("data.id_mode", "must be one of", "'loose'"),
      {"c.toml": toml('id_mode = "strict"', 'id_mode = "loose"')}, id="toml-bad-id-mode"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", ("table 't1'", "dim 4 differs from bottom_mlp[-1] = 8"),
      {"c.toml": toml("dim = 8\npooling = \"mean\"", "dim = 4\npooling = \"mean\"")}, id="toml-table-dim-mismatch"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", ("model.tables", "duplicate table names ['t0']"),
      {"c.toml": toml('name = "t1"', 'name = "t0"')}, id="toml-duplicate-table"),
    C([*TRAIN, "--config", "{tmp}/c.toml"], "{tmp}/c.toml", "not valid TOML",
      {"c.toml": toml("steps = 20", "steps = = 20")}, id="toml-syntax-error"),
    C([*TRAIN, "--config", "{tmp}/missing.toml"], "{tmp}/missing.toml", "does not exist", id="toml-missing-file"),

    # -- plan files (train --nproc 2 --plan FILE: checked before any rank starts) ----------------
    C([*TINY_2, "--plan", "{tmp}/missing.json"], "{tmp}/missing.json", "does not exist", id="plan-missing"),
    C([*TINY_2, "--plan", "{tmp}/p.json"], ("{tmp}/p.json", "--plan"), "not valid JSON",
      {"p.json": '{"world_size": 2, "tables": [,]}'},
      id="plan-malformed-json"),
    C([*TINY_2, "--plan", "{tmp}/p.json"], ("{tmp}/p.json", "--plan"), ("malformed", "tables"),
      {"p.json": '{"world_size": 2, "local_world_size": 2}'},
      id="plan-missing-key"),
    C([*TINY_2, "--plan", "{tmp}/p.json"], ("{tmp}/p.json", "--plan"), ("world size 4", "2 ranks"),
      {"p.json": PLAN_4}, id="plan-other-world-size"),
    C([*TINY_2, "--plan", "{tmp}/p.json"], ("{tmp}/p.json", "--plan"), ("'t4'", "that the model does not have"),
      {"p.json": PLAN_SMALL}, id="plan-other-model"),
    C([*TINY_2, "--plan", "{tmp}/p.json"], ("{tmp}/p.json", "--plan"), ("table 't0'", "shard on rank 7"),
      {"p.json": PLAN_RANK_7}, id="plan-rank-out-of-range"),
    C([*TINY_2, "--plan", "{tmp}/p.json"], ("{tmp}/p.json", "--plan"), "unknown sharding type 'rowwise'",
      {"p.json": PLAN_BAD_TYPE}, id="plan-unknown-sharding-type"),

    # -- train flags -------------------------------------------------------------------------------
    C([*TINY, "--stpes", "3"], "--stpes", "unrecognized arguments", id="flag-unknown"),
    C([*TINY, "--steps", "0"], "train.steps", "must be >= 1, got 0", id="flag-steps-0"),
    C([*TINY, "--steps", "-1"], "train.steps", "must be >= 1, got -1", id="flag-steps-negative"),
    C([*TINY, "--steps", "ten"], "--steps", "invalid int value: 'ten'", id="flag-steps-not-int"),
    C([*TINY, "--batch-size", "0"], "train.batch_size", "must be >= 1, got 0", id="flag-batch-size-0"),
    C([*TINY, "--nproc", "0"], "--nproc", "must be >= 1, got 0", id="flag-nproc-0"),
    C([*TINY, "--nproc", "2", "--local-world-size", "3"], "--local-world-size 3", "does not divide --nproc 2",
      id="flag-local-world-size-not-dividing"),
    C([*TINY, "--backend", "fbgem"], "train.kernel_backend", "unknown backend 'fbgem'", id="flag-backend-typo"),
    C([*TINY, "--sharding", "rowwise"], "--sharding", "invalid choice: 'rowwise'", id="flag-sharding-typo"),
    C([*TINY, "--timeout", "0"], "dist.timeout_s", "must be > 0", id="flag-timeout-0"),
    C([*TINY, "--timeout", "nan"], "dist.timeout_s", "must be a finite number", id="flag-timeout-nan"),
    C([*TINY, "--eval-every", "-1"], "train.eval_every", "must be >= 0, got -1", id="flag-eval-every-negative"),
    C([*TINY, "--row-scale", "0"], "row_scale", "must be a positive number", id="flag-row-scale-0"),
    C([*TINY, "--collective-rules", "all_to_all_v:nosuch"], "dist.collective_rules", "nosuch",
      id="flag-collective-rules-unknown-algorithm"),
    C([*TINY, "--metrics-out", "{tmp}"], "--metrics-out {tmp}", "is a directory", id="flag-metrics-out-directory"),
    C([*TINY, "--checkpoint-dir", "{tmp}/f"], "--checkpoint-dir {tmp}/f", "is a file, not a directory",
      {"f": "x"}, id="flag-checkpoint-dir-is-a-file"),
    C([*TINY, "--checkpoint-dir", "{tmp}/f/ck"], ("--checkpoint-dir {tmp}/f/ck", "{tmp}/f"), "not a directory",
      {"f": "x"}, id="flag-checkpoint-dir-under-a-file"),
    C([*TINY, "--checkpoint-dir", "{tmp}/ro/ck"], "--checkpoint-dir {tmp}/ro/ck", "is not writable", {"ro": None},
      prepare=_read_only("ro"), marks=[_NOT_AS_ROOT], id="flag-checkpoint-dir-unwritable"),
    C([*TINY, "--device", "tpu"], "--device", "'tpu'",
      id="flag-device-unknown"),
    C([*TINY, "--max-restarts", "-1"], "--max-restarts", "must be >= 0",
      id="flag-max-restarts-negative"),
    C([*TINY, "--comm-dtype-fwd", "fp8"], "--comm-dtype-fwd", "invalid choice: 'fp8'", id="flag-comm-dtype-unknown"),
    C([*TINY, "--trace-dir", "{tmp}/f"], "--trace-dir {tmp}/f", "is a file, not a directory", {"f": "x"},
      id="flag-trace-dir-is-a-file"),

    # -- config / plan subcommands -----------------------------------------------------------------
    C(["config", "--preset", "tiny", "--row-scale", "-1"], "row_scale", "must be a positive number",
      id="config-row-scale-negative"),
    C(["config", "--preset", "tiny", "--out", "{tmp}"], "{tmp}", "is a directory",
      id="config-out-directory"),
    C([*PLAN, "--nodes", "0"], "--nodes", "must be >= 1, got 0", id="plan-cmd-nodes-0"),
    C([*PLAN, "--gpus-per-node", "0"], "--gpus-per-node", "must be >= 1, got 0", id="plan-cmd-gpus-per-node-0"),
    C(["plan", "--preset", "tiny", "--topology", "{tmp}/missing.toml"], "{tmp}/missing.toml", "nor a cluster TOML file",
      id="plan-cmd-topology-missing"),
    C([*PLAN, "--config", "{tmp}/missing.toml"], "argument --config", "not allowed with argument --preset",
      id="plan-cmd-preset-and-config"),
    C([*PLAN, "--optimizer", "adagard"], "optimizer", "must be one of", id="plan-cmd-unknown-optimizer"),
    C([*PLAN, "--memory-fraction", "nan"], "--memory-fraction", "nan",
      id="plan-cmd-memory-fraction-nan"),
    C([*PLAN, "--out", "{tmp}"], ("--out", "{tmp}"), "is a directory",
      id="plan-cmd-out-directory"),

    # -- simulate ----------------------------------------------------------------------------------
    C([*SIM, "--nodes", "0"], "--nodes", "must be >= 1, got 0", id="sim-nodes-0"),
    C([*SIM, "--network", "torus"], "--network", "invalid choice: 'torus'", id="sim-unknown-network"),
    C([*SIM, "--nic-gbps", "0"], "--nic-gbps", "must be a finite number > 0", id="sim-nic-gbps-0"),
    C([*SIM, "--gpus-per-node", "0"], "--gpus-per-node", "must be >= 1, got 0", id="sim-gpus-per-node-0"),
    C([*SIM, "--gpu-tflops", "0"], "--gpu-tflops", "must be a finite number > 0", id="sim-gpu-tflops-0"),
    C([*SIM, "--topology", "{tmp}/missing.toml"], "{tmp}/missing.toml", "nor a cluster TOML file", id="sim-topology-missing"),
    C([*SIM_TRACE, "--compute", "fwd"], "--compute", "expected marker=seconds", trace(a2a()),
      id="sim-compute-no-equals"),
    C([*SIM_TRACE, "--compute", "fwd=-1"], ("--compute", "compute:fwd"), "seconds must be >= 0", trace(a2a()),
      id="sim-compute-negative"),
    C([*SIM, "--model", "nosuch"], "'nosuch'", "unknown preset", id="sim-unknown-model"),
    C([*SIM_TRACE[:2], "1", *SIM_TRACE[3:]], "--nodes 1", "too few for the trace", trace(a2a()),
      id="sim-trace-needs-more-nodes"),
    C([*SIM_TRACE, "--out", "{tmp}/f"], ("--out", "{tmp}/f"), "not a directory", {"f": "x", **trace(a2a())},
      id="sim-out-is-a-file"),
    C([*SIM_TRACE, "--compute", "fwd=fast"], "--compute", "'fast'", trace(a2a()),
      id="sim-compute-not-a-number"),
    C([*SIM, "--compute", "input_dist=0.01"], "--compute", "applies to --trace only", id="sim-compute-without-trace"),
    C([*SIM, "--bulk-threshold-mb", "nan"], "--bulk-threshold-mb", "must be a finite number >= 0, got nan",
      id="sim-bulk-threshold-nan"),

    # -- simulate --trace ----------------------------------------------------------------------------
    C([*SIM_TRACE], "{tmp}/tr", "does not exist", id="sim-trace-missing-dir"),
    C([*SIM_TRACE], "{tmp}/tr", "holds no rank*.json files", {"tr": None, "tr/notes.json": "[]"},
      id="sim-trace-dir-without-rank-files"),
    C([*SIM_TRACE], "{tmp}/tr/rank0.json", "not valid JSON", {"tr/rank0.json": "[{", "tr/rank1.json": "[]"},
      id="sim-trace-malformed-json"),
    C([*SIM_TRACE], ("{tmp}/tr/rank0.json", "rank 0 entry 0"), "unsupported collective 'all_to_some'",
      trace(a2a(comms="all_to_some")), id="sim-trace-unknown-comms"),
    C([*SIM_TRACE], ("{tmp}/tr/rank0.json", "rank 0 entry 0"), ("in_msg_size", "-8"),
      trace(a2a(in_msg_size=-8, in_split=[])), id="sim-trace-negative-size"),
    C([*SIM_TRACE], ("{tmp}/tr/rank0.json", "rank 0 entry 0"), ("in_split", "-4"),
      trace(a2a(in_split=[-4, 12])), id="sim-trace-negative-split"),
    C([*SIM_TRACE], ("{tmp}/tr/rank0.json", "rank 0 entry 0"), "expected an object",
      trace(5), id="sim-trace-entry-not-an-object"),
    C([*SIM_TRACE], ("{tmp}/tr/rank0.json", "rank 0 entry 0"), "dtype 'float7'",
      trace(a2a(dtype="float7")), id="sim-trace-unknown-dtype"),

    # -- replay ------------------------------------------------------------------------------------
    C(["replay", "{tmp}/tr"], "{tmp}/tr", "no such trace file", id="replay-missing"),
    C(["replay", "{tmp}/tr"], "{tmp}/tr", "no trace_rank*.json files", {"tr": None}, id="replay-dir-without-rank-files"),
    C(["replay", "{tmp}/tr"], "{tmp}/tr", "expected 0..1", {"tr/trace_rank0.json": json.dumps([a2a()]),
      "tr/trace_rank2.json": json.dumps([a2a()])}, id="replay-rank-gap"),
    C(["replay", "{tmp}/tr"], "{tmp}/tr/trace_rank0.json", "not valid JSON",
      {"tr/trace_rank0.json": "[{", "tr/trace_rank1.json": "[]"}, id="replay-malformed-json"),
    C(["replay", "{tmp}/tr"], "{tmp}/tr/trace_rank0.json: entry 0", "'all_to_some' is not a collective we replay",
      replay_trace(a2a(comms="all_to_some")), id="replay-unknown-comms"),
    C(["replay", "{tmp}/tr"], "{tmp}/tr/trace_rank0.json: entry 0", ("in_msg_size", "integer >= 0", "-8"),
      replay_trace(a2a(in_msg_size=-8)), id="replay-negative-size"),
    C(["replay", "{tmp}/tr"], "{tmp}/tr/trace_rank0.json: entry 0", ("in_split", "non-negative", "-4"),
      replay_trace(a2a(in_split=[-4, 12])), id="replay-negative-split"),
    C(["replay", "{tmp}/tr"], "{tmp}/tr/trace_rank0.json: entry 0", "'in_split' sums to 9",
      replay_trace(a2a(in_split=[4, 5])), id="replay-split-sum"),
    C(["replay", "{tmp}/tr"], "{tmp}/tr/trace_rank0.json: entry 0", "missing field 'world_size'",
      replay_trace(a2a(world_size=None)), id="replay-missing-field"),
    C(["replay", "{tmp}/tr"], "{tmp}/tr/trace_rank0.json: entry 0", ("dtype", "'float7'"),
      replay_trace(a2a(dtype="float7")), id="replay-unknown-dtype"),
    C(["replay", "{tmp}/tr"], "{tmp}/tr/trace_rank0.json: entry 0", "expected an object",
      replay_trace(5), id="replay-entry-not-an-object"),
    C(["replay", "{tmp}/tr"], "group 0", "different numbers of collectives",
      {"tr/trace_rank0.json": json.dumps([a2a(), a2a()]), "tr/trace_rank1.json": json.dumps([a2a()])},
      id="replay-ranks-disagree"),
    C(["replay", "{tmp}/tr", "--rules", "all_to_all_v:nosuch"], "'nosuch'", "unknown collective algorithm",
      replay_trace(a2a()),
      id="replay-unknown-algorithm"),

    # -- checkpoints (a real 2-step checkpoint of `tiny`, damaged; resumed by a 3-step run) ------
    C(RESUME, "{tmp}/ck/latest", "not a checkpoint directory inside", checkpoint=_latest_outside,
      id="ckpt-latest-outside-dir"),
    C(RESUME, "{tmp}/ck/step_00000002", "has no manifest.json", checkpoint=_no_manifest, id="ckpt-manifest-deleted"),
    C(RESUME, "'manifest.json'", "is unreadable", checkpoint=_manifest_not_json, id="ckpt-manifest-not-json"),
    C(RESUME, "'manifest.json'", "its own digest does not match", checkpoint=_tampered_manifest,
      id="ckpt-manifest-tampered"),
    C(RESUME, "'checkpoint.json'", "is missing from", checkpoint=_no_meta, id="ckpt-meta-deleted"),
    C(RESUME, "'__0_0.distcp'", "truncated or damaged", checkpoint=_truncated_shard, id="ckpt-truncated-shard"),
    C(RESUME, "'__0_0.distcp'", ("is corrupted", "SHA-256"), checkpoint=_flipped_byte, id="ckpt-hash-mismatch"),
    C([*RESUME, "--row-scale", "2"], "{tmp}/ck/step_00000002", ("different model", "num_rows: checkpoint 100, this run 200"),
      checkpoint=lambda ck: None, id="ckpt-other-model"),
    C([*RESUME, "--steps", "1"], "{tmp}/ck", ("at step 2", "beyond train.steps = 1"), checkpoint=lambda ck: None,
      id="ckpt-beyond-steps"),
]


# ---- the harness ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory) -> Path:
    """One real checkpoint: `tiny`, 2 steps, batch 8, this process."""
    d = tmp_path_factory.mktemp("ckpt") / "ck"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*TRAIN, "--preset", "tiny", "--steps", "2", "--batch-size", "8", "--checkpoint-dir", str(d)])
    assert rc == 0, out.getvalue() + err.getvalue()
    assert (d / "latest").is_file() and (_step_dir(d) / "manifest.json").is_file(), sorted(d.rglob("*"))
    return d


def _make_files(root: Path, files: dict[str, Content]) -> None:
    for rel, content in files.items():
        p = root / rel
        if content is None:
            p.mkdir(parents=True, exist_ok=True)
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


def run_cli(argv: list[str]) -> tuple[int, str, str, float]:
    """``python -m neo_train ARGV`` in this process: (exit code, stdout, stderr, seconds). An
    exception escaping main is what the real command would show: a traceback and exit code 1."""
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:  # main returns its code; an exit from deeper down still counts
            rc = e.code if isinstance(e.code, int) else 1
        except Exception:  # noqa: BLE001
            traceback.print_exc(file=sys.stderr)
            rc = 1
    return rc, out.getvalue(), err.getvalue(), time.perf_counter() - t0


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_error(case: Case, tmp_path: Path, monkeypatch, request) -> None:
    monkeypatch.chdir(tmp_path)  # anything a run writes by default (runs/, out/) stays here
    monkeypatch.delenv("RANK", raising=False)  # the launcher's view, not a rank's
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    _make_files(tmp_path, case.files)
    if case.checkpoint is not None:
        shutil.copytree(request.getfixturevalue("checkpoint_root"), tmp_path / "ck")
        case.checkpoint(tmp_path / "ck")
    if case.prepare is not None:
        case.prepare(tmp_path)
    fmt = lambda s: s.replace("{tmp}", str(tmp_path))  # noqa: E731
    argv = [fmt(a) for a in case.argv]

    rc, out, err, seconds = run_cli(argv)

    shown = f"$ neo-train {' '.join(argv)}\nrc={rc}, {seconds:.1f} s\n--- stderr:\n{err[-3000:]}\n--- stdout:\n{out[-1500:]}"
    assert "Traceback" not in out + err, shown
    assert rc == case.rc, shown
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, shown
    line = lines[0]
    assert line.startswith("neo-train") and "error" in line, shown
    assert len(line) <= MAX_LINE_CHARS, f"{len(line)} chars\n{shown[:3000]}"
    names = [fmt(n) for n in case.names]
    assert any(n in line for n in names), f"names none of {names}\n{shown}"
    for w in case.what:
        assert w in line, f"does not say {w!r}\n{shown}"
    assert seconds < TIME_BOUND_S, shown


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 40


def test_control_inputs_are_accepted(tmp_path: Path, monkeypatch, checkpoint_root: Path) -> None:
    """The inputs the table damages are good when undamaged (so each case fails for its own reason):
    the Criteo file trains, the checkpoint resumes, the trace simulates and passes replay's checks."""
    monkeypatch.chdir(tmp_path)
    _make_files(tmp_path, {"d.tsv": criteo(n=8), **trace(a2a())})
    argv = [a.replace("{tmp}", str(tmp_path)) for a in [*CRITEO, D]]
    rc, out, err, _ = run_cli(argv)
    assert rc == 0 and "steps=1" in out, out + err
    shutil.copytree(checkpoint_root, tmp_path / "ck")
    rc, out, err, _ = run_cli([a.replace("{tmp}", str(tmp_path)) for a in RESUME])
    assert rc == 0 and "resumed from step 2" in out, out + err
    rc, out, err, _ = run_cli([a.replace("{tmp}", str(tmp_path)) for a in SIM_TRACE])
    assert rc == 0, out + err

    from neo_train.comm.replay import check_traces
    from neo_train.comm.trace import load_trace

    _make_files(tmp_path, replay_trace(a2a()))
    check_traces([load_trace(tmp_path / "tr" / f"trace_rank{r}.json") for r in range(2)])
