"""W ranks, the calibration's style (burst U(0.5,1.5) x BUSY, barrier, launch, draw of OVER x U(0,2),
wait): DDP's 36 KB async all-reduce, on the world group or a second one, alone or launched 0.5 ms
behind a 128 KB async all-to-all on the other group (MODES: world, second, second_behind, world_behind,
a2a_world, a2a_second, second_prewarm: a blocking all-reduce on it before the burst, second_ownbar: the
barrier on it). Per variant: the mean over iterations of the
mean completion over ranks (the future's callback) after the last rank's launch, ms."""
import os, sys, time, statistics
import torch.distributed as dist
from spawn_ranks import busy, run, setup
OVER = float(os.environ.get("OVER_MS", "1.5")) / 1e3
BUSY = float(os.environ.get("BUSY_MS", "2.1")) / 1e3
ITERS = int(os.environ.get("ITERS", "120"))
def body(rank, W):
    g2, a, rng, ro, x, y, b = setup(rank, W, 29547)
    modes = os.environ.get("MODES", "world,second,a2a_world,a2a_second").split(",")
    res = {m: [] for m in modes}
    for it in range(ITERS):
        for mode in modes:
            if mode == "second_prewarm":
                dist.all_reduce(b, group=g2)
            busy(a, BUSY * rng.uniform(0.5, 1.5)); dist.barrier(group=g2 if mode == "second_ownbar" else None)
            ov = OVER * ro.uniform(0, 2)
            g_ar = g2 if mode.startswith("second") else None
            g_a2a = None if mode.startswith("second") else g2
            h1 = None
            if mode.endswith("behind"):
                h1 = dist.all_to_all_single(y, x, async_op=True, group=g_a2a)
                busy(a, 0.0005)
            seen = []
            t1 = time.time_ns()
            if mode.startswith("a2a"):
                h2 = dist.all_to_all_single(y, x, async_op=True, group=g2 if mode.endswith("second") else None)
            else:
                h2 = dist.all_reduce(b, async_op=True, group=g_ar)
            f = h2.get_future().then(lambda _f: seen.append(time.time_ns()))
            busy(a, ov)
            if h1 is not None: h1.wait()
            h2.wait(); f.wait()
            if it >= 10: res[mode].append((t1, seen[0]))
    return res
if __name__ == "__main__":
    W = int(sys.argv[1])
    out = run(body, W)
    line = []
    for k in out[0]:
        n = len(out[0][k])
        last = [max(out[r][k][i][0] for r in out) for i in range(n)]
        done = [statistics.fmean(out[r][k][i][1] for r in out) - last[i] for i in range(n)]
        line.append(f"{k} {statistics.fmean(done)/1e6:.2f}/{statistics.median(done)/1e6:.2f}")
    print(W, f"over {OVER*1e3:.1f}ms busy {BUSY*1e3:.1f}ms (mean/median)", " ".join(line), flush=True)
