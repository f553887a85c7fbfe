"""The metadata store's value types: what its calls take and return.

Frozen dataclasses, free of SQLAlchemy: a table's definition (:class:`TableDef`), a
partition's cached state (:class:`PartitionState`), a partition's placement on hot-tier
shards (:class:`Placement`, its segments as :data:`SegmentRow`), a snapshot lease
(:class:`Lease`) and the last run of a maintenance job (:class:`JobRun`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = [
    "TABLE_VIEW_TTL_S",
    "JobRun",
    "Lease",
    "PartitionState",
    "Placement",
    "SegmentRow",
    "TableDef",
]

#: One segment of a partition's chain: ``(seq, shard, start_offset, end_offset | None)``.
SegmentRow = tuple[int, str, int, int | None]

#: How long a gateway reuses a table's definition (``StreamTables.table``): a change of the
#: definition (a retention set) reaches every gateway within this time.
TABLE_VIEW_TTL_S = 2.0


@dataclass(frozen=True)
class TableDef:
    """A table as stored. ``table_id`` is unique for the table's lifetime."""

    table_id: str
    tenant: str
    namespace: str
    name: str
    #: The user schema: a list of field objects, as given at creation.
    fields: list[dict[str, Any]]
    partitions: int
    key_columns: list[str]
    created_at: datetime
    #: Raised by one at every schema change (0 at create).
    schema_version: int = 0
    #: Retention by age (milliseconds since append) and by count (records behind the
    #: high watermark); None: no limit of that kind.
    retention_ms: int | None = None
    retention_records: int | None = None
    #: When a retention was last set or cleared (None: never; no partition of the table
    #: then has an earliest offset).
    retention_set_at: datetime | None = None

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class Lease:
    """A snapshot kept for an open scan or a read plan until ``expires_at``."""

    lease_id: str
    table_id: str
    snapshot_id: int
    kind: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class JobRun:
    """The last run of a maintenance job on a table."""

    job: str
    finished_at: datetime
    outcome: str
    detail: str


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Cached state of one partition. The watermarks are caches: the hot tier's high
    watermark and the Iceberg snapshot's ``tidegate.watermarks`` win over them."""

    partition: int
    high_watermark: int
    tiered_watermark: int
    shard: str
    epoch: int
    #: The earliest readable offset, set by retention (0: nothing removed).
    earliest_offset: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one partition's hot log lives: its chain of segments (oldest first, the last
    one active) under a placement epoch, and the target of a move under way."""

    tenant: str
    table_id: str
    namespace: str
    name: str
    partition: int
    epoch: int
    segments: tuple[SegmentRow, ...]
    move_target: str | None

    @property
    def shard(self) -> str:
        """The shard of the active segment (the one taking appends)."""
        return self.segments[-1][1]

    def to_dict(self) -> dict[str, Any]:
        """The placement as JSON (the admin API's and ``tidegate shard list --json``'s)."""
        return {
            "tenant": self.tenant,
            "table": f"{self.namespace}.{self.name}",
            "partition": self.partition,
            "shard": self.shard,
            "epoch": self.epoch,
            "move_target": self.move_target,
            "segments": [{"shard": s, "start": a, "end": b} for _, s, a, b in self.segments],
        }
