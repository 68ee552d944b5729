"""The input dist's id exchange (``sharding.common.IdExchange``): one all-to-all sized from
earlier batches' counts, a second one when a sender's ids outgrow their reserved space.

Every rank builds every rank's sends from a seed (source, step, group), so each can compute what
it must receive without communicating; the routed ids, lengths and weights must equal that, in
[unit][source][bag] order, at every step: counts steady, jumping up (overflow), jumping down,
zero to some peer, zero everywhere."""
from __future__ import annotations

import pytest
import torch

from neo_train.comm import TracingCommunicator
from neo_train.sharding.common import IdExchange, Sends, reserved_capacity
from neo_train.testing import run_ranks

B = 5  # bags per source rank
# per group: units owned by each rank (W = 3; W = 2 uses the first two) and whether weighted
GROUPS = [([2, 1, 0], False), ([1, 0, 2], True), ([0, 1, 1], False)]


def _lengths(step: int, src: int, g: torch.Generator) -> torch.Tensor:
    """Bag lengths of a step's batch on source ``src``: steady (3 ids a bag), then around 9 on
    source 1 only (its peers' ids still fit), around 1, empty, around 6, steady again."""
    spread = {3: (8, 11) if src == 1 else (3, 4), 4: (0, 3), 5: (0, 1), 6: (5, 8)}.get(step, (3, 4))
    return torch.randint(*spread, (B,), generator=g, dtype=torch.int32)


def _piece(step: int, src: int, k: int, dest: int, unit: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source ``src``'s bags for (group k, unit ``unit`` of rank ``dest``): lengths, ids, weights."""
    g = torch.Generator().manual_seed(((step * 7 + src) * 5 + k) * 11 + dest * 3 + unit)
    lengths = _lengths(step, src, g)
    if step == 2 and dest == 0:
        lengths = torch.zeros(B, dtype=torch.int32)  # nothing to rank 0 this step
    n = int(lengths.sum())
    ids = torch.randint(0, 1 << 40, (n,), generator=g)
    if k == 2:  # int32 ids travel as int64 too, also in an overflow's second all-to-all
        ids = (ids >> 10).to(torch.int32)
    return lengths, ids, torch.rand(n, generator=g)


def _sends(step: int, src: int, W: int) -> list[Sends]:
    out = []
    for k, (units, weighted) in enumerate(GROUPS):
        per_dest = []
        for j in range(W):
            p = [_piece(step, src, k, j, u) for u in range(units[j])]
            per_dest.append(([x[0] for x in p], [x[1] for x in p], [x[2] for x in p] if weighted else None))
        out.append(Sends(per_dest, units[src], weighted))
    return out


def _expected(step: int, me: int, W: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    out = []
    for k, (units, weighted) in enumerate(GROUPS):
        p = [_piece(step, i, k, me, u) for u in range(units[me]) for i in range(W)]
        cat = (lambda c: torch.cat([x[c] for x in p]) if p else torch.zeros(0))  # noqa: E731
        out.append((cat(0).to(torch.int32), cat(1).to(torch.int64), cat(2).float() if weighted else None))
    return out


STEPS = 8


def _body(comm, W: int):
    comm = TracingCommunicator(comm)
    exchange = IdExchange(comm)
    per_step = []
    for step in range(STEPS):
        before = len(comm.entries)
        pending = exchange(_sends(step, comm.rank, W), B)
        pending.advance()
        routed = pending.wait()
        per_step.append(len(comm.entries) - before)
        for k, (r, (lengths, ids, wts)) in enumerate(zip(routed, _expected(step, comm.rank, W))):
            where = f"rank {comm.rank} step {step} group {k}"
            assert torch.equal(r.lengths, lengths), where
            assert torch.equal(r.values, ids), where
            if wts is None:
                assert r.weights is None, where
            else:
                assert torch.equal(r.weights, wts), where
    return per_step


@pytest.mark.parametrize("W", [2, 3])
def test_routed_ids_match_what_every_source_sent(W: int) -> None:
    """Exact ids, lengths and weights at every step; collectives per exchange: two for the first
    (no counts seen yet), one when every sender's ids fit, two on every rank when any sender's
    outgrew its space (step 3: source 1's bags triple; step 6: every source's double after an
    empty step), one after a drop (steps 4, 5) and after an overflow (step 7)."""
    res = run_ranks(_body, W, W)
    assert res[0] == res[-1]
    assert res[0] == [2, 1, 1, 2, 1, 1, 2, 1], res[0]


def test_capacity_from_the_counts_both_sides_have_seen() -> None:
    cap = reserved_capacity
    assert cap([]) == 0
    assert cap([640]) == 640 + 80 + 8
    assert cap([640] * 9) == 640 + 10 + 8  # steady counts (one-hot features): 1/64 + 8
    # iid variation: 6 median steps above the latest count; one jump moves the median little
    assert cap([100, 110, 95, 105, 100, 98, 103, 101, 1000]) == 1000 + 6 * 10 + 15 + 8
    assert all(cap(h) >= h[-1] for h in ([0], [0, 0], [5, 0], [1 << 20, 3]))
