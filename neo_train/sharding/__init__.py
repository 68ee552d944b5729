"""Sharding: plans, one file per sharding type, the sharded embedding collection."""
from .collection import SHARDING_CLASSES, ShardedEmbeddingBagCollection
from ..planning.plan import Shard, ShardingPlan, ShardingType, TablePlan

__all__ = ["ShardingPlan", "ShardingType", "Shard", "TablePlan", "ShardedEmbeddingBagCollection", "SHARDING_CLASSES"]
