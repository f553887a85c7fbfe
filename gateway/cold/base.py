"""The cold tier: one Apache Iceberg table per stream-table.

The Iceberg table *is* the stream's cold storage (shared tiering): its rows are the user
columns plus ``_partition``, ``_offset`` and ``_timestamp``, its partition spec is
identity(``_partition``) and its sort order ``(_partition, _offset)``. The tiered watermark
``T(p)`` of every partition lives in the snapshot summary property ``tidegate.watermarks``
(JSON object, partition -> watermark), written in the same commit as the data it covers;
every offset below ``T(p)`` is in that snapshot, none at or above it.

The unification layer talks to these interfaces only, never to pyiceberg.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from gateway.wire.errors import TidegateError
from gateway.wire.schema import OFFSET_COLUMN, PARTITION_COLUMN

if TYPE_CHECKING:
    from gateway.cold.plans import PlanFiles
    from gateway.config import Settings
    from gateway.meta import TableDef
    from gateway.wire.filters import Expr

__all__ = [
    "LOST_PROPERTY",
    "OFFSET_SORT",
    "OPERATION_PROPERTY",
    "ROW_GROUP_ROWS",
    "SORTED_KEY",
    "WATERMARKS_PROPERTY",
    "CatalogEntry",
    "ColdSnapshot",
    "ColdStore",
    "ColdTable",
    "DataAccess",
    "DataFile",
    "DataFileWriter",
    "FileStats",
    "PlannedFile",
    "RewriteObsolete",
    "ScanSlice",
    "SnapshotInfo",
    "StorageOptions",
    "fs_path",
    "write_data_file",
]

WATERMARKS_PROPERTY = "tidegate.watermarks"
#: Snapshot summary property holding the offsets lost with a hot tier's state, per
#: partition, as ``{"p": [[start, end], ...]}``: ranges below ``T(p)`` no data file holds
#: and no record will ever have (see ``ColdTable.commit_lost``). Carried by every commit.
LOST_PROPERTY = "tidegate.lost"
#: Snapshot summary property naming the lake job that committed it (``compact``...).
OPERATION_PROPERTY = "tidegate.operation"
#: Parquet key-value metadata of data files written sorted by ``_offset`` (by tiering and
#: compaction): their rows can be streamed in order, a row group at a time.
SORTED_KEY = b"tidegate.sorted"
OFFSET_SORT = b"_offset"
#: Rows per Parquet row group of the files we write: the unit a stream read decodes and
#: prunes by offset bounds. 16k rows keep a short read at a random offset of a large
#: (compacted) file cheap (it decodes one group) at no cost to whole-file reads.
ROW_GROUP_ROWS = 16 * 1024


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
class StorageOptions:
    """What a task on another process or host needs to write or read warehouse files:
    serialisable, so the Spark driver can ship it to executors. ``properties`` are
    pyiceberg FileIO properties (``s3.endpoint``, ``s3.access-key-id``...)."""

    warehouse: str
    properties: Mapping[str, str] = field(default_factory=dict)

    def filesystem(self) -> tuple[Any, str]:
        """A ``pyarrow.fs.FileSystem`` and the root path for this warehouse.

        Local warehouses get a ``LocalFileSystem``; ``s3://`` ones an ``S3FileSystem``
        configured from ``properties`` (endpoint override for MinIO or moto, keys,
        region, path-style addressing).
        """
        from pyarrow import fs as pafs

        if self.warehouse.startswith(("s3://", "s3a://")):
            p = self.properties
            endpoint = p.get("s3.endpoint")
            scheme = None
            if endpoint and "://" in endpoint:
                scheme, endpoint = endpoint.split("://", 1)
            s3 = pafs.S3FileSystem(
                access_key=p.get("s3.access-key-id"),
                secret_key=p.get("s3.secret-access-key"),
                region=p.get("s3.region") or None,
                endpoint_override=endpoint,
                scheme=scheme or "https",
                force_virtual_addressing=p.get("s3.force-virtual-addressing") == "true",
            )
            return s3, fs_path(self.warehouse)
        return pafs.LocalFileSystem(), fs_path(self.warehouse)


def fs_path(uri: str) -> str:
    """A warehouse URI as a path of :meth:`StorageOptions.filesystem`'s filesystem:
    ``s3://bucket/key`` -> ``bucket/key``, ``file:///a/b`` -> ``/a/b``."""
    from urllib.parse import unquote, urlparse

    if uri.startswith(("s3://", "s3a://")):
        return uri.split("://", 1)[1]
    if uri.startswith("file:"):
        return unquote(urlparse(uri).path)
    return uri


