"""The producer's fast path for rows given as Python dicts (no I/O, no Arrow per row).

Converting every sent dict to its own Arrow record batch costs tens of microseconds; a
:class:`RowPlan`, built once per table schema, checks a dict in plain Python instead and
appends its values to one list per column, so a whole request's rows become Arrow once,
a column at a time, when the batch is sealed (:func:`columns_to_batch`).

A one-dict send first tries :attr:`RowPlan.fill`, a function written for the schema when
the plan is built (as :mod:`dataclasses` writes ``__init__``): one test per column inlined,
no call per value, no tuple per row. It vouches only for the plainest values (an ``int``
in range, a ``float``, an ASCII ``str``, ``bytes``, ...); for anything else it appends
nothing and the send takes :meth:`RowPlan.check`, which refuses with the exact reason.

The check is conservative, per value:

- *fits*: the value surely converts to the column's Arrow type (an ``int`` in range for
  ``int64``, a ``str`` for ``string``, a ``datetime`` for ``timestamp``, ...);
- *does not fit*: Arrow would refuse it too (a ``str`` for ``int64``, ``300`` for
  ``int8``, a ``None`` in a non-nullable column): :class:`SchemaMismatch` at once;
- *unsure* (numpy scalars, ``bytearray``, ints for timestamps, the JSON forms HTTP takes
  such as an ISO-8601 string for a timestamp or a string for a decimal, lists and
  structs, ...): the row takes the careful way, converted at once by
  :func:`gateway.wire.jsonrows.python_rows_to_batch`, as every interface converts it.

Keys route by :func:`gateway.wire.routing.partition_for_key` on the values Arrow would hand back
(``route_by_key`` reads them with ``to_pylist``). That holds for the Python values of
integer, boolean, string, binary, date, time and float64 columns (an ``int`` in a float64
column is routed as the ``float``); float32, timestamp and decimal keys read back changed
(rounded, zoned, rescaled), so rows of tables keyed on those take the Arrow way.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import pyarrow as pa

from gateway.wire.errors import SchemaMismatch
from gateway.wire.schema import columns_mismatch
from gateway.wire.values import exact_decimal, rescaled_column

__all__ = ["RowPlan", "columns_to_batch", "values_to_batch"]

#: A value check: the value's estimated Arrow bytes; :data:`UNSURE` when only Arrow can
#: tell; raises :class:`_Refused` when Arrow would refuse the value.
Check = Callable[[Any], int]
UNSURE = -1
_MISSING = object()


class _Refused(Exception):
    """A value Arrow would not convert (message: why)."""


def _refuse(v: Any, expected: str) -> _Refused:
    return _Refused(f"expected {expected}, got {type(v).__name__} {v!r:.60}")


def _int_check(bits: int) -> Check:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    width = bits // 8

    def check(v: Any) -> int:
        if type(v) is int:
            if lo <= v <= hi:
                return width
            raise _Refused(f"{v} is out of range for int{bits} ({lo} to {hi})")
        if isinstance(v, bool | str | bytes):
            raise _refuse(v, "an integer")
        return UNSURE

    return check


def _float_check(width: int, mantissa: int) -> Check:
    """Arrow takes an ``int`` only where the float type holds it exactly."""
    exact = 1 << mantissa

    def check(v: Any) -> int:
        if type(v) is float:
            return width
        if type(v) is int and -exact <= v <= exact:
            return width
        if isinstance(v, str | bytes):
            raise _refuse(v, "a number")
        return UNSURE

    return check


def _bool_check(v: Any) -> int:
    if type(v) is bool:
        return 1
    if isinstance(v, int | str | bytes):
        raise _refuse(v, "a bool")
    return UNSURE


def _string_check(v: Any) -> int:
    if type(v) is str:
        if v.isascii():
            return len(v) + 4
        try:
            return len(v.encode("utf-8")) + 4
        except UnicodeEncodeError as exc:
            raise _Refused(f"not valid UTF-8 text: {exc}") from exc
    if isinstance(v, int | float):
        raise _refuse(v, "a str")
    return UNSURE


def _binary_check(v: Any) -> int:
    if type(v) is bytes:
        return len(v) + 4
    if isinstance(v, int | float):  # a str is base64, as over HTTP: the conversion judges
        raise _refuse(v, "bytes")
    return UNSURE


def _timestamp_check(v: Any) -> int:
    if isinstance(v, dt.datetime):
        return 8
    if isinstance(v, dt.date):
        raise _refuse(v, "a datetime")
    return UNSURE  # an ISO-8601 string or integer microseconds: converted as HTTP does


def _date_check(v: Any) -> int:
    if type(v) is dt.date:
        return 4
    return UNSURE


def _time_check(v: Any) -> int:
    if type(v) is dt.time and v.tzinfo is None:
        return 8
    return UNSURE


def _decimal_check(precision: int, scale: int) -> Check:
    def check(v: Any) -> int:
        if type(v) is decimal.Decimal:
            try:
                exact_decimal(v, precision, scale)  # rescaled so in columns_to_batch
            except ValueError as exc:
                raise _Refused(str(exc)) from None
            return 16
        return UNSURE  # a decimal string or a float: converted as HTTP does

    return check


def _unsure(v: Any) -> int:
    return UNSURE


def value_check(t: pa.DataType) -> Check:
    """The check of a value for a column of type ``t``."""
    if pa.types.is_integer(t):
        return _int_check(t.bit_width)
    if pa.types.is_float32(t):
        return _float_check(4, 24)
    if pa.types.is_float64(t):
        return _float_check(8, 53)
    if pa.types.is_boolean(t):
        return _bool_check
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _string_check
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return _binary_check
    if pa.types.is_timestamp(t):
        return _timestamp_check
    if pa.types.is_date32(t):
        return _date_check
    if pa.types.is_time64(t):
        return _time_check
    if pa.types.is_decimal(t):
        return _decimal_check(t.precision, t.scale)
    return _unsure  # lists, structs: Arrow converts them, per row


def _fast_test(t: pa.DataType, v: str) -> tuple[str, str] | None:
    """Python source of a test that the value named ``v`` surely fits ``t`` (a subset of
    :func:`value_check`'s *fits*) and of its estimated Arrow bytes; None: no inline test."""
    if pa.types.is_signed_integer(t):
        lo, hi = -(1 << (t.bit_width - 1)), (1 << (t.bit_width - 1)) - 1
        return f"type({v}) is int and {lo} <= {v} <= {hi}", str(t.bit_width // 8)
    if pa.types.is_float64(t):
        return f"type({v}) is float", "8"
    if pa.types.is_float32(t):
        return f"type({v}) is float", "4"
    if pa.types.is_boolean(t):
        return f"type({v}) is bool", "1"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return f"type({v}) is str and {v}.isascii()", f"len({v}) + 4"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return f"type({v}) is bytes", f"len({v}) + 4"
    if pa.types.is_timestamp(t):
        return f"type({v}) is _datetime", "8"
    if pa.types.is_date32(t):
        return f"type({v}) is _date", "4"
    return None


#: What a :attr:`RowPlan.fill` function returns when it cannot vouch for the row.
NOT_FILLED = -1


def _fill_function(schema: pa.Schema, omittable: Collection[str]) -> Callable[..., int]:
    """``fill(row, columns)``: append a dict row's values to ``columns`` (one list per
    column, schema order) and return its estimated Arrow bytes, when every value surely
    fits; else append nothing and return :data:`NOT_FILLED`.

    The row must be a ``dict`` (its ``[]`` then never calls ``__missing__``)."""
    n = len(schema)
    if n == 0 or omittable:
        # Rows may leave added columns out: the careful path sorts them out.
        return lambda row, columns: NOT_FILLED
    lines = ["def fill(row, columns):", f"    if len(row) != {n}:", "        return -1", "    try:"]
    lines += [f"        v{i} = row[{f.name!r}]" for i, f in enumerate(schema)]
    lines += ["    except KeyError:", "        return -1"]
    sizes = []
    for i, f in enumerate(schema):
        test = _fast_test(f.type, f"v{i}")
        if test is None:
            return lambda row, columns: NOT_FILLED
        cond, size = test
        if f.nullable:
            cond = f"v{i} is None or ({cond})"
            size = f"(0 if v{i} is None else {size})"
        lines += [f"    if not ({cond}):", "        return -1"]
        sizes.append(size)
    lines += [f"    columns[{i}].append(v{i})" for i in range(n)]
    fixed = sum(int(x) for x in sizes if x.isdigit())
    lines.append("    return " + " + ".join([str(fixed), *(x for x in sizes if not x.isdigit())]))
    source = "\n".join(lines)
    namespace: dict[str, Any] = {"_datetime": dt.datetime, "_date": dt.date}
    exec(compile(source, f"<fill of {schema.names}>", "exec"), namespace)
    fill: Callable[..., int] = namespace["fill"]
    fill.__doc__ = source
    return fill


def _routes_as_python(t: pa.DataType) -> bool:
    """Whether a fitting Python value of ``t`` is what Arrow's ``to_pylist`` gives back."""
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_date32(t)
        or pa.types.is_time64(t)
        or pa.types.is_float64(t)  # an int is keyed as float(v), see key()
    )


class RowPlan:
    """Checks dict rows against one table schema and routes them by key, in Python."""

    def __init__(
        self, schema: pa.Schema, key_columns: Sequence[str] = (), omittable: Collection[str] = ()
    ) -> None:
        self.schema = schema
        self.names = tuple(schema.names)
        self._names = frozenset(self.names)
        # A nullable column is given as None, not left out; only a column added by a
        # schema change may be left out (rows written under the older schema).
        self._omittable = frozenset(omittable)
        self._required = self._names - self._omittable
        self._fields = [(f.name, value_check(f.type), f.nullable) for f in schema]
        index = {n: i for i, n in enumerate(self.names)}
        self.key_index = tuple(index[c] for c in key_columns)
        self._float_keys = tuple(pa.types.is_float64(schema.field(c).type) for c in key_columns)
        #: Whether dict rows can be routed by key here (else they take the Arrow way).
        self.keys_in_python = all(_routes_as_python(schema.field(c).type) for c in key_columns)
        #: ``fill(row, columns) -> bytes``, see :func:`_fill_function`.
        self.fill = _fill_function(schema, self._omittable)

    def check(self, row: Mapping[str, Any]) -> tuple[tuple[Any, ...], int] | None:
        """The row's values in schema order and its estimated Arrow bytes; None when only
        an Arrow conversion can tell whether it fits.

        Raises:
            SchemaMismatch: unknown or missing columns, or a value Arrow
                would refuse.
        """
        values = []
        nbytes = 0
        found = 0
        for name, check, nullable in self._fields:
            v = row.get(name, _MISSING)
            if v is _MISSING:  # every column needs a value (None for a nullable one)
                if name not in self._omittable:
                    self._refuse_columns(row)
                v = None
            else:
                found += 1
            if v is None:
                if not nullable:
                    raise SchemaMismatch(f"column {name!r} is not nullable but the row holds None")
            else:
                try:
                    size = check(v)
                except _Refused as exc:
                    raise SchemaMismatch(
                        f"column {name!r} cannot hold the row's value: {exc}", column=name
                    ) from None
                if size < 0:
                    return None
                nbytes += size
            values.append(v)
        if found != len(row):
            self._refuse_columns(row)
        return tuple(values), nbytes

    def _refuse_columns(self, row: Mapping[str, Any]) -> None:
        extra = sorted(str(k) for k in row if k not in self._names)
        missing = [n for n, _, _ in self._fields if n not in row and n not in self._omittable]
        raise columns_mismatch("the row", extra, missing)

    def check_columns(self, row: Mapping[str, Any]) -> None:
        """Refuse unknown and missing columns (for rows Arrow converts:
        ``from_pylist`` would drop unknown keys silently)."""
        if not self._names.issuperset(row) or not self._required.issubset(row):
            self._refuse_columns(row)

    def key(self, values: tuple[Any, ...]) -> list[Any]:
        """The key values of a checked row, as ``route_by_key`` sees them."""
        out = []
        for i, as_float in zip(self.key_index, self._float_keys, strict=True):
            v = values[i]
            out.append(float(v) if as_float and v is not None else v)
        return out


_ARROW_REFUSALS = (pa.ArrowException, OverflowError, TypeError, ValueError)


def columns_to_batch(columns: Sequence[Sequence[Any]], schema: pa.Schema) -> pa.RecordBatch:
    """One record batch of checked values, one sequence per column in schema order; each
    column is converted (and so type-checked) by Arrow in one call.

    Raises:
        SchemaMismatch: Arrow refused a value after all (the check let it through); the
            message names the column and the first value refused.
    """
    arrays = []
    for f, col in zip(schema, columns, strict=True):
        try:
            # Decimals made exact first: Arrow itself may crash on an extreme exponent.
            arr = pa.array(rescaled_column(col, f), type=f.type)
        except _ARROW_REFUSALS as exc:
            raise _refused_value(f, col, exc) from exc
        if not f.nullable and arr.null_count:
            raise SchemaMismatch(f"column {f.name!r} is not nullable but holds None", column=f.name)
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _refused_value(f: pa.Field, col: Sequence[Any], exc: BaseException) -> SchemaMismatch:
    """The one-sentence error for the first value of ``col`` Arrow refuses for ``f``."""
    for v in col:
        try:
            pa.array(rescaled_column([v], f), type=f.type)
        except _ARROW_REFUSALS as one:
            return SchemaMismatch(
                f"column {f.name!r} cannot hold {type(v).__name__} {v!r:.60} as {f.type}: {one}",
                column=f.name,
            )
    return SchemaMismatch(f"column {f.name!r} cannot be stored as {f.type}: {exc}", column=f.name)


def values_to_batch(rows: Sequence[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    """One record batch of checked rows (values in schema order), see
    :func:`columns_to_batch`."""
    if not rows:
        return pa.RecordBatch.from_pylist([], schema=schema)
    return columns_to_batch(list(zip(*rows, strict=True)), schema)
