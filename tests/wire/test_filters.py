"""The scan filter language: parsing, binding with SQL semantics, Arrow evaluation, limits."""

from __future__ import annotations

import datetime as dt
import decimal
import operator
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cold.iceberg.filters import to_pyiceberg
from gateway.wire.errors import InvalidRequest
from gateway.wire.filters import (
    ALWAYS_FALSE,
    Compare,
    FilterLimits,
    In,
    IsNull,
    bind,
    compile_filter,
    parse,
    to_arrow,
    to_text,
)

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("small", pa.int8()),
        ("tag", pa.string()),
        ("f", pa.float32()),
        ("d", pa.float64()),
        ("price", pa.decimal128(10, 2)),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("day", pa.date32()),
        ("tags", pa.list_(pa.int32())),
        ("blob", pa.binary()),
        ("_partition", pa.int32()),
    ]
)


def rows_kept(text: str, table: pa.Table) -> list[Any]:
    expr = compile_filter(text, table.schema)
    if expr is None:
        return table.column(0).to_pylist()
    return table.filter(to_arrow(expr, table.schema)).column(0).to_pylist()


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("id > 1.5", "id >= 2"),
        ("id >= 1.5", "id >= 2"),
        ("id < 1.5", "id <= 1"),
        ("id <= 1.5", "id <= 1"),
        ("id = 1.5", "false"),
        ("id != 1.5", "id is not null"),
        ("id = 2.0", "id = 2"),
        ("small > 300", "false"),
        ("small < 300", "small is not null"),
        ("small >= -128", "small is not null"),
        ("id in (1.5, 2, 2)", "id in (2)"),
        ("id not in (1.5)", "id is not null"),
        ("price > 1.234", "price >= 1.24"),
        ("price = 1.230", "price = 1.23"),
        ("price = 1.234", "false"),
        ("not (id > 3 and tag = 'x')", "(id <= 3) or (tag != 'x')"),
        ("not (id != 1.5)", "false"),
        ("not (small < 300)", "false"),
        ("id is nan", "false"),
        ("tag LIKE 'ab%' AND NOT id IS NULL", "(tag like 'ab%') and (id is not null)"),
        ("id is not nan", "true"),
        ("id == 3 or id <> 4", "(id = 3) or (id != 4)"),
        ('"id" > 2', "id >= 3"),
    ],
)
def test_binding_is_exact_and_normal(text: str, normal: str) -> None:
    bound = bind(parse(text), SCHEMA)
    assert to_text(bound) == normal
    # The text form reads back to the same tree.
    assert bind(parse(to_text(bound)), SCHEMA) == bound


def test_float_literals_against_integers_follow_sql() -> None:
    """Issue 18.3: ``id > 1.5`` missed id 2 and ``id = 1.5`` returned id 2 on hot rows."""
    t = pa.table({"id": pa.array([1, 2, 3, None], pa.int64())})
    assert rows_kept("id > 1.5", t) == [2, 3]
    assert rows_kept("id = 1.5", t) == []
    assert rows_kept("id != 1.5", t) == [1, 2, 3]
    assert rows_kept("id < 2.5", t) == [1, 2]
    assert rows_kept("id not in (1, 2.5)", t) == [2, 3]
    assert rows_kept("not (id in (1))", t) == [2, 3]


def test_nulls_stay_unknown_under_negation() -> None:
    t = pa.table(
        {
            "k": pa.array([1, 2, 3, 4]),
            "v": pa.array([1, None, 3, None], pa.int64()),
            "x": pa.array([1.0, None, float("nan"), 2.0]),
        }
    )
    assert rows_kept("not (v > 1)", t) == [1]
    assert rows_kept("not (v in (1))", t) == [3]
    assert rows_kept("v is null", t) == [2, 4]
    assert rows_kept("x is nan", t) == [3]
    # Iceberg: a null is not NaN.
    assert rows_kept("x is not nan", t) == [1, 2, 4]
    assert rows_kept("x = 'nan'", t) == []


def test_typed_literals() -> None:
    t = pa.table(
        {
            "ts": pa.array(
                [dt.datetime(2024, 1, 1, tzinfo=dt.UTC), dt.datetime(2024, 6, 1, tzinfo=dt.UTC)],
                pa.timestamp("us", tz="UTC"),
            ),
            "day": pa.array([dt.date(2024, 1, 1), dt.date(2024, 6, 1)]),
            "price": pa.array(
                [decimal.Decimal("1.25"), decimal.Decimal("9.99")], pa.decimal128(10, 2)
            ),
            "f": pa.array([1.1, 2.5], pa.float32()),
        }
    )
    assert len(rows_kept("ts >= '2024-03-01T00:00:00+00:00'", t)) == 1
    assert len(rows_kept("ts >= '2024-03-01T00:00:00'", t)) == 1  # naive text: UTC
    assert len(rows_kept("day < '2024-03-01'", t)) == 1
    assert len(rows_kept("price >= '9.99'", t)) == 1
    # float32 1.1 is not the double 1.1 (SQL widens the column, never rounds the literal).
    assert rows_kept("f = 1.1", t) == []
    assert len(rows_kept("f > 1.1", t)) == 2


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("v >>> 1", "cannot parse filter"),
        ("nope = 1", "nope"),
        ("tags = 1", "'tags'"),
        ("blob = 'a'", "'blob'"),
        ("tags is null", "'tags'"),
        ("tag = 5", "'tag'"),
        ("id = 'abc'", "'id'"),
        ("price = 'xyz'", "'price'"),
        ("ts > '2024-13-01'", "'ts'"),
        ("ts > 99999999999999999999", "'ts'"),
        ("tag like 'a_b%'", "prefix"),
        ("tag like 5", "pattern"),
        ("id in ()", "cannot parse"),
        ("id > ", "cannot parse"),
        ("(id > 1", "')'"),
        ("id = 1" + "0" * 100, "80 characters"),
        ("f > 'abc'", "'f'"),
    ],
)
def test_bad_filters_are_refused_naming_what_is_wrong(text: str, names: str) -> None:
    with pytest.raises(InvalidRequest, match=names.replace("(", r"\(").replace(")", r"\)")):
        compile_filter(text, SCHEMA)


