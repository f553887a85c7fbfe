"""What every part of an Iceberg table stands on: the store that opened it (as the
:class:`TableHome` protocol), loading its metadata, its names and snapshots."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from gateway.cold.base import (
    CatalogEntry,
    ColdSnapshot,
    ColdTable,
    DataFile,
    PlannedFile,
    SnapshotInfo,
    StorageOptions,
)
from gateway.cold.iceberg.schema import small_offsets
from gateway.cold.iceberg.summary import cold_snapshot
from gateway.wire.errors import SnapshotNotFound
from gateway.wire.schema import PARTITION_COLUMN, system_schema

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table


class TableHome(Protocol):
    """What a table needs of the store that opened it (the store's own table-facing
    parts, so that this module never imports the store: a child never imports its
    parent)."""

    catalog: Catalog

    def filesystem(self) -> Any:
        """The warehouse's pyarrow filesystem."""

    def storage_options(self) -> StorageOptions:
        """Where the warehouse is and how to reach it."""

    def planned(self, f: DataFile) -> PlannedFile:
        """A data file with a URL an executor can read without warehouse credentials."""


class TableBase(ColdTable):
    """One stream-table's Iceberg table."""

    def __init__(
        self,
        store: TableHome,
        identifier: tuple[str, ...],
        user_schema: pa.Schema,
        create: Callable[[], Table | None] | None = None,
    ) -> None:
        self.store = store
        self.identifier = identifier
        #: Creates the Iceberg table when it is missing (a stream-table's Iceberg table is
        #: made at its first use, not when the stream-table is created); None: a missing
        #: table is an error.
        self._create = create
        self._create_lock = threading.Lock()
        self.user_schema = user_schema
        self.stored_schema = system_schema(user_schema)
        self._cached: Table | None = None
        #: (snapshot id, partition) -> that partition's data files, sorted by offset. A
        #: snapshot never changes, so an entry never goes stale; it spares every stream
        #: read the manifest decoding of pyiceberg's planning (most of a small cold read).
        self._file_lists: OrderedDict[tuple[int, int], list[DataFile]] = OrderedDict()
        self._file_lists_lock = threading.Lock()
        #: (snapshot id, pruning expression) -> pyiceberg's file plan, for scans: repeated
        #: scans of a snapshot (dashboards, engines polling) plan once.
        self._plans: OrderedDict[tuple[int, str], list[Any]] = OrderedDict()

    def _load(self) -> Table:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            table = self.store.catalog.load_table(self.identifier)
        except NoSuchTableError:
            table = self._made()
        self._cached = table
        return table

    def _made(self) -> Table:
        """The Iceberg table after a load that missed it: made now, at the stream-table's
        first use of its lake side, empty, with the current schema; or made meanwhile by
        another thread using this handle, or by a racing gateway or job: then loaded.

        Raises:
            SnapshotNotFound: the table does not exist and this handle may not make it.
        """
        from pyiceberg.exceptions import NoSuchTableError

        name = ".".join(self.identifier)
        # One thread of the process makes it; the others wait here, then load what it
        # made (were they to look at ``_create`` unlocked, one that missed just before the
        # table was made could find the maker used up, and call the table missing).
        with self._create_lock:
            try:
                return self.store.catalog.load_table(self.identifier)
            except NoSuchTableError as exc:
                if self._create is None:
                    raise SnapshotNotFound(
                        f"the Iceberg table {name} does not exist", missing_iceberg_table=name
                    ) from exc
            made = self._create()
            if made is None:  # made by another process meanwhile
                try:
                    made = self.store.catalog.load_table(self.identifier)
                except NoSuchTableError as exc:
                    raise SnapshotNotFound(
                        f"the Iceberg table {name} does not exist yet; retry shortly",
                        missing_iceberg_table=name,
                    ) from exc
            self._create = None
            return made

    def _load_for(self, snap: ColdSnapshot) -> Table:
        """The table metadata holding ``snap``: the last loaded one when it does (a
        snapshot never changes once committed), else freshly loaded."""
        cached = self._cached
        if (
            cached is not None
            and snap.snapshot_id is not None
            and cached.snapshot_by_id(snap.snapshot_id) is not None
        ):
            return cached
        return self._load()

    def _data_file(self, f: Any, offset_id: int) -> DataFile:
        from pyiceberg.conversions import from_bytes
        from pyiceberg.types import LongType

        lower = f.lower_bounds or {}
        upper = f.upper_bounds or {}
        lo = from_bytes(LongType(), lower[offset_id]) if offset_id in lower else -1
        hi = from_bytes(LongType(), upper[offset_id]) if offset_id in upper else -1
        return DataFile(
            path=str(f.file_path),
            partition=int(f.partition[0]),
            record_count=int(f.record_count),
            file_size_bytes=int(f.file_size_in_bytes),
            min_offset=int(lo),
            max_offset=int(hi),
        )

    @property
    def name(self) -> str:
        return ".".join(self.identifier)

    @property
    def metadata_location(self) -> str:
        """The current metadata file (what an engine outside Tidegate opens)."""
        return str(self._load().metadata_location)

    def catalog_entry(self) -> CatalogEntry:
        table = self._load()
        # Serialised as pyiceberg writes the metadata file itself (no nulls), so the
        # document is the file's content for the committed metadata location.
        document = json.loads(table.metadata.model_dump_json(exclude_none=True))
        return CatalogEntry(str(table.metadata_location), document)

    def snapshots(self) -> list[SnapshotInfo]:
        out = []
        for snap in sorted(self._load().snapshots(), key=lambda s: s.timestamp_ms):
            summary = snap.summary
            props = dict(summary.additional_properties) if summary is not None else {}
            operation = summary.operation.value if summary is not None else ""
            out.append(SnapshotInfo(snap.snapshot_id, snap.timestamp_ms, operation, props))
        return out

    def data_bytes(self) -> int:
        if self._cached is None:  # a table never made is not made for a look
            from pyiceberg.exceptions import NoSuchTableError

            try:
                self._cached = self.store.catalog.load_table(self.identifier)
            except NoSuchTableError:
                return 0
        return super().data_bytes()

    @property
    def location(self) -> str:
        return str((self._cached or self._load()).location())  # never changes

    def snapshot(self, as_of: int | dt.datetime | None = None) -> ColdSnapshot:
        table = self._load()
        if as_of is None:
            return cold_snapshot(table.current_snapshot())
        if isinstance(as_of, dt.datetime):
            when = as_of if as_of.tzinfo else as_of.replace(tzinfo=dt.UTC)
            ms = int(when.timestamp() * 1000)
            snap = table.snapshot_as_of_timestamp(ms)
            if snap is None:
                raise SnapshotNotFound(
                    f"no snapshot was committed at or before {when.isoformat()}",
                    as_of=when.isoformat(),
                )
            # Expiry may keep an old snapshot (leased) and remove the ones after it: the
            # history then jumps from it to a snapshot whose parent is gone, and the
            # snapshot current at ``when`` may be one of the removed.
            later = [e for e in table.history() if e.timestamp_ms > ms]
            if later:
                successor = table.snapshot_by_id(later[0].snapshot_id)
                if successor is not None and successor.parent_snapshot_id != snap.snapshot_id:
                    raise SnapshotNotFound(
                        f"the snapshot current at {when.isoformat()} has been expired",
                        as_of=when.isoformat(),
                    )
            return cold_snapshot(snap)
        snap = table.snapshot_by_id(int(as_of))
        if snap is None:
            raise SnapshotNotFound(f"snapshot {as_of} does not exist", as_of=str(as_of))
        return cold_snapshot(snap)

    def data_location(self, partition: int) -> str:
        return f"{self.location}/data/{PARTITION_COLUMN}={int(partition)}"

    def file_schema(self) -> pa.Schema:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        # Loaded afresh: the schema evolves, and a tiering run must write files in the
        # schema current when it plans (a superset of the columns of the rows it moves).
        arrow = schema_to_pyarrow(self._load().schema(), include_field_ids=True)
        # Plain (not large) offsets: what Spark and DuckDB write too.
        return pa.schema(
            [pa.field(f.name, small_offsets(f.type), f.nullable, f.metadata) for f in arrow]
        )
