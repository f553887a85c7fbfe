"""The checks of a scan's request that the gateway's scan and the SDK's client-side scan
both make, so that either answers a bad projection or limit with the same sentence."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from gateway.wire.errors import InvalidRequest

__all__ = ["INT64_MAX", "check_limit", "projection"]

INT64_MAX = 2**63 - 1


def projection(stored: pa.Schema, columns: Sequence[str] | None) -> list[str]:
    """The columns a scan of ``columns`` answers, in order (none asked: every column of
    ``stored``, the table's stored schema).

    Raises:
        InvalidRequest: ``columns`` is not a list of names, names a column the table does
            not have (the message lists the table's) or names one twice.
    """
    if columns is None or len(columns) == 0:
        return list(stored.names)
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise InvalidRequest("columns must be a list of column names")
    unknown = [c for c in columns if c not in stored.names]
    if unknown:
        raise InvalidRequest(
            f"unknown column(s) {unknown}; the table has {stored.names}",
            unknown=",".join(unknown),
        )
    if len(set(columns)) != len(columns):
        raise InvalidRequest("a column is named twice in columns")
    return list(columns)


def check_limit(limit: object) -> None:
    """Raises: InvalidRequest: ``limit`` is neither None nor an integer from 0 to
    :data:`INT64_MAX`."""
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= INT64_MAX
    ):
        raise InvalidRequest(f"limit must be an integer from 0 to {INT64_MAX}")
