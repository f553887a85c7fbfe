"""Spark's pushed filters in Tidegate's filter language, and what they say about offsets.

Spark hands ``pushFilters`` a conjunction of :mod:`pyspark.sql.datasource` filters. Each
one we can evaluate with Spark's exact semantics becomes a node of
:mod:`gateway.wire.filters` (bound to the table's types, so the executors and the gateway
agree on it); the rest go back to Spark, which evaluates them after the scan.

Not pushed: nested columns, ``<=>`` (null-safe equality), ``LIKE '%x'`` and ``'%x%'``,
array literals, and comparisons on floating-point columns (Spark orders NaN above every
number and equal to itself; SQL comparisons here are false for NaN).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from gateway.wire.errors import InvalidRequest
from gateway.wire.filters import (
    And,
    Compare,
    Const,
    Expr,
    In,
    IsNull,
    Not,
    Or,
    StartsWith,
    bind,
)
from gateway.wire.schema import OFFSET_COLUMN, PARTITION_COLUMN

__all__ = ["OffsetBounds", "bounds_of", "translate"]

_OPS = {
    "EqualTo": "=",
    "GreaterThan": ">",
    "GreaterThanOrEqual": ">=",
    "LessThan": "<",
    "LessThanOrEqual": "<=",
}


def _literal(value: Any) -> Any:
    """A Spark literal as the filter language's binder takes it (ISO text for times)."""
    if isinstance(value, bool | int | str | decimal.Decimal):
        return value
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    raise ValueError(f"literal {value!r} is not pushed")


def _column(f: Any, schema: pa.Schema, *, compare: bool) -> str:
    path = tuple(f.attribute)
    if len(path) != 1 or path[0] not in schema.names:
        raise ValueError(f"column {path!r} is not pushed")
    if compare and pa.types.is_floating(schema.field(path[0]).type):
        raise ValueError("comparisons on floating-point columns stay with Spark (NaN order)")
    return str(path[0])


def _node(f: Any, schema: pa.Schema) -> Expr:
    kind = type(f).__name__
    if kind in _OPS:
        return Compare(_column(f, schema, compare=True), _OPS[kind], _literal(f.value))
    if kind == "In":
        values = tuple(_literal(v) for v in f.value)
        if not values:
            raise ValueError("an empty IN list is not pushed")
        return In(_column(f, schema, compare=True), values)
    if kind == "IsNull":
        return IsNull(_column(f, schema, compare=False))
    if kind == "IsNotNull":
        return IsNull(_column(f, schema, compare=False), negated=True)
    if kind == "Not":
        return Not(_node(f.child, schema))
    if kind == "StringStartsWith":
        return StartsWith(_column(f, schema, compare=False), str(f.value))
    raise ValueError(f"filter {kind} is not pushed")


def translate(filters: Iterable[Any], schema: pa.Schema) -> tuple[Expr | None, list[Any]]:
    """``(the conjunction of what we evaluate, unbound, the filters left to Spark)``.

    Each returned filter is one of ``filters`` itself, as ``pushFilters`` requires. The
    conjunction is unbound (its text is what the gateway parses); :func:`bind` it against
    ``schema`` to evaluate it.
    """
    pushed: list[Expr] = []
    rest: list[Any] = []
    for f in filters:
        try:
            node = _node(f, schema)
            bind(node, schema)
        except (ValueError, InvalidRequest):
            rest.append(f)
        else:
            pushed.append(node)
    if not pushed:
        return None, rest
    return (pushed[0] if len(pushed) == 1 else And(tuple(pushed))), rest


@dataclass(frozen=True)
class OffsetBounds:
    """What a bound filter says of ``_partition`` and ``_offset`` at its top level (a
    superset of the rows it keeps): the partitions it may keep (None: any) and the
    offsets ``[low, high)`` (None: unbounded)."""

    partitions: frozenset[int] | None = None
    low: int = 0
    high: int | None = None

    def keeps(self, partition: int) -> bool:
        return self.partitions is None or partition in self.partitions

    def clamp(self, start: int, end: int) -> tuple[int, int]:
        """``[start, end)`` narrowed to the offsets the filter can keep."""
        high = end if self.high is None else min(end, self.high)
        return max(start, self.low), high


def _int_range(leaf: Compare) -> tuple[int, int | None]:
    v = int(leaf.value)
    return {
        "=": (v, v + 1),
        ">": (v + 1, None),
        ">=": (v, None),
        "<": (0, v),
        "<=": (0, v + 1),
    }.get(leaf.op, (0, None))


def bounds_of(expr: Expr | None) -> OffsetBounds:
    """The partitions and offsets a bound filter can keep, read from its conjuncts."""
    if expr is None:
        return OffsetBounds()
    if isinstance(expr, Const) and not expr.value:
        return OffsetBounds(frozenset())
    leaves = expr.children if isinstance(expr, And) else (expr,)
    parts: set[int] | None = None
    low, high = 0, None
    for leaf in leaves:
        if isinstance(leaf, Or | Const):
            continue
        column = getattr(leaf, "column", None)
        if column == PARTITION_COLUMN:
            keep = _partitions_of(leaf)
            if keep is not None:
                parts = keep if parts is None else parts & keep
        elif column == OFFSET_COLUMN and isinstance(leaf, Compare):
            lo, hi = _int_range(leaf)
            low = max(low, lo)
            if hi is not None:
                high = hi if high is None else min(high, hi)
    return OffsetBounds(None if parts is None else frozenset(parts), low, high)


def _partitions_of(leaf: Expr) -> set[int] | None:
    if isinstance(leaf, In) and not leaf.negated:
        return {int(v) for v in leaf.values}
    if isinstance(leaf, Compare) and leaf.op == "=":
        return {int(leaf.value)}
    if isinstance(leaf, Compare) and leaf.op in ("<", "<=", ">", ">="):
        lo, hi = _int_range(leaf)
        return set(range(max(lo, 0), hi)) if hi is not None else None
    return None
