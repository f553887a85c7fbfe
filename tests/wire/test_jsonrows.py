"""JSON rows built a column at a time (the simple columns' fast path) answer exactly what
the value-at-a-time conversion answers: the same batch, or the same refusal sentence."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from gateway.wire.errors import MalformedPayload, SchemaMismatch
from gateway.wire.jsonrows import _converted_batch, _simple_batch, batch_to_rows, rows_to_batch

SCHEMA = pa.schema(
    [
        pa.field("i8", pa.int8()),
        pa.field("i64", pa.int64(), nullable=False),
        pa.field("u64", pa.uint64()),
        pa.field("f", pa.float64()),
        pa.field("f32", pa.float32()),
        pa.field("b", pa.bool_()),
        pa.field("s", pa.string()),
    ]
)
GOOD: dict[str, Any] = {"i8": 1, "i64": 2, "u64": 3, "f": 1.5, "f32": 2, "b": True, "s": "x"}

#: Values of every simple column that JSON can carry, the awkward ones above all.
EDGE_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    127,
    128,
    -129,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**63) - 1,
    10**400,
    1.0,
    -0.0,
    1.5,
    1e308,
    float("nan"),
    float("inf"),
    "",
    "7",
    "text",
    "é",
    "\ud800",
    [],
    {},
    [1],
]


def _outcome(convert: Any, rows: list[Any]) -> tuple[str, Any]:
    try:
        return "batch", convert(rows)
    except (SchemaMismatch, MalformedPayload) as err:
        return "refused", err.message


def _same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "refused":
        return bool(a[1] == b[1])
    # By each value's repr: NaN equals itself there, and -0.0 differs from 0.0.
    return bool(a[1].schema == b[1].schema and repr(a[1].to_pylist()) == repr(b[1].to_pylist()))


@pytest.mark.parametrize("column", SCHEMA.names)
def test_each_edge_value_is_taken_or_refused_as_the_value_path_does(column: str) -> None:
    for value in EDGE_VALUES:
        rows = [dict(GOOD), {**GOOD, column: value}]
        fast = _outcome(lambda r: rows_to_batch(r, SCHEMA), rows)
        slow = _outcome(lambda r: _converted_batch(r, SCHEMA, 0, "row", ()), rows)
        assert _same(fast, slow), (column, value, fast, slow)


def test_rows_missing_or_adding_a_column_are_refused_alike() -> None:
    missing = {k: v for k, v in GOOD.items() if k != "s"}
    extra = {**GOOD, "other": 1}
    for rows in ([GOOD, missing], [extra], [GOOD, 5], [GOOD, None]):
        fast = _outcome(lambda r: rows_to_batch(r, SCHEMA), rows)
        slow = _outcome(lambda r: _converted_batch(r, SCHEMA, 0, "row", ()), rows)
        assert fast[0] == "refused" and _same(fast, slow), (rows, fast, slow)
    # A column added by a schema change may be left out: the value path takes it as null.
    assert rows_to_batch([missing], SCHEMA, omittable={"s"}).column("s").null_count == 1


def test_plain_rows_take_the_column_path_and_read_back_as_they_came() -> None:
    rows = [dict(GOOD), {**GOOD, "i8": None, "f": None, "s": None, "b": False}]
    assert _simple_batch(rows, SCHEMA) is not None
    batch = rows_to_batch(rows, SCHEMA)
    assert batch_to_rows([batch]) == rows
    # Floats that JSON has no number for are written as strings, as before.
    odd = rows_to_batch([{**GOOD, "f": float("nan")}, {**GOOD, "f": float("-inf")}], SCHEMA)
    assert [r["f"] for r in batch_to_rows([odd])] == ["nan", "-inf"]
    # A column the fast path does not build (a timestamp) leaves it to the value path.
    stamped = pa.schema([pa.field("t", pa.timestamp("us", tz="UTC"))])
    assert _simple_batch([{"t": 0}], stamped) is None
    assert batch_to_rows([rows_to_batch([{"t": 0}], stamped)]) == [{"t": "1970-01-01T00:00:00Z"}]
