"""W = 4: the pairs' blocking all-gather of 128 KB, with compute after it and/or a world all-reduce
(DDP's bucket) in flight (experiments.txt). Since session 29 the code is
``session29_2026-11-28/bucket_w3w4.py`` (which also runs W = 3); this runs its W = 4 part, 60
iterations."""
import runpy
import sys
from pathlib import Path

here = Path(__file__).parent.parent / "session29_2026-11-28"
sys.path.insert(0, str(here))
sys.argv = [str(here / "bucket_w3w4.py"), "60", "4"]
runpy.run_path(sys.argv[0], run_name="__main__")
