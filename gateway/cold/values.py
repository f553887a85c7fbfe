"""The cold tier's values: what a cold table hands its callers (pinned snapshots, data
files, scan slices, read plans, storage health, catalog entries, read access) and the
snapshot summary properties it keeps its state in. Plain frozen dataclasses with no I/O;
:mod:`gateway.cold.base` (the interface) re-exports every one."""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from gateway.wire.errors import TidegateError

__all__ = [
    "APPLIED_PROPERTY",
    "LOST_PROPERTY",
    "OPERATION_PROPERTY",
    "WATERMARKS_PROPERTY",
    "CatalogEntry",
    "ColdSnapshot",
    "DataAccess",
    "DataFile",
    "FileStats",
    "KeyedFile",
    "PlannedFile",
    "RewriteObsolete",
    "ScanSlice",
    "SnapshotInfo",
    "key_values",
]

WATERMARKS_PROPERTY = "tidegate.watermarks"
#: Snapshot summary property holding the offsets lost with a hot tier's state, per
#: partition, as ``{"p": [[start, end], ...]}``: ranges below ``T(p)`` no data file holds
#: and no record will ever have (see ``ColdTable.commit_lost``). Carried by every commit.
LOST_PROPERTY = "tidegate.lost"
#: Snapshot summary property of a primary-key table's state table: through which offset
#: of each partition's changelog it holds the changes, ``A(p)``, as ``{"p": offset}``
#: (docs/decisions/primary-keys.md).
APPLIED_PROPERTY = "tidegate.applied"
#: Snapshot summary property naming the lake job that committed it (``compact``...).
OPERATION_PROPERTY = "tidegate.operation"


class RewriteObsolete(TidegateError):
    """A compaction's input files were replaced or removed by another commit since it
    planned: its rewrite no longer applies and is dropped (nothing was committed). Raised
    to the lake jobs only, never sent to a client."""

    reason = "REWRITE_OBSOLETE"


@dataclass(frozen=True, slots=True)
class ColdSnapshot:
    """A pinned view of a table's cold tier: everything a read needs to stay consistent
    while tiering and compaction commit new snapshots."""

    #: None while the table has no snapshot (nothing tiered yet).
    snapshot_id: int | None
    #: ``T(p)`` per partition, from the snapshot summary; a missing partition is 0.
    watermarks: Mapping[int, int] = field(default_factory=dict)
    timestamp_ms: int | None = None
    #: Offsets lost with a hot tier's state (``LOST_PROPERTY``): partition -> ranges
    #: ``(start, end)``, ordered and disjoint. Reads pass over them.
    lost: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    #: A state table's ``A(p)`` per partition (``APPLIED_PROPERTY``); a missing
    #: partition is 0. Empty for any other table.
    applied: Mapping[int, int] = field(default_factory=dict)

    def applied_through(self, partition: int) -> int:
        """``A(p)``: the state table holds the changes of ``partition`` below it."""
        return int(self.applied.get(partition, 0))

    def watermark(self, partition: int) -> int:
        return int(self.watermarks.get(partition, 0))

    def lost_through(self, partition: int, start: int, end: int) -> bool:
        """Whether every offset of ``[start, end)`` of ``partition`` was lost."""
        at = start
        for lo, hi in self.lost.get(partition, ()):
            if lo <= at < hi:
                at = hi
            if at >= end:
                return True
        return at >= end


