"""Our bound filter tree (:mod:`gateway.wire.filters`) as a pyiceberg expression, for
pruning files by partition values and column statistics.

Pruning must never drop a file holding a matching row, so the translation is exact where
pyiceberg compares as we do and *wider* (always true) where it might not: comparisons on
``float`` (float32) columns, whose literals pyiceberg would round to float32 while we
compare in float64. The rows of the files that remain are filtered with the Arrow form of
the same tree, so the answer is exact either way.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa

from gateway.wire.filters import (
    And,
    Compare,
    Const,
    Expr,
    In,
    IsNaN,
    IsNull,
    Or,
    StartsWith,
    balanced,
)

__all__ = ["to_pyiceberg"]

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _literal(value: Any) -> Any:
    """A Python value as pyiceberg takes it: temporal values as their integer encoding."""
    if isinstance(value, dt.datetime):
        epoch = _EPOCH_UTC if value.tzinfo is not None else _EPOCH
        delta = value - epoch
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(value, dt.date):
        return (value - dt.date(1970, 1, 1)).days
    if isinstance(value, dt.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + (
            value.microsecond
        )
    return value


def to_pyiceberg(expr: Expr | None, schema: pa.Schema) -> Any:
    """The pyiceberg ``BooleanExpression`` that prunes for ``expr`` (``AlwaysTrue`` for
    None). ``schema`` is the stored Arrow schema the tree was bound to."""
    from pyiceberg import expressions as ice

    # pyiceberg's predicates are generic over literal types and confuse type checkers.
    x: Any = ice

    def go(e: Expr) -> Any:
        if isinstance(e, Const):
            return x.AlwaysTrue() if e.value else x.AlwaysFalse()
        if isinstance(e, And):
            return balanced([go(c) for c in e.children], x.And)
        if isinstance(e, Or):
            return balanced([go(c) for c in e.children], x.Or)
        if isinstance(e, IsNull):
            return x.NotNull(e.column) if e.negated else x.IsNull(e.column)
        if isinstance(e, IsNaN):
            return x.NotNaN(e.column) if e.negated else x.IsNaN(e.column)
        if isinstance(e, Compare | In | StartsWith) and schema.field(e.column).type == pa.float32():
            return x.AlwaysTrue()
        if isinstance(e, Compare):
            op = {
                "=": x.EqualTo,
                "!=": x.NotEqualTo,
                "<": x.LessThan,
                "<=": x.LessThanOrEqual,
                ">": x.GreaterThan,
                ">=": x.GreaterThanOrEqual,
            }[e.op]
            return op(e.column, _literal(e.value))
        if isinstance(e, In):
            values = {_literal(v) for v in e.values}
            return x.NotIn(e.column, values) if e.negated else x.In(e.column, values)
        if isinstance(e, StartsWith):
            return (
                x.NotStartsWith(e.column, e.prefix)
                if e.negated
                else x.StartsWith(e.column, e.prefix)
            )
        raise TypeError(f"not a bound filter node: {e!r}")  # pragma: no cover

    return x.AlwaysTrue() if expr is None else go(expr)
