"""Hot records sent as stored (``raw_hot``: the gateway sends the appended bytes with
their offsets and append time, the reader adds the system columns) are the records the
decoding read answers, on both hot tiers: across the tiered watermark, under byte and
record caps, after schema changes, and for payloads stored before this read existed."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from gateway.config import Settings
from gateway.core import StreamTables
from gateway.core.views import ReadResult
from gateway.hot import PartitionId
from gateway.server.app import build_service
from gateway.wire.codec import decode_stream
from gateway.wire.schema import TIMESTAMP_TYPE
from gateway.wire.stored import piece_rows
from tests.cold.conftest import cold_section
from tests.cold.helpers import tier
from tests.services import RedisServer

pytestmark = pytest.mark.anyio

TENANT = "acme"
#: A hot payload as the gateway stored it before reads could send payloads as stored
#: (written by ``encode_batch`` at 5617d05: zstd, in record batches of 833 rows): 5,000
#: rows of ``FIELDS``, id i, name "name-i" (null when i % 7 == 0), score i / 4.
OLD_PAYLOAD = Path(__file__).parents[1] / "data" / "hot-payload-5617d05.arrows"
FIELDS = [
    {"name": "id", "type": "int32", "nullable": False},
    {"name": "name", "type": "string"},
    {"name": "score", "type": "float32"},
]


def old_rows(lo: int, hi: int) -> list[dict[str, object]]:
    """Records ``[lo, hi)`` of ``OLD_PAYLOAD`` read under the changed schema of these tests
    (id widened, a ``note`` column added), without ``_timestamp``."""
    return [
        {
            "id": i,
            "name": None if i % 7 == 0 else f"name-{i}",
            "score": i / 4,
            "note": None,
            "_partition": 0,
            "_offset": i,
        }
        for i in range(lo, hi)
    ]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["disk", "redis"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StreamTables]:
    if request.param == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        hot = {"type": "redis", "url": redis.url}
    else:
        hot = {"type": "disk", "fsync": "batch"}
    settings = Settings.explicit(
        data_dir=tmp_path, hot=hot, cold=cold_section("local-sqlite", request)
    )
    svc = build_service(settings)
    try:
        yield svc
    finally:
        svc.close()


def materialise(result: ReadResult, partition: int) -> pa.Table:
    """The records of a read as a client of ``raw_hot`` builds them."""
    user = pa.schema(list(result.schema)[:-3])
    batches = list(result.batches)
    for piece in result.pieces:
        batches.extend(piece_rows(piece, user, partition))
    return pa.Table.from_batches(batches, result.schema)


async def both_reads(
    svc: StreamTables, name: str, offset: int, n: int, max_bytes: int | None = None
) -> tuple[pa.Table, pa.Table, ReadResult]:
    """A read as stored (with the byte cap, which counts stored bytes there), and the
    decoding read of the records it answered."""
    raw = await svc.read(TENANT, "ns", name, 0, offset, n, max_bytes, raw_hot=True)
    decoded = await svc.read(TENANT, "ns", name, 0, offset, raw.num_records)
    assert raw.next_offset == decoded.next_offset == offset + raw.num_records
    if max_bytes is None:  # then only the record count ends either read
        assert raw.num_records == min(n, raw.high_watermark - offset)
    return pa.Table.from_batches(decoded.batches, decoded.schema), materialise(raw, 0), raw


async def test_raw_and_decoded_reads_hold_the_same_records(service: StreamTables) -> None:
    name = f"t{uuid.uuid4().hex[:8]}"
    fields = [{"name": "v", "type": "int64", "nullable": False}, {"name": "s", "type": "string"}]
    await service.create_table(TENANT, "ns", name, fields, 1)
    sizes = [1, 37, 500, 3, 2_000, 64]
    at = 0
    for n in sizes:
        batch = pa.record_batch(
            {
                "v": pa.array(range(at, at + n), pa.int64()),
                "s": pa.array(
                    [f"s{i}" * (i % 5) if i % 4 else None for i in range(at, at + n)], pa.string()
                ),
            }
        )
        await service.append(TENANT, "ns", name, [batch], partition=0)
        at += n
    d = service.meta.get_table(TENANT, "ns", name)
    assert service.cold is not None
    tier(service.hot, service.cold, service.cold.table(d), PartitionId(TENANT, d.table_id, 0), 300)
    rng = random.Random(11)
    for _ in range(60):
        offset = rng.randrange(0, at)
        n = rng.choice([1, 10, 37, 501, 5_000])
        cap = rng.choice([None, None, 100, 5_000])
        decoded, raw, result = await both_reads(service, name, offset, n, cap)
        assert raw.equals(decoded), (offset, n, cap)
        assert raw.column("_offset").to_pylist() == list(range(offset, offset + raw.num_rows))
        if offset >= 300:  # all hot: nothing decoded by the gateway
            assert not result.batches and result.pieces
    # Reading on from each answer's next offset covers the log once, with any cap.
    for cap in (None, 64):
        offset, seen = 0, []
        while offset < at:
            result = await service.read(TENANT, "ns", name, 0, offset, 700, cap, raw_hot=True)
            seen += materialise(result, 0).column("v").to_pylist()
            offset = result.next_offset
        assert seen == list(range(at))


async def test_a_payload_stored_before_raw_reads_reads_the_same_both_ways(
    service: StreamTables,
) -> None:
    """The compatibility case: bytes written by the earlier gateway's encoder (several
    zstd record batches), under an older schema, read as stored and decoded alike."""
    name = f"t{uuid.uuid4().hex[:8]}"
    await service.create_table(TENANT, "ns", name, FIELDS, 1)
    d = service.meta.get_table(TENANT, "ns", name)
    payload = OLD_PAYLOAD.read_bytes()
    service.hot.append(PartitionId(TENANT, d.table_id, 0), payload, 5_000, 1_700_000_000_000_000)
    stored = service.hot.read(PartitionId(TENANT, d.table_id, 0), 0, 5_000, 1 << 30)
    assert stored[0].payload == payload
    await service.alter_schema(
        TENANT,
        "ns",
        name,
        [
            {"op": "update_type", "column": "id", "type": "int64"},
            {"op": "update_type", "column": "score", "type": "float64"},
            {"op": "add_column", "column": "note", "type": "string"},
        ],
    )

    for offset, n in [(0, 5_000), (0, 1), (830, 10), (4_999, 5), (1_000, 2_500)]:
        decoded, raw, result = await both_reads(service, name, offset, n)
        assert raw.equals(decoded)
        assert [p.payload for p in result.pieces] == [payload]
        assert raw.schema.field("id").type == pa.int64() and "note" in raw.schema.names
        rows = raw.drop_columns(["_timestamp"]).to_pylist()
        assert rows == old_rows(offset, min(offset + n, 5_000))
        assert set(raw.column("_timestamp").to_pylist()) == {
            pa.scalar(1_700_000_000_000_000, TIMESTAMP_TYPE).as_py()
        }
    assert decode_stream(payload)[0].field("id").type == pa.int32()
