"""Type names, schema validation and JSON conversion."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.wire.errors import (
    InvalidSchema,
    MalformedPayload,
    SchemaChangeRefused,
    SchemaMismatch,
)
from gateway.wire.evolution import apply_changes
from gateway.wire.jsonrows import batch_to_rows, rows_to_batch
from gateway.wire.routing import partition_for_key, route_by_key
from gateway.wire.schema import (
    MAX_DOCS_CHARS,
    MAX_FIELDS,
    MAX_SCHEMA_CHARS,
    conform_batch,
    parse_fields,
    parse_fields_text,
    parse_type,
    with_system_columns,
)

ADMITTED = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "float",
    "double",
    "string",
    "binary",
    "date32[day]",
    "time64[us]",
    "timestamp[us]",
    "timestamp[us, tz=UTC]",
    "decimal128(38, 10)",
    "list<item: int64>",
    "struct<a: int32, b: list<item: string>>",
]


@pytest.mark.parametrize("name", ADMITTED)
def test_admitted_type_names_round_trip(name: str) -> None:
    t = parse_type(name)
    assert str(t) == name
    assert parse_type(str(t)) == t


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("uint32", "not supported"),
        ("timestamp[ns]", "microseconds"),
        ("timestamp[us, tz=America/New_York]", "UTC"),
        ("decimal128(40, 2)", "out of range"),
        ("list<int32", "expected"),
        ("map<string, int32>", "not supported"),
        ("", "non-empty"),
    ],
)
def test_refused_type_names_say_why(name: str, hint: str) -> None:
    with pytest.raises(InvalidSchema, match=hint):
        parse_type(name)


def test_field_rules() -> None:
    with pytest.raises(InvalidSchema, match="reserved"):
        parse_fields({"_offset": "int64"})
    with pytest.raises(InvalidSchema, match="twice"):
        parse_fields([{"name": "a", "type": "int64"}, {"name": "a", "type": "int32"}])
    with pytest.raises(InvalidSchema, match="start with a letter"):
        parse_fields({"1a": "int64"})
    with pytest.raises(InvalidSchema, match="unknown keys"):
        parse_fields([{"name": "a", "type": "int64", "default": 1}])
    schema = parse_fields([{"name": "a", "type": "int64", "nullable": False}])
    assert not schema.field("a").nullable


def test_names_that_differ_only_in_case_cannot_share_a_schema() -> None:
    """Issue 33.10: Spark, DuckDB and Trino match names without case, so ``a`` and ``A``
    (at the top or inside one struct, in lists too) are refused in one sentence naming
    both; a stored schema that has them (made before the rule) still loads."""
    cases = [
        ({"a": "int64", "A": "string"}, "columns 'a' and 'A' differ only in case"),
        ({"Name": "int64", "nAME": "int64"}, "columns 'Name' and 'nAME' differ only in case"),
        ({"s": "struct<k: int32, K: string>"}, "fields of struct column 's' 'k' and 'K'"),
        (
            {"l": "list<struct<x: struct<ab: int32, aB: int32>>>"},
            "struct column 'l.x' 'ab' and 'aB'",
        ),
        ({"s": "struct<k: int32, k: string>"}, "field 'k' of struct column 's' appears twice"),
    ]
    for spec, words in cases:
        with pytest.raises(InvalidSchema) as caught:
            parse_fields(spec)
        assert words in caught.value.message, caught.value.message
        assert "twice" in words or "Spark" in caught.value.message
    assert parse_fields({"a": "int64", "b": "struct<a: int32, A2: int32>"}).names == ["a", "b"]
    stored = [{"name": "a", "type": "int64"}, {"name": "A", "type": "int64"}]
    assert parse_fields(stored, stored=True).names == ["a", "A"]
    fields = [{"name": "a", "type": "int64", "nullable": True}]
    for change, words in (
        ({"op": "add_column", "column": "A", "type": "int64"}, "column 'a', which differs"),
        ({"op": "add_column", "column": "s", "type": "struct<x: int32, X: int32>"}, "'x' and 'X'"),
    ):
        with pytest.raises(SchemaChangeRefused, match=words):
            apply_changes(fields, [change], ())


def test_conform_widens_losslessly_and_refuses_the_rest() -> None:
    schema = parse_fields(
        {"i": "int64", "f": "float64", "s": "string", "ts": "timestamp[us, tz=UTC]"}
    )
    batch = pa.record_batch(
        {
            "s": pa.array(["x"], pa.large_string()),
            "ts": pa.array([1], pa.timestamp("ms", tz="UTC")),
            "i": pa.array([1], pa.int32()),
            "f": pa.array([1.5], pa.float32()),
        }
    )
    out = conform_batch(batch, schema)
    assert out.schema == schema
    assert out.column("ts")[0].as_py() == dt.datetime(1970, 1, 1, 0, 0, 0, 1000, tzinfo=dt.UTC)
    narrowing = pa.record_batch(
        {
            "i": pa.array([1.5]),
            "f": [1.0],
            "s": ["x"],
            "ts": pa.array([1], pa.timestamp("us", tz="UTC")),
        }
    )
    with pytest.raises(SchemaMismatch, match="'i' is double"):
        conform_batch(narrowing, schema)
    naive = pa.record_batch(
        {"i": [1], "f": [1.0], "s": ["x"], "ts": pa.array([1], pa.timestamp("us"))}
    )
    with pytest.raises(SchemaMismatch, match="'ts'"):
        conform_batch(naive, schema)
    with pytest.raises(SchemaMismatch, match="not nullable"):
        conform_batch(
            pa.record_batch({"a": pa.array([None], pa.int64())}),
            parse_fields([{"name": "a", "type": "int64", "nullable": False}]),
        )


def test_json_rows_errors_name_the_row() -> None:
    schema = parse_fields({"a": "int64", "b": "binary"})
    with pytest.raises(SchemaMismatch, match=r"row 1\.a"):
        rows_to_batch([{"a": 1, "b": None}, {"a": "x", "b": None}], schema)
    with pytest.raises(SchemaMismatch, match="base64"):
        rows_to_batch([{"a": 1, "b": 5}], schema)
    with pytest.raises(SchemaMismatch, match="row 0"):
        rows_to_batch([{"a": 1}], schema)
    with pytest.raises(MalformedPayload):
        rows_to_batch({"a": 1}, schema)
    with pytest.raises(SchemaMismatch, match="expected an integer"):
        rows_to_batch([{"a": True, "b": None}], schema)


ROW_SCHEMA = parse_fields(
    {
        "i": "int64",
        "f": "float64",
        "s": "string",
        "b": "binary",
        "d": "decimal128(12, 3)",
        "ts": "timestamp[us, tz=UTC]",
        "nts": "timestamp[us]",
        "day": "date32[day]",
        "l": "list<int32>",
        "st": "struct<x: int32, y: string>",
        "ok": "bool",
    }
)


def _rows() -> st.SearchStrategy[list[dict[str, object]]]:
    ts = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1))
    row = st.fixed_dictionaries(
        {
            "i": st.none() | st.integers(-(2**63), 2**63 - 1),
            "f": st.none() | st.floats(allow_nan=False, allow_infinity=False),
            "s": st.none() | st.text(),
            "b": st.none() | st.binary(),
            "d": st.none()
            | st.decimals(
                min_value=-(10**8), max_value=10**8, places=3, allow_nan=False, allow_infinity=False
            ),
            "ts": st.none() | ts.map(lambda t: t.replace(tzinfo=dt.UTC)),
            "nts": st.none() | ts,
            "day": st.none() | st.dates(),
            "l": st.none() | st.lists(st.none() | st.integers(-(2**31), 2**31 - 1), max_size=4),
            "st": st.none()
            | st.fixed_dictionaries(
                {"x": st.none() | st.integers(-(2**31), 2**31 - 1), "y": st.none() | st.text()}
            ),
            "ok": st.none() | st.booleans(),
        }
    )
    return st.lists(row, min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(_rows())
def test_json_round_trip_is_lossless(rows: list[dict[str, object]]) -> None:
    batch = pa.RecordBatch.from_pylist(rows, schema=ROW_SCHEMA)
    as_json = batch_to_rows([batch])
    again = rows_to_batch(as_json, ROW_SCHEMA)
    assert again.equals(batch)
    for got, want in zip(again.to_pylist(), rows, strict=True):
        if want["d"] is not None:
            assert got["d"] == decimal.Decimal(want["d"])  # type: ignore[arg-type]


def test_system_columns() -> None:
    b = rows_to_batch([{"a": 1}, {"a": 2}], parse_fields({"a": "int64"}))
    out = with_system_columns(b, 3, 40, 1_000_000)
    assert out.column("_partition").to_pylist() == [3, 3]
    assert out.column("_offset").to_pylist() == [40, 41]
    assert out.column("_timestamp")[0].as_py() == dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC)


def test_key_routing_is_deterministic_and_spread() -> None:
    assert partition_for_key(["user-1"], 8) == partition_for_key(["user-1"], 8)
    batch = pa.record_batch({"k": [f"u{i}" for i in range(200)], "v": list(range(200))})
    groups = route_by_key(batch, ["k"], 4)
    assert sorted(i for idx in groups.values() for i in idx.to_pylist()) == list(range(200))
    assert len(groups) == 4
    for p, idx in groups.items():
        assert all(partition_for_key([f"u{i}"], 4) == p for i in idx.to_pylist())


def test_type_aliases() -> None:
    assert parse_type("float64") == pa.float64()
    assert parse_type("float32") == pa.float32()
    assert parse_type("list<int64>") == pa.list_(pa.int64())


def test_fields_text_keeps_commas_inside_types() -> None:
    fields = parse_fields_text("id:int64, price:decimal128(10, 2),tags:struct<a: int32, b: string>")
    assert fields == [
        {"name": "id", "type": "int64"},
        {"name": "price", "type": "decimal128(10, 2)"},
        {"name": "tags", "type": "struct<a: int32, b: string>"},
    ]
    assert parse_fields(fields).names == ["id", "price", "tags"]


def test_fields_text_names_the_part_that_is_not_name_colon_type() -> None:
    with pytest.raises(InvalidSchema, match=r"expected name:type, got 'price'"):
        parse_fields_text("id:int64,price")


def _struct(n: int, prefix: str = "f") -> str:
    return "struct<" + ", ".join(f"{prefix}{i}: int8" for i in range(n)) + ">"


def test_a_schema_is_bounded_in_total_not_only_per_column() -> None:
    """Issue 33.6: fields at every depth, characters of names, types and docs, and of docs
    alone are bounded for the whole schema, each refusal naming the bound and the value."""
    # 150 struct columns of 1,345 fields each (201,750 leaves, 2.4 MB): refused by the
    # character count before any type is parsed.
    huge = [{"name": f"c{i}", "type": _struct(1345)} for i in range(150)]
    with pytest.raises(InvalidSchema) as err:
        parse_fields(huge)
    assert f"at most {MAX_SCHEMA_CHARS} are accepted" in err.value.message
    assert "characters in total" in err.value.message
    # Under the character bound, over the field bound (20 x 300 struct fields + columns):
    # refused while parsing, naming the column that crosses it.
    many = [{"name": f"c{i}", "type": _struct(300)} for i in range(20)]
    with pytest.raises(InvalidSchema) as err:
        parse_fields(many)
    assert f"more than {MAX_FIELDS} fields" in err.value.message
    assert "column 'c13'" in err.value.message  # c0-c12: 13 x 301 = 3,913 fields
    # Docs: each at most MAX_DOC_CHARS, all of them at most MAX_DOCS_CHARS.
    docs = [{"name": f"c{i}", "type": "int64", "doc": "d" * 1000} for i in range(70)]
    with pytest.raises(InvalidSchema) as err:
        parse_fields(docs)
    assert err.value.message == (
        f"the schema's docs hold 70000 characters in total; at most {MAX_DOCS_CHARS} are accepted"
    )
    # Just under every bound: accepted.
    fine = [{"name": f"c{i}", "type": _struct(200)} for i in range(20)]
    assert len(parse_fields(fine)) == 20
    # A schema stored before the bounds keeps reading (the metadata store's own form).
    assert len(parse_fields(many, stored=True)) == 20


def test_schema_changes_are_bounded_in_total_too() -> None:
    fields = [{"name": "a", "type": "int64"}]
    for i in range(64):
        fields = apply_changes(
            fields, [{"op": "add_column", "column": f"c{i}", "type": "string", "doc": "d" * 1024}]
        )
    # apply_changes checks each change; the whole schema's bounds are the core's, on
    # the result (gateway.core.tables): 64 docs of 1 KiB fill MAX_DOCS_CHARS.
    with pytest.raises(InvalidSchema, match=f"at most {MAX_DOCS_CHARS} are accepted"):
        parse_fields(
            apply_changes(
                fields, [{"op": "add_column", "column": "c64", "type": "string", "doc": "x"}]
            ),
            stored=True,
            bounded=True,
        )
