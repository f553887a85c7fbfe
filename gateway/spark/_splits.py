"""Input partitions and how an executor reads them: data files directly with pyarrow
(presigned URLs or local paths, never the warehouse's keys) and hot ranges through the
gateway with the tenant's key."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from gateway.client import TableInfo
from gateway.client._consuming import Outage
from gateway.client._lake_files import HttpRangeFile
from gateway.spark._options import Connection, Options, SparkOptionError
from gateway.wire.errors import TidegateError
from gateway.wire.filters import Expr, In, bind, to_arrow
from gateway.wire.schema import OFFSET_COLUMN, PARTITION_COLUMN, system_schema

__all__ = [
    "FileSlice",
    "FilesSplit",
    "HotSplit",
    "ReadSpec",
    "plan_splits",
    "read_spec",
    "read_split",
]

#: Rows per batch handed to Spark.
BATCH_ROWS = 64 * 1024

#: What opening a data file costs, in bytes read (Spark's ``spark.sql.files.openCostInBytes``).
OPEN_COST = 4 << 20


@dataclass(frozen=True)
class FileSlice:
    """One data file of the plan, and the offsets ``[low, high)`` to keep from it (None:
    all of it)."""

    url: str
    size: int
    partition: int
    min_offset: int
    max_offset: int
    low: int | None = None
    high: int | None = None
    #: The file in the warehouse folder the reader was given (``warehouse`` option), read
    #: instead of ``url`` where this executor finds it, of the plan's size.
    local: str | None = None


@dataclass(frozen=True)
class FilesSplit(InputPartition):
    """Data files read by one task."""

    files: tuple[FileSlice, ...]


@dataclass(frozen=True)
class HotSplit(InputPartition):
    """Offsets ``[start, end)`` of one partition read through the gateway."""

    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class ReadSpec:
    """What every task of one read needs: where, which columns, which rows."""

    connection: Connection
    #: The stored schema (user columns, then the system columns).
    stored: pa.Schema
    #: The columns Spark receives, in its order.
    columns: tuple[str, ...]
    #: The pushed filter, unbound (None: every row).
    filter: Expr | None = None
    #: Seconds a hot-range read keeps reconnecting to a gateway that went away (None:
    #: for ever, as streaming reads do).
    reconnect_timeout: float | None = 30.0
    #: A primary-key table: batch reads answer its current state (``gateway.spark._state``).
    keyed: bool = False

    @property
    def output(self) -> pa.Schema:
        return pa.schema([self.stored.field(c) for c in self.columns])

    def arrow_filter(self, low: int | None = None, high: int | None = None) -> pc.Expression | None:
        """The rows to keep: the pushed filter and the offsets ``[low, high)``; None when
        every row is kept."""
        terms = []
        if self.filter is not None:
            terms.append(to_arrow(bind(self.filter, self.stored), self.stored))
        if low is not None:
            terms.append(pc.field(OFFSET_COLUMN) >= pa.scalar(low, pa.int64()))
        if high is not None:
            terms.append(pc.field(OFFSET_COLUMN) < pa.scalar(high, pa.int64()))
        if not terms:
            return None
        expr = terms[0]
        for t in terms[1:]:
            expr = expr & t
        return expr

    def conform(self, batch: pa.RecordBatch, out: pa.Schema | None = None) -> pa.RecordBatch:
        """``batch`` with exactly the output columns and types (files store int8/int16 as
        int32; Spark wants the table's types). ``out``: :attr:`output`, when the caller
        keeps it for a split's batches (it is built afresh at each use)."""
        out = self.output if out is None else out
        if batch.schema.equals(out):
            return batch
        arrays = []
        for f in out:
            col = batch.column(batch.schema.get_field_index(f.name))
            arrays.append(col if col.type.equals(f.type) else col.cast(f.type))
        return pa.RecordBatch.from_arrays(arrays, schema=out)


def read_spec(
    options: Options, schema: StructType | None = None, info: TableInfo | None = None
) -> tuple[ReadSpec, int]:
    """The read's connection, stored schema, columns and partition subset (as a filter),
    with the table's partition count; every option checked on the driver. ``info``: the
    table as described already (else it is described now)."""
    connection = options.connection()
    if info is None:
        info = connection.table_info()
    stored = system_schema(info.schema)
    if schema is not None and options.get("columns") is None:
        wanted = [f.name for f in schema.fields]
        unknown = [c for c in wanted if c not in stored.names]
        if unknown:
            raise SparkOptionError(
                f"tidegate: the schema given names unknown column(s) {unknown}; "
                f"{connection.table} has {stored.names}"
            )
        columns = wanted
    else:
        columns = options.columns(stored.names)
    subset = options.partitions(info.partitions)
    row_filter: Expr | None = None
    if subset is not None:
        row_filter = In(PARTITION_COLUMN, tuple(subset))
    spec = ReadSpec(connection, stored, tuple(columns), row_filter, keyed=bool(info.primary_key))
    return spec, info.partitions


def _local(f: FileSlice) -> str | None:
    """``f``'s file in the given warehouse folder, when this host has it (at the plan's
    size); else None, and the plan's URL is read."""
    try:
        return f.local if f.local is not None and os.path.getsize(f.local) == f.size else None
    except OSError:
        return None


def _fragment(url: str, size: int) -> ds.Fragment:
    fmt = ds.ParquetFileFormat()
    if url.startswith(("http://", "https://")):
        return fmt.make_fragment(pa.PythonFile(HttpRangeFile(url, size), mode="r"))
    return fmt.make_fragment(url.removeprefix("file://"), filesystem=pafs.LocalFileSystem())


def _scan_schema(spec: ReadSpec, fragment: ds.Fragment) -> pa.Schema:
    """The schema to scan a data file with: its own types for the columns it holds, the
    table's for columns added by a schema change after it was written (read as nulls)."""
    physical = fragment.physical_schema
    return pa.schema(
        [
            physical.field(f.name) if f.name in physical.names else f.with_nullable(True)
            for f in spec.stored
        ]
    )


def _read_files(spec: ReadSpec, split: FilesSplit) -> Iterator[pa.RecordBatch]:
    out = spec.output
    for f in split.files:
        fragment = _fragment(_local(f) or f.url, f.size)
        for batch in fragment.to_batches(
            schema=_scan_schema(spec, fragment),
            columns=list(spec.columns),
            filter=spec.arrow_filter(f.low, f.high),
            batch_size=BATCH_ROWS,
            use_threads=False,
        ):
            if batch.num_rows:
                yield spec.conform(batch, out)


def _read_hot(spec: ReadSpec, split: HotSplit) -> Iterator[pa.RecordBatch]:
    keep = spec.arrow_filter(split.start, split.end)
    table = spec.connection.table
    outage = Outage(
        spec.connection.endpoint,
        f"tidegate read of {table} partition {split.partition}",
        spec.reconnect_timeout,
    )
    offset = split.start
    while offset < split.end:
        try:
            # Over the gateway's Flight edge when it offers one: the hot range is bulk
            # data. Through an outage it goes on after the last record it yielded.
            for chunk in spec.connection.shared().read_range(
                table, partition=split.partition, start=offset, end=split.end
            ):
                batches = [b for b in chunk if b.num_rows]
                if not batches:
                    continue
                offset = batches[-1].column(OFFSET_COLUMN)[-1].as_py() + 1
                # The gateway's batches have the table's current schema, which may have
                # gained columns since the DataFrame was loaded: keep the columns asked.
                rows = pa.Table.from_batches(batches)
                for batch in rows.filter(keep).select(list(spec.columns)).to_batches():
                    if batch.num_rows:
                        yield spec.conform(batch)
            outage.ok()
            return
        except TidegateError as err:
            time.sleep(outage.failed(err))


def read_split(spec: ReadSpec, split: InputPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one input partition, as record batches of ``spec.output``."""
    if isinstance(split, FilesSplit):
        return _read_files(spec, split)
    if isinstance(split, HotSplit):
        return _read_hot(spec, split)
    raise TypeError(f"not a Tidegate input partition: {split!r}")


def plan_splits(
    files: Sequence[FileSlice],
    hot: Sequence[HotSplit],
    *,
    split_bytes: int,
    min_partitions: int,
    hot_split_records: int,
) -> list[InputPartition]:
    """Files packed into splits as Spark's file sources pack them, then the hot ranges cut
    into pieces of at most ``hot_split_records``.

    Each file counts its size plus :data:`OPEN_COST` (opening it, reading its footer and
    starting its readers cost about as much as reading that many bytes), and a split
    holds at most ``split_bytes`` of it, or less when that would leave fewer than
    ``min_partitions`` splits (Spark's ``maxSplitBytes``). Without the opening cost, a
    table of a few small files would be one split, read by one core while the others
    wait.
    """
    total = sum(f.size + OPEN_COST for f in files)
    target = min(split_bytes, max(OPEN_COST, -(-total // max(1, min_partitions))))
    out: list[InputPartition] = []
    group: list[FileSlice] = []
    size = 0
    for f in files:
        if group and size + f.size > target:
            out.append(FilesSplit(tuple(group)))
            group, size = [], 0
        group.append(f)
        size += f.size + OPEN_COST
    if group:
        out.append(FilesSplit(tuple(group)))
    for h in hot:
        for start in range(h.start, h.end, hot_split_records):
            out.append(HotSplit(h.partition, start, min(h.end, start + hot_split_records)))
    return out
