"""A record's JSON value is read by orjson with the standard library behind it: every value
is taken or refused exactly as ``json.loads`` (the HTTP edge's parser) takes or refuses it,
and rows written back are the JSON the standard library reads."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from gateway.server.kafka.records import _loads, encode_fetch, rows_from_values
from gateway.wire.schema import OFFSET_COLUMN, TIMESTAMP_COLUMN

#: Values where the two parsers could part: what orjson refuses and json takes, and the rest.
VALUES = [
    b'{"a": 1}',
    b'{"a": NaN, "b": Infinity, "c": -Infinity}',
    b'{"a": 123456789012345678901234567890}',
    b'{"a": -9999999999999999999, "b": 18446744073709551615, "c": 9223372036854775807}',
    b'{"a": "\\ud800"}',
    '{"a": 1}'.encode("utf-16"),
    '{"a": 1}'.encode("utf-8-sig"),
    b'{"a": 1, "a": 2}',
    b"[" * 5000 + b"]" * 5000,
    b" \n\t{}\r\n ",
    b'{"a": 1} x',
    b"",
    b"\xff\xfe\x00",
    b'{"a": "\x01"}',
    b'{"a": 1.0e400}',
    b'{"\xc3\xa9": "\xc3\xa9"}',
]


def _parsed(parse: Any, value: bytes) -> tuple[str, str]:
    try:
        return "value", repr(parse(value))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return "refused", type(exc).__name__


def test_each_value_is_taken_or_refused_as_the_standard_library_does() -> None:
    for value in VALUES:
        assert _parsed(_loads, value) == _parsed(json.loads, value), value


def test_fetched_values_read_back_as_the_rows_produced() -> None:
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("x", pa.float64())])
    rows = [
        {"id": 1, "name": 'é ünïcode \u2028 "quoted" \\', "x": 0.1},
        {"id": 2, "name": None, "x": float("nan")},
    ]
    values = [json.dumps(r).encode() for r in rows]
    batch, refused = rows_from_values(values, schema, ())
    assert refused == [] and batch is not None
    full = batch.append_column(OFFSET_COLUMN, pa.array([5, 6], pa.int64())).append_column(
        TIMESTAMP_COLUMN, pa.array([0, 0], pa.timestamp("us", tz="UTC"))
    )
    data, count = encode_fetch([full], ["id"])
    assert count == 2
    from aiokafka.record.default_records import DefaultRecordBatch

    records = list(DefaultRecordBatch(data))
    assert [json.loads(r.key) for r in records] == [{"id": 1}, {"id": 2}]
    back = [json.loads(r.value) for r in records]
    assert back[0] == rows[0] and back[1] == {"id": 2, "name": None, "x": "nan"}
    assert [r.offset for r in records] == [5, 6]
