"""W ranks (gloo, this host): an asynchronous all-reduce of NBYTES (default 36 KB, DDP's bucket here)
launched together after a barrier, then COMPUTE_MS of compute on every rank, of one of several kinds
(matmul: 96 x 96 products, the calibration's burst; mlp: a small MLP's forward and backward on 1024
rows; emb: an EmbeddingBag's forward and backward; py: pure Python; spin: a perf_counter loop); its
completion (the future's callback) after the launch, ms, mean and median over 50 iterations per rank.

    COMPUTE_MS=4 python starve.py 2 matmul,mlp,emb,py,spin      (results: starve.txt)"""
import os, sys, time, statistics
import torch, torch.distributed as dist
import torch.multiprocessing as mp

KIND_MS = float(os.environ.get("COMPUTE_MS", "4"))
NB = int(os.environ.get("NBYTES", "36000"))

def body(rank, W, kinds, q):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("gloo", rank=rank, world_size=W)
    a = torch.randn(96, 96)
    mlp = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    x = torch.randn(1024, 128)
    emb = torch.nn.EmbeddingBag(100000, 64, mode="sum")
    ids = torch.randint(0, 100000, (1024 * 20,)); offs = torch.arange(0, 1024 * 20, 20)
    def compute(kind, sec):
        t_end = time.perf_counter() + sec
        while time.perf_counter() < t_end:
            if kind == "matmul":
                a @ a
            elif kind == "mlp":
                y = mlp(x).sum(); y.backward()
            elif kind == "emb":
                emb(ids, offs).sum().backward()
            elif kind == "py":
                sum(range(200))
            elif kind != "spin":
                raise ValueError(kind)
    t = torch.zeros(NB // 4)
    res = {}
    for kind in kinds:
        out = []
        for it in range(60):
            dist.barrier()
            seen = []
            t0 = time.time_ns()
            w = dist.all_reduce(t, async_op=True)
            fut = w.get_future().then(lambda f: seen.append(time.time_ns()))
            compute(kind, KIND_MS / 1e3)
            w.wait(); fut.wait()
            if it >= 10:
                out.append((seen[0] - t0) / 1e6)
        res[kind] = statistics.mean(out), statistics.median(out)
    q.put((rank, res))
    dist.destroy_process_group()

if __name__ == "__main__":
    W = int(sys.argv[1]); kinds = sys.argv[2].split(",")
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    ps = [ctx.Process(target=body, args=(r, W, kinds, q)) for r in range(W)]
    [p.start() for p in ps]
    out = dict(q.get() for _ in ps)
    [p.join() for p in ps]
    for k in kinds:
        print(W, k, KIND_MS, " ".join(f"r{r}: mean {out[r][k][0]:.2f} med {out[r][k][1]:.2f}" for r in sorted(out)))
