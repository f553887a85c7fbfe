"""An Iceberg table's reads: a partition's files by offset range (cached per snapshot),
scans with pushdown, scan slices and read plans."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from gateway.cold.base import (
    ColdSnapshot,
    DataFile,
    PlannedFile,
    ScanSlice,
)
from gateway.cold.iceberg.filters import to_pyiceberg
from gateway.cold.iceberg.parquet import (
    file_batches,
    is_sorted,
    parquet_footer,
    read_row_groups,
    read_unsorted,
)
from gateway.cold.iceberg.plans import IcebergPlanFiles
from gateway.cold.iceberg.schema import cast_to
from gateway.cold.iceberg.tablebase import TableBase
from gateway.wire.filters import Compare, Expr, columns_of, to_arrow
from gateway.wire.schema import OFFSET_COLUMN, PARTITION_COLUMN

if TYPE_CHECKING:
    pass


_FILE_LISTS = 64
#: Scan plans kept per table, and the longest pruning expression (as text) kept.
_PLANS = 16
_PLAN_KEY_CHARS = 4096


class TableReads(TableBase):
    """Reading the table: its files by partition and offset range, scans, read plans."""

    def _tasks(self, snap: ColdSnapshot, prune: Any) -> list[Any]:
        """pyiceberg's file plan for a pruning expression (see :func:`to_pyiceberg`),
        kept in a small LRU: a snapshot's plan for an expression never changes."""
        if snap.snapshot_id is None:
            return []
        text = repr(prune)
        key = (snap.snapshot_id, text)
        with self._file_lists_lock:
            hit = self._plans.get(key)
            if hit is not None:
                self._plans.move_to_end(key)
                return hit
        scan = self._load_for(snap).scan(row_filter=prune, snapshot_id=snap.snapshot_id)
        tasks = list(scan.plan_files())
        if len(text) <= _PLAN_KEY_CHARS:
            with self._file_lists_lock:
                self._plans[key] = tasks
                while len(self._plans) > _PLANS:
                    self._plans.popitem(last=False)
        return tasks

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
        oid = self._offset_id(snap)
        prune = to_pyiceberg(Compare(PARTITION_COLUMN, "=", partition), self.stored_schema)
        files = sorted(
            (self._data_file(t.file, oid) for t in self._tasks(snap, prune)),
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
            for data in file_batches(filesystem, f.path, self.stored_schema.names, (lo, hi)):
                yield cast_to(data, self.stored_schema)

    def _scan_plan(
        self, snap: ColdSnapshot, columns: Sequence[str] | None, row_filter: Expr | None
    ) -> tuple[list[str], pa.Schema, pa.Schema, Any, list[Any]]:
        """A scan's columns, answer schema, read schema (the columns and those the filter
        needs), the filter's Arrow form over the read schema, and its file tasks in order
        (by partition, then path).

        pyiceberg plans the files (manifest pruning by partition value and column bounds);
        the files are read with pyarrow directly, as in read_range, because pyiceberg's
        Arrow projection turns a null list<struct> into an empty list. Rows are cast to
        the stored schema before they are filtered, so the filter compares in the table's
        own types (int8 columns are int32 in the files)."""
        names = list(columns) if columns is not None else self.stored_schema.names
        target = pa.schema([self.stored_schema.field(n) for n in names])
        read_cols = (
            [n for n in self.stored_schema.names if n in set(names) | columns_of(row_filter)]
            if row_filter is not None
            else names
        )
        stored = pa.schema([self.stored_schema.field(n) for n in read_cols])
        arrow_filter = to_arrow(row_filter, stored) if row_filter is not None else None
        tasks = sorted(
            self._tasks(snap, to_pyiceberg(row_filter, self.stored_schema)),
            key=lambda t: (int(t.file.partition[0]), str(t.file.file_path)),
        )
        return names, target, stored, arrow_filter, tasks

    def scan(
        self,
        snap: ColdSnapshot,
        columns: Sequence[str] | None = None,
        row_filter: Expr | None = None,
        limit: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        if snap.snapshot_id is None or limit == 0:
            return
        names, target, stored, arrow_filter, tasks = self._scan_plan(snap, columns, row_filter)
        read_cols = stored.names
        filesystem = self.store.filesystem()
        left = limit
        for task in tasks:
            for batch in file_batches(filesystem, str(task.file.file_path), read_cols):
                data = pa.Table.from_batches([cast_to(batch, stored)])
                if arrow_filter is not None:
                    data = data.filter(arrow_filter)
                if left is not None:
                    data = data.slice(0, left)
                    left -= data.num_rows
                if data.num_rows:
                    yield cast_to(data.select(names), target)
                if left is not None and left <= 0:
                    return

    def scan_slices(
        self,
        snap: ColdSnapshot,
        columns: Sequence[str] | None,
        row_filter: Expr | None,
        target_bytes: int,
    ) -> list[ScanSlice]:
        if snap.snapshot_id is None:
            return []
        names, target, stored, arrow_filter, tasks = self._scan_plan(snap, columns, row_filter)
        filesystem = self.store.filesystem()
        out: list[ScanSlice] = []
        group: list[tuple[str, int, list[int]]] = []
        size = 0

        def flush() -> None:
            nonlocal group, size
            if group:
                parts = list(group)
                out.append(
                    ScanSlice(
                        size,
                        lambda: read_row_groups(
                            filesystem, parts, stored, names, target, arrow_filter
                        ),
                    )
                )
            group, size = [], 0

        for task in tasks:
            path = str(task.file.file_path)
            meta = parquet_footer(filesystem, path)
            if not is_sorted(meta):
                flush()
                whole = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
                out.append(
                    ScanSlice(
                        whole,
                        lambda path=path: read_unsorted(  # type: ignore[misc]
                            filesystem, path, stored, names, target, arrow_filter
                        ),
                    )
                )
                continue
            file_size = int(task.file.file_size_in_bytes)
            for rg in range(meta.num_row_groups):
                nbytes = meta.row_group(rg).total_byte_size
                if group and size + nbytes > target_bytes:
                    flush()
                if group and group[-1][0] == path:
                    group[-1][2].append(rg)
                else:
                    group.append((path, file_size, [rg]))
                size += nbytes
        flush()
        return out

    def plan(self, snap: ColdSnapshot, row_filter: Expr | None = None) -> list[PlannedFile]:
        oid = self._offset_id(snap) if snap.snapshot_id is not None else 0
        prune = to_pyiceberg(row_filter, self.stored_schema)
        files = [self._data_file(t.file, oid) for t in self._tasks(snap, prune)]
        files.sort(key=lambda d: (d.partition, d.min_offset, d.path))
        return [self.store.planned(f) for f in files]

    def plan_files(self) -> IcebergPlanFiles:
        return IcebergPlanFiles(self, self.store)
