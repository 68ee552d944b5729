"""The collective interface on real gloo ranks: each collective against a by-hand oracle, the
autograd mirrors, codecs' error bounds, uneven and zero-sized splits, and timeouts."""
import time

import pytest
import torch

from neo_train.comm import CollectiveError, all_gather_v, all_to_all_v, make_codec, reduce_scatter_v
from neo_train.testing import BackwardMark, RankFailed, run_ranks


def _splits(seed: int, W: int) -> list[list[int]]:
    """sizes[i][j]: rows rank i sends to rank j (zeros included)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(0, 4, (W, W), generator=g)
    s[0, W - 1] = 0
    return s.tolist()


def _data(seed: int, rank: int, n: int, d: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100 + rank)
    return torch.randn(n, d, generator=g, dtype=torch.float64).float()


def _collectives_body(comm, seed):
    W, r = comm.world_size, comm.rank
    sizes = _splits(seed, W)
    # all_to_all_v: rank r's block for peer j is rows [sum(sizes[r][:j]) ...)
    x = _data(seed, r, sum(sizes[r]))
    got = comm.all_to_all_v(x, sizes[r], [sizes[i][r] for i in range(W)])
    expect = []
    for i in range(W):
        xi = _data(seed, i, sum(sizes[i]))
        off = sum(sizes[i][:r])
        expect.append(xi[off : off + sizes[i][r]])
    assert torch.equal(got, torch.cat(expect))
    # split-size exchange
    assert comm.split_sizes(sizes[r]) == [sizes[i][r] for i in range(W)]
    # reduce_scatter_v: every rank holds (sum splits, D); rank r gets the sum of segment r
    splits = sizes[0]
    y = _data(seed + 1, r, sum(splits))
    rs = comm.reduce_scatter_v(y, splits)
    off = sum(splits[:r])
    ref = sum(_data(seed + 1, i, sum(splits))[off : off + splits[r]].double() for i in range(W))
    torch.testing.assert_close(rs.double(), ref, rtol=1e-6, atol=1e-6)
    # all_gather_v with uneven (and zero) sizes
    ag = comm.all_gather_v(_data(seed + 2, r, splits[r]), splits)
    assert torch.equal(ag, torch.cat([_data(seed + 2, i, splits[i]) for i in range(W)]))
    # all_reduce sum / max / avg, async handle
    z = torch.full((2,), float(r + 1))
    h = comm.all_reduce(z, async_op=True)
    assert torch.equal(h.wait(), torch.full((2,), W * (W + 1) / 2))
    assert torch.equal(comm.all_reduce(torch.tensor([float(r)]), op="max"), torch.tensor([float(W - 1)]))
    torch.testing.assert_close(comm.all_reduce(torch.tensor([float(r)]), op="avg"), torch.tensor([(W - 1) / 2]))
    return True


@pytest.mark.parametrize("W", [2, 3])
def test_collectives_match_the_oracle(W):
    assert run_ranks(_collectives_body, W, 7 + W) == [True] * W


def _autograd_body(comm, seed, codec):
    """Gradients through the autograd wrappers equal the mirror collective of the upstream grad."""
    W, r = comm.world_size, comm.rank
    sizes = _splits(seed, W)
    fwd = bwd = make_codec(codec)
    x = _data(seed, r, sum(sizes[r])).requires_grad_()
    outs = [sizes[i][r] for i in range(W)]
    y = all_to_all_v(comm, x, sizes[r], outs, fwd, bwd)
    gy = _data(seed + 5, r, y.shape[0])
    y.backward(gy)
    expect_gx = comm.all_to_all_v(gy, outs, sizes[r])
    tol = {"fp32": 0, "fp16": 1e-3, "bf16": 8e-3}[codec]
    torch.testing.assert_close(x.grad, expect_gx, rtol=tol, atol=tol)
    torch.testing.assert_close(y.detach(), comm.all_to_all_v(x.detach(), sizes[r], outs), rtol=tol, atol=tol)
    splits = sizes[0]
    a = _data(seed + 3, r, sum(splits)).requires_grad_()
    rs = reduce_scatter_v(comm, a, splits, fwd, bwd)
    g = _data(seed + 6, r, rs.shape[0])
    rs.backward(g)
    torch.testing.assert_close(a.grad, comm.all_gather_v(g, splits), rtol=tol, atol=tol)
    b = _data(seed + 4, r, splits[r]).requires_grad_()
    ag = all_gather_v(comm, b, splits, fwd, bwd)
    g2 = _data(seed + 7, r, ag.shape[0])
    ag.backward(g2)
    torch.testing.assert_close(b.grad, comm.reduce_scatter_v(g2, splits), rtol=tol * W, atol=tol * W)
    return True


@pytest.mark.parametrize("codec", ["fp32", "fp16", "bf16"])
def test_autograd_mirrors_and_codecs(codec):
    assert run_ranks(_autograd_body, 3, 11, codec) == [True] * 3


def _mismatch_body(comm):
    with pytest.raises(ValueError, match="sum to"):
        comm.all_to_all_v(torch.zeros(3, 2), [1, 1], [1, 1])
    with pytest.raises(ValueError, match="split sizes for a world of 2"):
        comm.all_to_all_v(torch.zeros(3, 2), [3], [1, 1])
    return True


def test_bad_splits_are_named():
    assert run_ranks(_mismatch_body, 2) == [True, True]


def _hang_body(comm):
    if comm.rank == 1:
        time.sleep(6)  # never joins the collective in time
        return "late"
    try:
        comm.all_to_all_v(torch.zeros(2, 1), [1, 1], [1, 1], tag="output_dist")
    except CollectiveError as e:
        return str(e)
    return "no error"


def test_a_missing_peer_is_an_error_naming_the_collective():
    t = time.time()
    msg, _ = run_ranks(_hang_body, 2, collective_timeout_s=2.0)
    assert "all_to_all_v [output_dist] on rank 0" in msg, msg
    assert time.time() - t < 60


def _raise_body(comm):
    if comm.rank == 1:
        raise KeyError("boom on rank 1")
    return True


def test_rank_failures_surface_with_their_traceback():
    with pytest.raises(RankFailed, match="rank 1"):
        run_ranks(_raise_body, 2)


class _Logged:
    """A communicator that logs each all-to-all call (tag, async?) and each wait on its handle."""

    def __init__(self, inner, log: list):
        self.inner, self.log = inner, log
        self.rank, self.world_size = inner.rank, inner.world_size

    def all_to_all_v(self, x, ins, outs, *, async_op=False, tag=""):
        from neo_train.comm.interface import Handle

        self.log.append(("call", tag, async_op))
        got = self.inner.all_to_all_v(x, ins, outs, async_op=async_op, tag=tag)
        if not async_op:
            return got
        return Handle(lambda: (self.log.append(("wait", tag)), got.wait())[1])


def _async_backward_body(comm, seed, codec):
    from neo_train.comm.autograd import all_to_all_v_async

    W, r = comm.world_size, comm.rank
    sizes = _splits(seed, W)
    log: list = []
    c = _Logged(comm, log)
    fwd = bwd = make_codec(codec)
    x = _data(seed, r, sum(sizes[r])).requires_grad_()
    outs = [sizes[i][r] for i in range(W)]
    pending = all_to_all_v_async(c, x * 1.0, sizes[r], outs, fwd, bwd, tag="t")
    h = _data(seed + 1, r, sum(outs)).requires_grad_()
    m = BackwardMark.apply(h * 2.0, log)  # recorded after the start, before the wait (the bottom MLP's place)
    y = pending.wait()
    gy = _data(seed + 5, r, y.shape[0])
    ((y + m) * gy).sum().backward()
    tol = {"fp32": 0, "fp16": 1e-3}[codec]
    torch.testing.assert_close(x.grad, comm.all_to_all_v(gy, outs, sizes[r]), rtol=tol, atol=tol)
    torch.testing.assert_close(h.grad, 2.0 * gy)
    return log


@pytest.mark.parametrize("codec", ["fp32", "fp16"])
def test_async_all_to_all_backward_overlaps_what_ran_between_start_and_wait(codec):
    """all_to_all_v_async's backward starts the mirror exchange in the wait's backward and waits
    for it in the start's, so the backward of what the forward ran between them (the bottom MLP)
    runs while it is in flight; the gradient is the mirror exchange's (uneven, zero splits)."""
    for log in run_ranks(_async_backward_body, 3, 13, codec):
        assert log == [("call", "t", True), ("wait", "t"), ("call", "t_bwd", True), "mark", ("wait", "t_bwd")], log


