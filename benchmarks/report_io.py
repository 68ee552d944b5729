"""What every benchmark does last: the JSON report and the PNG, each only when asked for."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def write_outputs(report: dict[str, Any], json_path: str | None, png_path: str | None,
                  write_png: Callable[[str, dict[str, Any]], None], indent: int = 1) -> None:  # fmt: skip
    """``report`` as JSON at ``json_path`` and ``write_png(png_path, report)``, creating folders."""
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report, indent=indent))
    if png_path:
        Path(png_path).parent.mkdir(parents=True, exist_ok=True)
        write_png(png_path, report)
