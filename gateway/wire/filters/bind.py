"""Binding a tree to a table's types with SQL semantics, and normalising it."""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from gateway.wire.errors import InvalidRequest
from gateway.wire.filters.parse import number_literal, parse
from gateway.wire.filters.tree import (
    ALWAYS_FALSE,
    ALWAYS_TRUE,
    DEFAULT_LIMITS,
    NEGATED_OP,
    And,
    Compare,
    Const,
    Expr,
    FilterLimits,
    In,
    IsNaN,
    IsNull,
    Not,
    Or,
    StartsWith,
)

__all__ = ["bind", "compile_filter"]


def _int_range(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    if pa.types.is_unsigned_integer(t):
        return 0, 2**bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


@dataclass(frozen=True, slots=True)
class _Grid:
    """A column whose values lie on a grid: integers (step 1) or decimals (10**-scale),
    between ``lo`` and ``hi``. Literals off the grid or out of range are resolved exactly
    instead of being rounded."""

    step: decimal.Decimal
    lo: decimal.Decimal
    hi: decimal.Decimal
    to_value: Callable[[decimal.Decimal], Any]

    def clamp(self, v: decimal.Decimal) -> decimal.Decimal:
        """``v``, or one step past the range when it lies beyond (every value past the
        range compares alike), so that rounding works on bounded numbers only."""
        return min(max(v, _CTX.subtract(self.lo, self.step)), _CTX.add(self.hi, self.step))

    def round(self, v: decimal.Decimal, rounding: str) -> decimal.Decimal:
        steps = _CTX.divide(self.clamp(v), self.step)
        return _CTX.multiply(steps.to_integral_value(rounding=rounding, context=_CTX), self.step)

    def floor(self, v: decimal.Decimal) -> decimal.Decimal:
        return self.round(v, decimal.ROUND_FLOOR)

    def ceil(self, v: decimal.Decimal) -> decimal.Decimal:
        return self.round(v, decimal.ROUND_CEILING)

    def holds(self, v: decimal.Decimal) -> bool:
        """Whether ``v`` is a value of the column (in range and on the grid)."""
        return self.lo <= v <= self.hi and self.floor(v) == v


#: Exact arithmetic for literals of at most ``_MAX_NUMBER_CHARS`` characters.
_CTX = decimal.Context(prec=200, Emax=100_000, Emin=-100_000)


def _grid(t: pa.DataType) -> _Grid | None:
    if pa.types.is_integer(t):
        lo, hi = _int_range(t)
        return _Grid(decimal.Decimal(1), decimal.Decimal(lo), decimal.Decimal(hi), int)
    if pa.types.is_decimal(t):
        step = decimal.Decimal(1).scaleb(-t.scale)
        # Exactly, in _CTX: the default context's 28 digits would round 10**38 - 1 up.
        top = _CTX.multiply(_CTX.subtract(_CTX.power(10, t.precision), 1), step)

        def on_scale(d: decimal.Decimal) -> decimal.Decimal:
            return d.quantize(step, context=_CTX)

        return _Grid(step, _CTX.minus(top), top, on_scale)
    return None


def _text(value: str) -> bool:
    """Whether ``value`` is storable text (no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Binder:
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def field(self, name: str, what: str) -> pa.Field:
        index = self.schema.get_field_index(name)
        if index < 0:
            raise InvalidRequest(
                f"invalid filter: unknown column {name!r}; the table has {self.schema.names}",
                column=name,
            )
        f = self.schema.field(index)
        t = f.type
        if pa.types.is_nested(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            raise InvalidRequest(
                f"invalid filter: column {name!r} is {t}, which takes no {what}; filters "
                "take columns of numbers, strings, booleans, dates, times and timestamps",
                column=name,
            )
        return f

    # literal coercion ---------------------------------------------------------------
    def number(self, f: pa.Field, v: Any) -> decimal.Decimal | float:
        if isinstance(v, bool):
            raise self.mistyped(f, v, "a number")
        if isinstance(v, str):
            try:
                v = number_literal(v.strip())
            except decimal.InvalidOperation:
                raise self.mistyped(f, v, "a number") from None
            if v.is_snan():
                raise self.mistyped(f, v, "a number (NaN is written 'NaN')")
            if not v.is_finite() and not pa.types.is_floating(f.type):
                raise self.mistyped(f, v, "a finite number")
        if isinstance(v, int):
            return decimal.Decimal(v)
        if isinstance(v, decimal.Decimal):
            return v
        if isinstance(v, float):
            return v if not math.isfinite(v) else decimal.Decimal(repr(v))
        raise self.mistyped(f, v, "a number")

    def mistyped(self, f: pa.Field, v: Any, want: str) -> InvalidRequest:
        shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:60] + "..."
        return InvalidRequest(
            f"invalid filter: column {f.name!r} is {f.type}; compare it with {want}, not {shown}",
            column=f.name,
        )

    def value(self, f: pa.Field, v: Any) -> Any:
        """``v`` as a value of the (non-grid) column's type."""
        t = f.type
        if pa.types.is_floating(t):
            n = self.number(f, v)
            return float(n)
        if pa.types.is_boolean(t):
            if not isinstance(v, bool):
                raise self.mistyped(f, v, "true or false")
            return v
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            if not isinstance(v, str) or not _text(v):
                raise self.mistyped(f, v, "a 'quoted string' of valid Unicode")
            return v
        if pa.types.is_timestamp(t):
            return self.timestamp(f, v)
        if pa.types.is_date(t):
            if not isinstance(v, str):
                raise self.mistyped(f, v, "an ISO date such as '2024-01-31'")
            try:
                return dt.date.fromisoformat(v)
            except ValueError:
                raise self.mistyped(f, v, "an ISO date such as '2024-01-31'") from None
        if pa.types.is_time(t):
            if not isinstance(v, str):
                raise self.mistyped(f, v, "an ISO time such as '12:30:00'")
            try:
                return dt.time.fromisoformat(v)
            except ValueError:
                raise self.mistyped(f, v, "an ISO time such as '12:30:00'") from None
        raise self.mistyped(f, v, "nothing: its type takes no filter")  # pragma: no cover

    def timestamp(self, f: pa.Field, v: Any) -> dt.datetime:
        zoned = f.type.tz is not None
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC if zoned else None)
        want = "an ISO-8601 time such as '2024-01-31T12:00:00" + ("Z'" if zoned else "'")
        if isinstance(v, int) and not isinstance(v, bool):
            try:
                return epoch + dt.timedelta(microseconds=v)
            except OverflowError:
                raise self.mistyped(f, v, "microseconds within years 1 to 9999") from None
        if not isinstance(v, str):
            raise self.mistyped(f, v, want)
        try:
            when = dt.datetime.fromisoformat(v)
        except ValueError:
            raise self.mistyped(f, v, want) from None
        if zoned:
            if when.tzinfo is None:
                when = when.replace(tzinfo=dt.UTC)
            try:
                return when.astimezone(dt.UTC)
            except OverflowError:
                raise self.mistyped(f, v, "a time within years 1 to 9999") from None
        if when.tzinfo is not None:
            raise self.mistyped(f, v, "a time without an offset (the column is naive)")
        return when

    # predicates ---------------------------------------------------------------------
    def compare(self, e: Compare) -> Expr:
        f = self.field(e.column, "comparison")
        grid = _grid(f.type)
        if grid is None:
            value = self.value(f, e.value)
            if isinstance(value, float) and math.isnan(value):
                # SQL: a comparison with NaN is false... except Arrow orders NaN; be exact.
                return IsNull(e.column, True) if e.op == "!=" else ALWAYS_FALSE
            return Compare(e.column, e.op, value)
        v = self.number(f, e.value)
        if isinstance(v, float):  # an infinity (NaN cannot reach a grid column)
            v = _CTX.add(grid.hi, 1) if v > 0 else _CTX.subtract(grid.lo, 1)
        not_null = IsNull(e.column, True)
        op = e.op
        if op in ("=", "!="):
            on_grid = grid.holds(v)
            if op == "=":
                return Compare(e.column, "=", grid.to_value(v)) if on_grid else ALWAYS_FALSE
            return Compare(e.column, "!=", grid.to_value(v)) if on_grid else not_null
        # Ranges: the tightest bound on the grid, then clamped to the type's range.
        if op in (">", ">="):
            bound = _CTX.add(grid.floor(v), grid.step) if op == ">" else grid.ceil(v)
            if bound <= grid.lo:
                return not_null
            if bound > grid.hi:
                return ALWAYS_FALSE
            return Compare(e.column, ">=", grid.to_value(bound))
        bound = _CTX.subtract(grid.ceil(v), grid.step) if op == "<" else grid.floor(v)
        if bound >= grid.hi:
            return not_null
        if bound < grid.lo:
            return ALWAYS_FALSE
        return Compare(e.column, "<=", grid.to_value(bound))

    def in_(self, e: In) -> Expr:
        f = self.field(e.column, "'in' list")
        grid = _grid(f.type)
        values: list[Any] = []
        for raw in e.values:
            if grid is None:
                v = self.value(f, raw)
                if isinstance(v, float) and math.isnan(v):
                    continue  # NaN equals nothing
                values.append(v)
                continue
            n = self.number(f, raw)
            if isinstance(n, decimal.Decimal) and grid.holds(n):
                values.append(grid.to_value(n))
        unique = tuple(dict.fromkeys(values))
        if not unique:
            return IsNull(e.column, True) if e.negated else ALWAYS_FALSE
        return In(e.column, unique, e.negated)

    def leaf(self, e: Expr) -> Expr:
        if isinstance(e, Compare):
            return self.compare(e)
        if isinstance(e, In):
            return self.in_(e)
        if isinstance(e, IsNull):
            self.field(e.column, "null check")
            return e
        if isinstance(e, IsNaN):
            f = self.field(e.column, "'is nan'")
            if not pa.types.is_floating(f.type):
                # Only floating columns hold NaN (and a null is not NaN).
                return ALWAYS_TRUE if e.negated else ALWAYS_FALSE
            return e
        if isinstance(e, StartsWith):
            f = self.field(e.column, "'like'")
            if not (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)):
                raise self.mistyped(f, e.prefix + "%", "no 'like' pattern (it is not a string)")
            if not _text(e.prefix):
                raise self.mistyped(f, e.prefix + "%", "a pattern of valid Unicode")
            return e
        raise TypeError(f"not a filter node: {e!r}")  # pragma: no cover

    def bind(self, e: Expr, negate: bool = False) -> Expr:
        """``e`` (negated when ``negate``) with negations pushed to the leaves."""
        if isinstance(e, Not):
            return self.bind(e.child, not negate)
        if isinstance(e, Const):
            return Const(e.value != negate)
        if isinstance(e, And | Or):
            children = [self.bind(c, negate) for c in e.children]
            conj = isinstance(e, And) != negate
            return _conjunction(children) if conj else _disjunction(children)
        # A leaf is negated before it is normalised: normal forms such as "v is not null"
        # for "v != 1.5" hold only un-negated (its negation is false, not "v is null").
        return self.leaf(_negate(e) if negate else e)


