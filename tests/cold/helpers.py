"""Shared pieces of the cold suite: a schema with every admitted type, rows that probe
the edges of each, a tiering step without Spark, and readers that are not Tidegate."""

from __future__ import annotations

import datetime as dt
import decimal
import glob
import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from gateway.cold import ColdSnapshot, ColdStore, ColdTable, write_data_file
from gateway.cold.iceberg import IcebergColdStore, IcebergColdTable
from gateway.hot import HotLog, PartitionId
from gateway.wire.codec import decode_batch
from gateway.wire.schema import parse_fields, with_system_columns

#: Every admitted type (gateway/schema.py), nested ones included.
ALL_TYPES_FIELDS: list[dict[str, Any]] = [
    {"name": "req", "type": "int64", "nullable": False},
    {"name": "b", "type": "bool"},
    {"name": "i8", "type": "int8"},
    {"name": "i16", "type": "int16"},
    {"name": "i32", "type": "int32"},
    {"name": "i64", "type": "int64"},
    {"name": "f32", "type": "float32"},
    {"name": "f64", "type": "float64"},
    {"name": "s", "type": "string"},
    {"name": "bin", "type": "binary"},
    {"name": "d", "type": "date32"},
    {"name": "t", "type": "time64[us]"},
    {"name": "naive", "type": "timestamp[us]"},
    {"name": "zoned", "type": "timestamp[us, tz=UTC]"},
    {"name": "dec", "type": "decimal128(38, 10)"},
    {"name": "money", "type": "decimal128(10, 2)"},
    {"name": "l16", "type": "list<int16>"},
    {"name": "lstr", "type": "list<item: string>"},
    {"name": "st", "type": "struct<a: int8, b: string, c: list<timestamp[us, tz=UTC]>>"},
    {"name": "ls", "type": "list<struct<x: int32, y: decimal128(5, 2)>>"},
]
ALL_TYPES = parse_fields(ALL_TYPES_FIELDS)

_I64 = [0, 1, -1, 2**63 - 1, -(2**63)]
_TS = [
    dt.datetime(1970, 1, 1),
    dt.datetime(1900, 1, 1, 0, 0, 0, 1),
    dt.datetime(2262, 4, 11, 23, 47, 16, 854775),
    dt.datetime(2024, 2, 29, 12, 30, 45, 123456),
]


def all_types_row(i: int) -> dict[str, Any]:
    """Row ``i``: edge values in turn; every nullable column is null in every 5th row."""
    if i % 5 == 4:
        return {f["name"]: (i if f["name"] == "req" else None) for f in ALL_TYPES_FIELDS}
    naive = _TS[i % len(_TS)] + dt.timedelta(microseconds=i)
    return {
        "req": i,
        "b": i % 2 == 0,
        "i8": [-128, 127, 0, -1][i % 4],
        "i16": [-32768, 32767, 7][i % 3],
        "i32": [-(2**31), 2**31 - 1, i][i % 3],
        "i64": _I64[i % len(_I64)],
        "f32": [1.5, -0.0, float("inf"), 3.25][i % 4],
        "f64": [0.1, -1e308, float("-inf"), 5e-324][i % 4],
        "s": ["", "héllo ✓", "x" * 300, "a\x00b"][i % 4],
        "bin": [b"", b"\x00\xff", bytes(range(256))][i % 3],
        "d": dt.date(1, 1, 1) + dt.timedelta(days=i * 997),
        "t": dt.time(23, 59, 59, 999999) if i % 2 else dt.time(0, 0, 0, i),
        "naive": naive,
        "zoned": naive.replace(tzinfo=dt.UTC),
        "dec": decimal.Decimal("-1234567890123456789012345678.0123456789")
        if i % 2
        else decimal.Decimal(f"{i}.0000000001"),
        "money": decimal.Decimal(f"{i % 1000}.{i % 100:02d}"),
        "l16": [] if i % 3 == 0 else [i % 32767, None, -32768],
        "lstr": ["a", None, ""] if i % 2 else [],
        "st": {
            "a": -128 if i % 2 else None,
            "b": "nested" if i % 3 else None,
            "c": [naive.replace(tzinfo=dt.UTC), None],
        },
        "ls": [{"x": i, "y": decimal.Decimal("-999.99")}, {"x": None, "y": None}],
    }


def all_types_batch(start: int, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [all_types_row(i) for i in range(start, start + n)], schema=ALL_TYPES
    )


def hot_rows(hot: HotLog, part: PartitionId, lo: int, hi: int) -> pa.Table | None:
    """Records ``[lo, hi)`` of a hot partition, with the system columns."""
    batches: list[pa.RecordBatch] = []
    offset = lo
    while offset < hi:
        stored = hot.read(part, offset, hi - offset, 64 * 1024 * 1024)
        assert stored, f"hot tier has nothing at {offset}"
        for sb in stored:
            rows = with_system_columns(
                decode_batch(sb.payload), part.partition, sb.base_offset, sb.timestamp_us
            )
            start = max(0, offset - sb.base_offset)
            length = min(rows.num_rows - start, hi - offset)
            if length > 0:
                batches.append(rows.slice(start, length))
                offset += length
            if offset >= hi:
                break
    return pa.Table.from_batches(batches) if batches else None


