"""The metadata store's value types: what its calls take and return.

Frozen dataclasses, free of SQLAlchemy: a table's definition (:class:`TableDef`), a
partition's cached state (:class:`PartitionState`), a partition's placement on hot-tier
shards (:class:`Placement`, its segments as :data:`SegmentRow`), a snapshot lease
(:class:`Lease`), a live gateway replica (:class:`Replica`), the last run of a
maintenance job (:class:`JobRun`), and a consumer group's membership
(:class:`GroupState` of :class:`GroupMember`, mutable: the coordinator in
:mod:`gateway.core.coordinator` changes them inside one transaction).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gateway.wire.changes import PrimaryKey

__all__ = [
    "TABLE_VIEW_TTL_S",
    "EdgeGroup",
    "EdgeMember",
    "GroupMember",
    "GroupState",
    "JobRun",
    "Lease",
    "PartitionState",
    "Placement",
    "Replica",
    "SegmentRow",
    "StorageMark",
    "TableDef",
    "TableLimits",
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
    #: A primary-key table's key and merge engine (None: append-only), immutable.
    primary_key: PrimaryKey | None = None

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class StorageMark:
    """What changes whenever the bytes a table holds may have changed: the sums of its
    partitions' cached watermarks and earliest offsets (raised by appends, tiering and
    retention), its pending lake work (a trim done deletes its row) and its last
    maintenance run (compaction, expiry). Equal marks: the same bytes."""

    partitions: int
    high_watermarks: int
    tiered_watermarks: int
    earliest_offsets: int
    work: tuple[int, str] | None = None
    last_run: str | None = None

    @property
    def written(self) -> bool:
        """Whether any append to the table was ever recorded."""
        return self.high_watermarks > 0

    @property
    def lake(self) -> tuple[int, int, str | None]:
        """The part that moves when the table's Iceberg bytes may have changed (a tiering,
        a retention, a maintenance run), not at every append."""
        return (self.tiered_watermarks, self.earliest_offsets, self.last_run)


@dataclass(frozen=True, slots=True)
class TableLimits:
    """A tenant's count quotas, checked by a create in the transaction that inserts the
    table (None: no limit)."""

    max_tables: int | None = None
    max_partitions: int | None = None


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
class Replica:
    """A live gateway replica: its Kafka node id and advertised address."""

    replica_id: str
    node_id: int
    host: str
    port: int
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


@dataclass
class GroupMember:
    """One live member of a consumer group, as the coordinator keeps it.

    ``assigned`` is what the member was last told it may read and ``owned`` what it last
    said it holds, each as partition -> the generation at which the member was given it
    (the member's commits for that partition must come from that generation or later).
    A partition in ``owned`` but not ``assigned`` is being revoked: nobody else gets it
    until the member says it let it go, or its session times out. ``target`` is where
    the member converges. Times are wall-clock milliseconds since the epoch.
    """

    member_id: str
    client_id: str
    generation: int
    assigned: dict[int, int]
    owned: dict[int, int]
    target: list[int]
    session_timeout_ms: int
    joined_ms: int
    seen_ms: int

    def held(self) -> dict[int, int]:
        """Partitions the member may still hold, with the generation it got each at (the
        older one when it was given one again before letting it go)."""
        return {**self.assigned, **self.owned}

    def to_json(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id,
            "client_id": self.client_id,
            "generation": self.generation,
            "assigned": {str(p): g for p, g in sorted(self.assigned.items())},
            "owned": {str(p): g for p, g in sorted(self.owned.items())},
            "target": sorted(self.target),
            "session_timeout_ms": self.session_timeout_ms,
            "joined_ms": self.joined_ms,
            "seen_ms": self.seen_ms,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> GroupMember:
        return cls(
            member_id=str(raw["member_id"]),
            client_id=str(raw.get("client_id", "")),
            generation=int(raw["generation"]),
            assigned={int(p): int(g) for p, g in raw.get("assigned", {}).items()},
            owned={int(p): int(g) for p, g in raw.get("owned", {}).items()},
            target=[int(p) for p in raw.get("target", [])],
            session_timeout_ms=int(raw["session_timeout_ms"]),
            joined_ms=int(raw["joined_ms"]),
            seen_ms=int(raw["seen_ms"]),
        )


@dataclass
class GroupState:
    """A consumer group's membership on one table: its generation (raised at every
    change of membership), its live members, and since when its current rebalance has
    been converging (None when every member holds its target)."""

    generation: int = 0
    members: dict[str, GroupMember] = field(default_factory=dict)
    rebalance_since_ms: int | None = None

    def to_json(self) -> list[dict[str, Any]]:
        """The members as stored (the other fields are columns of their own)."""
        return [m.to_json() for _, m in sorted(self.members.items())]

    @classmethod
    def load(
        cls, generation: int, members: list[dict[str, Any]], rebalance_since_ms: int | None
    ) -> GroupState:
        parsed = [GroupMember.from_json(m) for m in members]
        return cls(generation, {m.member_id: m for m in parsed}, rebalance_since_ms)


@dataclass(frozen=True, slots=True)
class EdgeMember:
    """A member of a group an edge's own protocol coordinates (a Kafka consumer): what
    it holds of one table."""

    member_id: str
    client_id: str
    generation: int
    assigned: tuple[int, ...]
    revoking: tuple[int, ...] = ()
    session_timeout_ms: int = 0
    joined_ms: int = 0
    seen_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id,
            "client_id": self.client_id,
            "generation": self.generation,
            "assigned": list(self.assigned),
            "revoking": list(self.revoking),
            "session_timeout_ms": self.session_timeout_ms,
            "joined_ms": self.joined_ms,
            "seen_ms": self.seen_ms,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> EdgeMember:
        return cls(
            member_id=str(raw["member_id"]),
            client_id=str(raw.get("client_id", "")),
            generation=int(raw.get("generation", 0)),
            assigned=tuple(int(p) for p in raw.get("assigned", ())),
            revoking=tuple(int(p) for p in raw.get("revoking", ())),
            session_timeout_ms=int(raw.get("session_timeout_ms", 0)),
            joined_ms=int(raw.get("joined_ms", 0)),
            seen_ms=int(raw.get("seen_ms", 0)),
        )


@dataclass(frozen=True, slots=True)
class EdgeGroup:
    """A group on one table as the edge that coordinates it publishes it (docs/kafka.md,
    "Groups in tidegate group describe"): its protocol (``kafka-classic``,
    ``kafka-consumer``), its state as that protocol names it, its generation (or group
    epoch), and the members that hold or are subscribed to the table."""

    tenant: str
    group: str
    namespace: str
    name: str
    protocol: str
    state: str
    generation: int
    members: tuple[EdgeMember, ...] = ()
