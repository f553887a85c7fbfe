"""Reading a data file's rows: Parquet footers kept per process, row groups by offset
range, files written unsorted, columns conformed to the table's current schema."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gateway.cold.base import (
    OFFSET_SORT,
    SORTED_KEY,
    fs_path,
)
from gateway.cold.iceberg.schema import cast_to
from gateway.wire.schema import OFFSET_COLUMN

#: Parquet footers kept per process: data files never change once written (Iceberg adds
#: and removes whole files), so a footer read once serves every later read of the file.
_FOOTERS = 512
_footers: OrderedDict[str, pq.FileMetaData] = OrderedDict()
_footers_lock = threading.Lock()


def open_parquet(source: Any, path: str) -> pq.ParquetFile:
    """``source`` as a ParquetFile, its footer parsed once per process and path."""
    with _footers_lock:
        meta = _footers.get(path)
        if meta is not None:
            _footers.move_to_end(path)
    parquet = pq.ParquetFile(source, metadata=meta)
    if meta is None:
        with _footers_lock:
            _footers[path] = parquet.metadata
            while len(_footers) > _FOOTERS:
                _footers.popitem(last=False)
    return parquet


def parquet_footer(filesystem: Any, path: str) -> pq.FileMetaData:
    """A data file's Parquet footer, read once per process and path."""
    with _footers_lock:
        meta = _footers.get(path)
        if meta is not None:
            _footers.move_to_end(path)
            return meta
    with filesystem.open_input_file(fs_path(path)) as source:
        return open_parquet(source, path).metadata


def is_sorted(meta: pq.FileMetaData) -> bool:
    return (meta.schema.to_arrow_schema().metadata or {}).get(SORTED_KEY) == OFFSET_SORT


def read_row_groups(
    filesystem: Any,
    parts: Sequence[tuple[str, int, list[int]]],
    stored: pa.Schema,
    names: Sequence[str],
    target: pa.Schema,
    arrow_filter: Any,
) -> pa.Table:
    """Row groups ``(path, file size, row group indexes)`` of sorted data files as one
    table, in the order given: each file's columns of ``stored`` cast to it (a column a
    file lacks is all nulls), filtered by ``arrow_filter`` in those types and projected
    to ``names`` by Arrow's C++ over the whole table. Python runs once per row group
    (``read_row_group``: measured 20 times faster than ``read_row_groups`` or a dataset
    scanner over the same row groups of our files, pyarrow 26), never per batch sent."""
    tables = []
    for path, _size, groups in parts:
        with filesystem.open_input_file(fs_path(path)) as source:
            parquet = open_parquet(source, path)
            present = set(parquet.schema_arrow.names)
            columns = [c for c in stored.names if c in present]
            for rg in groups:
                tables.append(conform_to(parquet.read_row_group(rg, columns=columns), stored))
    data = pa.concat_tables(tables) if tables else stored.empty_table()
    if arrow_filter is not None:
        data = data.filter(arrow_filter)
    data = data.select(list(names))
    return data if data.schema.equals(target) else data.cast(target)


def conform_to(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` as ``schema`` (by name; missing columns all nulls), chunks kept as they are."""
    columns = []
    for f in schema:
        if f.name in data.column_names:
            column = data.column(f.name)
            columns.append(column if column.type.equals(f.type) else column.cast(f.type))
        else:
            columns.append(pa.chunked_array([pa.nulls(data.num_rows, f.type)], f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def read_unsorted(
    filesystem: Any,
    path: str,
    stored: pa.Schema,
    names: Sequence[str],
    target: pa.Schema,
    arrow_filter: Any,
) -> pa.Table:
    """A data file not flagged sorted (written by another engine), read whole and put in
    offset order as :meth:`IcebergColdTable.scan` does."""
    out = []
    for batch in file_batches(filesystem, path, stored.names):
        data = pa.Table.from_batches([cast_to(batch, stored)])
        if arrow_filter is not None:
            data = data.filter(arrow_filter)
        out.append(cast_to(data.select(list(names)), target))
    return pa.Table.from_batches(out, target)


def file_batches(
    filesystem: Any, path: str, columns: Sequence[str], offsets: tuple[int, int] | None = None
) -> Iterator[pa.RecordBatch]:
    """A data file's rows (only offsets ``[lo, hi)`` when ``offsets``), in offset order.

    A file flagged sorted (every file tiering and compaction write) is read a row group at
    a time, skipping row groups outside the offsets by their statistics: memory stays at a
    row group (``ROW_GROUP_ROWS`` rows) whatever the file's size. A row group whose offsets
    are dense (as tiering and compaction write them) is sliced to the range rather than
    filtered. Any other file is read whole and sorted.
    """
    with filesystem.open_input_file(fs_path(path)) as source:
        parquet = open_parquet(source, path)
        # A file written before a column was added lacks it: cast_to fills it with nulls.
        present = set(parquet.schema_arrow.names)
        columns = [c for c in columns if c in present]
        if (parquet.schema_arrow.metadata or {}).get(SORTED_KEY) != OFFSET_SORT:
            table = parquet.read(columns=list(columns))
            if offsets is not None:
                table = table.filter(offsets_in(table.column(OFFSET_COLUMN), offsets))
            yield from table.sort_by(OFFSET_COLUMN).to_batches()
            return
        meta = parquet.metadata
        # The Parquet leaf column's index: a nested column before it has several leaves
        # (the Arrow field's index would name another column's statistics).
        index = next(
            j for j in range(meta.num_columns) if meta.schema.column(j).path == OFFSET_COLUMN
        )
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            stats = group.column(index).statistics
            known = stats is not None and stats.has_min_max
            if offsets is not None and known:
                if stats.max < offsets[0]:
                    continue
                if stats.min >= offsets[1]:
                    break  # sorted: no later row group holds the range
            table = parquet.read_row_group(rg, columns=list(columns))
            if offsets is not None:
                if known and stats.max - stats.min + 1 == group.num_rows:
                    lo = max(0, offsets[0] - stats.min)
                    table = table.slice(lo, max(0, min(offsets[1], stats.max + 1) - stats.min - lo))
                else:
                    table = table.filter(offsets_in(table.column(OFFSET_COLUMN), offsets))
            yield from table.to_batches()


def promotes_to(have: Any, want: Any) -> bool:
    """Whether Iceberg type ``want`` is a widening of ``have`` (int to long, float to
    double); the table may already be wider than the gateway's schema after a change
    that committed here but not in the metadata store: then it is left as it is."""
    from pyiceberg.types import DoubleType, FloatType, IntegerType, LongType

    return (isinstance(have, IntegerType) and isinstance(want, LongType)) or (
        isinstance(have, FloatType) and isinstance(want, DoubleType)
    )


def offsets_in(column: Any, offsets: tuple[int, int]) -> Any:
    lo, hi = offsets
    return pc.and_(pc.greater_equal(column, lo), pc.less(column, hi))
