import os, sys, json, time, ctypes, struct
sys.path.insert(0, "/work/main/benchmarks")
from pathlib import Path
import numpy as np
import sim_validation as sv
from neo_train.testing import run_ranks

libc = ctypes.CDLL(None, use_errno=True)
def set_slice(tid, ns, policy=0, nice=None):
    # struct sched_attr: size, policy, flags, nice, priority, runtime, deadline, period
    cur_nice = os.getpriority(os.PRIO_PROCESS, tid) if nice is None else nice
    buf = struct.pack("IIQiIQQQ", 48, policy, 0, cur_nice, 0, ns, 0, 0)
    b = ctypes.create_string_buffer(buf)
    r = libc.syscall(314, tid, b, 0)
    if r != 0:
        raise OSError(ctypes.get_errno(), f"sched_setattr {tid}")

def name_of(tid):
    return open(f'/proc/self/task/{tid}/comm').read().strip()

def comm_threads():
    out = []
    for tid in os.listdir("/proc/self/task"):
        name = open(f"/proc/self/task/{tid}/comm").read().strip()
        if name.startswith(("pt_gloo", "gloo_")):
            out.append(int(tid))
    return out

def apply(mode):
    if mode == "batch":
        os.sched_setscheduler(threading_native_id(), os.SCHED_BATCH, os.sched_param(0))
        return 0
    if mode == "yield":
        import neo_train.comm.native as nat
        orig = nat.NativeCommunicator._run
        def _run(self, op, tag, start, finish, async_op):
            def start2():
                w = start()
                os.sched_yield()
                return w
            return orig(self, op, tag, start2, finish, async_op)
        nat.NativeCommunicator._run = _run
        return 0
    tids = comm_threads()
    for tid in tids:
        if mode == "fifo" or (mode == "fifow" and name_of(tid).startswith("pt_gloo")):
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(1))
        elif mode in ("slice", "both"):
            set_slice(tid, 100_000)
        elif mode == "nice":
            os.setpriority(os.PRIO_PROCESS, tid, int(os.environ.get("NICE", "-10")))
    if mode in ("mainslice", "both"):
        set_slice(threading_native_id(), 100_000)
    return len(tids)

def threading_native_id():
    import threading
    return threading.get_native_id()

def body(comm, cfg, plan_json, trace_dir, mode):
    from neo_train.cli import wrap_communicator
    from neo_train.sharding import ShardingPlan
    from neo_train.train import Trainer
    L = int(os.environ.get("LOCAL_WORLD_SIZE", comm.world_size))
    comm = wrap_communicator(comm, cfg, L)
    t = Trainer(cfg, comm=comm, plan=ShardingPlan.from_json(plan_json), progress=False, log_dir=None)
    n = apply(mode)
    res = t.run()
    comm.dump(trace_dir)
    return {"ms": res.train_seconds / res.steps * 1e3, "n": n}

W = int(os.environ.get('W', '2'))
def waits(trace):
    out = []
    for r in range(W):
        d = json.load(open(f"{trace}/trace_rank{r}.json"))
        out += [e["wait_ns"] / 1e6 for e in d if "comms" in e and e.get("wait_ns") is not None and (e.get("step") or 0) >= 4]
    return np.array(out)

if __name__ == "__main__":
    from neo_train.config import preset
    cfg = preset("small")
    cfg = cfg.replace(train=cfg.train.replace(eval_every=0, eval_batches=1))
    wd = Path("/tmp/prio"); wd.mkdir(parents=True, exist_ok=True)
    plan = sys.argv[1]; W = int(os.environ.get("W", "2")); modes = sys.argv[2].split(","); reps = int(sys.argv[3])
    pipe = len(sys.argv) > 4 and sys.argv[4] == "pipelined"
    for rep in range(reps):
        for mode in modes:
            trace_dir = wd / f"{plan}_{mode}_{rep}"
            run_cfg = cfg.replace(train=cfg.train.replace(steps=40, pipeline=pipe), dist=cfg.dist.replace(trace_dir=str(trace_dir)))
            r = run_ranks(body, W, run_cfg, sv.make_plan(plan, cfg.model, W).to_json(), str(trace_dir), mode, timeout_s=900)
            w = waits(trace_dir)
            print(f"{plan} {mode:<9} rep{rep}: {r[0]['ms']:.2f} ms/step ({r[0]['n']} threads); waits mean {w.mean():.3f} p90 {np.percentile(w, 90):.3f} share>2ms {(w > 2).mean():.3f}", flush=True)
