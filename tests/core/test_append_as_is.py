"""Appends that store the client's Arrow IPC stream as it came, and every case that
still conforms, routes and encodes the rows: on both hot tiers, through the core and
the hot-log interface (the edges' checks, :func:`check_request` and :func:`decode_valid`,
are run as the edges run them)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from gateway.client._batching import ProducerBatch
from gateway.config import Settings
from gateway.core import ClientStream, StreamTables
from gateway.hot import PartitionId
from gateway.server.app import build_service
from gateway.wire.codec import check_request, decode_stream, decode_valid, inspect_stream
from gateway.wire.errors import SchemaMismatch
from gateway.wire.schema import parse_fields
from gateway.wire.types import AppendRange
from tests.services import RedisServer

pytestmark = pytest.mark.anyio

TENANT = "acme"
FIELDS = [
    {"name": "id", "type": "int64", "nullable": False},
    {"name": "name", "type": "string"},
    {"name": "at", "type": "timestamp[us, tz=UTC]"},
]
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("at", pa.timestamp("us", tz="UTC")),
    ]
)
LIMIT = 64 * 1024 * 1024


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["disk", "redis"])
def hot_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_service(
    hot_kind: str, tmp_path: Path, request: pytest.FixtureRequest, compression: str
) -> StreamTables:
    hot: dict[str, Any] = {"type": "disk", "fsync": "batch"}
    if hot_kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        hot = {"type": "redis", "url": server.url}
    settings = Settings.explicit(
        data_dir=tmp_path, hot=hot, compression=compression, tiering={"enabled": False}
    )
    return build_service(settings)


@pytest.fixture
def service(
    hot_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[StreamTables]:
    svc = make_service(hot_kind, tmp_path, request, "producer")
    try:
        yield svc
    finally:
        svc.close()


def rows(start: int, n: int) -> pa.RecordBatch:
    at = [1_700_000_000_000_000 + i for i in range(start, start + n)]
    return pa.record_batch(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "name": [f"n{i}" if i % 3 else None for i in range(start, start + n)],
            "at": pa.array(at, SCHEMA.field("at").type),
        },
        schema=SCHEMA,
    )


def body(*batches: pa.RecordBatch, compression: str = "none") -> bytes:
    sink = pa.BufferOutputStream()
    codec = {"none": None, "lz4": "lz4_frame"}.get(compression, compression)
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.ipc.new_stream(sink, batches[0].schema, options=options) as w:
        for b in batches:
            w.write_batch(b)
    return bytes(sink.getvalue().to_pybytes())


class Table:
    def __init__(self, svc: StreamTables, partitions: int, keys: tuple[str, ...]) -> None:
        self.svc = svc
        self.name = f"t{uuid.uuid4().hex[:8]}"
        self.partitions = partitions
        self.keys = keys

    @classmethod
    async def create(
        cls, svc: StreamTables, partitions: int = 1, keys: tuple[str, ...] = ()
    ) -> Table:
        t = cls(svc, partitions, keys)
        await svc.create_table(TENANT, "ns", t.name, FIELDS, partitions, keys)
        return t

    async def append(self, data: bytes, **kwargs: Any) -> list[AppendRange]:
        """As an edge appends a client's Arrow body."""
        info = check_request(data, LIMIT)
        _, batches = decode_valid(data)
        return await self.svc.append(
            TENANT, "ns", self.name, batches, stream=ClientStream(data, info), **kwargs
        )

    async def stored(self, partition: int = 0) -> list[bytes]:
        """The payloads the hot tier holds for ``partition``, through the HotLog interface."""
        view = await self.svc.table(TENANT, "ns", self.name)
        part = PartitionId(TENANT, view.definition.table_id, partition)
        return [sb.payload for sb in self.svc.hot.read(part, 0, 1 << 30, 1 << 40)]

    async def read(self, partition: int = 0) -> list[dict[str, Any]]:
        result = await self.svc.read(TENANT, "ns", self.name, partition, 0, None, None)
        out = pa.Table.from_batches(result.batches, result.schema).to_pylist()
        for row in out:
            del row["_partition"], row["_offset"], row["_timestamp"]
        return out


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
async def test_a_body_in_the_tables_schema_is_stored_as_it_came(
    service: StreamTables, compression: str
) -> None:
    t = await Table.create(service)
    first, second = (
        body(rows(0, 5), compression=compression),
        body(rows(5, 3), rows(8, 4), compression=compression),
    )
    assert await t.append(first) == [AppendRange(0, 0, 5)]
    # The second request's schema is known by its bytes: still checked value by value.
    assert await t.append(second, partition=0) == [AppendRange(0, 5, 7)]
    assert await t.stored() == [first, second]
    assert inspect_stream((await t.stored())[1]).compression == compression
    want = pa.Table.from_batches([rows(0, 12)]).to_pylist()
    assert await t.read() == want


