"""Offline variant (session 28): a blocking call made while an asynchronous collective is in flight on
one of its ranks (launched before it by the recorded order, joined after it) is charged that
collective's company figure: the in-flight kind's asynchronous ``KindFit.concurrent_s`` at the in-flight
group's size (the largest over the ones in flight). Session 23 charged the blocking call's own kind's
figure (about 0 for a g = 2 all-gather) and found no change; W = 4 TWRW's node-local all-gather in the
backward runs beside DDP's W-wide bucket and is short in every run (-24 to -33 %). Scored like
``idle_2026-11-24/offline.py`` (which it runs).

    python inflight_offline.py RUN_DIR                  # every W
    INFLIGHT_MIN_W=4 INFLIGHT_KINDS=all_reduce python inflight_offline.py RUN_DIR

Since session 29 this runs ``session29_2026-11-28/live_offline.py`` with ``LIVE=0`` (the same charge,
one copy of the code). Both are variants on the model before the live company was built (e5b8a93): run
them with ``ROOT=`` a checkout of 95a75a8 (``git worktree add /tmp/base 95a75a8``); on later code they
charge twice."""
import os
import runpy
import sys
from pathlib import Path

os.environ["LIVE"] = "0"
os.environ.setdefault("LIVE_MIN_W", os.environ.get("INFLIGHT_MIN_W", "2"))
if "INFLIGHT_KINDS" in os.environ:
    os.environ.setdefault("LIVE_KINDS", os.environ["INFLIGHT_KINDS"])
sys.argv[0] = str(Path(__file__).parent.parent / "session29_2026-11-28/live_offline.py")
runpy.run_path(sys.argv[0], run_name="__main__")
