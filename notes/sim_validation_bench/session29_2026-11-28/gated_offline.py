"""Offline variant (session 29) on the built live company (e5b8a93 on): charge it only where the live
collective's group is larger than the blocking call's (W = 4 TWRW's pairs beside DDP's world bucket), not
where they are the same ranks (W = 2, 3 TWRW's node-local group is the whole world), where the model was
unbiased before the rule and 8 - 16 points long with it. Scored like ``idle_2026-11-24/offline.py``.

    python gated_offline.py RUN_DIR"""
import os
import runpy
import sys
from pathlib import Path

ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT, ROOT + "/benchmarks"]
from neo_train.topology import trace_input as ti  # noqa: E402

_orig = ti.live_company


def live_company(blocks, colls):
    return {k: v for k, v in _orig(blocks, colls).items() if v[1] > len(colls[k])}  # v: (kind, group size)


ti.live_company = live_company
sys.argv = [str(Path(__file__).parent.parent / "idle_2026-11-24/offline.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
