"""W ranks: DDP's bucket (36 KB async all-reduce, its own group) launched alone or 0.5 ms behind an
asynchronous 128 KB all-to-all on the world group, bursts of compute as the calibration's; the bucket's
wait return - its launch, ms (mean over ranks and iterations), and the all-to-all's."""
import os, sys, time, statistics
import torch.distributed as dist
from spawn_ranks import busy, run, setup
OVER = float(os.environ.get("OVER_MS", "2")) / 1e3
def body(rank, W):
    g2, a, rng, ro, x, y, b = setup(rank, W, 29541)
    res = {"alone": [], "behind": [], "a2a_lead": [], "a2a_alone": []}
    for it in range(80):
        for mode in ("alone", "behind", "a2a_alone"):
            busy(a, 0.002 * rng.uniform(0.5, 1.5)); dist.barrier()
            ov = OVER * ro.uniform(0, 2)
            t0 = time.perf_counter()
            h1 = dist.all_to_all_single(y, x, async_op=True) if mode != "alone" else None
            if mode == "behind": busy(a, 0.0005)
            t1 = time.perf_counter()
            h2 = dist.all_reduce(b, async_op=True, group=g2) if mode != "a2a_alone" else None
            busy(a, ov)
            if h1 is not None: h1.wait(); t2 = time.perf_counter()
            if h2 is not None: h2.wait(); t3 = time.perf_counter()
            if it >= 10:
                if mode != "a2a_alone": res[mode].append((t3 - t1) * 1e3)
                if mode == "behind": res["a2a_lead"].append((t2 - t0) * 1e3)
                if mode == "a2a_alone": res["a2a_alone"].append((t2 - t0) * 1e3)
    return {k: statistics.fmean(v) for k, v in res.items()}
if __name__ == "__main__":
    W = int(sys.argv[1])
    out = run(body, W)
    print(W, f"over {OVER*1e3:.1f}ms", " ".join(f"{k} {statistics.fmean(o[k] for o in out.values()):.2f}" for k in out[0]))
