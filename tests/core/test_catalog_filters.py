"""Issue 40: the Iceberg REST spec's expression JSON read into Tidegate's filter tree, in
both of the spec's forms, as pyiceberg 0.12 serialises its expressions; and refused in one
sentence where it names no column of the table or is not a filter."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from gateway.core.catalog_filters import from_iceberg_json
from gateway.wire.errors import InvalidRequest
from gateway.wire.filters import DEFAULT_LIMITS, FilterLimits, bind, to_arrow, to_text

SCHEMA = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("f", pa.float64()), ("_partition", pa.int32())]
)
ROWS = pa.table(
    {
        "id": [1, 2, 3, None],
        "name": ["ab", "b", None, "ac"],
        "f": [0.5, float("nan"), 2.0, 1.0],
        "_partition": pa.array([0, 1, 0, 1], pa.int32()),
    }
)


def kept(doc: Any, case_sensitive: bool = True) -> list[int | None]:
    tree = bind(from_iceberg_json(doc, SCHEMA.names, case_sensitive, DEFAULT_LIMITS), SCHEMA)
    return ROWS.filter(to_arrow(tree, SCHEMA))["id"].to_pylist()


def test_pyiceberg_expressions_mean_what_they_say() -> None:
    from pyiceberg.catalog.rest.scan_planning import PlanTableScanRequest
    from pyiceberg.expressions import (
        And,
        GreaterThanOrEqual,
        In,
        IsNaN,
        IsNull,
        Not,
        NotStartsWith,
        Or,
        StartsWith,
    )

    def sent(e: Any) -> Any:
        return PlanTableScanRequest(filter=e).model_dump(by_alias=True, mode="json")["filter"]

    assert kept(sent(GreaterThanOrEqual("id", 2))) == [2, 3]
    assert kept(sent(And(In("id", {1, 3}), StartsWith("name", "a")))) == [1]
    assert kept(sent(Or(IsNull("name"), IsNaN("f")))) == [2, 3]
    assert kept(sent(Not(In("id", {1, 2})))) == [3]
    assert kept(sent(NotStartsWith("name", "a"))) == [2]


def test_the_newer_form_and_typed_literals() -> None:
    ref = {"type": "reference", "name": "id"}
    assert kept({"type": "lt", "left": ref, "right": {"type": "literal", "value": 3}}) == [1, 2]
    values = {"type": "literals", "values": [2, 3], "data-type": "long"}
    assert kept({"type": "not-in", "child": ref, "values": values}) == [1]
    assert kept({"type": "not-null", "child": "name"}) == [1, 2, None]
    assert kept(True) == [1, 2, 3, None] and kept({"type": "false"}) == []


def test_names_ignore_case_when_asked() -> None:
    doc = {"type": "eq", "term": "ID", "value": 2}
    assert kept(doc, case_sensitive=False) == [2]
    with pytest.raises(InvalidRequest, match="unknown column 'ID'"):
        kept(doc)


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"type": "gt", "term": "nope", "value": 1}, "unknown column 'nope'"),
        ({"type": "gt", "term": "id", "value": "x"}, "column 'id' is int64"),
        ({"type": "bogus"}, "unknown expression type 'bogus'"),
        ("id > 1", "an expression is true, false or an object"),
        ({"type": "and", "left": True}, "'and' needs 'left' and 'right'"),
        ({"type": "in", "term": "id", "values": []}, "non-empty list"),
        ({"type": "eq", "term": {"type": "transform", "transform": "day"}}, "transforms"),
        ({"type": "eq", "term": {"type": "reference", "id": 1}, "value": 1}, "by field id"),
        ({"type": "eq", "term": "id", "value": [1]}, "is not a literal"),
        ({"type": "starts-with", "term": "name", "value": 1}, "takes a string prefix"),
    ],
)
def test_what_is_refused_in_one_sentence(doc: Any, words: str) -> None:
    with pytest.raises(InvalidRequest, match="invalid filter") as err:
        kept(doc)
    assert words in err.value.message and "\n" not in err.value.message


def test_limits_bound_depth_and_terms() -> None:
    deep: Any = {"type": "eq", "term": "id", "value": 1}
    for _ in range(100):
        deep = {"type": "not", "child": deep}
    with pytest.raises(InvalidRequest, match="nested deeper than 64"):
        kept(deep)
    wide = {"type": "in", "term": "id", "values": list(range(50))}
    small = FilterLimits(max_terms=10)
    with pytest.raises(InvalidRequest, match="more than 10 predicates"):
        from_iceberg_json(wide, SCHEMA.names, True, small)
    assert to_text(from_iceberg_json(True, SCHEMA.names, True, small)) == "true"
