"""Rows whose error moved by more than 3 points, and those crossing +-25 %, between two offline.py outputs.

    python rowdiff.py base_FD.txt live_FD.txt"""
import re
import sys


def rows(path):
    out = {}
    for line in open(path):
        if "|" not in line:
            continue
        case, rest = line.split("|", 1)
        name = case.split()[0]
        out[(name, "step")] = float(re.search(r"step\s+([+-][\d.]+)%", case).group(1))
        for i, (lab, v) in enumerate(re.findall(r"(\S+?)([+-]\d+)%", rest)):
            out[(name, f"{i}:{lab}")] = float(v)
    return out


a, b = rows(sys.argv[1]), rows(sys.argv[2])
for k in a:
    if k in b and abs(b[k] - a[k]) > 3 or (abs(a[k]) > 25) != (abs(b.get(k, a[k])) > 25):
        mark = " CROSSES" if (abs(a[k]) > 25) != (abs(b[k]) > 25) else ""
        print(f"{k[0]:22s} {k[1]:22s} {a[k]:+6.1f} -> {b[k]:+6.1f}{mark}")
