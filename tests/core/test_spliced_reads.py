"""Hot records spliced into their stored bytes (``as_ipc``: the gateway sends the stored
record batch messages with the system columns added to them, decoding only the batches at
a read's edges) are the records the decoding read answers, on both hot tiers: across the
tiered watermark, under byte and record caps, for a primary-key table's changelog, and
after schema changes (where the read decodes instead)."""

from __future__ import annotations

import random
import uuid

import pyarrow as pa
import pytest

from gateway.core import StreamTables
from gateway.hot import PartitionId
from gateway.wire.codec import encode_batch
from gateway.wire.splice import stream_of
from tests.cold.helpers import tier
from tests.core import test_raw_reads as raw

FIELDS, OLD_PAYLOAD, TENANT = raw.FIELDS, raw.OLD_PAYLOAD, raw.TENANT
#: The service on each hot tier (the raw reads' fixture).
service = raw.service

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def both_reads(
    svc: StreamTables, name: str, offset: int, n: int, max_bytes: int | None = None
) -> tuple[pa.Table, pa.Table, int]:
    """The decoding read and the spliced read of the same range, as tables, and how many
    messages the spliced one answered with."""
    decoded = await svc.read(TENANT, "ns", name, 0, offset, n, max_bytes)
    spliced = await svc.read(TENANT, "ns", name, 0, offset, n, max_bytes, as_ipc=True)
    assert spliced.next_offset == decoded.next_offset
    assert spliced.high_watermark == decoded.high_watermark
    assert spliced.num_records == decoded.num_records
    data = stream_of(spliced.schema, spliced.messages)
    hot = pa.ipc.open_stream(data).read_all()
    hot.validate(full=True)
    table = pa.Table.from_batches(spliced.batches, spliced.schema)
    got = pa.concat_tables([table, hot]) if spliced.messages else table
    return pa.Table.from_batches(decoded.batches, decoded.schema), got, len(spliced.messages)


async def test_spliced_and_decoded_reads_hold_the_same_records(service: StreamTables) -> None:
    name = f"t{uuid.uuid4().hex[:8]}"
    fields = [
        {"name": "v", "type": "int64", "nullable": False},
        {"name": "s", "type": "string"},
        {"name": "f", "type": "bool"},
        {"name": "l", "type": "list<int32>"},
    ]
    await service.create_table(TENANT, "ns", name, fields, 1)
    at = 0
    for n in [1, 37, 500, 3, 2_000, 64, 9_000]:
        batch = pa.record_batch(
            {
                "v": pa.array(range(at, at + n), pa.int64()),
                "s": pa.array(
                    [f"s{i}" * (i % 5) if i % 4 else None for i in range(at, at + n)], pa.string()
                ),
                "f": pa.array(
                    [None if i % 3 == 0 else i % 2 == 0 for i in range(at, at + n)], pa.bool_()
                ),
                "l": pa.array(
                    [None if i % 7 == 0 else list(range(i % 4)) for i in range(at, at + n)],
                    pa.list_(pa.int32()),
                ),
            }
        )
        await service.append(TENANT, "ns", name, [batch], partition=0)
        at += n
    d = service.meta.get_table(TENANT, "ns", name)
    assert service.cold is not None
    tier(service.hot, service.cold, service.cold.table(d), PartitionId(TENANT, d.table_id, 0), 300)
    rng = random.Random(5)
    spliced_reads = 0
    for _ in range(40):
        offset = rng.randrange(0, at)
        n = rng.choice([1, 10, 37, 501, 5_000, 20_000])
        cap = rng.choice([None, None, 100, 5_000, 200_000])
        decoded, got, messages = await both_reads(service, name, offset, n, cap)
        assert got.equals(decoded), (offset, n, cap)
        if offset >= 300 and cap is None:  # all hot, no cap: nothing decoded but edges
            assert messages
        spliced_reads += bool(messages)
    assert spliced_reads >= 10


