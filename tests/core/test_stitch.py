"""One logical stream-table: stitched stream reads, pinned scans and read plans over
the hot tier and Iceberg, on every storage (local/S3 x SQLite/PostgreSQL)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from gateway.cold import ColdSnapshot
from gateway.cold.iceberg import IcebergColdStore, IcebergColdTable
from gateway.config import Settings
from gateway.core import StreamTables
from gateway.hot import PartitionId
from gateway.server.app import build_service
from gateway.wire.errors import (
    InvalidRequest,
    InvalidSchema,
    OffsetOutOfRange,
    SnapshotNotFound,
)
from gateway.wire.schema import system_schema
from tests.cold.helpers import (
    ALL_TYPES,
    ALL_TYPES_FIELDS,
    all_types_batch,
    duckdb_rows,
    normalise,
    pyiceberg_rows,
    pyiceberg_view,
    tier,
)

pytestmark = pytest.mark.anyio

TENANT = "acme"
SIMPLE = [{"name": "v", "type": "int64", "nullable": False}, {"name": "tag", "type": "string"}]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def service(cold_settings: Settings) -> Iterator[StreamTables]:
    svc = build_service(cold_settings)
    try:
        yield svc
    finally:
        svc.close()


class Table:
    """A table of the service under test, with a tiering step (no Spark)."""

    def __init__(self, svc: StreamTables, name: str) -> None:
        self.svc = svc
        self.ns = "ns"
        self.name = name

    @classmethod
    async def create(cls, svc: StreamTables, fields: Any = SIMPLE, partitions: int = 1) -> Table:
        t = cls(svc, f"t{uuid.uuid4().hex[:8]}")
        await svc.create_table(TENANT, t.ns, t.name, fields, partitions)
        return t

    async def append(self, batch: pa.RecordBatch, partition: int = 0) -> None:
        await self.svc.append(TENANT, self.ns, self.name, [batch], partition=partition)

    async def append_simple(self, start: int, n: int, partition: int = 0) -> None:
        batch = pa.record_batch(
            {
                "v": pa.array(range(start, start + n), pa.int64()),
                "tag": pa.array([f"r{i}" if i % 3 else None for i in range(start, start + n)]),
            }
        )
        await self.append(batch, partition)

    def cold(self) -> IcebergColdTable:
        d = self.svc.meta.get_table(TENANT, self.ns, self.name)
        assert self.svc.cold is not None
        cold = self.svc.cold.table(d)
        assert isinstance(cold, IcebergColdTable)
        return cold

    def part(self, partition: int = 0) -> PartitionId:
        d = self.svc.meta.get_table(TENANT, self.ns, self.name)
        return PartitionId(d.tenant, d.table_id, partition)

    def tier(self, upto: int, partition: int = 0, rows_per_file: int | None = None) -> ColdSnapshot:
        assert self.svc.cold is not None
        return tier(
            self.svc.hot, self.svc.cold, self.cold(), self.part(partition), upto, rows_per_file
        )

    async def read_all(self, partition: int = 0, offset: int = 0, chunk: int = 10_000) -> pa.Table:
        batches: list[pa.RecordBatch] = []
        while True:
            r = await self.svc.read(TENANT, self.ns, self.name, partition, offset, chunk)
            if not r.num_records:
                break
            batches.extend(r.batches)
            offset = r.next_offset
        return pa.Table.from_batches(batches, system_schema(self.schema))

    @property
    def schema(self) -> pa.Schema:
        from gateway.wire.schema import parse_fields

        return parse_fields(self.svc.meta.get_table(TENANT, self.ns, self.name).fields)

    async def scan(self, **kw: Any) -> pa.Table:
        result = await self.svc.scan(TENANT, self.ns, self.name, **kw)
        return pa.Table.from_batches([b async for b in result.batches], result.schema)


def key(r: dict[str, Any]) -> tuple[int, int]:
    return (r["_partition"], r["_offset"])


# --------------------------------------------------------------------------------------
async def test_every_admitted_type_round_trips_through_hot_and_iceberg(
    service: StreamTables,
) -> None:
    t = await Table.create(service, ALL_TYPES_FIELDS, partitions=2)
    for p in (0, 1):
        for start, n in ((0, 17), (17, 17), (34, 15)):
            await t.append(all_types_batch(start + p, n), p)
    served = {p: (await t.read_all(p)).to_pylist() for p in (0, 1)}  # from the hot tier
    assert [r["req"] for r in served[1]] == [i + 1 for i in range(49)]
    expected_user = [
        {k: v for k, v in r.items() if not k.startswith("_")} for p in (0, 1) for r in served[p]
    ]
    assert expected_user == [
        r for p in (0, 1) for b in (all_types_batch(p, 49),) for r in b.to_pylist()
    ]

    t.tier(30, 0, rows_per_file=11)
    t.tier(49, 1)
    view = await service.describe_table(TENANT, t.ns, t.name)
    assert [(p.tiered_watermark, p.high_watermark) for p in view.partitions] == [(30, 49), (49, 49)]

    # Stream reads (stitched on partition 0) serve exactly the same records, value for value.
    for p in (0, 1):
        again = await t.read_all(p, chunk=7)
        assert again.schema == system_schema(ALL_TYPES)
        assert again.to_pylist() == served[p]
    # So does a scan, and so do readers that are not Tidegate (the tiered part).
    everything = served[0] + served[1]
    scanned = await t.scan()
    assert scanned.schema == system_schema(ALL_TYPES)
    assert sorted(scanned.to_pylist(), key=key) == everything
    tiered = [r for r in everything if r["_partition"] == 1 or r["_offset"] < 30]
    assert isinstance(service.cold, IcebergColdStore)
    stored = system_schema(ALL_TYPES)
    assert normalise(duckdb_rows(service.cold, t.cold()), stored) == tiered
    assert normalise(pyiceberg_rows(service.cold, t.cold()), stored) == pyiceberg_view(tiered)


async def test_create_refuses_unstorable_schemas(service: StreamTables) -> None:
    with pytest.raises(InvalidSchema):
        await service.create_table(TENANT, "ns", "bad", {"x": "uint32"}, 1)
    assert await service.list_tables(TENANT) == []


async def test_the_iceberg_table_is_made_at_first_use(service: StreamTables) -> None:
    """Creating a stream-table writes nothing to the Iceberg catalog (a create costs the
    same however many tables exist); the first use makes the Iceberg table, empty."""
    created = await service.create_table(TENANT, "ns", "lazy", SIMPLE, 2)
    assert [(p.high_watermark, p.tiered_watermark) for p in created.partitions] == [(0, 0)] * 2
    assert isinstance(service.cold, IcebergColdStore)
    ident = (TENANT, "ns", "lazy")
    assert not service.cold.catalog.table_exists(ident)
    # The metering sampler's look at the tenant's lake bytes makes nothing either.
    assert service.storage_of(TENANT) == (0, 0)
    assert not service.cold.catalog.table_exists(ident)
    described = await service.describe_table(TENANT, "ns", "lazy")
    assert service.cold.catalog.table_exists(ident)
    assert described.iceberg_metadata.endswith(".metadata.json")
    assert await service.list_snapshots(TENANT, "ns", "lazy") == []


async def test_first_uses_at_once_make_one_iceberg_table(service: StreamTables) -> None:
    """Many reads reaching a new table's lake side at once (follow streams opening
    together): one makes the Iceberg table, the others use it; none takes the metadata
    file it finds half-registered for a table dropped behind the gateway's back."""
    await service.create_table(TENANT, "ns", "racy", SIMPLE, 1)
    definition = service.meta.get_table(TENANT, "ns", "racy")
    cold = service.cold
    assert isinstance(cold, IcebergColdStore)
    assert not cold.catalog.table_exists((TENANT, "ns", "racy"))
    tables = [cold.table(definition) for _ in range(8)]
    barrier = threading.Barrier(len(tables))

    def first_use(t: Any) -> int:
        barrier.wait()
        return t.snapshot().watermark(0)

    with concurrent.futures.ThreadPoolExecutor(len(tables)) as pool:
        assert list(pool.map(first_use, tables)) == [0] * len(tables)
    assert cold.catalog.table_exists((TENANT, "ns", "racy"))


