"""The calibrations' cells by size: first return (ms; the mean return where a cell has none), mean over
the kept runs' calibration files, per (W, kind, asynchronous, group size). Session 32: an all-reduce's
smallest cell at g = 3, 4 (one element per rank) is 35-50 % faster than every larger one, at g = 2
(four elements) not (tiny_cells.txt).
Usage: python tiny.py 'GLOB'  (default: /tmp/keeps/F?/keep/calibration_w*.json; the kept runs' keep/
directories come from the runF?_keep.tar.xz archives, `tar -xJf`)."""
import json, glob, statistics, sys
from collections import defaultdict

pattern = sys.argv[1] if len(sys.argv) > 1 else '/tmp/keeps/F?/keep/calibration_w*.json'
agg = defaultdict(list)
for f in sorted(glob.glob(pattern)):
    d = json.load(open(f))
    W = d['world_size']
    for s in d['samples']:
        if s.get('pass') is not None:  # the first pass only (the second and third measure other things)
            continue
        agg[(W, s['kind'], bool(s.get('async')), s['group'])].append((s['bytes'], s.get('first_s', s['seconds'])))
for key in sorted(agg):
    by = defaultdict(list)
    for b, t in agg[key]:
        by[b].append(t)
    print(key, ' '.join(f'{b}:{1e3 * statistics.fmean(by[b]):.2f}' for b in sorted(by)))
