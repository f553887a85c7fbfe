"""The cold tier on Apache Iceberg through pyiceberg (SQL or REST catalog, local or S3).

Mapping of the admitted Arrow types (:mod:`gateway.wire.schema`) to Iceberg, chosen so every
value survives the round trip:

==========================  =========================  ==============================
Arrow                       Iceberg                    read back as
==========================  =========================  ==============================
bool                        boolean                    bool
int8, int16, int32          int                        cast back to int8/int16/int32
int64                       long                       int64
float32, float64            float, double              same
string, binary              string, binary             same
date32, time64[us]          date, time                 same
timestamp[us]               timestamp                  timestamp[us] (naive)
timestamp[us, tz=UTC]       timestamptz                timestamp[us, tz=UTC]
decimal128(p, s)            decimal(p, s)              decimal128(p, s)
list<T>, struct<...>        list, struct               same, recursively
==========================  =========================  ==============================

Field ids are assigned as a catalog does at create (top-level columns in order, the
system columns last among them, then nested fields); they never
change for a table (no schema evolution yet). Data files carry the ids in their Parquet
schema, and the table has a default name mapping too, so files written without ids
(plain pyarrow) resolve by name.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pyiceberg  # noqa: F401 - the dependency of this backend: fail at load when absent

from gateway.cold.base import (
    WATERMARKS_PROPERTY,
    ColdSnapshot,
    ColdStore,
    ColdTable,
    DataFile,
    PlannedFile,
    StorageOptions,
    fs_path,
)
from gateway.wire.errors import CommitConflict, InvalidRequest, InvalidSchema, SnapshotNotFound
from gateway.wire.schema import OFFSET_COLUMN, PARTITION_COLUMN, system_schema

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from gateway.config import Settings
    from gateway.meta import TableDef

__all__ = ["IcebergColdStore", "IcebergColdTable", "arrow_to_iceberg", "parse_filter"]

log = logging.getLogger(__name__)

TABLE_PROPERTIES = {
    "write.delete.isolation-level": "snapshot",
    "write.parquet.compression-codec": "zstd",
    # Full bounds for the system columns whatever the column count, so pruning by offset
    # always works.
    "write.metadata.metrics.column._partition": "full",
    "write.metadata.metrics.column._offset": "full",
    "tidegate.layout": "1",
    # No silent re-apply of a conflicting commit by pyiceberg: commit_tiered must raise
    # CommitConflict so the tiering job re-plans (else a racing run commits twice).
    "commit.retry.num-retries": "0",
}


# --------------------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------------------
class _Ids:
    def __init__(self) -> None:
        self.next = 0

    def __call__(self) -> int:
        self.next += 1
        return self.next


def _iceberg_type(t: pa.DataType, ids: _Ids, where: str) -> Any:
    from pyiceberg import types as it

    if pa.types.is_boolean(t):
        return it.BooleanType()
    if t in (pa.int8(), pa.int16(), pa.int32()):
        return it.IntegerType()
    if t == pa.int64():
        return it.LongType()
    if t == pa.float32():
        return it.FloatType()
    if t == pa.float64():
        return it.DoubleType()
    if t == pa.string():
        return it.StringType()
    if t == pa.binary():
        return it.BinaryType()
    if t == pa.date32():
        return it.DateType()
    if t == pa.time64("us"):
        return it.TimeType()
    if pa.types.is_timestamp(t) and t.unit == "us":
        if t.tz is None:
            return it.TimestampType()
        if t.tz in ("UTC", "+00:00", "Etc/UTC"):
            return it.TimestamptzType()
    if pa.types.is_decimal128(t) and 1 <= t.precision <= 38:
        return it.DecimalType(t.precision, t.scale)
    if pa.types.is_list(t):
        element_id = ids()
        value = t.value_field
        return it.ListType(
            element_id,
            _iceberg_type(value.type, ids, f"{where}[]"),
            element_required=not value.nullable,
        )
    if pa.types.is_struct(t):
        fields = []
        for i in range(t.num_fields):
            f = t.field(i)
            fid = ids()
            fields.append(
                it.NestedField(
                    fid, f.name, _iceberg_type(f.type, ids, f"{where}.{f.name}"), not f.nullable
                )
            )
        return it.StructType(*fields)
    raise InvalidSchema(
        f"column {where!r} has type {t}, which Iceberg cannot store losslessly", column=where
    )


def arrow_to_iceberg(user: pa.Schema) -> Schema:
    """The Iceberg schema of a table: user columns then the required system columns.

    Raises:
        InvalidSchema: a type that would not round-trip value for value.
    """
    from pyiceberg import types as it
    from pyiceberg.schema import Schema, assign_fresh_schema_ids

    ids = _Ids()
    fields = []
    for f in user:
        fid = ids()
        fields.append(
            it.NestedField(fid, f.name, _iceberg_type(f.type, ids, f.name), not f.nullable)
        )
    fields.append(it.NestedField(ids(), PARTITION_COLUMN, it.IntegerType(), True))
    fields.append(it.NestedField(ids(), OFFSET_COLUMN, it.LongType(), True))
    fields.append(it.NestedField(ids(), "_timestamp", it.TimestamptzType(), True))
    # The ids a catalog assigns at create (top-level fields first, then nested ones), so
    # this function and the table agree on every id.
    return assign_fresh_schema_ids(Schema(*fields))


def _cast(batch: pa.RecordBatch | pa.Table, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` as ``target`` (names, order, types, nullability), by name."""
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks()
        arrays = [batch.column(f.name).combine_chunks() for f in target]
    else:
        arrays = [batch.column(f.name) for f in target]
    out = [
        a if a.type.equals(f.type) else a.cast(f.type) for a, f in zip(arrays, target, strict=True)
    ]
    return pa.RecordBatch.from_arrays(out, schema=target)


