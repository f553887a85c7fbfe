"""The SDK's small value types and their protobuf conversions (no I/O)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Literal, NamedTuple

import pyarrow as pa

from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.errors import InvalidRequest
from gateway.wire.keywrites import write_omittable, write_schema
from gateway.wire.schema import parse_fields
from gateway.wire.types import AppendRange

__all__ = [
    "AppendRange",
    "Field",
    "GroupInfo",
    "GroupMemberInfo",
    "GroupPartitionInfo",
    "JobRun",
    "Maintenance",
    "PartitionInfo",
    "RecordMetadata",
    "Snapshot",
    "SnapshotLease",
    "StartAt",
    "TableInfo",
    "TableRef",
    "ranges_from_pb",
    "table_fields",
    "timestamp_us",
]

#: Where a consumer starts in a partition without a committed offset.
StartAt = Literal["earliest", "latest"] | int | dt.datetime


class RecordMetadata(NamedTuple):
    """Where one produced record landed."""

    partition: int
    offset: int


class InvalidTableName(InvalidRequest, ValueError):
    """A table named without its namespace (an :class:`InvalidRequest`, and a
    ``ValueError`` as it always was)."""


@dataclass(frozen=True, slots=True)
class TableRef:
    namespace: str
    name: str

    @classmethod
    def parse(cls, table: str | TableRef) -> TableRef:
        if isinstance(table, TableRef):
            return table
        namespace, sep, name = table.partition(".")
        if not sep or not namespace or not name:
            raise InvalidTableName(
                f"{table!r} is not a table name: write namespace.name, e.g. shop.orders"
            )
        return cls(namespace, name)

    def pb(self) -> pb.TableRef:
        return pb.TableRef(namespace=self.namespace, name=self.name)

    def __str__(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An Iceberg snapshot of a table: what ``as_of`` can name."""

    snapshot_id: int
    timestamp_ms: int
    operation: str
    summary: Mapping[str, str]

    @classmethod
    def from_pb(cls, s: pb.Snapshot) -> Snapshot:
        return cls(s.snapshot_id, s.timestamp_ms, s.operation, dict(s.summary))


