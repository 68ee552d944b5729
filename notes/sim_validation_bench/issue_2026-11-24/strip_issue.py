"""Copy a benchmark run's kept traces and calibrations (--keep) without the traces' issue_ns: the
same traces predicted under the rule before (an asynchronous collective starts when its last launch
returned). The calibrations' samples stay as measured (their launches timed at the issue).

    python strip_issue.py RUN_DIR OUT_DIR && python ../idle_2026-11-24/offline.py OUT_DIR"""
import json
import shutil
import sys
from pathlib import Path

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
n = 0
for f in dst.glob("*/trace_rank*.json"):
    es = json.loads(f.read_text())
    for e in es:
        n += e.pop("issue_ns", None) is not None
    f.write_text(json.dumps(es))
print(f"{n} issue_ns removed")