def parse_filter(text: str | None, schema: pa.Schema) -> Any:
    """A row filter in pyiceberg's expression syntax (``a > 5 and b = 'x'``,
    ``c is null``, ``d in (1, 2)``, ``e like 'pre%'``), bound-checked against the stored
    schema so that an unknown column is refused with its name.

    Raises:
        InvalidRequest: unparsable, or naming an unknown column.
    """
    if text is None or not text.strip():
        return None
    from pyiceberg.expressions import AlwaysTrue, BooleanExpression
    from pyiceberg.expressions.parser import parse
    from pyiceberg.expressions.visitors import bind

    try:
        expr: BooleanExpression = parse(text)
    except Exception as exc:  # pyparsing raises its own ParseException
        raise InvalidRequest(f"cannot parse filter {text!r}: {exc}", filter=text) from None
    if expr == AlwaysTrue():
        return expr
    ice = arrow_to_iceberg(pa.schema([f for f in schema if not f.name.startswith("_")]))
    try:
        bind(ice, expr, case_sensitive=True)
    except ValueError as exc:
        raise InvalidRequest(f"invalid filter {text!r}: {exc}", filter=text) from None
    return expr


def filter_to_arrow(expr: Any, stored: pa.Schema) -> pc.Expression | None:
    """The Arrow compute expression of an Iceberg filter (for the hot side of a scan)."""
    if expr is None:
        return None
    from pyiceberg.expressions.visitors import bind
    from pyiceberg.io.pyarrow import expression_to_pyarrow

    user = pa.schema([f for f in stored if not f.name.startswith("_")])
    ice = arrow_to_iceberg(user)
    return expression_to_pyarrow(bind(ice, expr, case_sensitive=True), ice)


# --------------------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------------------
#: Partition file lists kept per table handle (see ``IcebergColdTable._partition_files``).
_FILE_LISTS = 64


def _ascending(offsets: pa.ChunkedArray) -> bool:
    values = offsets.to_numpy()
    return bool(len(values) < 2 or (np.diff(values) > 0).all())


def _watermarks(summary: Any) -> dict[int, int]:
    if summary is None:
        return {}
    raw = summary.additional_properties.get(WATERMARKS_PROPERTY)
    if not raw:
        return {}
    return {int(k): int(v) for k, v in json.loads(raw).items()}


def _cold_snapshot(snap: Any) -> ColdSnapshot:
    if snap is None:
        return ColdSnapshot(None, {}, None)
    return ColdSnapshot(snap.snapshot_id, _watermarks(snap.summary), snap.timestamp_ms)