async def test_drop_removes_the_iceberg_table(service: StreamTables) -> None:
    t = await Table.create(service)
    await t.append_simple(0, 10)
    t.tier(10)
    assert service.cold is not None
    ident = t.cold().identifier
    await service.drop_table(TENANT, t.ns, t.name)
    assert isinstance(service.cold, IcebergColdStore)
    assert not service.cold.catalog.table_exists(ident)
    # The name can be used again, with a fresh, empty table.
    await service.create_table(TENANT, t.ns, t.name, SIMPLE, 1)
    assert (await t.read_all()).num_rows == 0


async def test_stitched_reads_across_the_boundary(service: StreamTables) -> None:
    t = await Table.create(service)
    for i in range(10):
        await t.append_simple(i * 37, 37)
    t.tier(100, rows_per_file=30)
    t.tier(211, rows_per_file=50)  # not on a batch boundary
    rng = random.Random(3)
    for _ in range(40):
        offset = rng.randrange(0, 370)
        n = rng.choice([1, 5, 37, 111, 500])
        r = await service.read(TENANT, t.ns, t.name, 0, offset, n)
        got = pa.Table.from_batches(r.batches).column("_offset").to_pylist()
        want = list(range(offset, min(offset + n, 370)))
        assert got == want
        assert r.next_offset == offset + len(want)
        assert pa.Table.from_batches(r.batches).column("v").to_pylist() == want
    assert (await t.read_all(chunk=13)).column("v").to_pylist() == list(range(370))
    empty = await service.read(TENANT, t.ns, t.name, 0, 370)
    assert empty.num_records == 0 and empty.next_offset == 370


