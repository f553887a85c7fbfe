"""The write path of primary-key tables through the core, on both hot tiers: writes are
resolved into the changelog they make (docs/decisions/primary-keys.md), each merge engine
decides as :mod:`gateway.wire.changes` does, the stream read is the changelog, and bad
writes store nothing."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from gateway.config import Settings
from gateway.core import StreamTables
from gateway.core.recent import RecentBatches
from gateway.hot import PartitionId
from gateway.server.app import build_service
from gateway.wire.changes import Change
from gateway.wire.errors import InvalidIdempotentAppend, InvalidRequest, SchemaMismatch
from gateway.wire.routing import partition_for_key
from gateway.wire.types import AppendRange
from tests.keytables import FIELDS, USER, replay
from tests.services import RedisServer

pytestmark = pytest.mark.anyio

TENANT = "acme"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["disk", "redis"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StreamTables]:
    hot: dict[str, Any] = {"type": "disk", "fsync": "batch"}
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        hot = {"type": "redis", "url": server.url}
    settings = Settings.explicit(data_dir=tmp_path, hot=hot, tiering={"enabled": False})
    svc = build_service(settings)
    try:
        yield svc
    finally:
        svc.close()


class KeyTable:
    def __init__(self, svc: StreamTables, partitions: int) -> None:
        self.svc = svc
        self.name = f"k{uuid.uuid4().hex[:8]}"
        self.partitions = partitions

    @classmethod
    async def create(
        cls, svc: StreamTables, partitions: int = 1, engine: Any = None, **kw: Any
    ) -> KeyTable:
        t = cls(svc, partitions)
        await svc.create_table(
            TENANT,
            "ns",
            t.name,
            kw.get("fields", FIELDS),
            partitions,
            primary_key=kw.get("primary_key", ["id", "region"]),
            merge_engine=engine,
        )
        return t

    async def write(self, rows: list[dict[str, Any]], **kw: Any) -> list[AppendRange]:
        schema = pa.schema(
            [
                pa.field("id", pa.int64()),
                pa.field("region", pa.string()),
                pa.field("v", pa.int64()),
                pa.field("note", pa.string()),
                *([pa.field("_change", pa.int8())] if any("_change" in r for r in rows) else []),
            ]
        )
        full = [{n: r.get(n) for n in schema.names} for r in rows]
        batch = pa.RecordBatch.from_pylist(full, schema=schema)
        return await self.svc.append(TENANT, "ns", self.name, [batch], **kw)

    async def changelog(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for p in range(self.partitions):
            result = await self.svc.read(TENANT, "ns", self.name, p, 0, 1 << 20, None)
            assert result.schema.names == [*USER, "_change", "_partition", "_offset", "_timestamp"]
            out += pa.Table.from_batches(result.batches, result.schema).to_pylist()
        return out


async def test_random_upserts_and_deletes_replay_to_the_model(service: StreamTables) -> None:
    t = await KeyTable.create(service, partitions=3)
    rng = random.Random(42)
    model: dict[tuple[int, str], dict[str, Any]] = {}
    for step in range(40):
        batch = []
        for _ in range(rng.randint(1, 30)):
            key = (rng.randrange(60), rng.choice(["eu", "us"]))
            row = {"id": key[0], "region": key[1], "v": step, "note": f"s{step}"}
            if rng.random() < 0.3:
                batch.append({"id": key[0], "region": key[1], "_change": Change.DELETE})
                model.pop(key, None)
            else:
                row["_change"] = rng.choice([Change.INSERT, Change.UPDATE_AFTER, None])
                batch.append(row)
                model[key] = {n: row[n] for n in USER}
        await t.write(batch)
    changes = await t.changelog()
    assert replay(changes) == model
    # Every change is resolved: no upsert that changed nothing is in the log.
    assert all(c["_change"] in (0, 1, 2, 3) for c in changes)


async def test_concurrent_writers_to_the_same_keys_resolve_in_turn(service: StreamTables) -> None:
    t = await KeyTable.create(service, partitions=1)

    async def writer(w: int) -> None:
        for i in range(15):
            await t.write(
                [{"id": k, "region": "eu", "v": w * 100 + i, "note": None} for k in range(5)]
            )

    await asyncio.gather(*(writer(w) for w in range(4)))
    changes = await t.changelog()
    state = replay(changes)
    assert set(state) == {(k, "eu") for k in range(5)}
    # One +I per key, then a -U/+U pair per later write: nothing lost, nothing twice.
    assert sum(c["_change"] == Change.INSERT for c in changes) == 5
    assert sum(c["_change"] == Change.UPDATE_AFTER for c in changes) == 5 * (4 * 15 - 1)


@pytest.mark.parametrize(
    ("engine", "want"),
    [
        (None, {"v": 1, "note": "late"}),
        ("first_row", {"v": 5, "note": "first"}),
        ({"type": "versioned", "column": "v"}, {"v": 5, "note": "first"}),
        ("partial_update", {"v": 1, "note": "first"}),
    ],
)
async def test_each_merge_engine_decides_the_change(
    service: StreamTables, engine: Any, want: dict[str, Any]
) -> None:
    t = await KeyTable.create(service, engine=engine)
    first = await t.write([{"id": 1, "region": "eu", "v": 5, "note": "first"}])
    assert first == [AppendRange(0, 0, 1)]
    late = {"id": 1, "region": "eu", "v": 1, "note": None if engine == "partial_update" else "late"}
    second = await t.write([late])
    changes = await t.changelog()
    state = replay(changes)
    assert state == {(1, "eu"): {"id": 1, "region": "eu", **want}}
    if engine in ("first_row",) or isinstance(engine, dict):
        # Kept the old row: nothing appended, the high watermark did not move.
        assert second == [AppendRange(0, 1, 0)]
        assert [c["_change"] for c in changes] == [Change.INSERT]
    else:
        assert [c["_change"] for c in changes] == [0, 1, 2]
    # A delete removes the key under every engine; a delete of an absent key is nothing.
    await t.write(
        [{"id": 1, "region": "eu", "_change": 3}, {"id": 9, "region": "eu", "_change": 3}]
    )
    assert replay(await t.changelog()) == {}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"id": 1, "region": "eu", "v": 1, "_change": 1},
            r"row 1\._change is 1; a write's _change is 0 or 2 \(upsert\) and 3 \(delete\)",
        ),
        (
            {"id": None, "region": "eu", "_change": 3},
            r"'id' is not nullable but holds nulls",
        ),
    ],
)
async def test_a_bad_write_is_one_sentence_and_stores_nothing(
    service: StreamTables, row: dict[str, Any], message: str
) -> None:
    t = await KeyTable.create(service, partitions=2)
    good = {"id": 2, "region": "us", "v": 1, "note": "x"}
    with pytest.raises(SchemaMismatch, match=message) as err:
        await t.write([good, row])
    assert err.value.message.count(". ") == 0
    assert await t.changelog() == []


async def test_a_versioned_upsert_without_its_version_is_refused(service: StreamTables) -> None:
    t = await KeyTable.create(service, engine={"type": "versioned", "column": "v"})
    with pytest.raises(SchemaMismatch, match=r"row 0\.v is null in an upsert; every upsert"):
        await t.write([{"id": 1, "region": "eu", "v": None, "note": "x"}])
    assert await t.changelog() == []


async def test_an_idempotent_retry_is_applied_once(service: StreamTables) -> None:
    t = await KeyTable.create(service)
    row = {"id": 1, "region": "eu", "v": 1, "note": "a"}
    first = await t.write([row], producer_id="p", sequence=0)
    assert first == [AppendRange(0, 0, 1)]
    # The retry resolves to -U/+U now, yet is answered as the batch it is.
    again = await t.write([row], producer_id="p", sequence=0)
    assert again == [AppendRange(0, 0, 1, duplicate=True)]
    # A write that changes nothing (a delete of an absent key) still takes its sequence.
    gone = await t.write([{"id": 7, "region": "eu", "_change": 3}], producer_id="p", sequence=1)
    assert gone == [AppendRange(0, 1, 0)]
    assert await t.write(
        [{"id": 7, "region": "eu", "_change": 3}], producer_id="p", sequence=1
    ) == [AppendRange(0, 1, 0, duplicate=True)]
    nxt = await t.write([{**row, "note": "b"}], producer_id="p", sequence=2)
    assert nxt == [AppendRange(0, 1, 2)]
    assert replay(await t.changelog()) == {(1, "eu"): {**row, "note": "b"}}
    with pytest.raises(InvalidIdempotentAppend, match="count sequences by batch"):
        await t.write([row], producer_id="k", sequence=0, sequence_counts_records=True)


async def test_two_gateways_over_one_redis_resolve_each_others_writes(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Two gateways (each with its own cache of recent change batches) over one Redis and
    one metadata store write the same keys at once: each resolves against the other's
    changes, so the changelog replays cleanly (every -U is the live row) to the last write
    of each key."""
    server: RedisServer = request.getfixturevalue("redis_server")
    settings = Settings.explicit(
        data_dir=tmp_path, hot={"type": "redis", "url": server.url}, tiering={"enabled": False}
    )
    one, two = build_service(settings), build_service(settings)
    try:
        t = await KeyTable.create(one, partitions=2)
        other = KeyTable(two, 2)
        other.name = t.name
        last: dict[int, int] = {}

        async def writer(side: KeyTable, w: int) -> None:
            rng = random.Random(w)
            for i in range(25):
                keys = rng.sample(range(12), 4)
                await side.write(
                    [{"id": k, "region": "eu", "v": w * 1000 + i, "note": None} for k in keys]
                )

        await asyncio.gather(writer(t, 1), writer(other, 2))
        changes = await t.changelog()
        state = replay(changes)
        for c in sorted(changes, key=lambda c: (c["_partition"], c["_offset"])):
            if c["_change"] in (Change.INSERT, Change.UPDATE_AFTER):
                last[c["id"]] = c["v"]
        assert {k[0]: row["v"] for k, row in state.items()} == last
        assert sum(c["_change"] == Change.INSERT for c in changes) == len(state) == 12
        assert sum(c["_change"] == Change.UPDATE_AFTER for c in changes) == 2 * 25 * 4 - 12
    finally:
        one.close()
        two.close()


