"""Column-wise sharding: a table's columns split into shards, each shard on one rank.

Every column shard is looked up like a table-wise table (the ids are duplicated to each shard's
rank: Neo's "input indices duplicated"), and the pooled column blocks are concatenated back in
column order after the output all-to-all. With row-wise AdaGrad each shard keeps its own row
accumulator (as in Neo), so a CW table trains like k narrower tables side by side.
"""
from __future__ import annotations

from .common import Unit
from .table_wise import TableWiseSharding

__all__ = ["ColumnWiseSharding"]


class ColumnWiseSharding(TableWiseSharding):
    def make_units(self) -> list[Unit]:
        """One unit per (feature, column shard)."""
        return [Unit(i, s) for i, f in enumerate(self.features) for s in sorted(f.plan.shards, key=lambda s: s.col_start)]