def key_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The distinct values of a key column, sorted, as Python values comparable with the
    bounds of a manifest's column statistics (:attr:`KeyedFile.low`): dates as days,
    times and timestamps as microseconds, the rest as their Python values."""
    t = column.type
    if pa.types.is_date32(t):
        column = pc.cast(column, pa.int32())
    elif pa.types.is_timestamp(t):
        column = pc.cast(pc.cast(column, pa.timestamp("us", t.tz)), pa.int64())
    elif pa.types.is_time64(t):
        column = pc.cast(pc.cast(column, pa.time64("us")), pa.int64())
    return sorted(pc.unique(column).to_pylist())


@dataclass(frozen=True, slots=True)
class KeyedFile:
    """A state table's data file with the bounds of the primary key's first column in it
    (from the manifest's column statistics; None: unknown, the file may hold any key)."""

    file: DataFile
    low: Any = None
    high: Any = None

    def may_hold(self, sorted_values: list[Any]) -> bool:
        """Whether a key whose first column is one of ``sorted_values`` (from
        :func:`key_values`) may be in the file (a value within its bounds; always, when
        they are unknown or incomparable)."""
        if self.low is None or self.high is None:
            return True
        try:
            at = bisect.bisect_left(sorted_values, self.low)
            return at < len(sorted_values) and sorted_values[at] <= self.high
        except TypeError:
            return True


@dataclass(frozen=True, slots=True)
class DataFile:
    """A Parquet data file written for the cold tier (by a tiering or compaction task)
    or listed from a snapshot. Holds rows of exactly one partition, sorted by offset."""

    path: str
    partition: int
    record_count: int
    file_size_bytes: int
    min_offset: int
    max_offset: int
    #: The file's Parquet footer as its writer closed it (a metadata-only Parquet file),
    #: when this process wrote it: the commit takes the column statistics from it instead
    #: of reading the file's footer back from storage.
    footer: bytes | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class ScanSlice:
    """One part of a cold scan, read whole by Arrow's C++ (:attr:`read`, a blocking call
    for the I/O pool): row groups of one or more data files, decoded, cast to the stored
    types, filtered and projected without Python running per batch. ``nbytes`` is its
    uncompressed size by the files' footers (what a reader budgets before reading)."""

    nbytes: int
    read: Callable[[], pa.Table]


@dataclass(frozen=True, slots=True)
class PlannedFile:
    """A data file in a read plan, readable by an executor without warehouse credentials
    (a presigned HTTPS URL on object storage, a file path or a link through the gateway on
    a local warehouse). ``warehouse_path``: on a local warehouse, the file's path inside
    the warehouse folder, for a reader given that folder."""

    file: DataFile
    url: str
    expires_at: dt.datetime | None = None
    warehouse_path: str | None = None


@dataclass(frozen=True, slots=True)
class FileStats:
    """How healthy a table's storage is: what compaction and expiry act on."""

    data_files: int
    #: Data files below the small-file threshold (``compaction.small_file_bytes``).
    small_files: int
    data_bytes: int
    #: Snapshots retained in the table's metadata.
    snapshots: int

    @property
    def small_file_ratio(self) -> float:
        return self.small_files / self.data_files if self.data_files else 0.0


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """One committed snapshot, as engines list them."""

    snapshot_id: int
    timestamp_ms: int
    operation: str
    summary: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """A table as an Iceberg REST catalog serves it: its current committed metadata file
    and that file's JSON document (the spec's ``TableMetadata``)."""

    metadata_location: str
    metadata: Mapping[str, Any]

    @property
    def location(self) -> str:
        return str(self.metadata.get("location", ""))


@dataclass(frozen=True, slots=True)
class DataAccess:
    """How an engine outside Tidegate reads one table's files without the warehouse's
    keys: FileIO properties for the table (region, endpoint, addressing: no secret) and,
    where the warehouse needs them, temporary credentials valid only under ``prefix``
    (the Iceberg REST spec's ``storage-credentials``)."""

    config: Mapping[str, str] = field(default_factory=dict)
    #: ``s3.access-key-id``, ``s3.secret-access-key``, ``s3.session-token``... Empty when
    #: the files need none (a local folder) or none can be vended (no role configured).
    credentials: Mapping[str, str] = field(default_factory=dict)
    prefix: str = ""
    #: Unix milliseconds the credentials stop working; None without credentials.
    expires_at_ms: int | None = None
