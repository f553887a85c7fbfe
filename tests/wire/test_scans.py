"""A scan's projection and limit, checked alike by the gateway's scan and the SDK's
client-side one (gateway/wire/scans.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from gateway.wire.errors import InvalidRequest
from gateway.wire.scans import INT64_MAX, check_limit, projection

STORED = pa.schema([("v", pa.int64()), ("tag", pa.string()), ("_offset", pa.int64())])


def test_projection_answers_the_columns_asked_in_order() -> None:
    assert projection(STORED, None) == ["v", "tag", "_offset"]
    assert projection(STORED, []) == ["v", "tag", "_offset"]
    assert projection(STORED, ["_offset", "v"]) == ["_offset", "v"]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ("v", "columns must be a list of column names"),
        (["v", 3], "columns must be a list of column names"),
        (["v", "nope", "gone"], r"unknown column\(s\) \['nope', 'gone'\]; the table has "),
        (["v", "v"], "a column is named twice in columns"),
    ],
)
def test_projection_refuses_bad_columns_in_one_sentence(columns: object, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message) as err:
        projection(STORED, columns)  # type: ignore[arg-type]
    if "unknown" in message:
        assert err.value.details["unknown"] == "nope,gone"
        assert "['v', 'tag', '_offset']" in str(err.value)


@pytest.mark.parametrize("limit", [None, 0, 1, INT64_MAX])
def test_limits_in_range_pass(limit: int | None) -> None:
    check_limit(limit)


@pytest.mark.parametrize("limit", [-1, INT64_MAX + 1, True, 1.5, "10"])
def test_limits_out_of_range_are_refused(limit: object) -> None:
    with pytest.raises(InvalidRequest, match=f"limit must be an integer from 0 to {INT64_MAX}"):
        check_limit(limit)
