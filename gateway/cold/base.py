"""The cold tier: one Apache Iceberg table per stream-table.

The Iceberg table *is* the stream's cold storage (shared tiering): its rows are the user
columns plus ``_partition``, ``_offset`` and ``_timestamp``, its partition spec is
identity(``_partition``) and its sort order ``(_partition, _offset)``. The tiered watermark
``T(p)`` of every partition lives in the snapshot summary property ``tidegate.watermarks``
(JSON object, partition -> watermark), written in the same commit as the data it covers;
every offset below ``T(p)`` is in that snapshot, none at or above it.

The unification layer talks to these interfaces only, never to pyiceberg. This module is
the interface: the two ABCs (:class:`ColdTable`, :class:`ColdStore`) here, and every name of
the values they hand out (:mod:`gateway.cold.values`) and of the data-file writer
(:mod:`gateway.cold.datafiles`) re-exported, so ``gateway.cold.base.X`` names all of it.
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from gateway.cold.datafiles import (
    OFFSET_SORT,
    ROW_GROUP_ROWS,
    SORTED_KEY,
    DataFileWriter,
    StorageOptions,
    fs_path,
    write_data_file,
)
from gateway.cold.values import (
    APPLIED_PROPERTY,
    LOST_PROPERTY,
    OPERATION_PROPERTY,
    WATERMARKS_PROPERTY,
    CatalogEntry,
    ColdSnapshot,
    DataAccess,
    DataFile,
    FileStats,
    KeyedFile,
    PlannedFile,
    RewriteObsolete,
    ScanSlice,
    SnapshotInfo,
    key_values,
)

if TYPE_CHECKING:
    from gateway.cold.plans import PlanFiles
    from gateway.config import Settings
    from gateway.meta import TableDef
    from gateway.wire.filters import Expr

__all__ = [
    "APPLIED_PROPERTY",
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
    "KeyedFile",
    "PlannedFile",
    "RewriteObsolete",
    "ScanSlice",
    "SnapshotInfo",
    "StateTable",
    "StorageOptions",
    "fs_path",
    "key_values",
    "write_data_file",
]


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


class StateTable(ColdTable):
    """A primary-key table's *state table*: one live row per key (the user columns and
    the ``_partition``, ``_offset``, ``_timestamp`` of the change that made it, no
    ``_change``), partitioned by ``_partition``, sorted by the key, written copy-on-write
    (docs/decisions/primary-keys.md). Its snapshots carry ``tidegate.applied``
    (:attr:`ColdSnapshot.applied`): through which changelog offset of each partition it
    holds the changes. Reads and scans are a :class:`ColdTable`'s."""

    @abstractmethod
    def key_files(self, snap: ColdSnapshot, partition: int) -> list[KeyedFile]:
        """The data files of ``partition`` in ``snap``, each with the bounds of the key's
        first column, from the manifests only."""

    @abstractmethod
    def lookup(self, snap: ColdSnapshot, partition: int, keys: pa.Table) -> pa.Table:
        """The rows of ``snap`` in ``partition`` whose key is one of ``keys`` (a table of
        the key's columns, in the key's types), in the stored schema: only the files
        whose key bounds may hold one are opened, and of those the row groups whose
        statistics may."""

    @abstractmethod
    def read_files(self, files: Sequence[DataFile]) -> pa.Table:
        """Every row of ``files``, in the stored schema (user columns, then the system
        columns)."""

    @abstractmethod
    def write_files(self, partition: int, rows: pa.Table, target_bytes: int) -> list[DataFile]:
        """Write ``rows`` (one partition's live rows, stored schema) as new data files of
        about ``target_bytes`` of Arrow data each, sorted by the key, and describe them
        for :meth:`commit_state`. Nothing is visible until then."""

    @abstractmethod
    def commit_state(
        self,
        removed: Sequence[DataFile],
        added: Sequence[DataFile],
        applied: Mapping[int, int],
        base: ColdSnapshot,
        *,
        operation: str = "apply",
    ) -> ColdSnapshot:
        """Replace ``removed`` by ``added`` and raise ``tidegate.applied`` to ``applied``
        (never lowered; ``{}`` keeps it), in one overwrite commit on ``base`` whose
        ``tidegate.operation`` is ``operation`` (``apply``, ``compact``).

        Raises:
            CommitConflict: the table moved since ``base``; nothing was committed (re-plan
                from the new snapshot).
        """


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

    def state_table(self, table: TableDef) -> StateTable:
        """The state table of a primary-key table (made empty at its first use, like
        :meth:`table`).

        Raises:
            NotImplementedError: a store that keeps no state tables.
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no state tables")

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
