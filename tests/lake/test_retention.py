"""Table retention with real hot tiers (disk and Redis) and a real Iceberg SQL catalog:
the earliest offset is computed by count and by time, recorded (never backwards), and
the records below it leave both tiers; the Iceberg table keeps ``tidegate.watermarks``
and DuckDB no longer sees the removed rows; tiering racing retention loses nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from gateway.cold.base import OPERATION_PROPERTY, WATERMARKS_PROPERTY
from gateway.hot import PartitionId
from gateway.lake.components import Components
from gateway.lake.retention import retain_all, retain_table
from gateway.lake.tiering import tier_table
from gateway.meta import TableDef
from gateway.server.app import build_service
from gateway.wire.errors import OffsetOutOfRange
from tests.cold.helpers import duckdb_rows
from tests.lake.conftest import Harness, tier_settings
from tests.lake.test_compaction import _Interleaving


def _with_retention(h: Harness, d: TableDef, ms: int | None, records: int | None) -> TableDef:
    return h.c.meta.set_retention(d.table_id, ms, records)


def _batches(h: Harness, d: TableDef, p: int, count: int, per: int, start: int = 0) -> None:
    for i in range(count):
        h.append(d, p, [{"k": f"{p}", "n": start + i * per + j} for j in range(per)])


def _earliest(h: Harness, d: TableDef) -> dict[int, int]:
    return {p.partition: p.earliest_offset for p in h.c.meta.partitions(d.table_id)}


def _hot_low(h: Harness, d: TableDef, p: int) -> int:
    return h.c.hot.offsets(PartitionId(d.tenant, d.table_id, p)).low


def _hot_offsets(h: Harness, d: TableDef, p: int) -> list[int]:
    part = PartitionId(d.tenant, d.table_id, p)
    o = h.c.hot.offsets(part)
    out: list[int] = []
    for sb in h.c.hot.read(part, o.low, 10_000, 2**30) if o.high > o.low else []:
        out.extend(range(sb.base_offset, sb.next_offset))
    return out


def test_retention_by_records_removes_from_both_tiers(harness: Harness) -> None:
    h = harness
    d = h.create_table(partitions=2)
    for _ in range(3):  # three data files of ten records per partition: 0..29
        for p in range(2):
            _batches(h, d, p, 1, 10)
        tier_table(h.c, d)  # trims the hot tier (hot_retention_s=0)
    for p in range(2):
        _batches(h, d, p, 10, 1)  # offsets 30..39 stay hot, one record per batch
    d = _with_retention(h, d, None, 15)

    result = retain_table(h.c, d)

    # HW 40 - 15: offset 25 sits inside the third file (20..29), which is rewritten.
    assert result.earliest == {0: 25, 1: 25}
    assert _earliest(h, d) == {0: 25, 1: 25}
    assert result.records == result.tiered_rows == 2 * 25
    rows = h.cold_rows(d)
    assert [(r["_partition"], r["_offset"]) for r in rows] == [
        (p, o) for p in range(2) for o in range(25, 30)
    ]
    cold = h.c.cold.table(d)
    assert [(r["_partition"], r["_offset"]) for r in duckdb_rows(h.c.cold, cold)] == [
        (p, o) for p in range(2) for o in range(25, 30)
    ]
    # pyiceberg's own reader, through the catalog, sees the same rows.
    pyi = h.c.cold.catalog.load_table(cold.identifier).scan().to_arrow()  # type: ignore[attr-defined]
    assert sorted(zip(pyi["_partition"].to_pylist(), pyi["_offset"].to_pylist(), strict=True)) == [
        (p, o) for p in range(2) for o in range(25, 30)
    ]
    last = cold.snapshots()[-1]
    assert last.summary[OPERATION_PROPERTY] == "retention"
    assert last.summary[WATERMARKS_PROPERTY] == '{"0": 30, "1": 30}'  # kept as they were
    assert [_hot_offsets(h, d, p) for p in range(2)] == [list(range(30, 40))] * 2
    assert h.c.meta.last_runs(d.table_id)["retention"].outcome == "ok"

    # Tiering goes on from T(p) = 30: nothing is tiered twice, nothing lost.
    tier_table(h.c, d)
    assert [(r["_partition"], r["_offset"]) for r in h.cold_rows(d)] == [
        (p, o) for p in range(2) for o in range(25, 40)
    ]


def test_retention_by_time_above_the_tiered_watermark_raises_it(harness: Harness) -> None:
    h = harness
    d = h.create_table(partitions=1)
    _batches(h, d, 0, 2, 5)  # 0..9, tiered
    tier_table(h.c, d, trim=False)
    _batches(h, d, 0, 2, 5, start=10)  # 10..19, old, hot only
    time.sleep(0.01)
    cutoff_ms = int(time.time() * 1000) + 1
    time.sleep(0.01)
    _batches(h, d, 0, 2, 5, start=20)  # 20..29, recent
    d = _with_retention(h, d, 60_000, None)

    result = retain_table(h.c, d, now_ms=cutoff_ms + 60_000)

    assert result.earliest == {0: 20}
    assert h.cold_rows(d) == []  # every tiered row was older
    assert h.watermarks(d) == {0: 20}  # T(p) raised: 10..19 will never be tiered
    assert _hot_low(h, d, 0) == 20
    assert _hot_offsets(h, d, 0) == list(range(20, 30))
    tier_table(h.c, d)
    assert [r["_offset"] for r in h.cold_rows(d)] == list(range(20, 30))
    assert [r["n"] for r in h.cold_rows(d)] == list(range(20, 30))


def test_retention_by_time_finds_the_first_recent_tiered_row(harness: Harness) -> None:
    h = harness
    d = h.create_table(partitions=1)
    _batches(h, d, 0, 3, 4)  # 0..11
    time.sleep(0.01)
    cutoff_ms = int(time.time() * 1000) + 1
    time.sleep(0.01)
    _batches(h, d, 0, 2, 4, start=12)  # 12..19
    tier_table(h.c, d)  # one file 0..19: it straddles the cutoff
    d = _with_retention(h, d, 1000, 1000)  # both: the larger offset wins

    result = retain_table(h.c, d, now_ms=cutoff_ms + 1000)

    assert result.earliest == {0: 12}
    assert [r["_offset"] for r in h.cold_rows(d)] == list(range(12, 20))


def test_earliest_offset_never_goes_backwards(harness: Harness) -> None:
    h = harness
    d = h.create_table(partitions=1)
    _batches(h, d, 0, 4, 5)
    tier_table(h.c, d)
    d = _with_retention(h, d, None, 5)
    assert retain_table(h.c, d).earliest == {0: 15}

    # A longer retention keeps what is left; what was removed stays removed.
    d = _with_retention(h, d, None, 1000)
    assert retain_table(h.c, d).earliest == {0: 15}
    h.c.meta.raise_earliest_offsets(d.table_id, {0: 3})
    assert _earliest(h, d) == {0: 15}
    assert [r["_offset"] for r in h.cold_rows(d)] == list(range(15, 20))
    # No retention at all: the job leaves the table alone.
    d = _with_retention(h, d, None, None)
    assert retain_all(h.c, tables=[d]).tables[0].earliest == {}
    assert _earliest(h, d) == {0: 15}


def test_retention_between_tiering_plan_and_commit(harness: Harness) -> None:
    """Retention commits (raising T(p) and trimming the hot tier) after tiering planned
    and wrote its files: tiering's commit conflicts and re-plans from the new T(p)."""
    h = harness
    d = h.create_table(partitions=1)
    _batches(h, d, 0, 10, 2)  # 0..19, all hot
    d = _with_retention(h, d, None, 6)
    ran: list[Any] = []

    result = tier_table(h.c, d, runner=_Interleaving(h, lambda: ran.append(retain_table(h.c, d))))

    assert ran[0].earliest == {0: 14}
    assert result.conflicts == 1 and result.moved == {0: (14, 20)}
    assert h.watermarks(d) == {0: 20}
    assert [r["_offset"] for r in h.cold_rows(d)] == list(range(14, 20))