def test_recent_batches_find_by_offset_evict_and_forget() -> None:
    def rows(n: int) -> pa.RecordBatch:
        return pa.record_batch({"x": pa.array(range(n), pa.int64())})

    a, b = PartitionId("t", "x", 0), PartitionId("t", "x", 1)
    recent = RecentBatches(max_bytes=8 * 100 * 4)  # four batches of 100 int64
    recent.add(a, 0, rows(100), 7)
    recent.add(a, 100, rows(100), 8)
    recent.add(b, 0, rows(100), 9)
    found = recent.find(a, 150)
    assert found is not None and found[0] == 100 and found[2] == 8
    assert recent.find(a, 200) is None and recent.find(b, 100) is None
    for base in (200, 300):
        recent.add(a, base, rows(100), 1)  # over the bound: the least recently used go
    assert recent.find(a, 0) is None and recent.find(a, 150) is not None
    recent.forget(a)
    assert recent.find(a, 150) is None and recent.find(a, 250) is None
    assert recent.find(b, 5) is not None


def test_recent_batches_of_another_incarnation_are_dropped_and_never_kept() -> None:
    """A lookup that answers a new incarnation of a partition's hot state (another
    gateway re-seeded it) drops what was kept of the old one, and a batch read under the
    old one is not kept afterwards; a tier without incarnations (None) changes nothing."""
    rows = pa.record_batch({"x": pa.array(range(10), pa.int64())})
    a, b = PartitionId("t", "x", 0), PartitionId("t", "x", 1)
    recent = RecentBatches()
    recent.observe(a, "one")
    recent.add(a, 0, rows, 1, "one")
    recent.add(b, 0, rows, 1)
    recent.observe(a, None)
    assert recent.find(a, 5) is not None
    recent.observe(a, "one")
    assert recent.find(a, 5) is not None
    recent.observe(a, "two")
    assert recent.find(a, 5) is None and recent.find(b, 5) is not None
    recent.add(a, 0, rows, 1, "one")  # read before the re-seed, kept after: refused
    assert recent.find(a, 5) is None
    recent.add(a, 0, rows, 1, "two")
    assert recent.find(a, 5) is not None
    recent.forget(a)  # this process re-seeded it: what it sees next is new again
    recent.add(a, 0, rows, 1, "two")
    assert recent.find(a, 5) is None


