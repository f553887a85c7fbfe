"""Using a tree: its Arrow compute expression, the columns it reads, its text."""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from gateway.wire.filters.parse import KEYWORDS
from gateway.wire.filters.tree import (
    And,
    Compare,
    Const,
    Expr,
    In,
    IsNaN,
    IsNull,
    Not,
    Or,
    StartsWith,
)

__all__ = ["balanced", "columns_of", "to_arrow", "to_text"]


def balanced(items: Sequence[Any], join: Callable[[Any, Any], Any]) -> Any:
    """``items`` joined pairwise into a tree of depth log2(n), never a chain of depth n
    (deep chains overflow recursive visitors and Arrow's expression simplifier)."""
    level = list(items)
    while len(level) > 1:
        nxt = [join(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def _scalar(schema: pa.Schema, column: str, value: Any) -> pa.Scalar:
    t = schema.field(column).type
    # Floats compare as float64, so a float32 column is widened, never the literal rounded.
    return pa.scalar(value, pa.float64() if pa.types.is_floating(t) else t)


def to_arrow(expr: Expr, schema: pa.Schema) -> pc.Expression:
    """The Arrow compute expression of a bound tree over rows of ``schema``."""
    if isinstance(expr, Const):
        return pc.scalar(expr.value)
    if isinstance(expr, And):
        return balanced([to_arrow(c, schema) for c in expr.children], lambda a, b: a & b)
    if isinstance(expr, Or):
        return balanced([to_arrow(c, schema) for c in expr.children], lambda a, b: a | b)
    if isinstance(expr, Compare):
        field, value = pc.field(expr.column), _scalar(schema, expr.column, expr.value)
        ops: dict[str, Callable[[Any, Any], pc.Expression]] = {
            "=": lambda a, b: a == b,
            "!=": lambda a, b: a != b,
            "<": lambda a, b: a < b,
            "<=": lambda a, b: a <= b,
            ">": lambda a, b: a > b,
            ">=": lambda a, b: a >= b,
        }
        return ops[expr.op](field, value)
    if isinstance(expr, In):
        t = schema.field(expr.column).type
        values = pa.array(expr.values, pa.float64() if pa.types.is_floating(t) else t)
        field = pc.field(expr.column)
        if pa.types.is_floating(t):
            field = field.cast(pa.float64())
        found = field.isin(values)
        # is_in answers false for a null; a null must stay unknown under 'not in' too.
        return (~found & pc.field(expr.column).is_valid()) if expr.negated else found
    if isinstance(expr, IsNull):
        f = pc.field(expr.column)
        return f.is_valid() if expr.negated else f.is_null()
    if isinstance(expr, IsNaN):
        nan = pc.is_nan(pc.field(expr.column))
        # Iceberg: a null is not NaN, so 'is not nan' keeps it.
        return (~nan | pc.field(expr.column).is_null()) if expr.negated else nan
    if isinstance(expr, StartsWith):
        found = pc.starts_with(pc.field(expr.column), pattern=expr.prefix)
        return ~found if expr.negated else found
    raise TypeError(f"not a bound filter node: {expr!r}")  # pragma: no cover


def columns_of(expr: Expr | None) -> set[str]:
    """The columns a tree reads."""
    if expr is None or isinstance(expr, Const):
        return set()
    if isinstance(expr, And | Or):
        return set().union(*(columns_of(c) for c in expr.children))
    if isinstance(expr, Not):
        return columns_of(expr.child)
    if isinstance(expr, Compare | In | IsNull | IsNaN | StartsWith):
        return {expr.column}
    raise TypeError(f"not a filter node: {expr!r}")  # pragma: no cover


def _literal_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        value = value.isoformat()
    return "'" + str(value).replace("'", "''") + "'"


def _name_text(name: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and name.lower() not in KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def to_text(expr: Expr) -> str:
    """The filter text of a tree (bound or not); :func:`parse` reads it back."""
    if isinstance(expr, Const):
        return "true" if expr.value else "false"
    if isinstance(expr, And | Or):
        joiner = " and " if isinstance(expr, And) else " or "
        return joiner.join(f"({to_text(c)})" for c in expr.children)
    if isinstance(expr, Not):
        return f"not ({to_text(expr.child)})"
    if isinstance(expr, Compare):
        return f"{_name_text(expr.column)} {expr.op} {_literal_text(expr.value)}"
    if isinstance(expr, In):
        values = ", ".join(_literal_text(v) for v in expr.values)
        return f"{_name_text(expr.column)} {'not in' if expr.negated else 'in'} ({values})"
    if isinstance(expr, IsNull):
        return f"{_name_text(expr.column)} is {'not ' if expr.negated else ''}null"
    if isinstance(expr, IsNaN):
        return f"{_name_text(expr.column)} is {'not ' if expr.negated else ''}nan"
    if isinstance(expr, StartsWith):
        pattern = _literal_text(expr.prefix + "%")
        return f"{_name_text(expr.column)} {'not like' if expr.negated else 'like'} {pattern}"
    raise TypeError(f"not a filter node: {expr!r}")  # pragma: no cover
