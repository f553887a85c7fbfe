"""What the core answers with: table and partition views, read results, read plans,
consumer groups."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from gateway.hot import StoredBatch
from gateway.meta import TableDef
from gateway.wire.changes import CHANGE_COLUMN, CHANGE_TYPE
from gateway.wire.keywrites import write_omittable, write_schema
from gateway.wire.schema import OFFSET_COLUMN, added_columns, fields_to_json, system_schema
from gateway.wire.splice import SplicedMessage
from gateway.wire.stored import HotPiece, piece_rows

if TYPE_CHECKING:
    from gateway.cold import PlannedFile
    from gateway.cold.base import FileStats
    from gateway.meta.records import JobRun, Lease

__all__ = [
    "UNCAPPED",
    "GroupMemberView",
    "GroupPartitionView",
    "GroupView",
    "HotRange",
    "MaintenanceView",
    "PartitionView",
    "ReadPlan",
    "ReadResult",
    "ScanPart",
    "ScanResult",
    "TableView",
    "hot_pieces",
    "slice_batches",
]


@dataclass(frozen=True, slots=True)
class PartitionView:
    partition: int
    earliest_offset: int
    high_watermark: int
    tiered_watermark: int
    hot_bytes: int
    #: Estimated hot bytes of the records not yet tiered (:meth:`LogOffsets.bytes_from`).
    lag_bytes: int = 0

    @property
    def lag_records(self) -> int:
        """Records not yet tiered: ``HW(p) - T(p)``."""
        return max(0, self.high_watermark - self.tiered_watermark)


@dataclass(frozen=True, slots=True)
class MaintenanceView:
    """The lake side of a table's health (describe only): its files and snapshots, the
    snapshots open scans and plans hold, the last run of each maintenance job."""

    stats: FileStats
    leases: tuple[Lease, ...] = ()
    #: job (``compact``, ``expire``, ``orphans``) -> its last run on this table.
    last_runs: dict[str, JobRun] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TableView:
    definition: TableDef
    schema: pa.Schema
    partitions: tuple[PartitionView, ...] = ()
    #: The Iceberg table's identifier and current metadata file (describe only).
    iceberg_table: str = ""
    iceberg_metadata: str = ""
    #: The Iceberg table's current schema id (describe only; -1 when unknown).
    iceberg_schema_id: int = -1
    maintenance: MaintenanceView | None = None

    @property
    def log_schema(self) -> pa.Schema:
        """What the table's hot payloads hold: the user columns, and a primary-key
        table's change kind ``_change`` after them (its log is its changelog)."""
        if self.definition.primary_key is None:
            return self.schema
        return self.schema.append(pa.field(CHANGE_COLUMN, CHANGE_TYPE, nullable=False))

    @property
    def write_schema(self) -> pa.Schema:
        """What an append's rows are conformed to (:func:`~gateway.wire.keywrites.write_schema`):
        the user schema, and for a primary-key table every column outside the key
        nullable and ``_change`` (omittable: an upsert without it)."""
        pk = self.definition.primary_key
        return self.schema if pk is None else write_schema(self.schema, pk.columns)

    @property
    def write_omittable(self) -> frozenset[str]:
        """Columns an append's rows may leave out: those added by a schema change, and a
        key table's ``_change``."""
        pk = self.definition.primary_key
        return write_omittable(self.added_columns, pk.columns if pk is not None else ())

    @property
    def stored_schema(self) -> pa.Schema:
        return system_schema(self.log_schema)

    @property
    def scan_schema(self) -> pa.Schema:
        """What a scan answers: the stored schema, but a primary-key table's current
        state has no ``_change`` (every row is live); its system columns are those of
        the change that made the row."""
        if self.definition.primary_key is None:
            return self.stored_schema
        return system_schema(self.schema)

    @property
    def schema_version(self) -> int:
        return self.definition.schema_version

    @property
    def added_columns(self) -> frozenset[str]:
        """Columns added by a schema change: an append may leave them out."""
        return added_columns(self.definition.fields)

    @property
    def fields(self) -> list[dict[str, Any]]:
        """The schema's JSON form, with column docs and ``added`` marks."""
        return fields_to_json(self.schema, self.definition.fields)


@dataclass(frozen=True, slots=True)
class ReadResult:
    #: Batches in offset order, user columns then the system columns.
    batches: list[pa.RecordBatch]
    next_offset: int
    high_watermark: int
    schema: pa.Schema = field(repr=False, default_factory=lambda: pa.schema([]))
    #: Offsets below it were read from the Iceberg table, the others from the hot tier.
    tiered_watermark: int = 0
    #: Hot records as stored, following those of ``batches`` (reads that ask for them).
    pieces: list[HotPiece] = field(default_factory=list)
    #: Hot records as IPC messages with the system columns, spliced into the stored
    #: bytes (:mod:`gateway.wire.splice`), following those of ``batches`` (reads that
    #: ask for them, when every hot payload read can be).
    messages: list[SplicedMessage] = field(default_factory=list)

    @property
    def num_records(self) -> int:
        return (
            int(sum(b.num_rows for b in self.batches))
            + sum(p.count for p in self.pieces)
            + sum(m.rows for m in self.messages)
        )

    @property
    def nbytes(self) -> int:
        """Bytes the answer carries: Arrow bytes of the batches (uncompressed), stored
        bytes of the pieces, Arrow bytes the messages declare."""
        return (
            int(sum(b.nbytes for b in self.batches))
            + sum(len(p.payload) for p in self.pieces)
            + sum(m.nbytes for m in self.messages)
        )