async def test_idempotent_and_round_robin_appends_are_stored_as_they_came(
    service: StreamTables,
) -> None:
    t = await Table.create(service, partitions=3)
    data = body(rows(0, 4))
    first = await t.append(data, producer_id="p1", sequence=0)
    again = await t.append(data, producer_id="p1", sequence=0)
    assert again == [AppendRange(first[0].partition, 0, 4, duplicate=True)]
    assert await t.stored(first[0].partition) == [data]
    spread = [(await t.append(data))[0].partition for _ in range(3)]
    assert sorted(spread) == [0, 1, 2]
    for p in range(3):
        assert data in await t.stored(p)


async def test_key_routed_rows_in_one_partition_are_stored_as_they_came(
    service: StreamTables,
) -> None:
    t = await Table.create(service, partitions=4, keys=("name",))
    batch = pa.record_batch(
        {"id": pa.array([1, 2, 3], pa.int64()), "name": ["k", "k", "k"], "at": [None] * 3},
        schema=SCHEMA,
    )
    (r,) = await t.append(body(batch))
    assert await t.stored(r.partition) == [body(batch)]


async def test_key_routed_rows_across_partitions_are_split(service: StreamTables) -> None:
    t = await Table.create(service, partitions=4, keys=("id",))
    data = body(rows(0, 10), rows(10, 10))
    ranges = await t.append(data)
    assert len(ranges) > 1 and sum(r.count for r in ranges) == 20
    got = []
    for r in ranges:
        (payload,) = await t.stored(r.partition)
        assert payload != data
        got += await t.read(r.partition)
    want = pa.Table.from_batches([rows(0, 20)]).to_pylist()
    assert sorted(got, key=lambda row: row["id"]) == want


async def test_a_body_that_differs_from_the_schema_is_conformed_and_encoded(
    service: StreamTables,
) -> None:
    t = await Table.create(service)
    reordered = rows(0, 3).select(["name", "at", "id"])
    widened = pa.record_batch(
        {"id": pa.array([3, 4], pa.int32()), "name": ["a", "b"], "at": [None, None]},
        schema=pa.schema(
            [
                pa.field("id", pa.int32(), nullable=False),
                pa.field("name", pa.string()),
                pa.field("at", pa.timestamp("ms", tz="UTC")),
            ]
        ),
    )
    with_metadata = rows(5, 2).replace_schema_metadata({"pandas": "{}"})
    for batch in (reordered, widened, with_metadata):
        await t.append(body(batch))
    stored = await t.stored()
    for payload, batch in zip(stored, (reordered, widened, with_metadata), strict=True):
        assert payload != body(batch)
        schema, _ = decode_stream(payload)
        assert schema.equals(SCHEMA, check_metadata=True)
    got = await t.read()
    assert [r["id"] for r in got] == [0, 1, 2, 3, 4, 5, 6]
    assert got[3] == {"id": 3, "name": "a", "at": None}


async def test_a_body_without_an_added_column_is_filled_and_encoded(
    service: StreamTables,
) -> None:
    t = await Table.create(service)
    data = body(rows(0, 2))
    await t.append(data)  # its schema message is now known for schema version 0
    await service.alter_schema(
        TENANT, "ns", t.name, [{"op": "add_column", "column": "extra", "type": "int32"}]
    )
    await t.append(data)  # the same bytes, no longer the whole schema
    first, second = await t.stored()
    assert first == data and second != data
    assert decode_stream(second)[0].names == ["id", "name", "at", "extra"]
    assert [r["extra"] for r in await t.read()] == [None] * 4


@pytest.mark.parametrize("setting", ["zstd", "lz4", "none"])
async def test_a_forced_compression_re_encodes_other_bodies(
    hot_kind: str, tmp_path: Path, request: pytest.FixtureRequest, setting: str
) -> None:
    svc = make_service(hot_kind, tmp_path, request, setting)
    try:
        t = await Table.create(svc)
        same = body(rows(0, 3), compression=setting)
        other = body(rows(3, 3), compression="zstd" if setting != "zstd" else "none")
        await t.append(same)
        await t.append(other)
        first, second = await t.stored()
        assert first == same
        assert second != other and inspect_stream(second).compression == setting
        assert [r["id"] for r in await t.read()] == list(range(6))
    finally:
        svc.close()