async def test_earliest_offset_and_out_of_range(service: StreamTables) -> None:
    hot_only = await Table.create(service)
    for i in range(5):
        await hot_only.append_simple(i * 10, 10)
    service.hot.trim(hot_only.part(), 20)
    with pytest.raises(OffsetOutOfRange) as info:
        await service.read(TENANT, hot_only.ns, hot_only.name, 0, 5)
    assert (info.value.details["earliest"], info.value.details["latest"]) == (20, 50)
    with pytest.raises(OffsetOutOfRange):
        await service.read(TENANT, hot_only.ns, hot_only.name, 0, 51)

    tiered = await Table.create(service)
    for i in range(5):
        await tiered.append_simple(i * 10, 10)
    assert (await tiered.read_all()).num_rows == 50  # caches the snapshot (nothing tiered)
    tiered.tier(30)
    # Trimmed at once (a retention shorter than the snapshot reuse): reads look again.
    service.hot.trim(tiered.part(), 30)
    assert (await tiered.read_all()).column("v").to_pylist() == list(range(50))
    view = await service.describe_table(TENANT, tiered.ns, tiered.name)
    assert (view.partitions[0].earliest_offset, view.partitions[0].tiered_watermark) == (0, 30)
    assert (await tiered.read_all()).column("v").to_pylist() == list(range(50))
    # The cached watermark follows the snapshot.
    d = service.meta.get_table(TENANT, tiered.ns, tiered.name)
    assert service.meta.partitions(d.table_id)[0].tiered_watermark == 30


async def test_follow_goes_cold_then_hot_then_live(service: StreamTables) -> None:
    t = await Table.create(service)
    await t.append_simple(0, 50)
    await t.append_simple(50, 50)
    t.tier(60)
    seen: list[int] = []

    async def consume() -> None:
        async for r in service.follow(TENANT, t.ns, t.name, 0, 10, max_records=120):
            for b in r.batches:
                seen.extend(b.column("_offset").to_pylist())

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    await t.append_simple(100, 30)
    await asyncio.wait_for(task, 30)
    assert seen == list(range(10, 130))


async def test_scan_projection_filter_limit_and_as_of(service: StreamTables) -> None:
    t = await Table.create(service, partitions=2)
    for p in (0, 1):
        await t.append_simple(0, 40, p)
        await t.append_simple(40, 40, p)
    s1 = t.tier(50, 0)
    t.tier(30, 1)
    await t.append_simple(80, 5, 0)

    full = await t.scan()
    assert full.num_rows == 165
    assert sorted(key(r) for r in full.to_pylist()) == sorted(
        [(0, o) for o in range(85)] + [(1, o) for o in range(80)]
    )
    proj = await t.scan(columns=["tag", "_offset"])
    assert proj.schema.names == ["tag", "_offset"] and proj.num_rows == 165

    # The filter applies on both sides (cold rows < T, hot rows >= T).
    f = await t.scan(
        columns=["v", "_partition"], row_filter="v >= 45 and v < 55 and tag is not null"
    )
    want = sorted((p, v) for p in (0, 1) for v in range(45, 55) if v % 3)
    assert sorted((r["_partition"], r["v"]) for r in f.to_pylist()) == want
    f2 = await t.scan(row_filter="_partition = 1 and _offset in (1, 29, 30, 79)")
    assert sorted(f2.column("_offset").to_pylist()) == [1, 29, 30, 79]

    assert (await t.scan(limit=7)).num_rows == 7
    assert (await t.scan(limit=0)).num_rows == 0
    assert (await t.scan(limit=100)).num_rows == 100

    # as_of: only that cold snapshot (id or time).
    old = await t.scan(as_of=s1.snapshot_id)
    assert sorted(key(r) for r in old.to_pylist()) == [(0, o) for o in range(50)]
    assert s1.timestamp_ms is not None
    import datetime as dt

    at = dt.datetime.fromtimestamp(s1.timestamp_ms / 1000, dt.UTC).isoformat()
    assert (await t.scan(as_of=at)).num_rows == 50
    assert (await t.scan(as_of=str(s1.snapshot_id))).num_rows == 50

    # Clear errors.
    with pytest.raises(InvalidRequest, match="cannot parse filter"):
        await t.scan(row_filter="v >>> 3")
    with pytest.raises(InvalidRequest, match="nope"):
        await t.scan(row_filter="nope = 1")
    with pytest.raises(InvalidRequest, match="unknown column"):
        await t.scan(columns=["v", "nope"])
    with pytest.raises(SnapshotNotFound):
        await t.scan(as_of=42)
    with pytest.raises(SnapshotNotFound):
        await t.scan(as_of="2001-01-01T00:00:00Z")
    with pytest.raises(InvalidRequest, match="as_of"):
        await t.scan(as_of="yesterday")

    # The read plan is the same pinned view.
    plan = await service.plan(TENANT, t.ns, t.name)
    cold = t.cold().snapshot()
    assert plan.snapshot_id == cold.snapshot_id
    assert [(r.partition, r.from_offset, r.to_offset) for r in plan.hot_ranges] == [
        (0, 50, 85),
        (1, 30, 80),
    ]
    assert sum(f.file.record_count for f in plan.files) == 80
    pruned = await service.plan(TENANT, t.ns, t.name, row_filter="_partition = 1")
    assert {f.file.partition for f in pruned.files} == {1}


