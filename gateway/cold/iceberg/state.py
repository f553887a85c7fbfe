"""A primary-key table's state table on Iceberg, written copy-on-write
(docs/decisions/primary-keys.md): its files by partition with the bounds of the key's
first column, reading whole files, writing new ones sorted by the key, and the overwrite
commit that replaces files and raises ``tidegate.applied``."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gateway.cold.base import (
    APPLIED_PROPERTY,
    OPERATION_PROPERTY,
    ROW_GROUP_ROWS,
    ColdSnapshot,
    DataFile,
    KeyedFile,
    StateTable,
    fs_path,
    key_values,
)
from gateway.cold.iceberg.filters import to_pyiceberg
from gateway.cold.iceberg.parquet import file_batches
from gateway.cold.iceberg.schema import cast_to
from gateway.cold.iceberg.summary import current_snapshot_id
from gateway.cold.iceberg.table import IcebergColdTable, TableHome
from gateway.wire.errors import CommitConflict
from gateway.wire.filters import Compare
from gateway.wire.routing import key_bytes
from gateway.wire.schema import OFFSET_COLUMN, PARTITION_COLUMN

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyiceberg.table import Table

__all__ = ["STATE_OPERATION", "IcebergStateTable"]

#: ``tidegate.operation`` of a commit that applied changes to a state table.
STATE_OPERATION = "apply"


class IcebergStateTable(IcebergColdTable, StateTable):
    """The state table of one primary-key table (``key``: its primary key's columns)."""

    def __init__(
        self,
        store: TableHome,
        identifier: tuple[str, ...],
        user_schema: pa.Schema,
        key: Sequence[str],
        create: Callable[[], Table | None] | None = None,
    ) -> None:
        super().__init__(store, identifier, user_schema, create)
        self.key = tuple(key)

    def key_files(self, snap: ColdSnapshot, partition: int) -> list[KeyedFile]:
        from pyiceberg.conversions import from_bytes

        if snap.snapshot_id is None:
            return []
        schema = self._load_for(snap).schema()
        oid = int(schema.find_field(OFFSET_COLUMN).field_id)
        first = schema.find_field(self.key[0])
        prune = to_pyiceberg(Compare(PARTITION_COLUMN, "=", partition), self.stored_schema)
        out = []
        for t in self._tasks(snap, prune):
            f = t.file
            lower, upper = f.lower_bounds or {}, f.upper_bounds or {}
            low = high = None
            if first.field_id in lower and first.field_id in upper:
                kind: Any = first.field_type  # a key column is primitive
                low = from_bytes(kind, lower[first.field_id])
                high = from_bytes(kind, upper[first.field_id])
            out.append(KeyedFile(self._data_file(f, oid), low, high))
        return out

    def lookup(self, snap: ColdSnapshot, partition: int, keys: pa.Table) -> pa.Table:
        if snap.snapshot_id is None or keys.num_rows == 0:
            return self.stored_schema.empty_table()
        first = self.key[0]
        values = key_values(keys.column(first))
        files = [f.file for f in self.key_files(snap, partition) if f.may_hold(values)]
        wanted = pa.array(key_bytes([keys.column(c) for c in self.key]), pa.binary())
        # Row groups pruned by their statistics of the key's first column (files are
        # sorted by the key, so a few keys read a few row groups).
        prune = [(first, "in", keys.column(first).unique().to_pylist())]
        filesystem = self.store.filesystem()
        found = []
        for f in files:
            rows = pq.read_table(fs_path(f.path), filesystem=filesystem, filters=prune)
            if not rows.num_rows:
                continue
            rows = pa.Table.from_batches([cast_to(rows, self.stored_schema)])
            have = pa.array(key_bytes([rows.column(c) for c in self.key]), pa.binary())
            found.append(rows.filter(pc.is_in(have, value_set=wanted)))
        if not found:
            return self.stored_schema.empty_table()
        return pa.concat_tables(found)

    def read_files(self, files: Sequence[DataFile]) -> pa.Table:
        filesystem = self.store.filesystem()
        batches = [
            cast_to(b, self.stored_schema)
            for f in files
            for b in file_batches(filesystem, f.path, self.stored_schema.names)
        ]
        return pa.Table.from_batches(batches, self.stored_schema)

    def write_files(self, partition: int, rows: pa.Table, target_bytes: int) -> list[DataFile]:
        if rows.num_rows == 0:
            return []
        rows = rows.sort_by([(c, "ascending") for c in self.key])
        pieces = max(1, math.ceil(rows.nbytes / max(1, target_bytes)))
        step = math.ceil(rows.num_rows / pieces)
        file_schema = self.file_schema()
        filesystem = self.store.filesystem()
        folder = self.data_location(partition)
        if not folder.startswith(("s3://", "s3a://")):
            filesystem.create_dir(fs_path(folder), recursive=True)
        out = []
        for start in range(0, rows.num_rows, step):
            out.append(
                _write_file(filesystem, folder, partition, rows.slice(start, step), file_schema)
            )
        return out

    def commit_state(
        self,
        removed: Sequence[DataFile],
        added: Sequence[DataFile],
        applied: Mapping[int, int],
        base: ColdSnapshot,
        *,
        operation: str = STATE_OPERATION,
    ) -> ColdSnapshot:
        from pyiceberg.expressions import In

        table = self._load()
        current_id = current_snapshot_id(table)
        if current_id != base.snapshot_id:
            raise CommitConflict(
                f"the state table moved from snapshot {base.snapshot_id} to {current_id}; re-plan",
                base=str(base.snapshot_id),
                current=str(current_id),
            )
        live: dict[str, Any] = {}
        if removed:
            parts = sorted({f.partition for f in removed})
            live = {
                str(t.file.file_path): t.file
                for t in table.scan(
                    row_filter=In(term=PARTITION_COLUMN, literals=parts), snapshot_id=current_id
                ).plan_files()
            }
        merged = dict(base.applied)
        for p, a in applied.items():
            merged[int(p)] = max(int(a), merged.get(int(p), 0))
        props = {
            APPLIED_PROPERTY: json.dumps({str(p): merged[p] for p in sorted(merged)}),
            OPERATION_PROPERTY: operation,
        }
        return self._commit(table, props, added, [live[f.path] for f in removed], overwrite=True)


def _write_file(
    filesystem: Any, folder: str, partition: int, rows: pa.Table, file_schema: pa.Schema
) -> DataFile:
    """One state data file of ``rows`` (sorted by the key) in ``file_schema``, with its
    footer handed back for the commit's column statistics."""
    path = f"{folder.rstrip('/')}/{uuid.uuid4().hex}.parquet"
    for f in file_schema:
        if f.name not in rows.column_names:
            rows = rows.append_column(f.name, pa.nulls(rows.num_rows, f.type))
    data = rows.select(file_schema.names).cast(file_schema)
    with filesystem.open_output_stream(fs_path(path)) as out:
        writer = pq.ParquetWriter(out, file_schema, compression="zstd")
        writer.write_table(data, row_group_size=ROW_GROUP_ROWS)
        writer.close()
        size = out.tell()
    footer = pa.BufferOutputStream()
    writer.writer.metadata.write_metadata_file(footer)
    bounds = pc.min_max(rows.column(OFFSET_COLUMN))
    return DataFile(
        path=path,
        partition=partition,
        record_count=rows.num_rows,
        file_size_bytes=int(size),
        min_offset=int(bounds["min"].as_py()),
        max_offset=int(bounds["max"].as_py()),
        footer=footer.getvalue().to_pybytes(),
    )
