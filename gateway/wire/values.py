"""Python values checked before Arrow builds a column from them.

Arrow's own converters trust their input in places: ``pa.array([Decimal('0E-999999999')],
pa.decimal128(10, 2))`` (and the same text cast from a string, or read from CSV) kills the
process instead of raising. Every conversion of a caller's values into Arrow therefore goes
through this module first: a decimal is rescaled here, exactly, to its column's scale, or
refused with a sentence saying what fits; nested lists and structs are walked for the
decimals they hold. What reaches Arrow is then a value it is known to handle.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

__all__ = [
    "decimal_fits",
    "exact_decimal",
    "has_decimal",
    "rescaled",
    "rescaled_column",
    "rescaled_rows",
    "to_decimal",
]

#: The longest decimal text taken (a decimal128 has at most 38 digits; the rest is sign,
#: point, exponent and zeros a caller may pad with).
MAX_DECIMAL_CHARS = 200


def decimal_fits(precision: int, scale: int) -> str:
    """What a ``decimal128(precision, scale)`` holds, in words, with an example."""
    before = precision - scale
    example = ("1" * min(2, before) or "0") + ("." + "5" * scale if scale else "")
    return (
        f"decimal128({precision}, {scale}) holds up to {before} digits before the point "
        f'and {scale} after, e.g. "{example}"'
    )


def to_decimal(value: str | int | float, precision: int, scale: int) -> decimal.Decimal:
    """A decimal string or number as a decimal of exactly ``scale`` digits after the point.

    Raises:
        ValueError: not a decimal number, too long, or not held by the type exactly;
            the message says what fits.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        d = decimal.Decimal(value)  # no str(): an int of 5,000 digits is refused below
    else:
        text = str(value).strip()
        if len(text) > MAX_DECIMAL_CHARS:
            raise ValueError(
                f"{text[:40]!r}... has {len(text)} characters; {decimal_fits(precision, scale)}"
            )
        try:
            d = decimal.Decimal(text)
        except decimal.InvalidOperation:
            raise ValueError(
                f"{text[:40]!r} is not a decimal number; {decimal_fits(precision, scale)}"
            ) from None
    return exact_decimal(d, precision, scale)


def exact_decimal(d: decimal.Decimal, precision: int, scale: int) -> decimal.Decimal:
    """``d`` with exactly ``scale`` digits after the point and at most ``precision`` in all,
    so that Arrow stores it without rescaling anything; any exponent is taken (``0E-9999``
    is a zero, ``1.50E+1`` is fifteen).

    Raises:
        ValueError: not finite, or more digits before or after the point than the type
            holds; the message says what fits.
    """
    if not d.is_finite():
        raise ValueError(f"{d} is not a finite number; {decimal_fits(precision, scale)}")
    sign, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int)
    # Trailing zeros of the coefficient only move the exponent.
    n = len(digits)
    while n > 1 and digits[n - 1] == 0:
        n -= 1
    exponent += len(digits) - n
    digits = digits[:n]
    if digits == (0,):
        return decimal.Decimal((0, (0,), -scale))
    before = len(digits) + exponent
    if exponent < -scale:
        raise ValueError(
            f"{_shown(d)} has {-exponent} digits after the point; {decimal_fits(precision, scale)}"
        )
    if before > precision - scale:
        raise ValueError(
            f"{_shown(d)} has {before} digits before the point; {decimal_fits(precision, scale)}"
        )
    return decimal.Decimal((sign, digits + (0,) * (exponent + scale), -scale))


def _shown(d: decimal.Decimal) -> str:
    text = str(d)
    return text if len(text) <= 48 else text[:45] + "..."


def has_decimal(t: pa.DataType) -> bool:
    """Whether values of ``t`` hold decimals anywhere (in lists and structs too)."""
    if pa.types.is_decimal(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return has_decimal(t.value_type)
    if pa.types.is_struct(t):
        return any(has_decimal(t.field(i).type) for i in range(t.num_fields))
    return False


def rescaled(t: pa.DataType) -> Callable[[Any], Any] | None:
    """A function that hands a Python value of ``t`` back with every ``Decimal`` in it
    made exact for its decimal type (:func:`exact_decimal`), anything else as it is; None
    when ``t`` holds no decimal (nothing to do).

    The function raises ValueError for a decimal the type cannot hold."""
    if not has_decimal(t):
        return None
    if pa.types.is_decimal(t):
        precision, scale = t.precision, t.scale

        def one(v: Any) -> Any:
            if isinstance(v, decimal.Decimal):
                return exact_decimal(v, precision, scale)
            return v

        return one
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = rescaled(t.value_type)
        assert inner is not None

        def items(v: Any) -> Any:
            if isinstance(v, list | tuple):
                return [inner(x) for x in v]
            return v

        return items
    fields: Sequence[tuple[str, Callable[[Any], Any] | None]] = [
        (t.field(i).name, rescaled(t.field(i).type)) for i in range(t.num_fields)
    ]

    def struct(v: Any) -> Any:
        if isinstance(v, dict):
            out = dict(v)
            for name, fn in fields:
                if fn is not None and name in out:
                    out[name] = fn(out[name])
            return out
        return v

    return struct


def rescaled_column(values: Sequence[Any], f: pa.Field) -> Sequence[Any]:
    """``values`` of column ``f`` with their decimals made exact (:func:`rescaled`); the
    same sequence when the column holds no decimal.

    Raises:
        ValueError: naming the column, for a decimal its type cannot hold.
    """
    fn = rescaled(f.type)
    if fn is None:
        return values
    try:
        return [None if v is None else fn(v) for v in values]
    except ValueError as exc:
        raise ValueError(f"column {f.name!r}: {exc}") from None


def rescaled_rows(rows: Sequence[Any], schema: pa.Schema) -> Sequence[Any]:
    """Dict rows with the decimals of ``schema``'s columns made exact (:func:`rescaled`);
    the same rows when the schema holds no decimal. Anything not a dict is left as it is
    for Arrow to refuse.

    Raises:
        ValueError: naming the column, for a decimal its type cannot hold.
    """
    fns = [(f.name, fn) for f in schema if (fn := rescaled(f.type)) is not None]
    if not fns:
        return rows
    out = []
    for row in rows:
        if isinstance(row, Mapping):
            row = dict(row)
            for name, fn in fns:
                v = row.get(name)
                if v is not None:
                    try:
                        row[name] = fn(v)
                    except ValueError as exc:
                        raise ValueError(f"column {name!r}: {exc}") from None
        out.append(row)
    return out
