"""Table-column-wise sharding: a table placed on one node, its columns split over that node's
ranks. The mechanics are column-wise sharding's (input all-to-all to the shards' ranks, output
all-to-all of the column blocks); the plan keeps every shard on one node, so a table's traffic
for its own node's samples stays on the fast intra-node links."""
from __future__ import annotations

from .column_wise import ColumnWiseSharding

__all__ = ["TableColumnWiseSharding"]


class TableColumnWiseSharding(ColumnWiseSharding):
    """Same stages as column-wise; placement (one node) is checked by ShardingPlan.validate."""
