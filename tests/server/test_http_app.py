"""Unit-level checks of the HTTP edge: the real app in-process over a real service.

The service runs on the real disk hot tier and a SQLite metadata store in ``tmp_path``;
only the network hop is skipped (``httpx.ASGITransport``). The real-process tests live in
``tests/integration``.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import decimal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from fastapi import FastAPI, Request
from prometheus_client import REGISTRY

from gateway.config import Settings
from gateway.core import StreamTables
from gateway.hot import load_hot_log
from gateway.meta import MetadataStore
from gateway.server.http import ARROW_STREAM, create_app
from gateway.wire.codec import decode_stream, encode_stream
from gateway.wire.errors import Throttled

pytestmark = pytest.mark.anyio

MAX_REQUEST_BYTES = 64 * 1024
FOLLOW_CAP_MS = 10_000

ALL_TYPES: list[dict[str, Any]] = [
    {"name": "id", "type": "int64", "nullable": False},
    {"name": "small", "type": "int32"},
    {"name": "ratio", "type": "double"},
    {"name": "flag", "type": "bool"},
    {"name": "label", "type": "string"},
    {"name": "blob", "type": "binary"},
    {"name": "at", "type": "timestamp[us, tz=UTC]"},
    {"name": "local", "type": "timestamp[us]"},
    {"name": "amount", "type": "decimal128(10, 2)"},
    {"name": "day", "type": "date32"},
    {"name": "clock", "type": "time64[us]"},
    {"name": "tags", "type": "list<int32>"},
    {"name": "point", "type": "struct<x: int32, name: string>"},
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Gateway:
    settings: Settings
    service: StreamTables
    app: FastAPI
    http: httpx.AsyncClient

    def client_for(self, app: FastAPI) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tg")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings.explicit(
        data_dir=tmp_path,
        tenant="acme",
        hot={"type": "disk", "fsync": "never"},
        server={"max_request_bytes": MAX_REQUEST_BYTES, "http_follow_wait_ms": FOLLOW_CAP_MS},
    )


@pytest.fixture
async def gw(settings: Settings, tmp_path: Path) -> AsyncIterator[Gateway]:
    service = StreamTables(
        settings, MetadataStore(f"sqlite:///{tmp_path / 'meta.db'}"), load_hot_log(settings)
    )
    app = create_app(service, settings)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://tg", timeout=30) as http:
        try:
            yield Gateway(settings, service, app, http)
        finally:
            service.close()


# Helpers ------------------------------------------------------------------------------
async def create(
    gw: Gateway, name: str = "events", schema: Any = None, partitions: int = 2, **extra: Any
) -> dict[str, Any]:
    body = {
        "namespace": "ns",
        "name": name,
        "schema": schema if schema is not None else {"id": "int64", "label": "string"},
        "partitions": partitions,
        **extra,
    }
    r = await gw.http.post("/v1/tables", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def watermarks(gw: Gateway, name: str = "events") -> list[int]:
    r = await gw.http.get(f"/v1/tables/ns/{name}")
    assert r.status_code == 200, r.text
    return [p["high_watermark"] for p in r.json()["partition_info"]]


def assert_error(r: httpx.Response, status: int, reason: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["reason"] == reason, error
    assert error.get("message")
    return dict(error)


def arrow(batch: pa.RecordBatch) -> bytes:
    return encode_stream([batch], batch.schema)


async def post_arrow(
    gw: Gateway, body: bytes, name: str = "events", **params: Any
) -> httpx.Response:
    return await gw.http.post(
        f"/v1/tables/ns/{name}/records",
        content=body,
        params=params,
        headers={"Content-Type": ARROW_STREAM},
    )


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# Tables -------------------------------------------------------------------------------
async def test_table_lifecycle(gw: Gateway) -> None:
    created = await create(
        gw,
        schema=[
            {"name": "id", "type": "int64", "nullable": False},
            {"name": "v", "type": "string"},
        ],
        partitions=3,
        key_columns=["id"],
    )
    assert created["namespace"] == "ns" and created["name"] == "events"
    assert created["schema"] == [
        {"name": "id", "type": "int64", "nullable": False},
        {"name": "v", "type": "string", "nullable": True},
    ]
    assert created["partitions"] == 3 and created["key_columns"] == ["id"]
    assert created["created_at"].endswith("Z")
    assert created["partition_info"] == [
        {
            "partition": p,
            "earliest_offset": 0,
            "high_watermark": 0,
            "tiered_watermark": 0,
            "hot_bytes": 0,
            "lag_records": 0,
            "lag_bytes": 0,
        }
        for p in range(3)
    ]
    await create(gw, name="other", schema={"x": "double"}, partitions=1)
    r = await gw.http.post(
        "/v1/tables",
        json={"namespace": "ns2", "name": "t", "schema": {"a": "int8"}, "partitions": 1},
    )
    assert r.status_code == 201

    described = (await gw.http.get("/v1/tables/ns/events")).json()
    assert described == created

    listed = (await gw.http.get("/v1/tables", params={"namespace": "ns"})).json()["tables"]
    assert sorted(t["name"] for t in listed) == ["events", "other"]
    assert all("partition_info" not in t for t in listed)
    everything = (await gw.http.get("/v1/tables")).json()["tables"]
    assert sorted((t["namespace"], t["name"]) for t in everything) == [
        ("ns", "events"),
        ("ns", "other"),
        ("ns2", "t"),
    ]

    assert_error(
        await gw.http.post(
            "/v1/tables",
            json={"namespace": "ns", "name": "events", "schema": {"a": "int8"}, "partitions": 1},
        ),
        409,
        "TABLE_ALREADY_EXISTS",
    )

    r = await gw.http.delete("/v1/tables/ns/events")
    assert r.status_code == 204 and r.content == b""
    assert_error(await gw.http.get("/v1/tables/ns/events"), 404, "TABLE_NOT_FOUND")
    assert_error(await gw.http.delete("/v1/tables/ns/events"), 404, "TABLE_NOT_FOUND")
    listed = (await gw.http.get("/v1/tables", params={"namespace": "ns"})).json()["tables"]
    assert [t["name"] for t in listed] == ["other"]


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ({"namespace": "ns", "name": "t", "schema": {"a": "int64"}, "partitions": 1, "x": 1},
         400, "INVALID_REQUEST"),
        # (no "partitions" is one partition, as in the SDK and CLI; no schema is refused)
        ({"namespace": "ns", "name": "t", "partitions": 1}, 400, "INVALID_REQUEST"),
        ({"namespace": "ns", "name": "t", "schema": {"a": "int64"}, "partitions": "2"},
         400, "INVALID_REQUEST"),
        ({"namespace": "ns", "name": "t", "schema": {"a": "int64"}, "partitions": 0},
         400, "INVALID_REQUEST"),
        ({"namespace": "n s", "name": "t", "schema": {"a": "int64"}, "partitions": 1},
         400, "INVALID_REQUEST"),
        ({"namespace": "ns", "name": "t", "schema": {"a": "varchar"}, "partitions": 1},
         400, "INVALID_SCHEMA"),
        ({"namespace": "ns", "name": "t", "schema": [{"name": "a", "type": "int64", "k": 1}],
          "partitions": 1}, 400, "INVALID_REQUEST"),
        ({"namespace": "ns", "name": "t", "schema": {"_offset": "int64"}, "partitions": 1},
         400, "INVALID_SCHEMA"),
        ({"namespace": "ns", "name": "t", "schema": {"a": "int64"}, "partitions": 1,
          "key_columns": ["b"]}, 400, "INVALID_SCHEMA"),
    ],
)  # fmt: skip
async def test_create_table_rejects(
    gw: Gateway, body: dict[str, Any], status: int, reason: str
) -> None:
    assert_error(await gw.http.post("/v1/tables", json=body), status, reason)
    assert (await gw.http.get("/v1/tables")).json() == {"tables": [], "next_page_token": ""}


async def test_create_table_rejects_malformed_json(gw: Gateway) -> None:
    r = await gw.http.post(
        "/v1/tables", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert_error(r, 400, "INVALID_REQUEST")


async def test_list_tables_rejects_bad_namespace(gw: Gateway) -> None:
    assert_error(
        await gw.http.get("/v1/tables", params={"namespace": "not valid"}), 400, "INVALID_REQUEST"
    )


# Records: round trips -----------------------------------------------------------------
async def test_json_round_trip_of_every_type(gw: Gateway) -> None:
    await create(gw, schema=ALL_TYPES, partitions=1)
    rows: list[dict[str, Any]] = [
        {
            "id": 1,
            "small": -7,
            "ratio": 0.25,
            "flag": True,
            "label": "héllo ✓",
            "blob": base64.b64encode(b"\x00\x01\xfe\xff").decode(),
            "at": "2024-05-01T12:00:00.123456+02:00",
            "local": "2024-05-01T12:00:00.000001",
            "amount": "12345678.90",
            "day": "2024-02-29",
            "clock": "23:59:59.999999",
            "tags": [1, None, 3],
            "point": {"x": 4, "name": "p"},
        },
        {
            "id": 2,
            **{f["name"]: None for f in ALL_TYPES if f["name"] != "id"},
        },
        {
            "id": 3,
            "small": 2**31 - 1,
            "ratio": -1e300,
            "flag": False,
            "label": "",
            "blob": "",
            "at": 1_700_000_000_000_001,
            "local": 0,
            "amount": 1.5,
            "day": "1970-01-01",
            "clock": "00:00:00",
            "tags": [],
            "point": {"x": None, "name": None},
        },
    ]
    r = await gw.http.post("/v1/tables/ns/events/records", json={"rows": rows})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "ranges": [{"partition": 0, "base_offset": 0, "count": 3, "duplicate": False}]
    }

    r = await gw.http.get("/v1/tables/ns/events/partitions/0/records", params={"offset": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["next_offset"] == 3 and body["high_watermark"] == 3
    assert r.headers["Tidegate-Next-Offset"] == "3"
    assert r.headers["Tidegate-High-Watermark"] == "3"
    got = body["records"]
    assert [g["_offset"] for g in got] == [0, 1, 2]
    assert {g["_partition"] for g in got} == {0}
    stamps = {g["_timestamp"] for g in got}
    assert len(stamps) == 1 and next(iter(stamps)).endswith("Z")
    user = [{k: v for k, v in g.items() if not k.startswith("_")} for g in got]
    assert user[0] == {
        **rows[0],
        "at": "2024-05-01T10:00:00.123456Z",  # the same instant, in UTC
    }
    assert user[1] == rows[1]
    assert user[2] == {
        **rows[2],
        "at": "2023-11-14T22:13:20.000001Z",
        "local": "1970-01-01T00:00:00",
        "amount": "1.50",
        "ratio": -1e300,
    }

    # The same records as Arrow, with their exact types.
    r = await gw.http.get(
        "/v1/tables/ns/events/partitions/0/records", headers={"Accept": ARROW_STREAM}
    )
    schema, batches = decode_stream(r.content)
    table = pa.Table.from_batches(batches, schema)
    assert table.column("at")[0].as_py() == dt.datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=dt.UTC)
    assert table.column("amount")[0].as_py() == decimal.Decimal("12345678.90")
    assert table.column("blob")[0].as_py() == b"\x00\x01\xfe\xff"
    assert table.column("point")[2].as_py() == {"x": None, "name": None}


async def test_arrow_append_and_arrow_read(gw: Gateway) -> None:
    await create(gw, schema={"id": "int64", "label": "string", "at": "timestamp[us, tz=UTC]"})
    at = pa.array([1, 2, 3], pa.timestamp("ms", tz="UTC"))  # widened losslessly to us
    batch = pa.RecordBatch.from_arrays(
        # Columns in another order and narrower ints: conformed, not rejected.
        [pa.array(["a", None, "c"]), at, pa.array([10, 11, 12], pa.int32())],
        names=["label", "at", "id"],
    )
    before = metric("tidegate_append_records_total")
    r = await post_arrow(gw, arrow(batch), partition=1)
    assert r.status_code == 200, r.text
    assert r.json()["ranges"] == [
        {"partition": 1, "base_offset": 0, "count": 3, "duplicate": False}
    ]
    assert metric("tidegate_append_records_total") == before + 3

    r = await gw.http.get(
        "/v1/tables/ns/events/partitions/1/records",
        params={"offset": 1, "max_records": 5},
        headers={"Accept": f"application/json;q=0.5, {ARROW_STREAM}"},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == ARROW_STREAM
    assert r.headers["Tidegate-Next-Offset"] == "3"
    assert r.headers["Tidegate-High-Watermark"] == "3"
    schema, batches = decode_stream(r.content)
    assert schema.names == ["id", "label", "at", "_partition", "_offset", "_timestamp"]
    assert schema.field("_partition").type == pa.int32()
    assert schema.field("_offset").type == pa.int64()
    assert schema.field("_timestamp").type == pa.timestamp("us", tz="UTC")
    table = pa.Table.from_batches(batches, schema)
    assert table.column("id").to_pylist() == [11, 12]
    assert table.column("label").to_pylist() == [None, "c"]
    assert table.column("_offset").to_pylist() == [1, 2]
    assert table.column("_partition").to_pylist() == [1, 1]
    assert table.column("at").to_pylist() == [
        dt.datetime(1970, 1, 1, 0, 0, 0, 2000, tzinfo=dt.UTC),
        dt.datetime(1970, 1, 1, 0, 0, 0, 3000, tzinfo=dt.UTC),
    ]

    # At the high watermark: an empty stream that still carries the schema.
    r = await gw.http.get(
        "/v1/tables/ns/events/partitions/1/records",
        params={"offset": 3},
        headers={"Accept": ARROW_STREAM},
    )
    schema, batches = decode_stream(r.content)
    assert schema.names[-3:] == ["_partition", "_offset", "_timestamp"]
    assert sum(b.num_rows for b in batches) == 0
    assert r.headers["Tidegate-Next-Offset"] == "3"

    # q=0 means "not Arrow": JSON.
    r = await gw.http.get(
        "/v1/tables/ns/events/partitions/1/records", headers={"Accept": f"{ARROW_STREAM};q=0"}
    )
    assert r.headers["content-type"] == "application/json"
    assert [rec["id"] for rec in r.json()["records"]] == [10, 11, 12]


async def test_read_limits_and_paging(gw: Gateway) -> None:
    await create(gw, partitions=1)
    for i in range(3):
        rows = [{"id": i * 10 + j, "label": None} for j in range(4)]
        r = await gw.http.post("/v1/tables/ns/events/records", json={"rows": rows})
        assert r.status_code == 200
    seen: list[int] = []
    offset = 0
    while True:
        r = await gw.http.get(
            "/v1/tables/ns/events/partitions/0/records",
            params={"offset": offset, "max_records": 5},
        )
        body = r.json()
        assert len(body["records"]) <= 5 and body["high_watermark"] == 12
        if not body["records"]:
            break
        seen += [rec["id"] for rec in body["records"]]
        offset = body["next_offset"]
    assert seen == [i * 10 + j for i in range(3) for j in range(4)]
    assert offset == 12


async def test_idempotent_appends_are_not_written_twice(gw: Gateway) -> None:
    await create(gw)
    body = {"rows": [{"id": 1, "label": "x"}], "producer_id": "p1", "sequence": 0, "partition": 1}
    first = await gw.http.post("/v1/tables/ns/events/records", json=body)
    again = await gw.http.post("/v1/tables/ns/events/records", json=body)
    assert first.json()["ranges"] == [
        {"partition": 1, "base_offset": 0, "count": 1, "duplicate": False}
    ]
    assert again.json()["ranges"] == [
        {"partition": 1, "base_offset": 0, "count": 1, "duplicate": True}
    ]
    # Arrow carries the same fields as query parameters.
    batch = pa.record_batch({"id": [2, 3], "label": ["y", "z"]})
    params: dict[str, Any] = {"producer_id": "p1", "sequence": 1, "partition": 1}
    first = await post_arrow(gw, arrow(batch), **params)
    again = await post_arrow(gw, arrow(batch), **params)
    assert first.json()["ranges"][0] == {
        "partition": 1,
        "base_offset": 1,
        "count": 2,
        "duplicate": False,
    }
    assert again.json()["ranges"][0]["duplicate"] is True
    assert await watermarks(gw) == [0, 3]
    # A sequence gap is refused (retryable, 409) and writes nothing.
    gap = await post_arrow(gw, arrow(batch), producer_id="p1", sequence=5, partition=1)
    assert_error(gap, 409, "OUT_OF_ORDER_SEQUENCE")
    assert await watermarks(gw) == [0, 3]


async def test_keyed_rows_are_routed(gw: Gateway) -> None:
    await create(gw, partitions=4, key_columns=["id"])
    rows = [{"id": i, "label": str(i)} for i in range(40)]
    r = await gw.http.post("/v1/tables/ns/events/records", json={"rows": rows})
    ranges = r.json()["ranges"]
    assert sum(x["count"] for x in ranges) == 40
    assert len({x["partition"] for x in ranges}) > 1
    assert sum(await watermarks(gw)) == 40


# Records: long poll -------------------------------------------------------------------
async def test_follow_returns_a_record_appended_while_waiting(gw: Gateway) -> None:
    await create(gw, partitions=1)

    async def poll() -> httpx.Response:
        return await gw.http.get(
            "/v1/tables/ns/events/partitions/0/records",
            params={"offset": 0, "follow": "true", "wait_ms": FOLLOW_CAP_MS},
        )

    waiter = asyncio.create_task(poll())
    await asyncio.sleep(0.2)
    assert not waiter.done()  # nothing to return yet: the request is parked
    r = await gw.http.post("/v1/tables/ns/events/records", json={"rows": [{"id": 7, "label": "x"}]})
    assert r.status_code == 200
    got = await asyncio.wait_for(waiter, FOLLOW_CAP_MS / 1000 * 2)
    assert got.status_code == 200, got.text
    body = got.json()
    assert [rec["id"] for rec in body["records"]] == [7]
    assert body["next_offset"] == 1


async def test_follow_ends_empty_when_the_wait_ends(gw: Gateway) -> None:
    await create(gw, partitions=1)
    r = await gw.http.post("/v1/tables/ns/events/records", json={"rows": [{"id": 1, "label": "a"}]})
    assert r.status_code == 200
    # Records already there: answered at once, no waiting.
    r = await gw.http.get(
        "/v1/tables/ns/events/partitions/0/records", params={"follow": "true", "wait_ms": 60_000}
    )
    assert [rec["id"] for rec in r.json()["records"]] == [1]
    # Nothing new: an empty result once the (short) wait ends, in either format.
    r = await gw.http.get(
        "/v1/tables/ns/events/partitions/0/records",
        params={"offset": 1, "follow": "true", "wait_ms": 50},
    )
    assert r.json() == {
        "records": [],
        "next_offset": 1,
        "high_watermark": 1,
        "tiered_watermark": 0,
    }
    r = await gw.http.get(
        "/v1/tables/ns/events/partitions/0/records",
        params={"offset": 1, "follow": "true", "wait_ms": 0},
        headers={"Accept": ARROW_STREAM},
    )
    assert r.status_code == 200 and r.headers["Tidegate-Next-Offset"] == "1"
    assert sum(b.num_rows for b in decode_stream(r.content)[1]) == 0


# Records: bad input -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rows", "detail"),
    [
        ([{"id": 1, "label": "x", "extra": 1}], "extra"),
        ([{"id": 1}], "label"),
        ([{"id": "one", "label": "x"}], "id"),
        ([{"id": 1, "label": "x"}, {"id": 2, "label": 3}], "label"),
        ([{"id": None, "label": "x"}], "id"),  # id is not nullable
    ],
)
async def test_json_rows_that_do_not_match_the_schema(
    gw: Gateway, rows: list[dict[str, Any]], detail: str
) -> None:
    await create(
        gw,
        schema=[
            {"name": "id", "type": "int64", "nullable": False},
            {"name": "label", "type": "string"},
        ],
    )
    await gw.http.post("/v1/tables/ns/events/records", json={"rows": [{"id": 0, "label": "ok"}]})
    before = await watermarks(gw)
    r = await gw.http.post("/v1/tables/ns/events/records", json={"rows": rows})
    error = assert_error(r, 400, "SCHEMA_MISMATCH")
    assert detail in error["message"]
    assert await watermarks(gw) == before


@pytest.mark.parametrize(
    ("batch", "detail"),
    [
        (pa.record_batch({"id": [1], "label": ["x"], "extra": [1.0]}), "extra"),
        (pa.record_batch({"id": [1]}), "label"),
        (pa.record_batch({"id": ["1"], "label": ["x"]}), "id"),
        (pa.record_batch({"id": [1.0], "label": ["x"]}), "id"),
        (pa.record_batch({"id": pa.array([1], pa.uint64()), "label": ["x"]}), "id"),
    ],
)
async def test_arrow_batches_that_do_not_match_the_schema(
    gw: Gateway, batch: pa.RecordBatch, detail: str
) -> None:
    await create(gw)
    await post_arrow(gw, arrow(pa.record_batch({"id": [0], "label": ["ok"]})))
    before = await watermarks(gw)
    error = assert_error(await post_arrow(gw, arrow(batch)), 400, "SCHEMA_MISMATCH")
    assert detail in error["message"]
    assert await watermarks(gw) == before


async def test_unknown_table(gw: Gateway) -> None:
    await create(gw)
    rows = {"rows": [{"id": 1, "label": "x"}]}
    assert_error(
        await gw.http.post("/v1/tables/ns/missing/records", json=rows), 404, "TABLE_NOT_FOUND"
    )
    batch = arrow(pa.record_batch({"id": [1], "label": ["x"]}))
    assert_error(await post_arrow(gw, batch, name="missing"), 404, "TABLE_NOT_FOUND")
    assert_error(
        await gw.http.get("/v1/tables/ns/missing/partitions/0/records"), 404, "TABLE_NOT_FOUND"
    )
    assert_error(
        await gw.http.get("/v1/tables/other/events/partitions/0/records"), 404, "TABLE_NOT_FOUND"
    )
    assert await watermarks(gw) == [0, 0]


@pytest.mark.parametrize("partition", [2, -1, 99])
async def test_partition_outside_the_table(gw: Gateway, partition: int) -> None:
    await create(gw)
    rows = {"rows": [{"id": 1, "label": "x"}], "partition": partition}
    r = await gw.http.post("/v1/tables/ns/events/records", json=rows)
    assert_error(r, 400, "INVALID_PARTITION")
    batch = arrow(pa.record_batch({"id": [1], "label": ["x"]}))
    assert_error(await post_arrow(gw, batch, partition=partition), 400, "INVALID_PARTITION")
    r = await gw.http.get(f"/v1/tables/ns/events/partitions/{partition}/records")
    assert_error(r, 400, "INVALID_PARTITION")
    assert await watermarks(gw) == [0, 0]


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/v1/tables/ns/events/partitions/zero/records", {}),
        ("/v1/tables/ns/events/partitions/1.5/records", {}),
        ("/v1/tables/ns/events/partitions/0/records", {"offset": "first"}),
        ("/v1/tables/ns/events/partitions/0/records", {"offset": "1.5"}),
        ("/v1/tables/ns/events/partitions/0/records", {"max_records": "many"}),
        ("/v1/tables/ns/events/partitions/0/records", {"max_records": "0"}),
        ("/v1/tables/ns/events/partitions/0/records", {"wait_ms": "-1", "follow": "true"}),
        ("/v1/tables/ns/events/partitions/0/records", {"follow": "maybe"}),
    ],
)
async def test_read_parameters_that_are_not_valid(
    gw: Gateway, path: str, params: dict[str, str]
) -> None:
    await create(gw)
    error = assert_error(await gw.http.get(path, params=params), 400, "INVALID_REQUEST")
    assert error["errors"] and {"loc", "message", "type"} <= set(error["errors"][0])


async def test_append_parameters_that_are_not_valid(gw: Gateway) -> None:
    await create(gw)
    batch = arrow(pa.record_batch({"id": [1], "label": ["x"]}))
    for params in ({"partition": "first"}, {"sequence": "1.5", "producer_id": "p"}):
        assert_error(await post_arrow(gw, batch, **params), 400, "INVALID_REQUEST")
    url = "/v1/tables/ns/events/records"
    row = [{"id": 1, "label": "x"}]
    assert_error(
        await gw.http.post(url, json={"rows": row, "partition": "1"}), 400, "INVALID_REQUEST"
    )
    assert_error(
        await gw.http.post(url, json={"rows": row, "partition": 0}, params={"partition": 1}),
        400,
        "INVALID_REQUEST",
    )
    assert_error(
        await gw.http.post(url, json={"rows": row, "producer_id": "p"}),
        400,
        "INVALID_IDEMPOTENT_APPEND",
    )
    assert_error(await post_arrow(gw, batch, producer_id="p"), 400, "INVALID_IDEMPOTENT_APPEND")
    assert await watermarks(gw) == [0, 0]


@pytest.mark.parametrize("offset", [3, 100, -1])
async def test_offset_out_of_range(gw: Gateway, offset: int) -> None:
    await create(gw)
    await gw.http.post(
        "/v1/tables/ns/events/records",
        json={"rows": [{"id": i, "label": None} for i in range(2)], "partition": 0},
    )
    r = await gw.http.get("/v1/tables/ns/events/partitions/0/records", params={"offset": offset})
    error = assert_error(r, 416, "OFFSET_OUT_OF_RANGE")
    assert error["earliest"] == 0 and error["latest"] == 2 and error["offset"] == offset
    assert await watermarks(gw) == [2, 0]


async def test_oversized_request_declared_by_content_length(gw: Gateway) -> None:
    await create(gw)
    rows = [{"id": i, "label": "x" * 100} for i in range(1000)]
    before = metric(
        "tidegate_http_requests_total",
        route="/v1/tables/{namespace}/{name}/records",
        method="POST",
        status="413",
    )
    r = await gw.http.post("/v1/tables/ns/events/records", json={"rows": rows})
    assert int(r.request.headers["content-length"]) > MAX_REQUEST_BYTES
    error = assert_error(r, 413, "REQUEST_TOO_LARGE")
    assert error["limit"] == MAX_REQUEST_BYTES
    batch = pa.record_batch({"id": list(range(20_000)), "label": ["y" * 8] * 20_000})
    assert_error(await post_arrow(gw, arrow(batch)), 413, "REQUEST_TOO_LARGE")
    assert await watermarks(gw) == [0, 0]
    after = metric(
        "tidegate_http_requests_total",
        route="/v1/tables/{namespace}/{name}/records",
        method="POST",
        status="413",
    )
    assert after == before + 2


async def test_oversized_chunked_request(gw: Gateway) -> None:
    await create(gw)
    batch = pa.record_batch({"id": list(range(20_000)), "label": ["y" * 8] * 20_000})
    payload = arrow(batch)
    assert len(payload) > MAX_REQUEST_BYTES
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        for i in range(0, len(payload), 8192):
            sent += 1
            yield payload[i : i + 8192]

    r = await gw.http.post(
        "/v1/tables/ns/events/records", content=chunks(), headers={"Content-Type": ARROW_STREAM}
    )
    assert "content-length" not in r.request.headers
    assert_error(r, 413, "REQUEST_TOO_LARGE")
    assert await watermarks(gw) == [0, 0]

    # A chunked body under the limit is fine.
    small = arrow(pa.record_batch({"id": [1], "label": ["x"]}))

    async def one_chunk() -> AsyncIterator[bytes]:
        yield small

    r = await gw.http.post(
        "/v1/tables/ns/events/records", content=one_chunk(), headers={"Content-Type": ARROW_STREAM}
    )
    assert r.status_code == 200, r.text
    assert sum(await watermarks(gw)) == 1


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not an arrow stream at all",
        b"\xff\xff\xff\xff\x10\x00\x00\x00" + b"\x00" * 16,
        "truncated",
    ],
)
async def test_malformed_arrow(gw: Gateway, body: bytes | str) -> None:
    await create(gw)
    if body == "truncated":
        whole = arrow(pa.record_batch({"id": list(range(100)), "label": ["x"] * 100}))
        body = whole[: len(whole) // 2]
    assert isinstance(body, bytes)
    assert_error(await post_arrow(gw, body), 400, "MALFORMED_PAYLOAD")
    assert await watermarks(gw) == [0, 0]


async def test_arrow_stream_without_rows(gw: Gateway) -> None:
    await create(gw)
    empty = encode_stream([], pa.schema([("id", pa.int64()), ("label", pa.string())]))
    assert_error(await post_arrow(gw, empty), 400, "INVALID_REQUEST")
    assert await watermarks(gw) == [0, 0]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "MALFORMED_PAYLOAD"),
        (b'{"rows": [{"id": 1, "label": "x"}]', "MALFORMED_PAYLOAD"),
        (b"\xff\xfe", "MALFORMED_PAYLOAD"),
        (b"", "MALFORMED_PAYLOAD"),
        (b"[]", "MALFORMED_PAYLOAD"),
        (b'{"rows": []}', "MALFORMED_PAYLOAD"),
        (b'{"rows": [1, 2]}', "INVALID_REQUEST"),
        (b'{"rows": [{"id": 1, "label": "x"}], "unknown": true}', "INVALID_REQUEST"),
        (b'{"records": [{"id": 1, "label": "x"}]}', "INVALID_REQUEST"),
    ],
)
async def test_malformed_json(gw: Gateway, body: bytes, reason: str) -> None:
    await create(gw)
    r = await gw.http.post(
        "/v1/tables/ns/events/records",
        content=body,
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert_error(r, 400, reason)
    assert await watermarks(gw) == [0, 0]


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/octet-stream", None],
)
async def test_unsupported_content_type(gw: Gateway, content_type: str | None) -> None:
    await create(gw)
    headers = {"Content-Type": content_type} if content_type else {}
    r = await gw.http.post(
        "/v1/tables/ns/events/records",
        content=b'{"rows": [{"id": 1, "label": "x"}]}',
        headers=headers,
    )
    if content_type is None:
        assert "content-type" not in r.request.headers
    assert_error(r, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert await watermarks(gw) == [0, 0]


# The edge itself ------------------------------------------------------------------------
async def test_metrics_declare_their_token_only_when_one_is_set(gw: Gateway) -> None:
    """Issue 16, item 9: /metrics is open unless server.metrics_token is set, and the
    OpenAPI document says so (the tenant and operator keys: tests/integration)."""
    r = await gw.http.get("/openapi.json")
    assert "security" not in r.json()["paths"]["/metrics"]["get"]
    server = gw.settings.server.model_copy(update={"metrics_token": "m" * 32})
    app = create_app(gw.service, gw.settings.model_copy(update={"server": server}))
    async with gw.client_for(app) as http:
        doc = (await http.get("/openapi.json")).json()
        assert doc["paths"]["/metrics"]["get"]["security"] == [{"metricsToken": []}]
        assert doc["components"]["securitySchemes"]["metricsToken"]["scheme"] == "bearer"
        assert (await http.get("/metrics")).status_code == 401
        ok = await http.get("/metrics", headers={"authorization": "Bearer " + "m" * 32})
        assert ok.status_code == 200


async def test_health_readiness_and_metrics(gw: Gateway) -> None:
    state = {"ready": False}
    app = create_app(gw.service, gw.settings, ready=lambda: state["ready"])
    async with gw.client_for(app) as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).status_code == 503
        state["ready"] = True
        assert (await http.get("/readyz")).status_code == 200

        await create(gw)
        await gw.http.post("/v1/tables/ns/events/records", json={"rows": [{"id": 1, "label": "x"}]})
        await gw.http.get("/v1/tables/ns/events/partitions/0/records")
        await gw.http.get("/v1/tables/ns/nothere")
        await gw.http.get("/no/such/route")
        r = await http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in (
        "tidegate_append_records_total",
        "tidegate_append_bytes_total",
        "tidegate_read_records_total",
        "tidegate_http_request_duration_seconds_bucket",
    ):
        assert name in text
    requests = [
        line for line in text.splitlines() if line.startswith("tidegate_http_requests_total")
    ]
    # Route templates, never raw paths: cardinality stays bounded.
    assert any('route="/v1/tables/{namespace}/{name}"' in line and 'status="404"' in line
               for line in requests)  # fmt: skip
    assert any('route="<unmatched>"' in line for line in requests)
    assert not any("nothere" in line or "/no/such" in line for line in requests)


async def test_unknown_route_and_method_use_the_error_body(gw: Gateway) -> None:
    assert_error(await gw.http.get("/v1/nothing"), 404, "NOT_FOUND")
    assert_error(await gw.http.put("/v1/tables"), 405, "METHOD_NOT_ALLOWED")


async def test_tenant_resolution_and_error_translation(gw: Gateway) -> None:
    """Tenants come from ``tenant_of``; what it raises is translated like any error."""
    await create(gw)  # tenant "acme", from settings

    def other_tenant(request: Request) -> str:
        return "globex"

    async with gw.client_for(create_app(gw.service, gw.settings, tenant_of=other_tenant)) as http:
        assert (await http.get("/v1/tables")).json() == {"tables": [], "next_page_token": ""}
        assert_error(await http.get("/v1/tables/ns/events"), 404, "TABLE_NOT_FOUND")

    def throttled(request: Request) -> str:
        raise Throttled("slow down", retry_after_ms=1_200)

    async with gw.client_for(create_app(gw.service, gw.settings, tenant_of=throttled)) as http:
        r = await http.get("/v1/tables")
        error = assert_error(r, 429, "THROTTLED")
        assert error["retry_after_ms"] == 1_200
        assert r.headers["Retry-After"] == "2"


async def test_unexpected_errors_are_500_and_logged(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(request: Request) -> str:
        raise RuntimeError("boom")

    app = create_app(gw.service, gw.settings, tenant_of=broken)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    before = metric("tidegate_http_requests_total", route="/v1/tables", method="GET", status="500")
    async with httpx.AsyncClient(transport=transport, base_url="http://tg") as http:
        r = await http.get("/v1/tables")
    assert r.status_code == 500
    assert r.json()["error"]["reason"] == "INTERNAL"
    assert "boom" not in r.text
    assert any("boom" in str(rec.exc_info[1]) for rec in caplog.records if rec.exc_info)
    after = metric("tidegate_http_requests_total", route="/v1/tables", method="GET", status="500")
    assert after == before + 1


async def test_a_client_gone_mid_body_is_one_quiet_line(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """The client sends half its body and disconnects: no ERROR, no traceback, no 500,
    nothing appended; the request is counted as 499 (client closed request)."""
    await create(gw)
    route = "/v1/tables/{namespace}/{name}/records"
    labels = {"route": route, "method": "POST"}
    before = {s: metric("tidegate_http_requests_total", **labels, status=s) for s in ("499", "500")}
    body = b'{"rows": [{"id": 1, "label": "a"}]}'
    incoming = [
        {"type": "http.request", "body": body[:10], "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/tables/ns/events/records",
        "raw_path": b"/v1/tables/ns/events/records",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"tg"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("tg", 80),
    }
    caplog.set_level("DEBUG", logger="tidegate")
    await gw.app(scope, receive, send)

    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]
    assert any("disconnected before its body was read" in r.getMessage() for r in caplog.records)
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [499]
    after = {s: metric("tidegate_http_requests_total", **labels, status=s) for s in ("499", "500")}
    assert after == {"499": before["499"] + 1, "500": before["500"]}
    assert await watermarks(gw) == [0, 0]


async def test_openapi_describes_the_routes(gw: Gateway) -> None:
    doc = (await gw.http.get("/openapi.json")).json()
    paths = doc["paths"]
    assert set(paths) >= {
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/tables",
        "/v1/tables/{namespace}/{name}",
        "/v1/tables/{namespace}/{name}/records",
        "/v1/tables/{namespace}/{name}/partitions/{partition}/records",
    }
    assert set(paths["/v1/tables"]) == {"get", "post"}
    # PATCH changes the table's options (retention).
    assert set(paths["/v1/tables/{namespace}/{name}"]) == {"get", "delete", "patch"}
    append = paths["/v1/tables/{namespace}/{name}/records"]["post"]
    content = append["requestBody"]["content"]
    assert set(content) == {"application/json", ARROW_STREAM}
    assert content["application/json"]["schema"]["additionalProperties"] is False
    assert content[ARROW_STREAM]["schema"]["format"] == "binary"
    assert {p["name"] for p in append["parameters"]} >= {"partition", "producer_id", "sequence"}
    assert {"413", "415"} <= set(append["responses"])
    read = paths["/v1/tables/{namespace}/{name}/partitions/{partition}/records"]["get"]
    assert ARROW_STREAM in read["responses"]["200"]["content"]
    assert "long poll" in read["description"]
    schemas = doc["components"]["schemas"]
    assert schemas["CreateTableRequest"]["additionalProperties"] is False
    assert "schema" in schemas["CreateTableRequest"]["properties"]