def test_timing_books_what_the_caller_waited_apart_from_issue_to_done():
    """TimingCommunicator: ``comm:<tag>`` runs from an asynchronous collective's launch to its
    wait's return, ``blocked:<tag>`` only the launch and the wait (not the work in between); a
    blocking collective is both."""
    from neo_train.comm.interface import Handle
    from neo_train.comm.timing import TimingCommunicator
    from neo_train.train.timing import PhaseTimer

    class Instant:
        rank, world_size = 0, 1

        def all_to_all_v(self, x, ins, outs, *, async_op=False, tag=""):
            return Handle(lambda: x) if async_op else x

    timer = PhaseTimer()
    comm = TimingCommunicator(Instant(), timer)
    x = torch.zeros(4)
    handle = comm.all_to_all_v(x, [4], [4], async_op=True, tag="a")
    time.sleep(0.05)  # the work the collective overlaps
    handle.wait()
    comm.all_to_all_v(x, [4], [4], tag="s")
    t = timer.totals()
    assert t["comm:a"] >= 0.05 and t["blocked:a"] < 0.01
    assert t["blocked:s"] < 0.01 and t["comm:s"] < 0.01


def test_a_paused_timer_books_nothing():
    """PhaseTimer.paused (the trainer's evaluation): spans and additions closed inside are not
    booked; outside, as before."""
    from neo_train.train.timing import PhaseTimer

    timer = PhaseTimer()
    with timer("a"):
        pass
    with timer.paused():
        with timer("a"):
            time.sleep(0.02)
        timer.add("b", 1.0)
    timer.add("b", 0.5)
    t = timer.totals()
    assert t["a"] < 0.01 and t["b"] == 0.5


def test_handle_future_is_the_backends_own_or_completed_by_waiting():
    from neo_train.comm.interface import Handle

    waited = []
    plain = Handle(lambda: (waited.append(1), torch.ones(2))[1])
    assert not plain.has_future and not waited
    fut = plain.future()  # no backend future: completed by waiting now
    assert waited == [1] and fut.done() and torch.equal(fut.value(), torch.ones(2))

    own: torch.futures.Future = torch.futures.Future()
    backed = Handle(lambda: torch.zeros(1), _future=lambda: own)
    assert backed.has_future
    got = backed.future()
    assert got is own and not got.done()  # nothing waited: the transport completes it
    own.set_result(torch.full((1,), 3.0))
    assert got.value().item() == 3.0