class IcebergColdTable(ColdTable):
    """One stream-table's Iceberg table."""

    def __init__(
        self, store: IcebergColdStore, identifier: tuple[str, ...], user_schema: pa.Schema
    ) -> None:
        self.store = store
        self.identifier = identifier
        self.user_schema = user_schema
        self.stored_schema = system_schema(user_schema)
        self._cached: Table | None = None
        #: (snapshot id, partition) -> that partition's data files, sorted by offset. A
        #: snapshot never changes, so an entry never goes stale; it spares every stream
        #: read the manifest decoding of pyiceberg's planning (most of a small cold read).
        self._file_lists: OrderedDict[tuple[int, int], list[DataFile]] = OrderedDict()
        self._file_lists_lock = threading.Lock()

    def _load(self) -> Table:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            table = self.store.catalog.load_table(self.identifier)
        except NoSuchTableError as exc:
            raise SnapshotNotFound(
                f"the Iceberg table {'.'.join(self.identifier)} does not exist"
            ) from exc
        self._cached = table
        return table

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

    @property
    def metadata_location(self) -> str:
        """The current metadata file (what an engine outside Tidegate opens)."""
        return str(self._load().metadata_location)

    @property
    def location(self) -> str:
        return str((self._cached or self._load()).location())  # never changes

    def snapshot(self, as_of: int | dt.datetime | None = None) -> ColdSnapshot:
        table = self._load()
        if as_of is None:
            return _cold_snapshot(table.current_snapshot())
        if isinstance(as_of, dt.datetime):
            when = as_of if as_of.tzinfo else as_of.replace(tzinfo=dt.UTC)
            ms = int(when.timestamp() * 1000)
            snap = table.snapshot_as_of_timestamp(ms)
            if snap is None:
                raise SnapshotNotFound(
                    f"no snapshot was committed at or before {when.isoformat()}",
                    as_of=when.isoformat(),
                )
            return _cold_snapshot(snap)
        snap = table.snapshot_by_id(int(as_of))
        if snap is None:
            raise SnapshotNotFound(f"snapshot {as_of} does not exist", as_of=str(as_of))
        return _cold_snapshot(snap)

    def _tasks(self, snap: ColdSnapshot, row_filter: Any) -> list[Any]:
        if snap.snapshot_id is None:
            return []
        from pyiceberg.expressions import AlwaysTrue

        scan = self._load_for(snap).scan(
            row_filter=row_filter if row_filter is not None else AlwaysTrue(),
            snapshot_id=snap.snapshot_id,
        )
        return list(scan.plan_files())

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

    def _offset_id(self, snap: ColdSnapshot) -> int:
        return int(self._load_for(snap).schema().find_field(OFFSET_COLUMN).field_id)

    def _partition_files(self, snap: ColdSnapshot, partition: int) -> list[DataFile]:
        """Every data file of ``partition`` in ``snap``, sorted by first offset; planned
        once per snapshot and partition, then served from a small LRU."""
        assert snap.snapshot_id is not None
        key = (snap.snapshot_id, partition)
        with self._file_lists_lock:
            hit = self._file_lists.get(key)
            if hit is not None:
                self._file_lists.move_to_end(key)
                return hit
        from pyiceberg.expressions import EqualTo

        oid = self._offset_id(snap)
        # pyiceberg's literal predicates are generic and confuse type checkers alike.
        equal: Any = EqualTo
        expr = equal(PARTITION_COLUMN, partition)
        files = sorted(
            (self._data_file(t.file, oid) for t in self._tasks(snap, expr)),
            key=lambda d: (d.min_offset, d.path),
        )
        with self._file_lists_lock:
            self._file_lists[key] = files
            while len(self._file_lists) > _FILE_LISTS:
                self._file_lists.popitem(last=False)
        return files

    def files(
        self, snap: ColdSnapshot, partition: int, from_offset: int, to_offset: int
    ) -> list[DataFile]:
        if snap.snapshot_id is None or to_offset <= from_offset:
            return []
        # What pyiceberg's metrics pruning would keep: files whose [min, max] offset
        # bounds meet the range, and files without bounds (min_offset -1).
        return [
            f
            for f in self._partition_files(snap, partition)
            if f.min_offset < 0 or (f.min_offset < to_offset and f.max_offset >= from_offset)
        ]

    def read_range(
        self, snap: ColdSnapshot, partition: int, from_offset: int, to_offset: int
    ) -> Iterator[pa.RecordBatch]:
        filesystem = self.store.filesystem()
        for f in self.files(snap, partition, from_offset, to_offset):
            lo, hi = max(from_offset, f.min_offset), min(to_offset, f.max_offset + 1)
            if hi <= lo:
                continue
            with filesystem.open_input_file(fs_path(f.path)) as source:
                data = pq.read_table(
                    source,
                    columns=self.stored_schema.names,
                    filters=(pc.field(OFFSET_COLUMN) >= lo) & (pc.field(OFFSET_COLUMN) < hi),
                )
            if data.num_rows == 0:
                continue
            if not _ascending(data.column(OFFSET_COLUMN)):  # ours are written sorted
                data = data.sort_by(OFFSET_COLUMN)
            yield _cast(data, self.stored_schema)

    def scan(
        self,
        snap: ColdSnapshot,
        columns: Sequence[str] | None = None,
        row_filter: Any = None,
        limit: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        if snap.snapshot_id is None or limit == 0:
            return
        # pyiceberg plans the files (manifest pruning by partition value and column
        # bounds); the files are read with pyarrow directly, as in read_range, because
        # pyiceberg's Arrow projection turns a null list<struct> into an empty list.
        names = list(columns) if columns is not None else self.stored_schema.names
        target = pa.schema([self.stored_schema.field(n) for n in names])
        arrow_filter = filter_to_arrow(row_filter, self.stored_schema)
        read_cols = self.stored_schema.names if arrow_filter is not None else names
        filesystem = self.store.filesystem()
        left = limit
        tasks = sorted(
            self._tasks(snap, row_filter),
            key=lambda t: (int(t.file.partition[0]), str(t.file.file_path)),
        )
        for task in tasks:
            with filesystem.open_input_file(fs_path(str(task.file.file_path))) as source:
                data = pq.read_table(source, columns=read_cols)
            if arrow_filter is not None:
                data = data.filter(arrow_filter)
            if OFFSET_COLUMN in data.column_names and not _ascending(data.column(OFFSET_COLUMN)):
                data = data.sort_by(OFFSET_COLUMN)
            if left is not None:
                data = data.slice(0, left)
                left -= data.num_rows
            if data.num_rows:
                yield _cast(data.select(names), target)
            if left is not None and left <= 0:
                return

    def plan(self, snap: ColdSnapshot, row_filter: Any = None) -> list[PlannedFile]:
        oid = self._offset_id(snap) if snap.snapshot_id is not None else 0
        files = [self._data_file(t.file, oid) for t in self._tasks(snap, row_filter)]
        files.sort(key=lambda d: (d.partition, d.min_offset, d.path))
        return [self.store.planned(f) for f in files]

    def commit_tiered(
        self,
        files: Sequence[DataFile],
        watermarks: Mapping[int, int],
        base: ColdSnapshot,
    ) -> ColdSnapshot:
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.io.pyarrow import parquet_file_to_data_file

        table = self._load()
        current = table.current_snapshot()
        current_id = current.snapshot_id if current is not None else None
        if current_id != base.snapshot_id:
            raise CommitConflict(
                f"the table moved from snapshot {base.snapshot_id} to {current_id}; re-plan",
                base=str(base.snapshot_id),
                current=str(current_id),
            )
        merged = dict(base.watermarks)
        for p, w in watermarks.items():
            merged[int(p)] = max(int(w), merged.get(int(p), 0))
        props = {WATERMARKS_PROPERTY: json.dumps({str(p): merged[p] for p in sorted(merged)})}
        try:
            with (
                table.transaction() as tx,
                tx.update_snapshot(snapshot_properties=props).fast_append() as append,
            ):
                for f in files:
                    append.append_data_file(
                        parquet_file_to_data_file(table.io, tx.table_metadata, f.path)
                    )
        except CommitFailedException as exc:
            raise CommitConflict(f"a concurrent commit won: {exc}") from exc
        return self.snapshot()

    def data_location(self, partition: int) -> str:
        return f"{self.location}/data/{PARTITION_COLUMN}={int(partition)}"

    def file_schema(self) -> pa.Schema:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        # No schema evolution yet: the schema never changes.
        arrow = schema_to_pyarrow((self._cached or self._load()).schema(), include_field_ids=True)
        # Plain (not large) offsets: what Spark and DuckDB write too.
        return pa.schema([pa.field(f.name, _small(f.type), f.nullable, f.metadata) for f in arrow])


def _small(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        v = t.value_field
        return pa.list_(pa.field(v.name, _small(v.type), v.nullable, v.metadata))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _small(f.type), f.nullable, f.metadata) for f in t])
    return t


