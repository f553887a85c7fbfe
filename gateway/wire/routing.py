"""Stable routing of rows to partitions. Pure pyarrow: the client SDK uses it too.

A row with key columns goes to ``crc32(key bytes) % partitions`` where the key bytes are
the compact JSON array of the row's key values (strings as UTF-8 text, timestamps and
decimals by their string form). The hash is stable across processes, hosts and versions.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

__all__ = ["partition_for_key", "route_by_key"]


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
    columns = [batch.column(batch.schema.get_field_index(c)).to_pylist() for c in key_columns]
    groups: dict[int, list[int]] = {}
    for i, key in enumerate(zip(*columns, strict=True)):
        groups.setdefault(partition_for_key(key, partitions), []).append(i)
    return {p: pa.array(idx, pa.int64()) for p, idx in sorted(groups.items())}
