"""W ranks: a 36 KB async all-reduce on the world group vs on a second group (as DDP's), with the
calibration's bursts and a barrier before each launch; wait return - launch, ms, mean over ranks."""
import os, sys, time, statistics, random
import torch, torch.distributed as dist
import torch.multiprocessing as mp
OVER = float(os.environ.get("OVER_MS", "2")) / 1e3
def busy(a, s):
    t = time.perf_counter() + s
    while time.perf_counter() < t:
        a @ a
def body(rank, W, q):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29543")
    dist.init_process_group("gloo", rank=rank, world_size=W)
    g2 = dist.new_group(list(range(W)))
    g3 = dist.new_group(list(range(W))) if os.environ.get("THIRD") else None
    a = torch.randn(96, 96); rng = random.Random(rank); ro = random.Random(0)
    b = torch.randn(36000 // 4)
    res = {"world": [], "second": [], "second_ownbar": [], "world_blocking": [], "second_blocking": [], "second_blocking_ownbar": []}
    for it in range(70):
        for mode in res:
            busy(a, 0.002 * rng.uniform(0.5, 1.5)); dist.barrier(group=g2 if 'ownbar' in mode else None)
            ov = OVER * ro.uniform(0, 2)
            g = None if mode.startswith("world") else g2
            t1 = time.time_ns()
            if "blocking" in mode:
                dist.all_reduce(b, group=g)
            else:
                h = dist.all_reduce(b, async_op=True, group=g); busy(a, ov); h.wait()
            t3 = time.time_ns()
            if it >= 10: res[mode].append((t1, t3))
    q.put((rank, res))
    dist.destroy_process_group()
if __name__ == "__main__":
    W = int(sys.argv[1]); ctx = mp.get_context("spawn"); q = ctx.Queue()
    ps = [ctx.Process(target=body, args=(r, W, q)) for r in range(W)]; [p.start() for p in ps]
    out = dict(q.get() for _ in ps); [p.join() for p in ps]
    line = []
    for k in out[0]:
        n = len(out[0][k])
        last = [max(out[r][k][i][0] for r in out) for i in range(n)]
        ret = [statistics.fmean(out[r][k][i][1] for r in out) - last[i] for i in range(n)]
        skew = [last[i] - min(out[r][k][i][0] for r in out) for i in range(n)]
        line.append(f"{k} {statistics.fmean(ret)/1e6:.2f} (skew {statistics.fmean(skew)/1e6:.2f})")
    print(W, f"over {OVER*1e3:.1f}ms", " ".join(line))