@dataclass(frozen=True, slots=True)
class HotRange:
    """Offsets ``[from_offset, to_offset)`` of a partition that a reader fetches from the
    gateway (not in the pinned snapshot)."""

    partition: int
    from_offset: int
    to_offset: int


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """A pinned view of a table for engines that read in parallel: the snapshot's data
    files plus the hot ranges per partition. Together they hold every record once."""

    snapshot_id: int | None
    files: list[PlannedFile]
    hot_ranges: list[HotRange]
    schema: pa.Schema
    #: Partition -> earliest offset, where retention set one: rows of ``files`` below it
    #: (not yet removed by the retention job) are to be left out.
    earliest: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScanPart:
    """One part of a scan, read whole by :attr:`read` (a blocking call for the I/O pool)
    into one table of about ``nbytes`` of Arrow data at most, or None once nothing is
    left. Cold parts are read by Arrow's C++ alone (no Python per batch)."""

    nbytes: int
    read: Callable[[], pa.Table | None]


@dataclass
class ScanResult:
    """A scan's schema, pinned view and batches (an async iterator, consumed once), or
    the same rows as :attr:`parts` (for an edge that hands whole tables to Arrow's C++:
    consume one of the two, never both). ``parts`` is None for a scan with a limit."""

    schema: pa.Schema
    snapshot_id: int | None
    batches: AsyncIterator[pa.RecordBatch]
    parts: AsyncIterator[ScanPart] | None = None


def fit_bytes(batch: pa.RecordBatch, room: int, first: bool) -> pa.RecordBatch:
    """The leading rows of ``batch`` that fit in ``room`` bytes of Arrow data (by the
    batch's average row size); at least one row when ``first`` (a read always progresses,
    even past its cap, when a single record is larger)."""
    if batch.nbytes <= room or batch.num_rows == 0:
        return batch
    rows = room * batch.num_rows // max(1, batch.nbytes)
    return batch.slice(0, max(1 if first else 0, rows))


#: A byte cap no read reaches.
UNCAPPED = 1 << 62


def hot_pieces(
    stored: Sequence[StoredBatch],
    offset: int,
    max_records: int,
    max_bytes: int,
    used_bytes: int = 0,
) -> tuple[list[HotPiece], int]:
    """The pieces of hot batches that hold records ``[offset, offset + max_records)``, as
    stored, until their stored size passes ``max_bytes`` (``used_bytes`` of which are
    taken already; the first piece is always taken), and the offset after the last one."""
    out: list[HotPiece] = []
    remaining = max_records
    next_offset = offset
    for sb in stored:
        if remaining <= 0 or used_bytes >= max_bytes:
            break
        skip = max(0, next_offset - sb.base_offset)
        count = min(sb.count - skip, remaining)
        if count <= 0:
            continue
        out.append(HotPiece(sb.payload, sb.base_offset, sb.timestamp_us, skip, count))
        used_bytes += len(sb.payload)
        remaining -= count
        next_offset = sb.base_offset + skip + count
    return out, next_offset


def slice_batches(
    stored: Sequence[StoredBatch],
    partition: int,
    offset: int,
    max_records: int,
    max_bytes: int,
    used_bytes: int = 0,
    schema: pa.Schema | None = None,
) -> tuple[list[pa.RecordBatch], int]:
    """Decoded records ``[offset, offset + max_records)`` of hot batches, with system
    columns and in the user ``schema`` (a batch stored under an older schema reads under
    the current one: :func:`~gateway.wire.evolution.read_as`), cut where their Arrow size
    (uncompressed, as they are sent) would pass ``max_bytes`` (``used_bytes`` of which are
    taken already), and the offset after the last one."""
    out: list[pa.RecordBatch] = []
    next_offset = offset
    for piece in hot_pieces(stored, offset, max_records, UNCAPPED)[0]:
        if used_bytes >= max_bytes:
            break
        cut = False
        for rows in piece_rows(piece, schema, partition):
            part = fit_bytes(rows, max_bytes - used_bytes, not used_bytes)
            if part.num_rows * 2 < rows.num_rows:
                # A small part of a decoded chunk: copy it, so the chunk is freed now
                # rather than held for as long as the answer lives.
                part = part.take(pa.array(np.arange(part.num_rows)))
            if part.num_rows:
                out.append(part)
                used_bytes += part.nbytes
                next_offset = int(part.column(OFFSET_COLUMN)[-1].as_py()) + 1
            if part.num_rows < rows.num_rows:
                cut = True  # the byte cap: the next rows must not follow a gap
                break
        if cut:
            break
    return out, next_offset


@dataclass(frozen=True, slots=True)
class GroupMemberView:
    """One live member of a consumer group: what it reads now (``assigned``), what it is
    giving up (``revoking``), what it waits for (``pending``: given up by others soon)."""

    member_id: str
    client_id: str
    generation: int
    assigned: tuple[int, ...]
    revoking: tuple[int, ...]
    pending: tuple[int, ...]
    session_timeout_ms: int
    joined_ms: int
    last_heartbeat_ms: int
    #: Whose protocol it joined by: ``tidegate`` (the SDK, HTTP, gRPC), or that of the edge
    #: that coordinates its group (``kafka-classic``, ``kafka-consumer``).
    protocol: str = "tidegate"


@dataclass(frozen=True, slots=True)
class GroupPartitionView:
    """One partition of a group's table: its member (None: nobody reads it), committed
    offset (None: never committed), high watermark and lag in records."""

    partition: int
    member_id: str | None
    committed: int | None
    high_watermark: int
    lag: int


@dataclass(frozen=True, slots=True)
class GroupView:
    """A consumer group on one table: ``state`` is ``empty`` (no live member), ``stable``
    (every member holds its target) or ``rebalancing``."""

    group: str
    namespace: str
    name: str
    generation: int
    state: str
    members: tuple[GroupMemberView, ...]
    partitions: tuple[GroupPartitionView, ...]

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)