def tier(
    hot: HotLog,
    store: ColdStore,
    cold: ColdTable,
    part: PartitionId,
    upto: int,
    rows_per_file: int | None = None,
    base: ColdSnapshot | None = None,
) -> ColdSnapshot:
    """Move ``[T(p), upto)`` of one partition into the cold table in one commit (the
    tiering job's steps, without Spark)."""
    snap = base if base is not None else cold.snapshot()
    lo = snap.watermark(part.partition)
    if upto <= lo:
        return snap
    rows = hot_rows(hot, part, lo, upto)
    assert rows is not None
    step = rows_per_file or rows.num_rows
    files = [
        write_data_file(
            store.storage_options(),
            cold.data_location(part.partition),
            rows.slice(i, step),
            cold.file_schema(),
        )
        for i in range(0, rows.num_rows, step)
    ]
    return cold.commit_tiered(files, {part.partition: upto}, snap)


# Readers that are not Tidegate ----------------------------------------------------------
def extension_file(name: str) -> str:
    import importlib

    pkg = importlib.import_module(f"duckdb_extension_{name}")
    root = os.path.dirname(pkg.__file__ or "")
    found = glob.glob(os.path.join(root, "**", f"{name}.duckdb_extension"), recursive=True)
    assert found, f"no {name}.duckdb_extension inside duckdb_extension_{name}"
    return found[0]


def duckdb_rows(store: IcebergColdStore, table: IcebergColdTable) -> list[dict[str, Any]]:
    """The table's current metadata file read by DuckDB's Iceberg extension (from the
    PyPI packages), ordered by (_partition, _offset)."""
    import duckdb

    con = duckdb.connect()
    try:
        for name in ("avro", "iceberg"):
            con.execute(f"INSTALL '{extension_file(name)}'")
            con.execute(f"LOAD {name}")
        if store.warehouse.startswith("s3://"):
            p = store.io_properties
            con.execute(f"INSTALL '{extension_file('httpfs')}'")
            con.execute("LOAD httpfs")
            con.execute(
                "CREATE SECRET (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, "
                "URL_STYLE 'path', USE_SSL false)",
                [
                    p["s3.access-key-id"],
                    p["s3.secret-access-key"],
                    p["s3.region"],
                    p["s3.endpoint"].split("://", 1)[1],
                ],
            )
        location = table.metadata_location.removeprefix("file://")
        result = (
            con.execute(f"SELECT * FROM iceberg_scan('{location}') ORDER BY _partition, _offset")
            .arrow()
            .read_all()
        )
    finally:
        con.close()
    return result.to_pylist()


def pyiceberg_rows(store: IcebergColdStore, table: IcebergColdTable) -> list[dict[str, Any]]:
    """The metadata file opened directly by pyiceberg (no catalog)."""
    from pyiceberg.table import StaticTable

    static = StaticTable.from_metadata(table.metadata_location, properties=store.io_properties)
    data = static.scan().to_arrow().sort_by([("_partition", "ascending"), ("_offset", "ascending")])
    return data.to_pylist()


def pyiceberg_view(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` as pyiceberg 0.12's own reader returns them: it reads a null
    ``list<struct>`` as an empty list (a reader bug, reproduced with pyiceberg's own
    ``append`` and ``scan`` alone; the Parquet files hold the null, as DuckDB and
    Tidegate read it). Every other value must match exactly."""
    return [
        {**r, "ls": [] if r.get("ls", 0) is None else r.get("ls")} if "ls" in r else r for r in rows
    ]


def normalise(rows: Sequence[dict[str, Any]], schema: pa.Schema) -> list[dict[str, Any]]:
    """Rows cast to ``schema`` (readers differ in widths, e.g. int8 read back as int32)."""
    if not rows:
        return []
    names = schema.names
    table = pa.Table.from_pylist([{k: r[k] for k in names} for r in rows])
    arrays = [table.column(n).cast(schema.field(n).type) for n in names]
    return pa.Table.from_arrays(arrays, schema=schema).to_pylist()


def duckdb_scan(metadata: str) -> pa.Table:
    """Every row of the Iceberg table whose metadata file is ``metadata`` (a local path or
    ``file://`` URI), as DuckDB's Iceberg extension reads it, by (_partition, _offset)."""
    import duckdb

    con = duckdb.connect()
    try:
        for ext in ("avro", "iceberg"):
            con.execute(f"INSTALL '{extension_file(ext)}'")
            con.execute(f"LOAD {ext}")
        location = metadata.removeprefix("file://")
        result = con.execute(
            f"SELECT * FROM iceberg_scan('{location}') ORDER BY _partition, _offset"
        ).arrow()
        return result.read_all() if hasattr(result, "read_all") else result
    finally:
        con.close()
