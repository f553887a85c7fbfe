"""The producer's fast path for rows given as Python dicts (no I/O, no Arrow per row).

Converting every sent dict to its own Arrow record batch costs tens of microseconds; a
:class:`RowPlan`, built once per table schema, checks a dict in plain Python instead and
keeps its values, so a whole request's rows become Arrow once, when the batch is sealed
(:func:`values_to_batch`).

The check is conservative, per value:

- *fits*: the value surely converts to the column's Arrow type (an ``int`` in range for
  ``int64``, a ``str`` for ``string``, a ``datetime`` for ``timestamp``, ...);
- *does not fit*: Arrow would refuse it too (a ``str`` for ``int64``, ``300`` for
  ``int8``, a ``None`` in a non-nullable column): :class:`SchemaMismatch` at once;
- *unsure* (numpy scalars, ``bytearray``, ints for timestamps, lists and structs, ...): the
  row goes the Arrow way, converted at once, which gives exactly the old behaviour.

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

__all__ = ["RowPlan", "values_to_batch"]

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
            raise _Refused(f"{v} is out of range for int{bits}")
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
    if isinstance(v, int | float):
        raise _refuse(v, "bytes")
    return UNSURE


def _timestamp_check(v: Any) -> int:
    if isinstance(v, dt.datetime):
        return 8
    if isinstance(v, dt.date | str):
        raise _refuse(v, "a datetime")
    return UNSURE


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
            if not v.is_finite():
                raise _Refused(f"{v} is not a finite decimal")
            _, digits, exponent = v.as_tuple()
            assert isinstance(exponent, int)
            if exponent >= -scale and len(digits) + exponent + scale <= precision:
                return 16
            return UNSURE  # trailing zeros may still rescale; Arrow decides
        if isinstance(v, float | str):
            raise _refuse(v, "a Decimal or an int")
        return UNSURE

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


def values_to_batch(rows: Sequence[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    """One record batch of checked rows (values in schema order).

    Raises:
        SchemaMismatch: Arrow refused a value after all (the check let it through).
    """
    columns = list(zip(*rows, strict=True))
    arrays = []
    for f, col in zip(schema, columns, strict=True):
        try:
            arr = pa.array(col, type=f.type)
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
            raise SchemaMismatch(f"column {f.name!r} cannot be stored as {f.type}: {exc}") from exc
        if not f.nullable and arr.null_count:
            raise SchemaMismatch(f"column {f.name!r} is not nullable but holds nulls")
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
