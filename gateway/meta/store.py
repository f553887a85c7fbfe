"""The metadata store: tenants, tables, partitions and their cached watermarks, consumer
groups (offsets and membership), snapshot leases and maintenance runs, and the placement
of partitions on hot-tier shards.

The operations come in groups, one module each, over one shared :class:`MetaBase` (the
engine and its sessions), as :class:`gateway.core.StreamTables` composes its own: tables,
partitions, groups, maintenance, placement. The value types are in :mod:`gateway.meta.records`,
the engine and the migrations in :mod:`gateway.meta.engine`.
"""

from __future__ import annotations

from gateway.meta.groups import GroupOps
from gateway.meta.maintenance import MaintenanceOps
from gateway.meta.partitions import PartitionOps
from gateway.meta.placement import PlacementOps
from gateway.meta.tables import TableOps
from gateway.meta.work import LakeWorkOps

__all__ = ["MetadataStore"]


class MetadataStore(TableOps, PartitionOps, GroupOps, MaintenanceOps, PlacementOps, LakeWorkOps):
    """Tenants, tables and partitions in a SQL database (SQLite or PostgreSQL).

    Opening migrates the database to the newest schema. Close the store when done.
    """
