"""The planner's cache model: the hit-rate formula against a real cache on the synthetic power
law, and the planner caching the tables of a model that does not fit resident."""
import numpy as np
import pytest
import torch

from neo_train.config import preset
from neo_train.data.synthetic import power_law_ids
from neo_train.kernels import SparseOptimizerSpec, TableSpec
from neo_train.kernels.cache import CachedEmbeddingBag
from neo_train.planning.cost_model import cache_hit_rate
from neo_train.planning.planner import PlannerOptions, PlanningError, plan_sharding
from neo_train.topology.spec import preset_cluster


@pytest.mark.parametrize("alpha,fraction", [(1.05, 0.05), (1.05, 0.2), (1.2, 0.05), (0.8, 0.2)])
def test_the_hit_rate_formula_matches_an_lfu_cache_on_the_synthetic_law(alpha, fraction):
    rows, n, steps = 20_000, 2_000, 40
    k = CachedEmbeddingBag([TableSpec(rows, 4)], SparseOptimizerSpec("sgd", lr=0.0),
                           cache_rows=[int(fraction * rows)], policy="lfu")
    rng = np.random.default_rng(0)
    hits = total = 0
    for step in range(steps):
        ids = torch.from_numpy(power_law_ids(rng, n, rows, alpha, salt=7))
        if step >= steps // 2:  # steady state: the counts have seen the law
            hits += int(torch.isin(ids, k.resident_rows(0)).sum())
            total += n
        with torch.no_grad():
            k(ids, torch.tensor([0, n]))
    measured, model = hits / total, float(cache_hit_rate(fraction, rows, alpha))
    assert abs(measured - model) < 0.06, (measured, model)
    assert 0.2 < model < 0.99  # a case where the cache matters


def test_the_formula_at_its_edges():
    assert cache_hit_rate(1.0, 1000, 1.1) == 1.0
    assert float(cache_hit_rate(0.1, 1000, 0.0)) == pytest.approx(0.1)  # uniform ids
    assert float(cache_hit_rate(0.1, 1e9, 1.1)) > float(cache_hit_rate(0.01, 1e9, 1.1)) > 0.5


def _model_f_plan(nodes, **opts):
    cfg = preset("model_f")
    cluster = preset_cluster("zionex").replace(nodes=nodes, devices_per_node=8)
    o = PlannerOptions(batch_size=cfg.train.batch_size, optimizer=cfg.train.sparse_optimizer, **opts)
    return cfg.model, plan_sharding(cfg.model, cluster, o)


def test_model_f_on_128_zionex_nodes_fits_with_cached_tables():
    model, r = _model_f_plan(128)
    cached = {tp.table: tp.cache_load_factor for tp in r.plan.tables if tp.cache_load_factor is not None}
    assert r.fits and cached["f_huge"] < 1 and r.estimate.memory.max() <= r.estimate.capacity
    assert all(r.plan[n].sharding.value != "data_parallel" for n in cached)
    with pytest.raises(PlanningError):  # resident only, it does not fit (96 TB of fp32 + state)
        _model_f_plan(128, auto_cache=False)


def test_host_memory_bounds_a_host_cache_and_the_ssd_tier_lifts_it():
    with pytest.raises(PlanningError, match="give a storage dir \\(the SSD tier\\)"):
        _model_f_plan(16)  # 48 TB of rows + state, 16 x 1.5 TB of host memory
    _, r = _model_f_plan(16, ssd=True)
    assert r.fits and r.plan["f_huge"].cache_load_factor is not None