async def test_no_row_twice_or_missing_under_concurrent_tiering(service: StreamTables) -> None:
    t = await Table.create(service, partitions=2)
    for i in range(20):
        for p in (0, 1):
            await t.append_simple(i * 25, 25, p)
    stop = threading.Event()
    errors: list[BaseException] = []

    def tiering() -> None:
        rng = random.Random(11)
        try:
            while not stop.is_set():
                for p in (0, 1):
                    snap = t.cold().snapshot()
                    hw = service.hot.offsets(t.part(p)).high
                    upto = min(hw, snap.watermark(p) + rng.randrange(1, 120))
                    t.tier(upto, p, rows_per_file=rng.choice([30, 200, 1000]))
                    stop.wait(0.02)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    worker = threading.Thread(target=tiering, daemon=True)
    worker.start()
    try:
        scans = reads = 0
        for i in range(8):
            await t.append_simple(500 + i * 10, 10, i % 2)
            table = await t.scan(columns=["_partition", "_offset", "v"])
            per: dict[int, list[int]] = {0: [], 1: []}
            for r in table.to_pylist():
                per[r["_partition"]].append(r["_offset"])
                assert r["v"] == r["_offset"] if r["_offset"] < 500 else True
            for offs in per.values():
                assert sorted(offs) == list(range(len(offs))), "a row twice or missing"
            scans += 1
            got = (await t.read_all(i % 2, chunk=random.choice([9, 64, 333]))).column("_offset")
            assert got.to_pylist() == list(range(len(got)))
            reads += 1
    finally:
        stop.set()
        worker.join(60)
    assert not errors, errors
    assert scans == reads == 8
    assert sum(t.cold().snapshot().watermarks.values()) > 0


@pytest.mark.parametrize("storage", ["local-sqlite"], indirect=True)
async def test_stream_read_opens_only_the_files_of_its_range(service: StreamTables) -> None:
    """A 1,000-record stream read at a random offset of a table with 200 data files."""
    from tests.cold.test_iceberg_store import RecordingFS

    t = await Table.create(service)
    for i in range(20):
        await t.append_simple(i * 1000, 1000)
    snap = t.tier(20_000, rows_per_file=100)
    assert len(t.cold().plan(snap)) == 200
    assert isinstance(service.cold, IcebergColdStore)
    recorder = RecordingFS(service.cold.filesystem())
    service.cold._fs = recorder
    offset = random.Random(5).randrange(0, 19_000)
    r = await service.read(TENANT, t.ns, t.name, 0, offset, 1000)
    got = pa.Table.from_batches(r.batches).column("_offset").to_pylist()
    assert got == list(range(offset, offset + 1000))
    first, last = offset // 100, (offset + 999) // 100
    assert len(recorder.opened) == last - first + 1 <= 11
    assert all(
        f.min_offset // 100 in range(first, last + 1)
        for f in t.cold().files(snap, 0, offset, offset + 1000)
    )