def _leaf_paths(schema: pa.Schema) -> list[str]:
    """The Parquet leaf column paths of ``schema`` (``s.x.list.element``), as the writer
    names them in its per-column options."""
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_metadata(schema, sink)
    meta = pq.read_metadata(pa.BufferReader(sink.getvalue()))
    return [meta.schema.column(i).path for i in range(meta.num_columns)]


def _numpy(column: pa.Array | pa.ChunkedArray) -> Any:
    """A column without nulls as one numpy array (no copy when it is one chunk)."""
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 1:
            return column.chunk(0).to_numpy()
        return column.to_numpy()
    return column.to_numpy()


#: Rows of a file's first row group that decide which columns get a dictionary.
_DICTIONARY_SAMPLE = 4096


def _dictionary_columns(schema: pa.Schema, first: pa.Table) -> list[str]:
    """The Parquet columns worth a dictionary, judged on a file's first rows: every
    column but ``_offset`` (it never repeats) and the top-level columns whose first rows
    are mostly distinct (ids, times, measurements), for which a dictionary only costs
    time and bytes. Parquet-mr makes the same call after a column's first page; Arrow's
    writer never does, and would keep a dictionary of every value of a 16k-row group."""
    import pyarrow.compute as pc

    keep = []
    for path in _leaf_paths(schema):
        if path == OFFSET_COLUMN:
            continue
        if path in first.column_names and not pa.types.is_nested(first.schema.field(path).type):
            sample = first.column(path).slice(0, _DICTIONARY_SAMPLE)
            if len(sample) > 1 and pc.count_distinct(sample).as_py() > len(sample) // 2:
                continue
        keep.append(path)
    return keep


