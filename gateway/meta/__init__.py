"""The metadata store: tenants, tables, partitions, placement and cached watermarks.

SQLAlchemy models (:mod:`gateway.meta.models`) over SQLite (embedded default) or
PostgreSQL (production), migrated by the alembic scripts shipped in
``gateway/meta/migrations``, which run automatically when a store opens.
"""

from gateway.meta.records import (
    TABLE_VIEW_TTL_S,
    EdgeGroup,
    EdgeMember,
    GroupMember,
    GroupState,
    PartitionState,
    Placement,
    Replica,
    StorageMark,
    TableDef,
    TableLimits,
)
from gateway.meta.store import MetadataStore

__all__ = [
    "TABLE_VIEW_TTL_S",
    "EdgeGroup",
    "EdgeMember",
    "GroupMember",
    "GroupState",
    "MetadataStore",
    "PartitionState",
    "Placement",
    "Replica",
    "StorageMark",
    "TableDef",
    "TableLimits",
]
