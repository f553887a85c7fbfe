"""Rows as values: the HTTP edge's ``{"rows": [...]}`` bodies and answers, the CLI's JSON
lines, and the SDK's dict rows.

Values follow the column's Arrow type: timestamps as ISO-8601 strings (``Z`` for UTC) or
integer microseconds, decimals as strings or numbers, binary as base64, dates and times as
ISO strings. :func:`rows_to_batch` takes exactly that (JSON); :func:`python_rows_to_batch`
takes the same forms and, besides, the Python objects pyarrow builds columns from
(``datetime``, ``Decimal``, ``bytes``, numpy scalars...), so a row any interface accepts
is accepted by every other one.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import json
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from gateway.wire.errors import MalformedPayload, SchemaMismatch
from gateway.wire.schema import columns_mismatch
from gateway.wire.values import exact_decimal, rescaled_column, to_decimal

__all__ = ["batch_to_rows", "parse_json", "python_rows_to_batch", "rows_to_batch"]


class _Said(ValueError):
    """A refusal whose message is the whole sentence (no type and value appended)."""


def _int_range(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    if pa.types.is_unsigned_integer(t):
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _from_json(value: Any, t: pa.DataType, where: str) -> Any:
    """A JSON value as the Python value pyarrow builds ``t`` from."""
    if value is None:
        return None
    try:
        if pa.types.is_boolean(t):
            if not isinstance(value, bool):
                raise TypeError("expected true or false")
            return value
        if pa.types.is_integer(t):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError("expected an integer")
            lo, hi = _int_range(t)
            if not lo <= value <= hi:
                raise _Said(f"{str(value)[:80]} is out of range for {t} ({lo} to {hi})")
            return value
        if pa.types.is_floating(t):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError("expected a number")
            return float(value)
        if pa.types.is_string(t):
            if not isinstance(value, str):
                raise TypeError("expected a string")
            if not value.isascii():
                value.encode("utf-8")  # a lone surrogate (JSON's \ud800) is no text
            return value
        if pa.types.is_binary(t):
            if not isinstance(value, str):
                raise TypeError("expected a base64 string")
            return base64.b64decode(value, validate=True)
        if pa.types.is_decimal(t):
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise TypeError("expected a decimal string or number")
            return to_decimal(value, t.precision, t.scale)
        if pa.types.is_timestamp(t):
            return _timestamp_from_json(value, t)
        if pa.types.is_date(t):
            if not isinstance(value, str):
                raise TypeError("expected an ISO date string")
            return dt.date.fromisoformat(value)
        if pa.types.is_time(t):
            if not isinstance(value, str):
                raise TypeError("expected an ISO time string")
            return dt.time.fromisoformat(value)
        if pa.types.is_list(t):
            if not isinstance(value, list):
                raise TypeError("expected an array")
            return [_from_json(v, t.value_type, f"{where}[{i}]") for i, v in enumerate(value)]
        if pa.types.is_struct(t):
            if not isinstance(value, dict):
                raise TypeError("expected an object")
            return _struct(value, t, where, _from_json)
    except (
        TypeError,
        ValueError,
        OverflowError,
        RecursionError,
        decimal.InvalidOperation,
        binascii.Error,
    ) as exc:
        if isinstance(exc, _Said) or (pa.types.is_decimal(t) and isinstance(exc, ValueError)):
            raise SchemaMismatch(f"{where}: {exc}", column=where.rpartition(".")[2]) from exc
        raise SchemaMismatch(f"{where}: {exc} for type {t}, got {value!r:.80}") from exc
    raise SchemaMismatch(f"{where}: type {t} cannot be written from JSON")  # pragma: no cover


def _struct(value: Mapping[Any, Any], t: pa.StructType, where: str, convert: Any) -> dict[str, Any]:
    """A struct value's fields, each converted by ``convert``.

    Raises:
        TypeError: the value has keys the struct does not.
    """
    names = {t.field(i).name for i in range(t.num_fields)}
    extra = set(value) - names
    if extra:
        raise TypeError(f"unexpected key(s) {sorted(map(str, extra))}")
    return {
        t.field(i).name: convert(
            value.get(t.field(i).name), t.field(i).type, f"{where}.{t.field(i).name}"
        )
        for i in range(t.num_fields)
    }


def _timestamp_from_json(value: Any, t: pa.TimestampType) -> Any:
    if isinstance(value, bool):
        raise TypeError("expected an ISO-8601 string or integer microseconds")
    if isinstance(value, int):
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC if t.tz else None)
        return epoch + dt.timedelta(microseconds=value)
    if not isinstance(value, str):
        raise TypeError("expected an ISO-8601 string or integer microseconds")
    parsed = dt.datetime.fromisoformat(value)
    if t.tz is not None:
        if parsed.tzinfo is None:
            raise ValueError("a zoned timestamp needs an offset, e.g. 'Z' or '+00:00'")
        return parsed.astimezone(dt.UTC)
    if parsed.tzinfo is not None:
        raise ValueError("a naive timestamp column takes no offset")
    return parsed


def rows_to_batch(
    rows: Any,
    schema: pa.Schema,
    *,
    first: int = 0,
    unit: str = "row",
    omittable: Collection[str] = (),
) -> pa.RecordBatch:
    """JSON rows (a list of objects) as a batch of ``schema``; errors name the faulty
    ``unit`` by its number, counted from ``first`` (``line`` 1 for a file of JSON lines).
    A column named in ``omittable`` (added by a schema change) may be left out: null.

    Raises:
        MalformedPayload: ``rows`` is not a non-empty list of objects.
        SchemaMismatch: extra, missing or mistyped fields (named with their row index).
    """
    if not isinstance(rows, list) or not rows:
        raise MalformedPayload("'rows' must be a non-empty array of objects")
    simple = _simple_batch(rows, schema)
    if simple is not None:
        return simple
    return _converted_batch(rows, schema, first, unit, omittable)


def _converted_batch(
    rows: list[Any], schema: pa.Schema, first: int, unit: str, omittable: Collection[str]
) -> pa.RecordBatch:
    """:func:`rows_to_batch` one value at a time: every form of every type, and the
    sentence that names a refused row and column."""
    names = schema.names
    name_set = set(names)
    columns: dict[str, list[Any]] = {n: [] for n in names}
    for i, row in enumerate(rows, first):
        if not isinstance(row, dict):
            raise MalformedPayload(f"{unit} {i} is not an object")
        extra = set(row) - name_set
        missing = name_set - set(row) - set(omittable)
        if extra or missing:
            raise columns_mismatch(f"{unit} {i}", sorted(extra), sorted(missing))
        for f in schema:
            columns[f.name].append(_from_json(row.get(f.name), f.type, f"{unit} {i}.{f.name}"))
    return _columns_to_batch(columns, schema, first, unit)


#: The Python types of JSON values that Arrow builds each simple column kind from exactly
#: as :func:`_from_json` converts them (a bool is no integer; an integer is a float).
_SIMPLE_KINDS: tuple[tuple[Any, frozenset[type]], ...] = (
    (pa.types.is_boolean, frozenset({bool, type(None)})),
    (pa.types.is_integer, frozenset({int, type(None)})),
    (pa.types.is_floating, frozenset({int, float, type(None)})),
    (pa.types.is_string, frozenset({str, type(None)})),
)


def _simple_kind(t: pa.DataType) -> frozenset[type] | None:
    for test, kinds in _SIMPLE_KINDS:
        if test(t):
            return kinds
    return None


def _simple_batch(rows: list[Any], schema: pa.Schema) -> pa.RecordBatch | None:
    """The batch of rows whose every object has exactly the table's columns, each a bool,
    integer, float or string column given values of its own JSON kind, built a column at a
    time (the rows of an append or a Kafka batch are mostly such); None when any row or
    value is otherwise, for :func:`_converted_batch` to convert or name what it refuses."""
    kinds = [k for k in (_simple_kind(f.type) for f in schema) if k is not None]
    if len(kinds) < len(schema):
        return None
    names = set(schema.names)
    try:
        if not all(row.keys() == names for row in rows):
            return None
    except AttributeError:  # a row that is no object
        return None
    arrays = []
    for f, allowed in zip(schema, kinds, strict=True):
        values = [row[f.name] for row in rows]
        found = set(map(type, values))
        if not found <= allowed or (not f.nullable and type(None) in found):
            return None
        try:
            arrays.append(pa.array(values, type=f.type))
        except (pa.ArrowException, OverflowError, TypeError, ValueError, UnicodeError):
            return None  # out of range, a lone surrogate: named by the converting path
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _columns_to_batch(
    columns: dict[str, list[Any]], schema: pa.Schema, first: int, unit: str
) -> pa.RecordBatch:
    """Converted values, one list per column, as a batch; a value Arrow still refuses is
    named by its row (``unit`` number from ``first``) and column."""
    arrays = []
    for f in schema:
        values = columns[f.name]
        try:
            arrays.append(pa.array(rescaled_column(values, f), type=f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as exc:
            raise _refused_in_column(f, values, first, unit, exc) from exc
        if not f.nullable and arrays[-1].null_count:
            at = first + next(i for i, v in enumerate(values) if v is None)
            raise SchemaMismatch(
                f"{unit} {at}.{f.name}: the column is not nullable but the value is null",
                column=f.name,
            )
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _refused_in_column(
    f: pa.Field, values: Sequence[Any], first: int, unit: str, exc: BaseException
) -> SchemaMismatch:
    """The error for the first value of ``values`` that Arrow refuses for ``f``."""
    for i, v in enumerate(values):
        try:
            pa.array(rescaled_column([v], f), type=f.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as one:
            reason = str(one).splitlines()[0] if str(one) else type(one).__name__
            return SchemaMismatch(
                f"{unit} {first + i}.{f.name}: {type(v).__name__} {v!r:.60} cannot be stored "
                f"as {f.type} ({reason})",
                column=f.name,
            )
    return SchemaMismatch(f"column {f.name!r} cannot be stored as {f.type}: {exc}", column=f.name)


def _from_python(value: Any, t: pa.DataType, where: str) -> Any:
    """A Python value of a dict row as the value pyarrow builds ``t`` from: the JSON forms
    converted as :func:`rows_to_batch` converts them (an ISO-8601 string for a timestamp,
    a string for a decimal...), other objects (``datetime``, ``Decimal``, ``bytes``, numpy
    scalars) left for Arrow, which knows them."""
    if value is None:
        return None
    if isinstance(value, list | tuple) and (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return [_from_python(v, t.value_type, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping) and pa.types.is_struct(t):
        try:
            return _struct(value, t, where, _from_python)
        except TypeError as exc:
            raise SchemaMismatch(f"{where}: {exc}") from None
    if isinstance(value, str | int | float | list | dict):  # bool is an int
        return _from_json(value, t, where)
    if isinstance(value, decimal.Decimal) and pa.types.is_decimal(t):
        try:
            return exact_decimal(value, t.precision, t.scale)
        except ValueError as exc:
            raise SchemaMismatch(f"{where}: {exc}", column=where.rpartition(".")[2]) from None
    return value


def python_rows_to_batch(
    rows: Sequence[Any],
    schema: pa.Schema,
    *,
    first: int = 1,
    unit: str = "row",
    omittable: Collection[str] = (),
) -> pa.RecordBatch:
    """Dict rows of Python values as a batch of ``schema``: every value the HTTP edge takes
    in JSON is taken here too (:func:`_from_python`). A column named in ``omittable`` may
    be left out (null). Errors name the row, counted from ``first``, and the column.

    Raises:
        SchemaMismatch: a row that is not a mapping, unknown or missing columns, or a
            value the column's type cannot hold.
    """
    names = schema.names
    name_set = set(names)
    columns: dict[str, list[Any]] = {n: [] for n in names}
    for i, row in enumerate(rows, first):
        if not isinstance(row, Mapping):
            raise SchemaMismatch(f"{unit} {i} is a {type(row).__name__}, not a dict of columns")
        keys = set(row)
        if not keys <= name_set or not name_set - set(omittable) <= keys:
            extra = sorted(str(k) for k in keys - name_set)
            missing = [n for n in names if n not in keys and n not in omittable]
            raise columns_mismatch(f"{unit} {i}", extra, missing)
        for f in schema:
            columns[f.name].append(_from_python(row.get(f.name), f.type, f"{unit} {i}.{f.name}"))
    return _columns_to_batch(columns, schema, first, unit)


def _to_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    return value


def batch_to_rows(batches: Iterable[pa.RecordBatch]) -> list[dict[str, Any]]:
    """JSON-ready rows: timestamps ISO-8601 (``Z`` for UTC), decimals as strings, binary
    as base64."""
    out: list[dict[str, Any]] = []
    for b in batches:
        if _json_as_is(b):
            out.extend(b.to_pylist())
            continue
        for row in b.to_pylist():
            out.append({k: _to_json(v) for k, v in row.items()})
    return out


def _json_as_is(b: pa.RecordBatch) -> bool:
    """Whether every value of ``b`` is its own JSON (bool, integer and string columns, and
    float columns without NaN or infinities), so its rows need no conversion."""
    for f, column in zip(b.schema, b.columns, strict=True):
        if pa.types.is_floating(f.type):
            if column.null_count < len(column) and not pc.all(pc.is_finite(column)).as_py():
                return False
        elif _simple_kind(f.type) is None:
            return False
    return True


def parse_json(body: bytes) -> Any:
    """Parse a JSON body.

    Raises:
        MalformedPayload: not UTF-8 JSON.
    """
    try:
        return json.loads(body)
    except RecursionError:
        raise MalformedPayload("body is not accepted: JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise MalformedPayload(f"body is not valid JSON: {exc}") from None
    except UnicodeDecodeError:
        raise MalformedPayload("body is not valid JSON: it is not UTF-8 text") from None
    except ValueError:  # an integer longer than Python converts from text
        raise MalformedPayload(
            f"body is not accepted: a number in it has more than {sys.get_int_max_str_digits()} "
            "digits"
        ) from None