# --------------------------------------------------------------------------------------
# Store
# --------------------------------------------------------------------------------------
class IcebergColdStore(ColdStore):
    """A pyiceberg catalog (SQL or REST) and a warehouse (local folder or S3)."""

    def __init__(
        self,
        catalog: Catalog,
        warehouse: str,
        io_properties: Mapping[str, str],
        presign_expiry_s: int = 3600,
    ) -> None:
        self.catalog = catalog
        self.warehouse = warehouse.rstrip("/")
        self.io_properties = dict(io_properties)
        self.presign_expiry_s = presign_expiry_s
        self._s3: Any = None
        self._fs: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> IcebergColdStore:
        from gateway.config import SqlCatalogConfig

        cfg = settings.cold
        warehouse = settings.cold_warehouse
        io: dict[str, str] = {}
        if warehouse.startswith(("s3://", "s3a://")):
            s3 = cfg.s3
            io["s3.region"] = s3.region
            if s3.endpoint:
                io["s3.endpoint"] = s3.endpoint
            if s3.access_key_id:
                io["s3.access-key-id"] = s3.access_key_id
            if s3.secret_access_key:
                io["s3.secret-access-key"] = s3.secret_access_key
            io["s3.force-virtual-addressing"] = "false" if s3.path_style else "true"
        else:
            from pathlib import Path

            Path(fs_path(warehouse)).mkdir(parents=True, exist_ok=True)
        props = {"warehouse": warehouse, "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO", **io}
        c = cfg.catalog
        catalog: Catalog
        if isinstance(c, SqlCatalogConfig):
            from pyiceberg.catalog.sql import SqlCatalog

            uri = settings.cold_catalog_uri
            if uri.startswith("sqlite:///"):
                from pathlib import Path

                Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            catalog = SqlCatalog(c.name, uri=uri, **props)
        else:
            from pyiceberg.catalog.rest import RestCatalog

            rest = {"uri": c.uri, **props, **c.properties}
            if c.credential:
                rest["credential"] = c.credential
            catalog = RestCatalog(c.name, **rest)
        return cls(catalog, warehouse, io, cfg.presign_expiry_s)

    def _identifier(self, table: TableDef) -> tuple[str, str, str]:
        return (table.tenant, table.namespace, table.name)

    def create_table(self, table: TableDef, schema: pa.Schema) -> IcebergColdTable:
        from pyiceberg.exceptions import NamespaceAlreadyExistsError
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.table.sorting import SortField, SortOrder
        from pyiceberg.transforms import IdentityTransform

        ice = arrow_to_iceberg(schema)
        pid = ice.find_field(PARTITION_COLUMN).field_id
        oid = ice.find_field(OFFSET_COLUMN).field_id
        spec = PartitionSpec(
            PartitionField(
                source_id=pid, field_id=1000, transform=IdentityTransform(), name=PARTITION_COLUMN
            )
        )
        order = SortOrder(
            SortField(source_id=pid, transform=IdentityTransform()),
            SortField(source_id=oid, transform=IdentityTransform()),
        )
        for ns in ((table.tenant,), (table.tenant, table.namespace)):
            with contextlib.suppress(NamespaceAlreadyExistsError):
                self.catalog.create_namespace(ns)
        location = (
            f"{self.warehouse}/{table.tenant}/{table.namespace}/{table.name}-{table.table_id}"
        )
        props = {
            **TABLE_PROPERTIES,
            "tidegate.table-id": table.table_id,
            "schema.name-mapping.default": ice.name_mapping.model_dump_json(),
        }
        self.catalog.create_table(
            self._identifier(table),
            schema=ice,
            location=location,
            partition_spec=spec,
            sort_order=order,
            properties=props,
        )
        return IcebergColdTable(self, self._identifier(table), schema)

    def check_schema(self, schema: pa.Schema) -> None:
        arrow_to_iceberg(schema)

    def parse_filter(self, text: str | None, stored: pa.Schema) -> Any:
        return parse_filter(text, stored)

    def arrow_filter(self, expr: Any, stored: pa.Schema) -> Any:
        return filter_to_arrow(expr, stored)

    def table(self, table: TableDef) -> IcebergColdTable:
        from gateway.wire.schema import parse_fields

        return IcebergColdTable(self, self._identifier(table), parse_fields(table.fields))

    def drop_table(self, table: TableDef) -> None:
        from pyiceberg.exceptions import NoSuchTableError

        ident = self._identifier(table)
        location = None
        try:
            location = str(self.catalog.load_table(ident).location())
            self.catalog.purge_table(ident)
        except NoSuchTableError:
            pass
        if location:
            # Orphans (files of crashed jobs) too: everything under the table's folder.
            filesystem, _ = self.storage_options().filesystem()
            with contextlib.suppress(OSError):
                filesystem.delete_dir(fs_path(location))

    def drop_tenant(self, tenant: str) -> None:
        """Drop the tenant's Iceberg namespaces and delete everything under its prefix
        (tables are dropped one by one first; this removes what is left: empty folders,
        orphans of crashed jobs, the namespaces themselves)."""
        from pyiceberg.exceptions import NamespaceNotEmptyError, NoSuchNamespaceError

        with contextlib.suppress(NoSuchNamespaceError):
            for ns in self.catalog.list_namespaces((tenant,)):
                with contextlib.suppress(NoSuchNamespaceError, NamespaceNotEmptyError):
                    self.catalog.drop_namespace(ns)
        with contextlib.suppress(NoSuchNamespaceError, NamespaceNotEmptyError):
            self.catalog.drop_namespace((tenant,))
        filesystem, _ = self.storage_options().filesystem()
        with contextlib.suppress(OSError):
            filesystem.delete_dir(fs_path(f"{self.warehouse}/{tenant}"))

    def storage_options(self) -> StorageOptions:
        return StorageOptions(self.warehouse, self.io_properties)

    def filesystem(self) -> Any:
        """The warehouse's pyarrow filesystem, built once (thread-safe to share)."""
        with self._lock:
            if self._fs is None:
                self._fs, _ = self.storage_options().filesystem()
            return self._fs

    def _s3_client(self) -> Any:
        with self._lock:
            if self._s3 is None:
                import boto3
                from botocore.config import Config

                p = self.io_properties
                self._s3 = boto3.client(
                    "s3",
                    endpoint_url=p.get("s3.endpoint"),
                    aws_access_key_id=p.get("s3.access-key-id"),
                    aws_secret_access_key=p.get("s3.secret-access-key"),
                    region_name=p.get("s3.region"),
                    config=Config(
                        signature_version="s3v4",
                        s3={
                            "addressing_style": "virtual"
                            if p.get("s3.force-virtual-addressing") == "true"
                            else "path"
                        },
                    ),
                )
            return self._s3

    def planned(self, f: DataFile) -> PlannedFile:
        """A data file with a URL an executor can read without warehouse credentials."""
        if f.path.startswith(("s3://", "s3a://")):
            bucket, _, key = f.path.split("://", 1)[1].partition("/")
            url = self._s3_client().generate_presigned_url(
                "get_object",
                Params={"Bucket": bucket, "Key": key},
                ExpiresIn=self.presign_expiry_s,
            )
            expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self.presign_expiry_s)
            return PlannedFile(f, str(url), expires)
        return PlannedFile(f, fs_path(f.path), None)

    def close(self) -> None:
        engine = getattr(self.catalog, "engine", None)
        if engine is not None:
            engine.dispose()