@dataclass(frozen=True, slots=True)
class Field:
    """A column: its name, Arrow type name, whether it takes nulls, its doc, and whether
    a schema change added it (appends may then leave it out: it is null)."""

    name: str
    type: str
    nullable: bool
    doc: str = ""
    added: bool = False


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition's offsets. Offsets below ``tiered_watermark`` are in the Iceberg table,
    the ones from there to ``high_watermark`` in the hot tier."""

    partition: int
    earliest_offset: int
    high_watermark: int
    tiered_watermark: int
    hot_bytes: int
    lag_records: int
    lag_bytes: int


@dataclass(frozen=True, slots=True)
class SnapshotLease:
    """A snapshot an open scan or read plan holds against expiry until ``expires_at``."""

    snapshot_id: int
    kind: str  # "scan" or "plan"
    expires_at: dt.datetime


@dataclass(frozen=True, slots=True)
class JobRun:
    """The last run of one maintenance job on a table."""

    finished_at: dt.datetime
    outcome: str  # "ok" or "failed"
    detail: str


def _utc_ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


@dataclass(frozen=True, slots=True)
class Maintenance:
    """The lake side of a table's health (describe only): its data files (and how many are
    below the small-file threshold), its snapshots, the snapshots open scans and plans
    hold, and the last run of each maintenance job (compact, expire, orphans, retention)."""

    data_files: int
    small_files: int
    small_file_ratio: float
    data_bytes: int
    snapshots: int
    leases: tuple[SnapshotLease, ...] = ()
    last_runs: Mapping[str, JobRun] = dc_field(default_factory=dict)

    @classmethod
    def from_pb(cls, m: pb.TableMaintenance) -> Maintenance:
        return cls(
            data_files=m.data_files,
            small_files=m.small_files,
            small_file_ratio=m.small_file_ratio,
            data_bytes=m.data_bytes,
            snapshots=m.snapshots,
            leases=tuple(
                SnapshotLease(x.snapshot_id, x.kind, _utc_ms(x.expires_at_ms)) for x in m.leases
            ),
            last_runs={
                job: JobRun(_utc_ms(r.finished_at_ms), r.outcome, r.detail)
                for job, r in sorted(m.last_runs.items())
            },
        )


@dataclass(frozen=True, slots=True)
class TableInfo:
    """A table as the gateway describes it: schema, partitioning and live offsets."""

    ref: TableRef
    schema: pa.Schema
    partitions: int
    key_columns: tuple[str, ...]
    table_id: str = ""
    fields: tuple[Field, ...] = ()
    partition_info: tuple[PartitionInfo, ...] = ()
    #: The Iceberg table's identifier in the gateway's catalog and its current metadata
    #: file: what DuckDB, pyiceberg or Spark open to read the tiered rows directly.
    iceberg_table: str = ""
    iceberg_metadata: str = ""
    #: Raised by one at every schema change (0 at create).
    schema_version: int = 0
    #: The Iceberg table's current schema id (describe only).
    iceberg_schema_id: int | None = None
    #: Retention by age (milliseconds) and by count (records per partition); None: no
    #: limit of that kind.
    retention_ms: int | None = None
    retention_records: int | None = None
    #: Files, snapshots, leases and maintenance runs (describe only, with a cold tier).
    maintenance: Maintenance | None = None
    #: A primary-key table's key columns (empty: append-only) and merge engine
    #: (``{"type": ..., "column": ...}``; None: append-only).
    primary_key: tuple[str, ...] = ()
    merge_engine: dict[str, str] | None = None

    @property
    def table(self) -> TableRef:
        return self.ref

    @property
    def added_columns(self) -> frozenset[str]:
        """Columns added by a schema change: rows may leave them out (null)."""
        return frozenset(f.name for f in self.fields if f.added)

    @property
    def write_schema(self) -> pa.Schema:
        """What rows written to the table are converted by: :attr:`schema`, and for a
        primary-key table its columns outside the key nullable and ``_change`` (0 or 2
        upsert, 3 delete) after them."""
        return write_schema(self.schema, self.primary_key)

    @property
    def write_omittable(self) -> frozenset[str]:
        """Columns a written row may leave out (null): :attr:`added_columns`, and a key
        table's ``_change`` (an upsert)."""
        return write_omittable(self.added_columns, self.primary_key)

    @property
    def high_watermarks(self) -> tuple[int, ...]:
        return tuple(p.high_watermark for p in self.partition_info)

    @property
    def earliest_offsets(self) -> tuple[int, ...]:
        return tuple(p.earliest_offset for p in self.partition_info)

    @classmethod
    def from_pb(cls, info: pb.TableInfo) -> TableInfo:
        fields = tuple(Field(f.name, f.type, f.nullable, f.doc, f.added) for f in info.fields)
        parts = sorted(info.partition_info, key=lambda p: p.partition)
        return cls(
            ref=TableRef(info.table.namespace, info.table.name),
            schema=parse_fields(
                [{"name": f.name, "type": f.type, "nullable": f.nullable} for f in fields],
                bounded=False,  # the server's schema, whatever bounds it was created under
            ),
            partitions=info.partitions,
            key_columns=tuple(info.key_columns),
            table_id=info.table_id,
            iceberg_table=info.iceberg_table,
            iceberg_metadata=info.iceberg_metadata,
            schema_version=info.schema_version,
            iceberg_schema_id=(
                info.iceberg_schema_id if info.HasField("iceberg_schema_id") else None
            ),
            retention_ms=info.retention_ms if info.HasField("retention_ms") else None,
            retention_records=(
                info.retention_records if info.HasField("retention_records") else None
            ),
            maintenance=(
                Maintenance.from_pb(info.maintenance) if info.HasField("maintenance") else None
            ),
            primary_key=tuple(info.primary_key),
            merge_engine=(
                {"type": info.merge_engine.type, "column": info.merge_engine.column}
                if info.HasField("merge_engine")
                else None
            ),
            fields=fields,
            partition_info=tuple(
                PartitionInfo(
                    p.partition,
                    p.earliest_offset,
                    p.high_watermark,
                    p.tiered_watermark,
                    p.hot_bytes,
                    p.lag_records,
                    p.lag_bytes,
                )
                for p in parts
            ),
        )