def test_retention_racing_tiering_loses_nothing_it_keeps(harness: Harness) -> None:
    h = harness
    d = h.create_table(partitions=1)
    d = _with_retention(h, d, None, 25)
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop(job: Any) -> None:
        while not stop.is_set():
            try:
                job()
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
                return

    threads = [
        threading.Thread(target=loop, args=(lambda: tier_table(h.c, d),)),
        threading.Thread(target=loop, args=(lambda: retain_table(h.c, d),)),
    ]
    for t in threads:
        t.start()
    try:
        for i in range(30):
            _batches(h, d, 0, 1, 3, start=3 * i)
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    tier_table(h.c, d)
    retain_table(h.c, d)
    rows = h.cold_rows(d)
    assert [r["_offset"] for r in rows] == list(range(65, 90))
    assert [r["n"] for r in rows] == list(range(65, 90))
    assert _earliest(h, d) == {0: 65}
    assert h.watermarks(d) == {0: 90}
    batch = pa.Table.from_pylist(rows)
    assert batch.num_rows == 25


def test_earliest_offset_holds_once_recorded_before_anything_is_removed(
    hot_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Between recording the earliest offset and removing the records (the retention
    job's steps 2 and 3), every read path already answers as if they were gone."""
    redis = request.getfixturevalue("redis_server") if hot_kind == "redis" else None
    svc = build_service(tier_settings(hot_kind, tmp_path, redis))
    assert svc.cold is not None
    c = Components(svc.settings, svc.meta, svc.hot, svc.cold)
    try:

        async def check() -> None:
            await svc.create_table("default", "ns", "early", {"v": "int64"}, 1)
            for i in range(10):
                batch = pa.record_batch({"v": pa.array([2 * i, 2 * i + 1], pa.int64())})
                await svc.append("default", "ns", "early", [batch], partition=0)
            # A retention that keeps everything: the job would record nothing; the test
            # records the earliest offsets itself, as the job's step 2 does.
            await svc.set_retention("default", "ns", "early", retention_records=1000)
            d = (await svc.table("default", "ns", "early", fresh=True)).definition
            tier_table(c, d, trim=False)  # one data file 0..19
            batch = pa.record_batch({"v": pa.array(range(20, 25), pa.int64())})
            await svc.append("default", "ns", "early", [batch], partition=0)

            async def scanned() -> list[int]:
                result = await svc.scan("default", "ns", "early")
                return [
                    r["_offset"] for b in [b async for b in result.batches] for r in b.to_pylist()
                ]

            for earliest, tiered_left in ((7, True), (22, False)):
                c.meta.raise_earliest_offsets(d.table_id, {0: earliest})
                with pytest.raises(OffsetOutOfRange) as caught:
                    await svc.read("default", "ns", "early", 0, earliest - 1)
                assert caught.value.details["earliest"] == earliest
                res = await svc.read("default", "ns", "early", 0, earliest)
                got = [r["_offset"] for b in res.batches for r in b.to_pylist()]
                assert got == list(range(earliest, 25))
                assert sorted(await scanned()) == list(range(earliest, 25))
                plan = await svc.plan("default", "ns", "early")
                assert plan.earliest == {0: earliest}
                # The straddling file is still planned while it holds retained rows.
                assert bool(plan.files) is tiered_left
                assert [(r.from_offset, r.to_offset) for r in plan.hot_ranges] == [
                    (max(20, earliest), 25)
                ]
                info = await svc.describe_table("default", "ns", "early")
                assert info.partitions[0].earliest_offset == earliest
                # The first offset "at or after the epoch" is the earliest one kept.
                assert await svc.offsets_for_times("default", "ns", "early", 0) == {0: earliest}
            # Nothing was removed yet: the Iceberg table still holds every row.
            cold = c.cold.table(d)
            assert sum(b.num_rows for b in cold.scan(cold.snapshot())) == 20

        asyncio.run(check())
    finally:
        svc.close()
