"""What a write to a primary-key table looks like on the wire, shared by the gateway's
edges and the SDK: the schema its rows are conformed to (:func:`write_schema`), dict rows
whose deletes name their key only (:func:`blank_deletes`), and the rows a
``delete(table, keys)`` sends (:func:`delete_batch`). Light: pyarrow only."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import pyarrow as pa

from gateway.wire.changes import CHANGE_COLUMN, CHANGE_TYPE, Change
from gateway.wire.errors import SchemaMismatch
from gateway.wire.jsonrows import python_rows_to_batch

__all__ = ["blank_deletes", "delete_batch", "key_batch", "write_omittable", "write_schema"]


def write_schema(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """A key table's write schema: its user schema with every column outside the key
    nullable (a delete names its key only; an upsert's nulls are checked once its kind is
    known), then ``_change`` (int8: 0 or 2 upsert, 3 delete). ``schema`` itself for a
    table without a primary key."""
    if not primary_key:
        return schema
    fields = [f if f.name in primary_key else f.with_nullable(True) for f in schema]
    return pa.schema([*fields, pa.field(CHANGE_COLUMN, CHANGE_TYPE)], metadata=schema.metadata)


def write_omittable(added: Collection[str], primary_key: Sequence[str]) -> frozenset[str]:
    """Columns a write may leave out: those added by a schema change, and ``_change`` (an
    upsert without it) in a key table."""
    return frozenset(added) | ({CHANGE_COLUMN} if primary_key else frozenset())


def blank_deletes(rows: list[Any], schema: pa.Schema) -> list[Any]:
    """``rows`` (dict rows) with each delete (``_change`` 3) given a null for every column
    of ``schema`` it leaves out: a delete names its key only. Other rows as they are."""
    out: list[Any] = []
    for row in rows:
        if isinstance(row, Mapping) and row.get(CHANGE_COLUMN) == Change.DELETE:
            row = {**dict.fromkeys(schema.names), **row}
        out.append(row)
    return out


def key_batch(
    keys: Any, schema: pa.Schema, primary_key: Sequence[str], table: str
) -> pa.RecordBatch:
    """``keys`` as a batch of the key's columns of ``table`` of user ``schema``: one dict of
    the key's columns or a list of them (as the table's types take them: JSON forms too),
    or an Arrow table or batch of exactly the key's columns (cast to their types).

    Raises:
        SchemaMismatch: a table without a primary key, no key, or a key that does not name
            exactly the key's columns or whose value does not fit (one sentence each).
    """
    if not primary_key:
        raise SchemaMismatch(f"table {table} has no primary key; only a key table is keyed")
    key_schema = pa.schema([schema.field(c) for c in primary_key])
    if isinstance(keys, pa.Table | pa.RecordBatch):
        return _arrow_keys(keys, key_schema, table)
    listed = [keys] if isinstance(keys, Mapping) else list(keys)
    if not listed:
        raise SchemaMismatch(f"a call to {table} by key names at least one key")
    want = set(primary_key)
    for i, key in enumerate(listed):
        if not isinstance(key, Mapping) or set(key) != want:
            got = sorted(map(str, key)) if isinstance(key, Mapping) else type(key).__name__
            raise SchemaMismatch(
                f"key {i} names {got}; a key of {table} names exactly its primary key "
                f"columns {list(primary_key)}"
            )
    return python_rows_to_batch(listed, key_schema, first=0, unit="key")


def _arrow_keys(
    keys: pa.Table | pa.RecordBatch, key_schema: pa.Schema, table: str
) -> pa.RecordBatch:
    """An Arrow table or batch of keys as one batch of ``key_schema``."""
    if sorted(keys.schema.names) != sorted(key_schema.names):
        raise SchemaMismatch(
            f"the keys have the columns {keys.schema.names}; a key of {table} names exactly "
            f"its primary key columns {key_schema.names}"
        )
    if keys.num_rows == 0:
        raise SchemaMismatch(f"a call to {table} by key names at least one key")
    columns = []
    for f in key_schema:
        column = keys.column(f.name)
        if column.null_count:
            raise SchemaMismatch(
                f"key column {f.name!r} holds a null; every key of {table} names a value "
                f"for each of its primary key columns {key_schema.names}"
            )
        try:
            column = column.cast(f.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise SchemaMismatch(
                f"key column {f.name!r} is {column.type}, which does not fit the key's type "
                f"{f.type} of {table}"
            ) from None
        columns.append(column)
    if isinstance(keys, pa.Table):
        columns = [c.combine_chunks() if c.num_chunks != 1 else c.chunk(0) for c in columns]
    return pa.RecordBatch.from_arrays(columns, schema=key_schema)


def delete_batch(
    keys: Any, schema: pa.Schema, primary_key: Sequence[str], table: str
) -> pa.RecordBatch:
    """The write that deletes ``keys`` (as :func:`key_batch` takes them) from ``table`` of
    user ``schema``: each key, nulls elsewhere and ``_change`` 3, in the table's write
    schema.

    Raises:
        SchemaMismatch: as :func:`key_batch`.
    """
    typed = key_batch(keys, schema, primary_key, table)
    n = typed.num_rows
    target = write_schema(schema, primary_key)
    columns = [
        typed.column(f.name) if f.name in primary_key else pa.nulls(n, f.type) for f in target
    ]
    columns[-1] = pa.array([int(Change.DELETE)] * n, CHANGE_TYPE)
    return pa.RecordBatch.from_arrays(columns, schema=target)