def _negate(e: Expr) -> Expr:
    """The negation of a leaf."""
    if isinstance(e, Const):
        return Const(not e.value)
    if isinstance(e, Compare):
        return Compare(e.column, NEGATED_OP[e.op], e.value)
    if isinstance(e, In):
        return In(e.column, e.values, not e.negated)
    if isinstance(e, IsNull):
        return IsNull(e.column, not e.negated)
    if isinstance(e, IsNaN):
        return IsNaN(e.column, not e.negated)
    if isinstance(e, StartsWith):
        return StartsWith(e.column, e.prefix, not e.negated)
    raise TypeError(f"not a filter leaf: {e!r}")  # pragma: no cover


def _conjunction(children: Iterable[Expr]) -> Expr:
    flat: list[Expr] = []
    for c in children:
        if c == ALWAYS_FALSE:
            return ALWAYS_FALSE
        if c == ALWAYS_TRUE:
            continue
        flat.extend(c.children if isinstance(c, And) else [c])
    if not flat:
        return ALWAYS_TRUE
    return flat[0] if len(flat) == 1 else And(tuple(flat))


def _disjunction(children: Iterable[Expr]) -> Expr:
    flat: list[Expr] = []
    for c in children:
        if c == ALWAYS_TRUE:
            return ALWAYS_TRUE
        if c == ALWAYS_FALSE:
            continue
        flat.extend(c.children if isinstance(c, Or) else [c])
    if not flat:
        return ALWAYS_FALSE
    return flat[0] if len(flat) == 1 else Or(tuple(flat))


def bind(expr: Expr, schema: pa.Schema) -> Expr:
    """``expr`` checked against ``schema`` and normalised (see the module docstring).

    Raises:
        InvalidRequest: an unknown column, a column whose type takes no filter, or a
            literal that does not fit the column (each named in the message).
    """
    return _Binder(schema).bind(expr)


def compile_filter(
    text: str | None, schema: pa.Schema, limits: FilterLimits = DEFAULT_LIMITS
) -> Expr | None:
    """Parse and bind a filter text; None when there is nothing to filter (no text, or a
    filter that is always true).

    Raises:
        InvalidRequest: see :func:`parse` and :func:`bind`.
    """
    if text is None:
        return None
    if not isinstance(text, str):
        raise InvalidRequest("filter must be a string")
    if not text.strip():
        return None
    bound = bind(parse(text, limits), schema)
    return None if bound == ALWAYS_TRUE else bound
