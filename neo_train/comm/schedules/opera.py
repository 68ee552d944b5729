"""Opera-aligned all-to-all-v: rounds follow a rotor cycle's matchings over racks.

Ranks sit in racks of d hosts (``TopologyHint.hosts_per_rack``; rack of rank r = r // d, the last
rack may be partial). Opera's circuit switches cycle through N_r matchings of the racks that
together decompose the complete graph *with self-loops*: every rack pair gets a direct circuit in
exactly one slot of the cycle. Round t of this schedule is slot t of the cycle.

* Blocks of at least the bulk threshold (``TopologyHint.bulk_threshold_bytes``) wait for their
  rack pair's direct circuit: one transfer in round slot(A, B) (Opera's RotorLB bulk class).
* Smaller blocks do not wait: they take a two-hop relay through an intermediate rank (Valiant
  load balancing) in the earliest rounds: hop 1 to a host in the rack that the source rack's
  circuit reaches in the first slot where it is not a self-loop (slot 0, or 1), hop 2 from there
  to the destination in the next round. The relay host is spread over the intermediate rack
  ((src + dst) mod its size). Hop 2 does not wait for a circuit: it stands for Opera's
  always-available multi-hop expander path, so small blocks pay the two-hop bandwidth tax
  instead of waiting up to a cycle. When the first circuit already reaches the destination
  rack, the block goes direct.
* Traffic inside a rack goes through the top-of-rack switch: direct, round 0.

Every rank sends and receives in several rounds; on an ordinary network the executor runs the
independent rounds as one batch, while the round structure is what a simulator of the rotor
network times.

``matching_cycle(N_r)`` is a small deterministic generator: the circle construction, slot t pairs
rack i with rack (t - i) mod N_r. Each slot is a symmetric matching (an involution), each pair
{i, j} appears in slot (i + j) mod N_r only, and each rack has at most one self-loop slot.
``TopologyHint.matchings`` substitutes another cycle (e.g. a rotor schedule from the topology
layer); it is checked to be one.
"""
from __future__ import annotations

from typing import Sequence

from .registry import Algorithm, TopologyHint, prefix, register_algorithm
from .schedule import Schedule

__all__ = ["Opera", "matching_cycle", "check_matchings"]


def matching_cycle(n_racks: int) -> list[list[int]]:
    """N_r symmetric matchings (self-loops included) that cover every rack pair exactly once:
    ``cycle[t][i]`` is rack i's partner in slot t."""
    if n_racks < 1:
        raise ValueError(f"need at least one rack, got {n_racks}")
    return [[(t - i) % n_racks for i in range(n_racks)] for t in range(n_racks)]


def check_matchings(matchings: Sequence[Sequence[int]], n_racks: int) -> dict[tuple[int, int], int]:
    """Check ``matchings`` is a cycle over ``n_racks`` racks; return {(a, b): slot} for a != b."""
    slot: dict[tuple[int, int], int] = {}
    for t, m in enumerate(matchings):
        if len(m) != n_racks or any(not 0 <= p < n_racks for p in m):
            raise ValueError(f"opera: matching {t} must give a partner in 0..{n_racks - 1} for each of {n_racks} racks")
        for a, b in enumerate(m):
            if m[b] != a:
                raise ValueError(f"opera: matching {t} is not symmetric ({a}->{b} but {b}->{m[b]})")
            if a != b:
                if (a, b) in slot:
                    raise ValueError(f"opera: racks {a} and {b} meet in slots {slot[a, b]} and {t}")
                slot[a, b] = t
    missing = [(a, b) for a in range(n_racks) for b in range(n_racks) if a != b and (a, b) not in slot]
    if missing:
        raise ValueError(f"opera: rack pairs {missing[:4]} never get a direct circuit in the cycle")
    return slot


class Opera(Algorithm):
    ops = ("all_to_all_v",)

    def build(self, op: str, world_size: int, rank_sizes, topology_hint: TopologyHint) -> Schedule:
        W, S, hint = world_size, rank_sizes, topology_hint
        d = hint.hosts_per_rack or hint.local_world_size or 1
        if d < 1:
            raise ValueError(f"opera: hosts_per_rack must be >= 1, got {d}")
        nr = -(-W // d)
        cycle = [list(m) for m in hint.matchings] if hint.matchings is not None else matching_cycle(nr)
        slot = check_matchings(cycle, nr)
        rack = [r // d for r in range(W)]
        members = [list(range(a * d, min(W, a * d + d))) for a in range(nr)]
        threshold = hint.bulk_threshold_elems()
        s = Schedule.new(op, W, S, self.name)
        send_off = [prefix(S[r]) for r in range(W)]
        recv_off = [prefix([S[i][r] for i in range(W)]) for r in range(W)]
        fill = [0] * W
        steps = []  # (round, src, dst, src_buf, src_off, dst_buf, dst_off, n)
        for a in range(W):
            s.copy(0, a, "out", recv_off[a][a], "in", send_off[a][a], S[a][a])
            for b in range(W):
                n = S[a][b]
                if a == b or not n:
                    continue
                A, B = rack[a], rack[b]
                direct = (a, "in", send_off[a][b], b, "out", recv_off[b][a], n)
                if A == B:
                    steps.append((0, *direct))
                elif n >= threshold:
                    steps.append((slot[A, B], *direct))
                else:
                    t = 0 if cycle[0][A] != A else 1
                    C = cycle[t][A]
                    if C == B:
                        steps.append((t, *direct))
                        continue
                    v = members[C][(a + b) % len(members[C])]
                    steps.append((t, a, "in", send_off[a][b], v, "relay", fill[v], n))
                    steps.append((t + 1, v, "relay", fill[v], b, "out", recv_off[b][a], n))
                    fill[v] += n
        s.add_buffer("relay", fill)
        for k, src, sbuf, soff, dst, dbuf, doff, n in sorted(steps, key=lambda x: x[0]):
            s.send(k, src, dst, sbuf, soff, dbuf, doff, n)
        s.round(max(nr - 1, 0))  # one round per slot of the cycle, even when some carry nothing
        return s


register_algorithm("opera", Opera)
