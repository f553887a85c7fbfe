"""Arrow in and out of the SDK: whatever a user hands over becomes an Arrow IPC stream
through the one codec of :mod:`gateway.wire.codec`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from gateway.wire.codec import Compression, decode_stream, encode_stream

__all__ = ["decode", "ipc", "to_table"]


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