async def test_json_rows_are_encoded_with_zstd_when_the_setting_is_producer(
    service: StreamTables,
) -> None:
    t = await Table.create(service)
    await service.append(TENANT, "ns", t.name, [rows(0, 3)])  # no client stream
    (payload,) = await t.stored()
    assert inspect_stream(payload).compression == "zstd"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            pa.record_batch(
                {"id": pa.array([1, None], pa.int64()), "name": ["a", "b"], "at": [None] * 2},
                schema=SCHEMA,
            ),
            "column 'id' is not nullable but holds nulls",
        ),
        (
            pa.record_batch(
                {
                    "id": pa.array([1], pa.int64()),
                    "name": ["a"],
                    "at": pa.array([300_000_000_000_000_000], pa.timestamp("us", tz="UTC")),
                },
                schema=SCHEMA,
            ),
            "column 'at' holds timestamp[us, tz=UTC] value 300000000000000000, outside years "
            "1 to 9999",
        ),
    ],
    ids=["null in a non-nullable column", "timestamp out of range"],
)
async def test_invalid_values_in_a_known_schema_are_refused_and_store_nothing(
    service: StreamTables, bad: pa.RecordBatch, message: str
) -> None:
    t = await Table.create(service)
    good = body(rows(0, 2))
    await t.append(good)  # the schema message is known from here on
    data = body(bad)
    assert inspect_stream(data).schema_message == inspect_stream(good).schema_message
    with pytest.raises(SchemaMismatch) as err:
        await t.append(data)
    assert err.value.message == message
    assert await t.stored() == [good]


async def test_a_huge_record_batch_is_cut_into_chunks(service: StreamTables) -> None:
    t = await Table.create(service)
    big = pa.record_batch(
        {
            "id": pa.array(range(3000), pa.int64()),
            "name": ["x" * 1000] * 3000,
            "at": [None] * 3000,
        },
        schema=SCHEMA,
    )
    await t.append(body(big))
    (payload,) = await t.stored()
    assert payload != body(big)
    assert len(decode_stream(payload)[1]) > 1


async def test_the_sdk_producers_batches_are_stored_as_sent(service: StreamTables) -> None:
    """The SDK producer seals a batch in the schema it reads from describe and names its
    partition: the gateway stores that request's stream as it is."""
    t = await Table.create(service, partitions=3, keys=("id",))
    view = await service.table(TENANT, "ns", t.name)
    schema = parse_fields(
        [{"name": f["name"], "type": f["type"], "nullable": f["nullable"]} for f in view.fields]
    )
    batch = ProducerBatch(partition=2)
    batch.chunks.append(rows(0, 4))
    batch.chunks.append([[4, 5], ["four", None], [None, None]])  # dict rows, by column
    batch.seal(schema, "zstd")
    await t.append(batch.payload, partition=batch.partition)
    assert await t.stored(2) == [batch.payload]
    assert [r["id"] for r in await t.read(2)] == list(range(6))


async def test_a_gateway_with_a_stale_schema_looks_again_and_stores_the_new_schema_as_is(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis only: two gateways share the tier. One adds a column while the other still
    holds the old schema; a body in the new schema makes that one look again, and it is
    then stored as it came."""
    import gateway.core.base

    monkeypatch.setattr(gateway.core.base, "_TABLE_CACHE_TTL_S", 3600.0)
    a, b = (make_service("redis", tmp_path, request, "producer") for _ in range(2))
    try:
        t = await Table.create(a)
        t.svc = b
        await t.append(body(rows(0, 2)))
        await a.alter_schema(
            TENANT, "ns", t.name, [{"op": "add_column", "column": "extra", "type": "int32"}]
        )
        newer = rows(2, 2).append_column(
            pa.field("extra", pa.int32()), pa.array([7, None], pa.int32())
        )
        await t.append(body(newer))
        assert (await b.table(TENANT, "ns", t.name)).schema_version == 1
        assert (await t.stored())[1] == body(newer)
        assert [r["extra"] for r in await t.read()] == [None, None, 7, None]
    finally:
        a.close()
        b.close()