async def test_a_key_tables_changelog_reads_the_same_spliced(service: StreamTables) -> None:
    """A primary-key table's hot payloads hold its changes with ``_change``."""
    name = f"k{uuid.uuid4().hex[:8]}"
    fields = [
        {"name": "id", "type": "int64", "nullable": False},
        {"name": "v", "type": "string"},
    ]
    await service.create_table(TENANT, "ns", name, fields, 1, primary_key=["id"])
    for i in range(5):
        rows = pa.record_batch(
            {"id": pa.array(range(i, i + 50), pa.int64()), "v": pa.array([f"v{i}"] * 50)}
        )
        await service.append(TENANT, "ns", name, [rows], partition=0)
    end = (await service.read(TENANT, "ns", name, 0, 0, 10_000)).next_offset
    assert end > 50
    for offset, n in [(0, 10_000), (3, 40), (49, 2), (end - 1, 5)]:
        decoded, got, messages = await both_reads(service, name, offset, n)
        assert messages and got.equals(decoded)
        assert "_change" in got.schema.names


async def test_payloads_of_an_older_schema_are_decoded(service: StreamTables) -> None:
    """Bytes stored under an older schema cannot be sent as they are: the read converts
    them (a column added reads as nulls, a widened one is cast), as before."""
    name = f"t{uuid.uuid4().hex[:8]}"
    await service.create_table(TENANT, "ns", name, FIELDS, 1)
    d = service.meta.get_table(TENANT, "ns", name)
    part = PartitionId(TENANT, d.table_id, 0)
    service.hot.append(part, OLD_PAYLOAD.read_bytes(), 5_000, 1_700_000_000_000_000)
    decoded, got, messages = await both_reads(service, name, 10, 100)
    assert messages and got.equals(decoded)  # the stored schema is the table's
    await service.alter_schema(
        TENANT, "ns", name, [{"op": "add_column", "column": "note", "type": "string"}]
    )
    batch = pa.record_batch(
        {
            "id": pa.array([1, 2], pa.int32()),
            "name": pa.array(["a", None]),
            "score": pa.array([0.5, 1.5], pa.float32()),
            "note": pa.array(["n", None]),
        }
    )
    service.hot.append(part, encode_batch(batch), 2, 1_700_000_000_000_001)
    for offset, n in [(4_990, 20), (5_000, 2)]:
        decoded, got, messages = await both_reads(service, name, offset, n)
        assert got.equals(decoded)
        assert messages == 0  # the old payload (or the new under a stale view) is decoded
        assert "note" in got.schema.names


async def test_a_follow_answers_spliced_records(service: StreamTables) -> None:
    """A follow (the gRPC ``Read`` with ``follow`` and without ``raw_hot``) answers the
    same records spliced as decoded, and wakes up for an append."""
    name = f"f{uuid.uuid4().hex[:8]}"
    fields = [{"name": "v", "type": "int64", "nullable": False}]
    await service.create_table(TENANT, "ns", name, fields, 1)
    for i in range(3):
        batch = pa.record_batch({"v": pa.array(range(i * 100, i * 100 + 100), pa.int64())})
        await service.append(TENANT, "ns", name, [batch], partition=0)
    seen: dict[bool, list[int]] = {}
    for as_ipc in (False, True):
        follow = service.follow(TENANT, "ns", name, 0, 50, max_records=300, as_ipc=as_ipc)
        values: list[int] = []
        async for result in follow:
            if as_ipc:
                assert result.messages and not result.batches
                table = pa.ipc.open_stream(stream_of(result.schema, result.messages)).read_all()
            else:
                table = pa.Table.from_batches(result.batches, result.schema)
            values += table.column("_offset").to_pylist()
            assert table.column("v").to_pylist() == table.column("_offset").to_pylist()
            if len(values) == 250:  # caught up: the next records come from an append
                more = pa.record_batch({"v": pa.array(range(300, 350), pa.int64())})
                await service.append(TENANT, "ns", name, [more], partition=0)
        seen[as_ipc] = values
    assert seen[True] == seen[False] == list(range(50, 350))
