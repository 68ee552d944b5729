"""Topologies: Opera's matchings and rotor schedule, its timing arithmetic and config errors;
fat-tree sizing; world-size checks."""
import math
import random

import numpy as np
import pytest

from neo_train.topology.fattree import FatTree, fat_tree_k
from neo_train.topology.flat import FlatNetwork
from neo_train.topology.network import GBPS
from neo_train.topology.opera import OperaNetwork, hop_distances, random_matchings, superslice_timing

B = 100 * GBPS


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 32])
def test_matchings_cover_every_rack_pair_exactly_once(n):
    P = random_matchings(n, random.Random(n))
    assert P.shape == (n, n)
    seen = np.zeros((n, n), dtype=int)
    for m in range(n):
        assert (P[m][P[m]] == np.arange(n)).all(), "a matching must be symmetric"
        seen[np.arange(n), P[m]] += 1
    assert (seen == 1).all(), "every rack pair (self-loops included) in exactly one matching"


@pytest.mark.parametrize("racks,u", [(8, 4), (12, 4), (32, 4), (16, 8)])
def test_rotor_schedule_gives_each_pair_one_circuit_per_cycle(racks, u):
    net = OperaNetwork(racks, 2, u, tries=2)
    n = racks
    assert net.time_varying and net.per_rotor == n // u
    held = np.zeros((u, n), dtype=int)  # superslices each (rotor, matching) is held, reconfig slot included
    for k in range(n):
        assert net.reconfiguring(k) == k % u  # exactly one rotor reconfigures per superslice
        for b in range(u):
            held[b, net.matching_at(b, k)] += 1
    for b in range(u):  # each rotor cycles through its own N_r/u matchings, u superslices each
        assert sorted(np.flatnonzero(held[b]).tolist()) == sorted(net.rotor_matchings[b].tolist())
        assert (held[b][net.rotor_matchings[b]] == u).all()
    # over a cycle every rack pair's circuit is up for exactly W = (u-1) S + eps
    up = np.zeros((n, n))
    for e in range(2 * n):
        s, t = net.epoch_bounds(e)
        cap = net.epoch_net_capacity(e)[: n * n].reshape(n, n)
        up += (cap > 0) * (t - s)
    off = ~np.eye(n, dtype=bool)
    W = (u - 1) * net.superslice + net.eps
    assert np.allclose(up[off], W) and math.isclose(net.window, W)
    assert (up[~off] == 0).all(), "self-loops carry nothing"
    # and up_window names the same window
    a, c = 0, n - 1
    start, end = net.up_window(a, c)
    mid = (start + 1e-7) % net.cycle
    e = net.epoch_of(mid)[0]
    assert net.epoch_net_capacity(e)[a * n + c] == B


def test_superslice_arithmetic_by_hand():
    # 100 Gbps: t_pkt = 1500 B / 12.5e9 B/s = 0.12 us; delta = 0.5 + 0.12 = 0.62 us;
    # h_max 4: eps = 3 * (0.5 + 8 * 0.12) + 7 * 0.12 = 4.38 + 0.84 = 5.22 us; S = 5.22 + 0.62 + 10
    S, eps, delta = superslice_timing(4, B)
    assert math.isclose(delta, 0.62e-6) and math.isclose(eps, 5.22e-6) and math.isclose(S, 15.84e-6)
    net = OperaNetwork(8, 2, 4, tries=2)
    S, eps, _ = superslice_timing(net.h_max, B)
    assert math.isclose(net.superslice, S) and math.isclose(net.cycle, 8 * S)
    assert math.isclose(net.window, 4 * S - 10e-6 - 0.62e-6)  # u S - r - delta = (u-1) S + eps
    assert math.isclose(net.vlb_delay, net.cycle / 5)


def test_study_layouts_and_static_mesh():
    n16 = OperaNetwork.from_nodes(16)
    assert (n16.racks, n16.hosts_per_rack, n16.uplinks) == (4, 4, 4)
    assert not n16.time_varying and n16.h_max == 1  # each rotor one matching: a static full mesh
    assert n16.epoch_of(1.0) == (0, math.inf)
    n128 = OperaNetwork.from_nodes(128)
    assert (n128.racks, n128.hosts_per_rack, n128.uplinks) == (32, 4, 4) and n128.time_varying
    d = hop_distances(n128._adjacency(n128.partner, n128.rotor_matchings, 5))
    assert np.isfinite(d).all() and d.max() <= n128.h_max


def test_opera_configuration_errors():
    with pytest.raises(ValueError, match="multiple of the uplinks"):
        OperaNetwork(30, 4, 4)
    with pytest.raises(ValueError, match="do not fill"):
        OperaNetwork(8, 4, 4, nodes=30)
    with pytest.raises(ValueError, match="divide into racks"):
        OperaNetwork.from_nodes(30, k=8)
    with pytest.raises(ValueError, match="multiple of the uplinks"):
        OperaNetwork.from_nodes(24, k=8)  # 6 racks of 4 hosts, u = 4
    with pytest.raises(ValueError, match="no preset"):
        OperaNetwork.from_nodes(100)
    with pytest.raises(ValueError, match="u >= 2"):
        OperaNetwork(4, 1, 1)


@pytest.mark.parametrize("nodes,k", [(1, 2), (2, 2), (3, 4), (16, 4), (17, 6), (54, 6), (55, 8), (128, 8), (129, 10),
                                     (1024, 16)])
def test_fat_tree_k_is_the_smallest_that_fits(nodes, k):
    assert fat_tree_k(nodes) == k
    assert FatTree(nodes).k == k


def test_fat_tree_routes_and_errors():
    ft = FatTree(16)  # K = 4: 2 hosts per edge switch, 2 edges per pod
    src, dst = np.array([0, 0, 0, 0]), np.array([0, 1, 2, 4])
    assert ft.relation(src, dst).tolist() == [0, 1, 2, 3]
    assert ft.hops(src, dst).tolist() == [0, 2, 4, 6]
    r = ft.routes(np.array([0, 0]), np.array([2, 4]))
    assert sorted(r.member.tolist()) == [0, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="even"):
        FatTree(16, k=5)
    with pytest.raises(ValueError, match="only 16 nodes"):
        FatTree(17, k=4)


def test_world_size_must_fit():
    net = FlatNetwork(4, devices_per_host=8)
    assert net.hosts_for(32) == 4 and net.hosts_for(8) == 1
    with pytest.raises(ValueError, match="needs 5 hosts"):
        net.hosts_for(40)
    with pytest.raises(ValueError, match="multiple"):
        net.hosts_for(12)
    with pytest.raises(ValueError, match="needs 17 hosts"):
        OperaNetwork.from_nodes(16, devices_per_host=8).hosts_for(17 * 8)