async def test_a_partition_asked_must_be_where_the_keys_route(service: StreamTables) -> None:
    t = await KeyTable.create(service, partitions=4)
    rows = [{"id": i, "region": "eu", "v": 1, "note": None} for i in range(8)]
    with pytest.raises(InvalidRequest, match=r"routes by its key to partition \d, not \d; a"):
        await t.write(rows, partition=0)
    assert await t.changelog() == []
    p = partition_for_key([3, "eu"], 4)
    assert await t.write([rows[3]], partition=p) == [AppendRange(p, 0, 1)]


async def test_a_scan_of_named_partitions_reads_no_other_hot_range(
    service: StreamTables, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Spark read of a key table scans one partition per task (``_partition = p``):
    each such scan merges that partition's hot changes only, not every partition's."""
    t = await KeyTable.create(service, partitions=3)
    rows = [{"id": i, "region": "eu", "v": i, "note": None} for i in range(40)]
    await t.write(rows)
    await t.write([{**r, "v": r["v"] + 1} for r in rows[::2]])
    asked: list[int] = []
    read = service.hot.read

    def recorded(part: PartitionId, *args: Any, **kw: Any) -> Any:
        asked.append(part.partition)
        return read(part, *args, **kw)

    monkeypatch.setattr(service.hot, "read", recorded)

    async def scan(text: str) -> list[dict[str, Any]]:
        result = await service.scan(TENANT, "ns", t.name, row_filter=text)
        return pa.Table.from_batches([b async for b in result.batches], result.schema).to_pylist()

    every = await scan("v >= 0")
    assert len(every) == 40 and set(asked) == {0, 1, 2}
    for p in range(3):
        asked.clear()
        got = await scan(f"_partition = {p} and v >= 0")
        assert set(asked) == {p}
        assert got == [r for r in every if r["_partition"] == p]
    asked.clear()
    assert len(await scan("_partition in (0, 2)")) == sum(r["_partition"] != 1 for r in every)
    assert set(asked) == {0, 2}
