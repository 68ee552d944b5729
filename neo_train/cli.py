"""The ``neo-train`` command.

    neo-train train                         # the `small` preset on synthetic data
    neo-train train --preset tiny --steps 50 --metrics-out out/metrics.json
    neo-train train --config my.toml --backend reference
    neo-train config --preset criteo_kaggle --out criteo.toml
    neo-train info                          # versions and kernel backends
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

__all__ = ["main", "build_parser", "config_from_args"]


def build_parser() -> argparse.ArgumentParser:
    from .config import PRESETS

    p = argparse.ArgumentParser(prog="neo-train", description="Neo-style DLRM training.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a DLRM and report loss, AUC and throughput")
    src = t.add_mutually_exclusive_group()
    src.add_argument("--preset", default="small", choices=PRESETS, help="named config (default: small)")
    src.add_argument("--config", type=Path, help="TOML config file (see `neo-train config`)")
    t.add_argument("--row-scale", type=float, default=1.0, help="multiply every table's rows (preset only)")
    t.add_argument("--steps", type=int, help="training steps")
    t.add_argument("--batch-size", type=int, help="per-rank batch size")
    t.add_argument("--seed", type=int, help="seed of initialisation and synthetic data")
    t.add_argument("--backend", help="embedding kernel backend: auto, reference, fbgemm, triton")
    t.add_argument("--data", choices=("synthetic", "criteo"), help="data source")
    t.add_argument("--data-path", help="Criteo TSV (train)")
    t.add_argument("--eval-path", help="Criteo TSV (held out)")
    t.add_argument("--eval-every", type=int, help="evaluate every N steps (0: only at the end)")
    t.add_argument("--eval-batches", type=int, help="batches per evaluation")
    t.add_argument("--log-dir", default=None, help="TensorBoard directory (default runs/<config>-<time>; 'none' disables)")
    t.add_argument("--metrics-out", type=Path, help="write per-step losses, eval metrics and throughput as JSON")
    t.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")

    c = sub.add_parser("config", help="print or write a preset as TOML")
    c.add_argument("--preset", default="small", choices=PRESETS)
    c.add_argument("--row-scale", type=float, default=1.0)
    c.add_argument("--out", type=Path, help="write here instead of printing")

    sub.add_parser("info", help="versions and available kernel backends")
    return p


def config_from_args(args: argparse.Namespace):
    """The run's Config: the preset or file, then command-line overrides (validated again)."""
    from .config import Config, preset

    cfg = Config.load(args.config) if args.config else preset(args.preset, row_scale=args.row_scale)
    train = {
        k: v
        for k, v in {
            "steps": args.steps,
            "batch_size": args.batch_size,
            "seed": args.seed,
            "kernel_backend": args.backend,
            "eval_every": args.eval_every,
            "eval_batches": args.eval_batches,
        }.items()
        if v is not None
    }
    data = {k: v for k, v in {"source": args.data, "path": args.data_path, "eval_path": args.eval_path}.items() if v is not None}
    return cfg.replace(train=cfg.train.replace(**train), data=cfg.data.replace(**data))


def _train(args: argparse.Namespace) -> int:
    import torch

    from .kernels import backend_report
    from .train import Trainer

    cfg = config_from_args(args)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    log_dir = args.log_dir
    if log_dir is None:
        log_dir = f"runs/{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    elif log_dir.lower() == "none":
        log_dir = None
    trainer = Trainer(cfg, device=device, log_dir=log_dir, progress=not args.no_progress and sys.stderr.isatty())
    print(f"neo-train: {cfg.name} | {len(cfg.model.tables)} tables, "
          f"{cfg.model.num_embedding_params / 1e6:.2f}M embedding params | device {device} | "
          f"kernel backend {trainer.backend} ({backend_report()})", flush=True)
    result = trainer.run()
    print(result.summary())
    if args.metrics_out:
        result.to_json(args.metrics_out)
        print(f"metrics written to {args.metrics_out}")
    if log_dir:
        print(f"TensorBoard logs in {log_dir} (tensorboard --logdir {log_dir})")
    return 0


def _config(args: argparse.Namespace) -> int:
    from .config import preset

    text = preset(args.preset, row_scale=args.row_scale).dumps()
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def _info(args: argparse.Namespace) -> int:
    import torch

    from . import __version__
    from .kernels import backend_report

    print(f"neo_train {__version__}, torch {torch.__version__}, cuda available: {torch.cuda.is_available()}")
    print(backend_report())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"train": _train, "config": _config, "info": _info}[args.command]
    try:
        return handler(args)
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        print(f"neo-train: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
