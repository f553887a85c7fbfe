"""Arrow in and out of the SDK: whatever a user hands over becomes an Arrow IPC stream
through the one codec of :mod:`gateway.wire.codec`."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import pyarrow as pa

from gateway.wire.codec import Compression, decode_stream, encode_stream
from gateway.wire.jsonrows import python_rows_to_batch
from gateway.wire.keywrites import blank_deletes, delete_batch

__all__ = ["decode", "delete_ipc", "dict_rows", "ipc", "rows_ipc", "to_table"]


def dict_rows(data: Any) -> list[Mapping[str, Any]] | None:
    """``data`` as a list of dict rows (one dict, or a list or tuple of them); None when
    it is something else (Arrow data, a frame, an empty list)."""
    if isinstance(data, Mapping):
        return [data]
    if isinstance(data, list | tuple) and data and all(isinstance(r, Mapping) for r in data):
        return list(data)
    return None


def rows_ipc(
    rows: list[Mapping[str, Any]],
    schema: pa.Schema,
    omittable: Collection[str],
    compression: Compression = "none",
) -> bytes:
    """Dict rows converted by the table's own ``schema`` (its write schema: a key table's
    deletes may name their key only) (as the producer, HTTP and the
    CLI convert them: an ``int`` for an ``int32`` column, an ISO-8601 string for a
    timestamp...) as one Arrow IPC stream.

    Raises:
        SchemaMismatch: naming the row and the column of a value that does not fit.
    """
    batch = python_rows_to_batch(blank_deletes(rows, schema), schema, omittable=omittable)
    return encode_stream([batch], batch.schema, compression)


def to_table(data: Any, schema: pa.Schema | None = None) -> pa.Table:
    """An Arrow table from a table, batch, list of batches, pandas frame or list of dicts."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if type(data).__module__.partition(".")[0] == "pandas":
        return pa.Table.from_pandas(data, schema=schema, preserve_index=False)
    if isinstance(data, Mapping):
        data = [data]
    rows = list(data)
    if rows and isinstance(rows[0], pa.RecordBatch):
        return pa.Table.from_batches(rows)
    return pa.Table.from_pylist(rows, schema=schema)


def ipc(data: Any, compression: Compression = "none") -> bytes:
    """``data`` (anything :func:`to_table` takes) as one Arrow IPC stream."""
    table = to_table(data)
    return encode_stream(table.to_batches(), table.schema, compression)


def decode(data: bytes) -> list[pa.RecordBatch]:
    """The batches of an Arrow IPC stream; none for an empty message."""
    if not data:
        return []
    return decode_stream(data)[1]


def delete_ipc(keys: Any, schema: pa.Schema, primary_key: Sequence[str], table: str) -> bytes:
    """The deletes of ``keys`` (one dict of the key's columns, a list of them, or an Arrow
    table or batch of the key's columns) from a key table of user ``schema``, as one Arrow
    IPC stream (:func:`delete_batch`).

    Raises:
        SchemaMismatch: as :func:`~gateway.wire.keywrites.delete_batch`.
    """
    batch = delete_batch(keys, schema, primary_key, table)
    return encode_stream([batch], batch.schema)