class DataFileWriter:
    """Streams the rows of one partition, in increasing offset order, into one new
    Parquet data file in ``folder`` (a :meth:`ColdTable.data_location`), in
    ``file_schema`` (:meth:`ColdTable.file_schema`, which carries the Iceberg field ids).
    Rows are written in row groups of :data:`ROW_GROUP_ROWS` as they come: nothing but
    the current row group is held in memory, and no row is sorted or copied on the
    Python side. Pure pyarrow: runs in a Spark task without pyiceberg or a catalog.

    ``_offset``, and the columns whose first rows are mostly distinct, are written plain
    (:func:`_dictionary_columns`); the others keep Parquet's dictionary encoding. The
    writer's own footer is handed back with the :class:`DataFile`, so the commit builds the Iceberg
    column statistics without reading the file again.

    Use :meth:`write` then :meth:`close` (or :meth:`abort`)."""

    def __init__(
        self,
        options: StorageOptions,
        folder: str,
        file_schema: pa.Schema,
        *,
        filesystem: Any = None,
    ) -> None:
        import uuid

        self.path = f"{folder.rstrip('/')}/{uuid.uuid4().hex}.parquet"
        self.schema = file_schema
        fs = filesystem if filesystem is not None else options.filesystem()[0]
        if not folder.startswith(("s3://", "s3a://")):
            fs.create_dir(fs_path(folder), recursive=True)
        self._filesystem = fs
        self._writer: Any = None  # opened with the first row group (see _open)
        self._out: Any = None
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        #: Rows written so far, and their Arrow bytes.
        self.records = 0
        self.nbytes = 0
        self.partition: int | None = None
        self.min_offset = -1
        self.max_offset = -1

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Add ``batch`` (stored or file schema: user columns then the system columns;
        columns of ``file_schema`` it lacks are written as nulls). Its offsets must be
        increasing and above every offset written before, its partition the file's.

        Raises:
            ValueError: offsets out of order, or a second partition.
        """
        n = batch.num_rows
        if n == 0:
            return
        offsets = _numpy(batch.column(OFFSET_COLUMN))
        if offsets[0] <= self.max_offset or (n > 1 and not (offsets[1:] > offsets[:-1]).all()):
            raise ValueError("a data file's rows must come in increasing offset order")
        parts = batch.column(PARTITION_COLUMN)
        if parts.null_count:
            raise ValueError("a data file's rows need a partition")
        values = _numpy(parts)
        if self.partition is None:
            self.partition = int(values[0])
        if not (values == self.partition).all():
            found = sorted({self.partition, *(int(v) for v in set(values.tolist()))})
            raise ValueError(f"a data file holds one partition, got {found}")
        if self.min_offset < 0:
            self.min_offset = int(offsets[0])
        self.max_offset = int(offsets[-1])
        self._pending.append(
            batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        )
        self._pending_rows += n
        self.records += n
        self.nbytes += batch.nbytes
        if self._pending_rows >= ROW_GROUP_ROWS:
            self._flush(whole_groups=True)

    def _flush(self, *, whole_groups: bool) -> None:
        if not self._pending:
            return
        rows = self._pending[0] if len(self._pending) == 1 else pa.concat_tables(self._pending)
        keep = rows.num_rows % ROW_GROUP_ROWS if whole_groups else 0
        out = rows.slice(0, rows.num_rows - keep)
        self._pending = [rows.slice(rows.num_rows - keep)] if keep else []
        self._pending_rows = keep
        if out.num_rows:
            rows = self._conform(out)
            if self._writer is None:
                self._open(rows)
            self._writer.write_table(rows, row_group_size=ROW_GROUP_ROWS)

    def _open(self, first: pa.Table) -> None:
        """Open the file, choosing the columns to dictionary-encode from its first rows
        (:func:`_dictionary_columns`)."""
        import pyarrow.parquet as pq

        # Flagged as sorted by offset, so readers stream it instead of reading it whole.
        metadata = {**(self.schema.metadata or {}), SORTED_KEY: OFFSET_SORT}
        out = self._filesystem.open_output_stream(fs_path(self.path))
        try:
            self._writer = pq.ParquetWriter(
                out,
                self.schema.with_metadata(metadata),
                compression="zstd",
                use_dictionary=_dictionary_columns(self.schema, first),
            )
        except BaseException:
            out.close()
            raise
        self._out = out

    def _conform(self, rows: pa.Table) -> pa.Table:
        """``rows`` in the file schema: reordered, cast, and columns added to the table
        since the rows' schema was read filled with nulls."""
        if rows.schema.equals(self.schema):
            return rows
        for f in self.schema:
            if f.name not in rows.column_names:
                rows = rows.append_column(f.name, pa.nulls(rows.num_rows, f.type))
        return rows.select(self.schema.names).cast(self.schema)

    def close(self) -> DataFile:
        """Finish the file and return its description for :meth:`ColdTable.commit_tiered`.

        Raises:
            ValueError: no row was written.
        """
        if self.records == 0 or self.partition is None:
            self.abort()
            raise ValueError("a data file needs at least one row")
        try:
            self._flush(whole_groups=False)
            self._writer.close()
            size = self._out.tell()
        finally:
            if self._out is not None:
                self._out.close()
        footer = pa.BufferOutputStream()
        self._writer.writer.metadata.write_metadata_file(footer)
        return DataFile(
            path=self.path,
            partition=self.partition,
            record_count=self.records,
            file_size_bytes=int(size),
            min_offset=self.min_offset,
            max_offset=self.max_offset,
            footer=footer.getvalue().to_pybytes(),
        )

    def abort(self) -> None:
        """Give the file up (what was written stays an orphan until the clean-up)."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        if self._out is not None:
            self._out.close()


def write_data_file(
    options: StorageOptions, folder: str, rows: pa.Table, file_schema: pa.Schema
) -> DataFile:
    """Write ``rows`` (one partition, any order) as one Parquet data file in ``folder``
    (a :meth:`ColdTable.data_location`), sorted by offset and in ``file_schema``
    (:meth:`ColdTable.file_schema`, which carries the Iceberg field ids), and return
    its description for :meth:`ColdTable.commit_tiered`: a :class:`DataFileWriter`
    fed with the rows once sorted (they are not sorted again when they already are).
    Pure pyarrow: runs in a Spark task without pyiceberg or a catalog."""
    if rows.num_rows == 0:
        raise ValueError("a data file needs at least one row")
    offsets = rows.column(OFFSET_COLUMN).to_numpy()
    if not (offsets[1:] > offsets[:-1]).all():
        rows = rows.sort_by(OFFSET_COLUMN)
    writer = DataFileWriter(options, folder, file_schema)
    try:
        writer.write(rows)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


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


class ColdTable(ABC):
    """One stream-table's Iceberg table."""

    @property
    @abstractmethod
    def name(self) -> str:
        """The table's identifier in the catalog (``namespace.table``)."""

    @property
    @abstractmethod
    def metadata_location(self) -> str:
        """The current metadata file (what an engine outside Tidegate opens)."""

    @abstractmethod
    def snapshots(self) -> list[SnapshotInfo]:
        """Every retained snapshot, oldest first."""

    def data_bytes(self) -> int:
        """Bytes of the data files of the latest snapshot (0 for a table with none, or
        whose lake side was never made: a look that makes nothing)."""
        snaps = self.snapshots()
        return int(snaps[-1].summary.get("total-files-size", 0)) if snaps else 0

    @abstractmethod
    def catalog_entry(self) -> CatalogEntry:
        """The table's current committed metadata file and its document, read afresh
        (what an Iceberg REST catalog answers ``loadTable`` with).

        Raises:
            NotFound: the Iceberg table does not exist.
        """

    @abstractmethod
    def snapshot(self, as_of: int | dt.datetime | None = None) -> ColdSnapshot:
        """The current snapshot, or the one with id ``as_of``, or the last one committed at
        or before the time ``as_of``.

        Raises:
            NotFound: no such snapshot (a clear message with the reason SNAPSHOT_NOT_FOUND).
        """

    @abstractmethod
    def files(
        self, snap: ColdSnapshot, partition: int, from_offset: int, to_offset: int
    ) -> list[DataFile]:
        """Data files of ``snap`` that may hold offsets in ``[from_offset, to_offset)`` of
        ``partition``, chosen by the ``_partition`` partition value and the ``_offset``
        column statistics of the manifests (never by opening other data files), in offset
        order."""

    @abstractmethod
    def read_range(
        self, snap: ColdSnapshot, partition: int, from_offset: int, to_offset: int
    ) -> Iterator[pa.RecordBatch]:
        """Records of ``partition`` with offsets in ``[from_offset, to_offset)`` from
        ``snap``, in offset order, in the stored schema (user columns cast back to the
        table's Arrow types, then the system columns). Opens only the files that
        :meth:`files` returns. ``to_offset`` must be ``<= snap.watermark(partition)``."""

    @abstractmethod
    def scan(
        self,
        snap: ColdSnapshot,
        columns: Sequence[str] | None = None,
        row_filter: Expr | None = None,
        limit: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Rows of ``snap`` that ``row_filter`` (a tree bound to the stored schema by
        :func:`gateway.wire.filters.bind`) keeps, at most ``limit``, in batches of the
        stored schema restricted to ``columns``. The backend prunes files with the filter
        and must answer exactly the rows its Arrow form (:func:`~gateway.wire.filters.to_arrow`)
        keeps."""

    @abstractmethod
    def scan_slices(
        self,
        snap: ColdSnapshot,
        columns: Sequence[str] | None,
        row_filter: Expr | None,
        target_bytes: int,
    ) -> list[ScanSlice]:
        """What :meth:`scan` answers without a limit, as slices of about ``target_bytes``
        (uncompressed) each, in :meth:`scan`'s order: reading every slice in turn gives
        the same rows in the same order."""

    @abstractmethod
    def plan(self, snap: ColdSnapshot, row_filter: Expr | None = None) -> list[PlannedFile]:
        """The data files a scan of ``snap`` with ``row_filter`` must read (a superset of
        the files holding matching rows)."""

    def plan_files(self) -> PlanFiles:
        """The files of Iceberg REST catalog scan plans of this table
        (:mod:`gateway.cold.plans`).

        Raises:
            NotImplementedError: a backend that serves no catalog plans.
        """
        raise NotImplementedError(f"{type(self).__name__} serves no catalog scan plans")

    def file_stats(self, partitions: int, small_bytes: int) -> FileStats:
        """Data files of the current snapshot (how many, how many below ``small_bytes``,
        their bytes) and the snapshot count, from the manifests only."""
        snaps = self.snapshots()
        current = self.snapshot()
        files = (
            [f for p in range(partitions) for f in self.files(current, p, 0, 2**63 - 1)]
            if current.snapshot_id is not None
            else []
        )
        return FileStats(
            data_files=len(files),
            small_files=sum(1 for f in files if f.file_size_bytes < small_bytes),
            data_bytes=sum(f.file_size_bytes for f in files),
            snapshots=len(snaps),
        )

    @abstractmethod
    def commit_tiered(
        self,
        files: Sequence[DataFile],
        watermarks: Mapping[int, int],
        base: ColdSnapshot,
    ) -> ColdSnapshot:
        """Add ``files`` and set ``tidegate.watermarks`` to ``base``'s watermarks updated
        with ``watermarks``, in one Iceberg commit.

        Exactly once: if the current snapshot is no longer ``base`` (a concurrent commit),
        nothing is committed and ``CommitConflict`` (retryable) is raised so the caller
        re-plans from the new snapshot. Watermarks never move backwards.
        """

    @abstractmethod
    def commit_lost(self, partition: int, end: int, base: ColdSnapshot) -> ColdSnapshot:
        """Record that the offsets ``[T(p), end)`` of ``partition`` are lost (a hot tier
        lost them before tiering did, and re-seeded the partition at ``end``): one commit
        that raises ``T(p)`` to ``end`` without data and adds the range to
        ``tidegate.lost``, so that tiering goes on from ``end`` and reads pass over it.
        Nothing is committed when ``T(p)`` is already at or above ``end``.

        Raises:
            CommitConflict: the table moved since ``base``; retry from the new snapshot.
        """

    @abstractmethod
    def evolve_schema(self, user: pa.Schema, docs: Mapping[str, str]) -> int:
        """Bring the table's schema to the user schema ``user`` (with column ``docs``) in
        one commit, and return the current schema id. ``user`` differs from the table's
        by admitted changes only (:func:`gateway.wire.evolution.apply_changes`): added
        nullable columns, widened types, optional columns, docs. What the table already
        has is left alone, so repeating a change that committed here is a no-op.

        Raises:
            CommitConflict: a concurrent schema change committed first (retryable).
        """

    @abstractmethod
    def schema_id(self) -> int:
        """The id of the table's current schema (what engines reading it see)."""

    @abstractmethod
    def commit_rewrite(
        self,
        removed: Sequence[DataFile],
        added: Sequence[DataFile],
        base: ColdSnapshot,
    ) -> ColdSnapshot:
        """Replace the data files ``removed`` by ``added`` (the same records, rewritten by
        compaction) in one Iceberg commit that keeps the current ``tidegate.watermarks``.

        Snapshot isolation: ``base`` is the snapshot the rewrite was planned from. When
        the table has moved on (a tiering commit: it only adds files), the rewrite is
        applied to the new snapshot as long as every removed file is still live in it.

        Raises:
            CommitConflict: a concurrent commit won the race; retry from the new snapshot.
            RewriteObsolete: a removed file is no longer live (another compaction or a
                retention replaced it): give up, nothing was committed.
        """

    @abstractmethod
    def commit_retention(self, earliest: Mapping[int, int]) -> tuple[ColdSnapshot, int]:
        """Remove every row below ``earliest[p]`` in each partition ``p`` in one commit on
        the current snapshot: data files wholly below it are dropped, the one file that
        straddles it (files are disjoint in offsets) is rewritten with its rows at or
        above it. The snapshot carries the current ``tidegate.watermarks``, each raised
        to ``earliest[p]`` (offsets below it are gone for good, so tiering resumes there)
        and ``tidegate.operation=retention``. Nothing is committed when no row is below.

        Returns the current snapshot after the commit and the number of rows removed.

        Raises:
            CommitConflict: a concurrent commit won; nothing was committed (the caller
                retries from the new snapshot).
        """

    @abstractmethod
    def expire_snapshots(self, snapshot_ids: Sequence[int]) -> list[str]:
        """Remove the snapshots ``snapshot_ids`` from the table's metadata in one commit
        (never the current one), and return the paths of the files (data files,
        manifests, manifest lists) that only they referenced: no retained snapshot reads
        them any more, so the caller may delete them. Deletes no file itself.

        Raises:
            CommitConflict: a concurrent commit won; nothing was expired.
        """

    @abstractmethod
    def referenced_files(self) -> set[str]:
        """Paths of every file the table's metadata references: the data files,
        manifests and manifest lists of every retained snapshot, and the metadata files.
        A file under :attr:`location` that is not among them is an orphan."""

    @property
    @abstractmethod
    def location(self) -> str:
        """The table's root folder (URI): its data and metadata files live below it."""

    @abstractmethod
    def data_location(self, partition: int) -> str:
        """Folder (URI) where tasks write new data files of ``partition``."""

    @abstractmethod
    def file_schema(self) -> pa.Schema:
        """The Arrow schema data files are written in (Iceberg physical types, with
        ``PARQUET:field_id`` metadata so any Iceberg reader resolves columns by id), as
        :func:`write_data_file` takes it."""


class ColdStore(ABC):
    """The catalog and warehouse holding every stream-table's Iceberg table."""

    @classmethod
    @abstractmethod
    def from_settings(cls, settings: Settings) -> ColdStore:
        """Build from ``settings.cold``."""

    @abstractmethod
    def create_table(self, table: TableDef, schema: pa.Schema) -> ColdTable:
        """Create the Iceberg table of a new stream-table (namespace
        ``<tenant>.<namespace>``, tenant-prefixed location). ``schema`` is the user schema.

        Raises:
            InvalidSchema: a type Iceberg cannot store losslessly.
        """

    @abstractmethod
    def check_schema(self, schema: pa.Schema) -> None:
        """Refuse a user schema this store cannot hold losslessly (called before any
        metadata is written).

        Raises:
            InvalidSchema: with the offending column.
        """

    @abstractmethod
    def table(self, table: TableDef) -> ColdTable:
        """The Iceberg table of an existing stream-table, created empty with the
        table's current schema when it is first used (the gateway does not create it
        with the stream-table: a create stays cheap however many tables exist)."""

    @abstractmethod
    def drop_table(self, table: TableDef) -> None:
        """Drop the Iceberg table and delete its files."""

    @abstractmethod
    def drop_tenant(self, tenant: str) -> None:
        """Remove everything left of a deleted tenant: its namespaces and its prefix."""

    @abstractmethod
    def storage_options(self) -> StorageOptions:
        """How tasks elsewhere reach the warehouse."""

    @abstractmethod
    def data_access(self, tenant: str, location: str) -> DataAccess:
        """How an engine of ``tenant`` reads the files of the table at ``location`` (a
        folder of that tenant) without the warehouse's keys: a local warehouse needs
        nothing; object storage gets temporary credentials limited to reads under
        ``location`` when the store can vend them. Never the warehouse's own keys.

        Raises:
            Unavailable: the credential service refused or could not be reached.
        """

    @abstractmethod
    def close(self) -> None:
        """Release catalog connections."""
