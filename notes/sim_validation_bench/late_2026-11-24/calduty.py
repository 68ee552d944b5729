import sys, time
SIZES = [16, 4096, 32768]
def body(comm, busy_s, overlap, iters):
    import neo_train.topology.calibrate as cb
    from neo_train.topology.calibrate import DEFAULT_SIZES
    acc = [0.0]
    orig = cb._busy
    def busy(work, s):
        t = time.perf_counter(); orig(work, s); acc[0] += time.perf_counter() - t
    cb._busy = busy
    t0 = time.perf_counter()
    cb.measure_collectives(comm, sizes=SIZES, iters=iters, busy_s=busy_s, overlap_s=overlap)
    return acc[0] / (time.perf_counter() - t0)
if __name__ == "__main__":
    from neo_train.testing import run_ranks
    for X in (0.00064, 0.0012):
        r = run_ranks(body, 2, X, {"all_reduce": 0.0003, "all_to_allv": 0.0002, "all_gather": 0.0003}, 20, timeout_s=900)
        print(X, r)
