"""The metadata store: tenants, tables, partitions and their cached watermarks, consumer
groups (offsets and membership), snapshot leases and maintenance runs, the placement of
partitions on hot-tier shards, and the live gateway replicas.

The operations come in groups, one module each, over one shared :class:`MetaBase` (the
engine and its sessions), as :class:`gateway.core.StreamTables` composes its own: tables,
partitions, groups, maintenance, placement, replicas. The value types are in
:mod:`gateway.meta.records`, the engine and the migrations in :mod:`gateway.meta.engine`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from gateway.meta.edge_groups import EdgeGroupOps
from gateway.meta.groups import GroupOps
from gateway.meta.maintenance import MaintenanceOps
from gateway.meta.partitions import PartitionOps
from gateway.meta.placement import PlacementOps
from gateway.meta.records import SegmentRow
from gateway.meta.replicas import ReplicaOps
from gateway.meta.tables import TableOps
from gateway.meta.work import LakeWorkOps, Mark

__all__ = ["MetadataStore"]


class MetadataStore(
    TableOps,
    PartitionOps,
    GroupOps,
    EdgeGroupOps,
    MaintenanceOps,
    PlacementOps,
    LakeWorkOps,
    ReplicaOps,
):
    """Tenants, tables and partitions in a SQL database (SQLite or PostgreSQL).

    Opening migrates the database to the newest schema. Close the store when done.
    """

    def replace_chain(
        self,
        table_id: str,
        partition: int,
        expected_epoch: int,
        segments: Sequence[SegmentRow],
        finish_move: bool,
    ) -> bool:
        """:meth:`PlacementOps.replace_chain`; a chain that now holds a sealed segment is
        marked for tiering, which drops the segment once its records are tiered, whoever
        made the chain (a mover, a gateway finishing a move, the next mover after a
        crash): an idle partition is otherwise never visited again (lake work is driven
        by change)."""
        applied = super().replace_chain(table_id, partition, expected_epoch, segments, finish_move)
        if applied and len(segments) > 1:
            now = dt.datetime.now(dt.UTC)
            self.mark_work([Mark(table_id, partition, "tier", since=now, due_at=now)])
        return applied
