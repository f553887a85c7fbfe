"""Key routing computed with Arrow compute (:func:`route_by_key`, the gateway's and the
SDK's batch path) sends every row where the row-by-row reference
(:func:`partition_for_key` on the values Arrow hands back, the SDK's dict-row path) sends
it, for every key type, and where the hashes of earlier versions sent it."""

from __future__ import annotations

import datetime as dt
import decimal
import string
from typing import Any

import hypothesis.strategies as st
import pyarrow as pa
from hypothesis import given, settings

from gateway.wire.routing import partition_for_key, route_by_key


def _reference(batch: pa.RecordBatch, keys: list[str], partitions: int) -> dict[int, list[int]]:
    values = [batch.column(k).to_pylist() for k in keys]
    groups: dict[int, list[int]] = {}
    for i, key in enumerate(zip(*values, strict=True)):
        groups.setdefault(partition_for_key(key, partitions), []).append(i)
    return dict(sorted(groups.items()))


def _routed(batch: pa.RecordBatch, keys: list[str], partitions: int) -> dict[int, list[int]]:
    return {p: idx.to_pylist() for p, idx in route_by_key(batch, keys, partitions).items()}


_TEXT = st.text(alphabet=string.printable + '"\\\u00e9\u2028\u65e5\U0001f600\x00\x1f\x7f')
#: Arrow type -> values of it (None: a null).
_KINDS: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "int8": (pa.int8(), st.integers(-128, 127)),
    "int16": (pa.int16(), st.integers(-(2**15), 2**15 - 1)),
    "int32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "bool": (pa.bool_(), st.booleans()),
    "string": (pa.string(), _TEXT),
    "large_string": (pa.large_string(), _TEXT),
    "float64": (pa.float64(), st.floats(allow_nan=True, allow_infinity=True)),
    "float32": (pa.float32(), st.floats(width=32)),
    "binary": (pa.binary(), st.binary(max_size=20)),
    "date32": (pa.date32(), st.dates()),
    "timestamp_us": (
        pa.timestamp("us", tz="UTC"),
        st.datetimes(timezones=st.just(dt.UTC)),
    ),
    "decimal": (pa.decimal128(10, 2), st.decimals(-(10**7), 10**7, places=2)),
}


@st.composite
def _batches(draw: st.DrawFn) -> tuple[pa.RecordBatch, list[str]]:
    kinds = draw(st.lists(st.sampled_from(sorted(_KINDS)), min_size=1, max_size=3))
    rows = draw(st.integers(0, 40))
    columns = {}
    for i, kind in enumerate(kinds):
        arrow_type, values = _KINDS[kind]
        column = draw(st.lists(st.none() | values, min_size=rows, max_size=rows))
        columns[f"k{i}"] = pa.array(column, arrow_type)
    return pa.record_batch(columns), list(columns)


@settings(max_examples=150, deadline=None)
@given(_batches(), st.integers(1, 64))
def test_vectorised_routing_matches_the_row_by_row_reference(
    drawn: tuple[pa.RecordBatch, list[str]], partitions: int
) -> None:
    batch, keys = drawn
    assert _routed(batch, keys, partitions) == _reference(batch, keys, partitions)


def test_a_sliced_batch_routes_as_its_rows() -> None:
    batch = pa.record_batch(
        {"k": pa.array([f"u{i}" if i % 5 else None for i in range(100)]), "n": list(range(100))}
    )
    part = batch.slice(17, 50)
    assert _routed(part, ["k", "n"], 7) == _reference(part, ["k", "n"], 7)


def test_partitions_of_earlier_versions_are_kept() -> None:
    # Computed by the row-by-row routing of the versions before this one (crc32 of the
    # compact JSON of the key values): a key must never move.
    pinned: list[tuple[list[Any], int, int]] = [
        ([42], 8, 3),
        (["user-1"], 8, 5),
        (["a", 1, True], 5, 3),
        ([None], 3, 2),
        (['quote"back\\slash'], 10, 5),
        (["日本"], 7, 0),
        ([-(2**63)], 64, 50),
    ]
    for values, partitions, want in pinned:
        assert partition_for_key(values, partitions) == want, values
        columns = {f"k{i}": pa.array([v]) for i, v in enumerate(values)}
        batch = pa.record_batch(columns)
        assert _routed(batch, list(columns), partitions) == {want: [0]}, values
    # And the types routed row by row (floats, decimals, dates) keep theirs too.
    batch = pa.record_batch(
        {
            "f": pa.array([1.5]),
            "d": pa.array([decimal.Decimal("3.10")], pa.decimal128(5, 2)),
            "t": pa.array([dt.date(2026, 1, 2)]),
        }
    )
    assert _routed(batch, ["f", "d", "t"], 9) == _reference(batch, ["f", "d", "t"], 9)
