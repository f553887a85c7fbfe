"""Stable routing of rows to partitions. Pure pyarrow: the client SDK uses it too.

A row with key columns goes to ``crc32(key bytes) % partitions`` where the key bytes are
the compact JSON array of the row's key values (strings as UTF-8 text, timestamps and
decimals by their string form). The hash is stable across processes, hosts and versions.

:func:`route_by_key` computes the same bytes and hash with Arrow compute and numpy, a
column at a time, for the key types whose JSON form Arrow can write exactly (integers,
booleans, strings without control characters, nulls), then zlib's CRC over each key's
bytes; other columns and rows go through :func:`partition_for_key` row by row. Both give
every row the same partition.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["key_bytes", "partition_for_key", "route_by_key"]


def _key_bytes(values: Sequence[Any]) -> bytes:
    return json.dumps(list(values), separators=(",", ":"), ensure_ascii=False, default=str).encode(
        "utf-8"
    )


def partition_for_key(values: Sequence[Any], partitions: int) -> int:
    """The partition of a row whose key columns hold ``values``."""
    return zlib.crc32(_key_bytes(values)) % partitions


def route_by_key(
    batch: pa.RecordBatch, key_columns: Sequence[str], partitions: int
) -> dict[int, pa.Array]:
    """Row indices of ``batch`` per partition, each in row order."""
    columns = [batch.column(batch.schema.get_field_index(c)) for c in key_columns]
    if batch.num_rows == 0:
        return {}
    parts = _partitions(columns, batch.num_rows, partitions)
    order = np.argsort(parts, kind="stable")
    found, starts = np.unique(parts[order], return_index=True)
    ends = [*starts[1:], len(order)]
    return {
        int(p): pa.array(order[a:b], pa.int64())
        for p, a, b in zip(found, starts, ends, strict=True)
    }


def key_bytes(columns: Sequence[pa.Array | pa.ChunkedArray]) -> list[bytes]:
    """Each row's key bytes over ``columns`` (the values' compact JSON array, as
    :func:`partition_for_key` hashes them): what a primary-key table's hot key index
    holds per key."""
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    rows = len(arrays[0]) if arrays else 0
    texts = [_json_texts(c) for c in arrays]
    if any(t is None for t in texts) or rows == 0:
        values = [c.to_pylist() for c in arrays]
        return [_key_bytes(key) for key in zip(*values, strict=True)]
    pieces: list[Any] = ["["]
    for i, t in enumerate(texts):
        pieces += [",", t] if i else [t]
    pieces.append("]")
    out: list[bytes] = pc.cast(pc.binary_join_element_wise(*pieces, ""), pa.binary()).to_pylist()
    slow = np.zeros(rows, bool)
    for t in texts:
        assert t is not None
        slow |= _needs_python(t)
    for row in np.flatnonzero(slow).tolist():
        out[row] = _key_bytes([c[row].as_py() for c in arrays])
    return out


def _partitions(columns: Sequence[pa.Array], rows: int, partitions: int) -> np.ndarray:
    """The partition of each row (as :func:`partition_for_key` gives it)."""
    texts = [_json_texts(c) for c in columns]
    if any(t is None for t in texts):
        return _by_rows(columns, np.arange(rows), partitions, np.zeros(rows, np.int64))
    pieces: list[Any] = ["["]
    for i, t in enumerate(texts):
        pieces += [",", t] if i else [t]
    pieces.append("]")
    joined = pc.binary_join_element_wise(*pieces, "")
    out = (_crc32(pc.cast(joined, pa.binary())) % partitions).astype(np.int64)
    # Rows Arrow cannot write exactly (a control character to escape) go the reference way.
    slow = np.zeros(rows, bool)
    for t in texts:
        assert t is not None
        slow |= _needs_python(t)
    if slow.any():
        out = _by_rows(columns, np.flatnonzero(slow), partitions, out)
    return out


def _by_rows(
    columns: Sequence[pa.Array], rows: np.ndarray, partitions: int, out: np.ndarray
) -> np.ndarray:
    values = [c.take(pa.array(rows, pa.int64())).to_pylist() for c in columns]
    for i, key in zip(rows, zip(*values, strict=True), strict=True):
        out[i] = partition_for_key(key, partitions)
    return out


_CONTROL = "[\\x00-\\x1f]"


def _json_texts(column: pa.Array) -> pa.Array | None:
    """Each value's compact JSON text as ``json.dumps`` writes it (``null`` for nulls),
    or None for a type this module writes row by row."""
    t = column.type
    if pa.types.is_integer(t):
        text = pc.cast(column, pa.string())
    elif pa.types.is_boolean(t):
        text = pc.if_else(column, "true", "false")
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        escaped = pc.replace_substring(pc.cast(column, pa.string()), "\\", "\\\\")
        escaped = pc.replace_substring(escaped, '"', '\\"')
        text = pc.binary_join_element_wise('"', escaped, '"', "")
    elif pa.types.is_null(t):
        return pa.array(["null"] * len(column), pa.string())
    else:
        return None
    return pc.fill_null(text, "null")


def _needs_python(text: pa.Array) -> np.ndarray:
    """Rows whose text holds a control character (JSON escapes them as ``\\uXXXX``)."""
    found = pc.match_substring_regex(text, _CONTROL)
    return np.asarray(found.to_numpy(zero_copy_only=False), dtype=bool)


def _crc32(keys: pa.Array) -> np.ndarray:
    """zlib's CRC-32 of each binary value (zlib's C loop per value: measured faster at
    batch sizes than a numpy CRC a byte position at a time over all rows)."""
    crc = zlib.crc32
    return np.fromiter((crc(k) for k in keys.to_pylist()), np.uint32, len(keys))
