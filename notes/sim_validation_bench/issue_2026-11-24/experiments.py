"""The session-24 experiments (experiments.txt), W = 4 gloo ranks on this host:

    python experiments.py skew      # 1: the return after the last arrival against the arrivals' spread
    python experiments.py launch    # 4: what a long asynchronous launch is
    python experiments.py callback  # 7: how late a completion callback runs on computing ranks
    python experiments.py sweep     # 8: an all-reduce's duration against the compute over it"""
import random
import sys
import time

import numpy as np
import torch

from neo_train.comm.spawn import run_ranks
from neo_train.topology.calibrate import _busy

W = 4


def a2a(comm, nbytes):
    n = nbytes // 4 // W * W
    x, sp = torch.ones(n), [n // W] * W
    return lambda asyn: comm.all_to_all_v(x, sp, sp, async_op=asyn, tag="x")


def py_loop(seconds):
    t_end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < t_end:
        for i in range(200):
            x += i * i
    return x


# ---- 1: skew --------------------------------------------------------------------------------------
def skew_body(comm, variants, iters):
    work, op, rng, out = torch.randn(96, 96), a2a(comm, 65536), random.Random(comm.rank), {}
    for width_ms, asyn in variants:
        rows = []
        for it in range(iters + 3):
            comm.barrier()
            _busy(work, 2e-3 + width_ms * 1e-3 * rng.uniform(0, 1))
            t0 = time.time_ns()
            h = op(asyn)
            if asyn:
                h.wait()
            t1 = time.time_ns()
            _busy(work, 2e-3)
            if it >= 3:
                rows.append((t0, t1))
        out[(width_ms, asyn)] = rows
    return out


def skew(iters=80):
    variants = [(w, a) for a in (False, True) for w in (0.0, 2.4, 6.0)]
    res = run_ranks(skew_body, W, variants, iters, timeout_s=900)
    for v in variants:
        t = np.array([res[q][v] for q in range(W)], dtype=np.float64) / 1e6  # (W, iters, 2) ms
        last = t[:, :, 0].max(axis=0)
        leads, rets = (last - t[:, :, 0]).mean(axis=0), t[:, :, 1].mean(axis=0) - last
        firsts = t[:, :, 1].min(axis=0) - last
        b = np.polyfit(leads, rets, 1)
        q = np.quantile(leads, [0.25, 0.75])
        print(f"W={W} 65536B width {v[0]:.1f} ms {'async' if v[1] else 'block'}: mean lead {leads.mean():.2f} ms, "
              f"return after last {rets.mean():.2f} (first {firsts.mean():.2f}); slope {b[0]:+.3f} ms/ms; "
              f"lowest-lead quarter {rets[leads <= q[0]].mean():.2f}, highest {rets[leads >= q[1]].mean():.2f}", flush=True)


# ---- 4: launch ------------------------------------------------------------------------------------
def launch_body(comm, iters):
    work, op, rng, rows = torch.randn(96, 96), a2a(comm, 65536), random.Random(comm.rank), []
    for it in range(iters + 3):
        _busy(work, 2e-3 * rng.uniform(0.5, 1.5))
        ta = time.time_ns()
        h = op(True)
        tb = time.time_ns()
        h.wait()
        tw = time.time_ns()
        _busy(work, 2e-3 * rng.uniform(0.5, 1.5))
        if it >= 3:
            rows.append((ta, tb, tw))
    return rows


def launch(iters=300):
    t = np.array(run_ranks(launch_body, W, iters, timeout_s=900), dtype=np.float64) / 1e6  # (W, iters, 3) ms
    ta, tb, tw = t[..., 0], t[..., 1], t[..., 2]
    length = tb - ta
    last, it = tb.argmax(axis=0), np.arange(iters)
    last_len = length[last, it]
    others = np.array([[tw[q, i] for q in range(W) if q != last[i]] for i in range(iters)])
    print(f"W={W} comm: launch median {np.median(length):.3f} p90 {np.quantile(length, .9):.3f} ms; "
          f"last launcher's launch mean {last_len.mean():.3f}")
    for lo, hi in ((0, 0.4), (0.4, 1.0), (1.0, 100)):
        m = (last_len >= lo) & (last_len < hi)
        if m.any():
            print(f"  last launch {lo}-{hi} ms (n={m.sum()}): first peer's wait returns "
                  f"{(others.min(axis=1) - tb[last, it])[m].mean():+.3f} ms after its launch returned, "
                  f"{(others.min(axis=1) - ta[last, it])[m].mean():+.3f} after it began; mean peer return after its "
                  f"launch return {(others[m].mean(axis=1) - tb[last[m], it[m]]).mean():+.3f}")


# ---- 7, 8: an all-reduce seen through its callback ------------------------------------------------
def callback_body(comm, iters, kind, compute_ms, idle0):
    r, work, x, rng, rows = comm.rank, torch.randn(96, 96), torch.ones(36036 // 4), random.Random(comm.rank), []
    for it in range(iters + 3):
        comm.barrier()
        _busy(work, 1e-3 * rng.uniform(0.5, 1.5))
        seen = []
        t0 = time.time_ns()
        h = comm.all_reduce(x.clone(), async_op=True, tag="b")
        if r == 0 and idle0:  # rank 0 waits at once: its return marks the collective's end
            h.wait()
            t1 = tcb = time.time_ns()
        else:
            fut = h.future().then(lambda f: seen.append(time.time_ns()))
            (_busy(work, compute_ms * 1e-3) if kind == "busy" else py_loop(compute_ms * 1e-3))
            fut.wait()
            t1, tcb = time.time_ns(), seen[0]
        if it >= 3:
            rows.append((t0, tcb, t1))
    return rows


def callback(iters=60):
    for kind in ("busy", "python"):
        t = np.array(run_ranks(callback_body, W, iters, kind, 10.0, True, timeout_s=900), dtype=np.float64) / 1e6
        done0, last_launch = t[0, :, 2], t[:, :, 0].max(axis=0)
        cb = t[1:, :, 1] - done0[None, :]
        print(f"W=4 36 KB all_reduce, ranks 1-3 computing 10 ms ({kind}): rank 0 (idle) returns "
              f"{np.mean(done0 - last_launch):.2f} ms after the last launch; the computing ranks' callbacks run "
              f"{np.mean(cb):+.2f} ms after that (median {np.median(cb):+.2f}, p90 {np.quantile(cb, .9):+.2f})", flush=True)


def sweep(iters=40):
    for idle0 in (True, False):
        for ms in (2.5, 5.0, 10.0, 20.0):
            t = np.array(run_ranks(callback_body, W, iters, "busy", ms, idle0, timeout_s=900), dtype=np.float64) / 1e6
            last_launch, done = t[:, :, 0].max(axis=0), t[:, :, 1]  # completion as each rank saw it
            first = done.min(axis=0) - last_launch
            print(f"W=4 36 KB all_reduce, {'rank 0 idle, ' if idle0 else 'all '}ranks computing {ms:4.1f} ms after "
                  f"launching: first completion {np.mean(first):.2f} ms after the last launch (median "
                  f"{np.median(first):.2f}), mean {np.mean(done.mean(axis=0) - last_launch):.2f}", flush=True)


if __name__ == "__main__":
    {"skew": skew, "launch": launch, "callback": callback, "sweep": sweep}[sys.argv[1]]()