def test_limits_bound_size_terms_and_depth() -> None:
    limits = FilterLimits(max_chars=1000, max_terms=50, max_depth=8)
    with pytest.raises(InvalidRequest, match="1000"):
        compile_filter("id = 1 or " * 200 + "id = 1", SCHEMA, limits)
    with pytest.raises(InvalidRequest, match="more than 50 terms"):
        compile_filter("id in (" + ", ".join(str(i) for i in range(60)) + ")", SCHEMA, limits)
    with pytest.raises(InvalidRequest, match="deeper than 8"):
        compile_filter("(" * 9 + "id = 1" + ")" * 9, SCHEMA, limits)
    with pytest.raises(InvalidRequest, match="deeper than 8"):
        compile_filter("not " * 9 + "id = 1", SCHEMA, limits)
    # Within the default limits, a long flat list evaluates through a balanced tree.
    text = " or ".join(f"id = {i}" for i in range(2000))
    t = pa.table({"id": pa.array(range(0, 4000, 3), pa.int64())})
    assert len(rows_kept(text, t)) == len(range(0, 2000, 3))
    assert to_pyiceberg(compile_filter(text, SCHEMA), SCHEMA) is not None


def test_empty_and_trivial_filters() -> None:
    assert compile_filter(None, SCHEMA) is None
    assert compile_filter("  ", SCHEMA) is None
    assert compile_filter("true or id = 1", SCHEMA) is None
    assert compile_filter("false and id = 1", SCHEMA) == ALWAYS_FALSE
    with pytest.raises(InvalidRequest):
        compile_filter(5, SCHEMA)  # type: ignore[arg-type]


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.integers(-128, 127)), min_size=1, max_size=30),
    op=st.sampled_from(sorted(_OPS)),
    literal=st.one_of(
        st.integers(-1000, 1000),
        st.decimals(-300, 300, places=2, allow_nan=False, allow_infinity=False),
    ),
    negate=st.booleans(),
)
def test_integer_comparisons_match_exact_arithmetic(
    values: list[int | None], op: str, literal: int | decimal.Decimal, negate: bool
) -> None:
    """Whatever the literal, an int8 column keeps exactly the rows exact arithmetic keeps
    (SQL: a null compares unknown, and stays unknown under 'not')."""
    t = pa.table({"v": pa.array(values, pa.int8())})
    text = f"v {op} {literal}"
    if negate:
        text = f"not ({text})"
    expr = compile_filter(text, t.schema)
    kept = t.filter(to_arrow(expr, t.schema)).column("v").to_pylist() if expr else values
    want = [
        v
        for v in values
        if v is not None and _OPS[op](decimal.Decimal(v), decimal.Decimal(literal)) != negate
    ]
    assert kept == want


def test_decimal_grids_of_38_digits_are_exact_at_both_ends() -> None:
    """Issue 33: the range of a decimal128(38, s) column was computed in 28-digit
    arithmetic, so its ends rounded to 10**(38-s) and a literal there bound to a value no
    column holds (Arrow then refused it: a 500)."""
    schema = pa.schema([pa.field("c", pa.decimal128(38, 38)), pa.field("b", pa.decimal128(38, 0))])
    top = "0." + "9" * 38
    assert compile_filter("c in (-1, 1)", schema) == ALWAYS_FALSE
    assert compile_filter("c = -1", schema) == ALWAYS_FALSE
    assert compile_filter("c > -1", schema) == IsNull("c", True)
    assert compile_filter(f"c >= -{top}", schema) == IsNull("c", True)
    assert compile_filter(f"c <= {top}", schema) == IsNull("c", True)
    assert compile_filter(f"c = -{top}", schema) == Compare("c", "=", decimal.Decimal(f"-{top}"))
    big = "9" * 38
    assert compile_filter(f"b < -{big}", schema) == ALWAYS_FALSE
    assert compile_filter(f"b = -1{'0' * 38}", schema) == ALWAYS_FALSE
    assert compile_filter(f"b in (-{big}, {big})", schema) == In(
        "b", (decimal.Decimal(f"-{big}"), decimal.Decimal(big)), False
    )
    # Every bound literal converts to the column's Arrow type.
    for text in [f"c = -{top}", f"b in (-{big}, {big})", "c > -1", "c >= 7E-9223372036854775809"]:
        bound = compile_filter(text, schema)
        if bound is not None:
            pa.table(
                {"c": pa.nulls(1, schema.field("c").type), "b": pa.nulls(1, pa.decimal128(38, 0))}
            ).filter(to_arrow(bound, schema))
