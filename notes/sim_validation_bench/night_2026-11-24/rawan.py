import pickle, sys, numpy as np
for f in sys.argv[1:]:
    g = pickle.load(open(f, "rb"))  # (W, 4, iters): launch-return, wait start, wait return, overlap ns
    L = g[:, 0].max(0); S = g[:, 1]; R = g[:, 2]; o = g[0, 3] / 1e6
    blocked = (R - S) / 1e6  # ms per rank
    b = blocked.mean(0)
    print(f, "iters", g.shape[2])
    bins = [0, 0.05, 0.2, 0.5, 1, 1.5, 2, 3, 5, 20]
    for lo, hi in zip(bins, bins[1:]):
        m = (o >= lo) & (o < hi)
        if m.sum() == 0: continue
        end = (R.min(0) - L)[m] / 1e6  # first return after last launch
        print(f"  overlap [{lo},{hi}) ms n={m.sum():3d}: mean blocked {b[m].mean():.3f}  P(blocked>0.05) {(blocked[:, m] > 0.05).mean():.2f}  p90 blocked {np.percentile(blocked[:, m], 90):.3f}  first-return-after-launch median {np.median(end):.3f}")
