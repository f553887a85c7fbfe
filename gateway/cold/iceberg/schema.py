"""Iceberg schemas of stream-tables: the Arrow-to-Iceberg type mapping and its inverse.

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
system columns last among them, then nested fields); a column added by a schema change
gets the next free id and keeps it. Data files carry the ids in their Parquet schema, and
the table has a default name mapping too, so files written without ids (plain pyarrow)
resolve by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from gateway.wire.errors import InvalidSchema
from gateway.wire.schema import OFFSET_COLUMN, PARTITION_COLUMN

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

__all__ = ["arrow_to_iceberg", "cast_to", "iceberg_type", "small_offsets"]


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


def iceberg_type(t: pa.DataType, where: str) -> Any:
    """The Iceberg type of one column (nested ids are placeholders: a schema update
    assigns fresh ones).

    Raises:
        InvalidSchema: a type that would not round-trip value for value.
    """
    return _iceberg_type(t, _Ids(), where)


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def cast_to(batch: pa.RecordBatch | pa.Table, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` as ``target`` (names, order, types, nullability), by name. A column the
    batch lacks (added by a schema change after its file was written) is all nulls."""
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks()  # leaves one-chunk columns as they are
        # ChunkedArray.combine_chunks copies even a single chunk: take it as it is.
        arrays = [
            _one_array(batch.column(f.name))
            if f.name in batch.column_names
            else pa.nulls(batch.num_rows, f.type)
            for f in target
        ]
    else:
        arrays = [
            batch.column(f.name)
            if f.name in batch.schema.names
            else pa.nulls(batch.num_rows, f.type)
            for f in target
        ]
    out = [
        a if a.type.equals(f.type) else a.cast(f.type) for a, f in zip(arrays, target, strict=True)
    ]
    return pa.RecordBatch.from_arrays(out, schema=target)


def small_offsets(t: pa.DataType) -> pa.DataType:
    """``t`` with plain (32-bit) offsets: what Spark and DuckDB write too."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        v = t.value_field
        return pa.list_(pa.field(v.name, small_offsets(v.type), v.nullable, v.metadata))
    if pa.types.is_struct(t):
        return pa.struct(
            [pa.field(f.name, small_offsets(f.type), f.nullable, f.metadata) for f in t]
        )
    return t