def table_fields(schema: Mapping[str, str] | Sequence[Mapping[str, Any]]) -> list[pb.Field]:
    if isinstance(schema, Mapping):
        return [pb.Field(name=k, type=v, nullable=True) for k, v in schema.items()]
    return [
        pb.Field(
            name=f["name"], type=f["type"], nullable=f.get("nullable", True), doc=f.get("doc") or ""
        )
        for f in schema
    ]


def schema_changes(changes: Sequence[Mapping[str, Any]]) -> list[pb.SchemaChange]:
    """Schema changes as dicts (``{"op": "add_column", "column": "c", "type": "int64"}``,
    the form of the HTTP API) as protobuf messages."""
    out = []
    for c in changes:
        unknown = set(c) - {"op", "column", "type", "doc", "nullable"}
        if unknown:
            raise InvalidRequest(
                f"a schema change has unknown keys {sorted(unknown)}; it takes op, column, "
                "type, doc and nullable"
            )
        given = {k: v for k, v in c.items() if v is not None or k == "doc"}
        if "doc" in given and given["doc"] is None:
            given["doc"] = ""  # update_doc with no doc: clear it
        out.append(pb.SchemaChange(**given))
    return out


def ranges_from_pb(response: pb.AppendResponse) -> list[AppendRange]:
    return [AppendRange(r.partition, r.base_offset, r.count, r.duplicate) for r in response.ranges]


def timestamp_us(when: dt.datetime | float | int) -> int:
    """Microseconds since the epoch of an aware datetime (naive means UTC) or epoch seconds."""
    if isinstance(when, dt.datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return int(when * 1_000_000)


@dataclass(frozen=True, slots=True)
class GroupMemberInfo:
    """One live member of a consumer group: what it reads now (``assigned``), gives up
    (``revoking``) and waits for (``pending``)."""

    member_id: str
    client_id: str
    generation: int
    assigned: tuple[int, ...]
    revoking: tuple[int, ...]
    pending: tuple[int, ...]
    session_timeout_ms: int
    joined_at: dt.datetime
    last_heartbeat: dt.datetime
    #: Whose protocol it joined by: ``tidegate`` (this SDK, HTTP, gRPC), or the edge that
    #: coordinates its group (``kafka-classic``, ``kafka-consumer``).
    protocol: str = "tidegate"


@dataclass(frozen=True, slots=True)
class GroupPartitionInfo:
    """A partition of a group's table: its member (None: nobody reads it), the group's
    committed offset (None: never committed), the high watermark, and the lag."""

    partition: int
    member_id: str | None
    committed: int | None
    high_watermark: int
    lag: int


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group on a table (``describe_group``): ``state`` is ``empty`` (no live
    member), ``stable`` or ``rebalancing``."""

    group: str
    table: TableRef
    generation: int
    state: str
    members: tuple[GroupMemberInfo, ...]
    partitions: tuple[GroupPartitionInfo, ...]
    lag: int

    @classmethod
    def from_pb(cls, g: pb.DescribeGroupResponse) -> GroupInfo:
        def when(ms: int) -> dt.datetime:
            return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)

        return cls(
            group=g.group,
            table=TableRef(g.table.namespace, g.table.name),
            generation=g.generation,
            state=g.state,
            members=tuple(
                GroupMemberInfo(
                    m.member_id,
                    m.client_id,
                    m.generation,
                    tuple(m.assigned),
                    tuple(m.revoking),
                    tuple(m.pending),
                    m.session_timeout_ms,
                    when(m.joined_at_ms),
                    when(m.last_heartbeat_ms),
                    m.protocol or "tidegate",
                )
                for m in g.members
            ),
            partitions=tuple(
                GroupPartitionInfo(
                    p.partition,
                    p.member_id or None,
                    p.committed if p.HasField("committed") else None,
                    p.high_watermark,
                    p.lag,
                )
                for p in g.partitions
            ),
            lag=g.lag,
        )
