"""The stream-table model, checked by hypothesis: random interleavings of appends,
tiering runs (local runner), hot retention trims (within and past the retention),
compaction, snapshot expiry (with file deletion) and orphan clean-up, stream reads, scans,
scans left open across other operations, and read plans executed file by file across
other operations, on both hot tiers. Every stream read, scan and plan equals a reference
model (as of when the scan or plan was taken): no gap, no duplicate, no reordering, the
same values, wherever the tier boundary falls; and no file an open scan or plan needs is
deleted while its lease lasts (its read would fail)."""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.config import Settings
from gateway.core import StreamTables
from gateway.lake.compaction import compact_table
from gateway.lake.components import Components
from gateway.lake.expiry import clean_orphans, expire_table
from gateway.lake.tiering import tier_table, trim_hot
from gateway.server.app import build_service
from tests.services import RedisServer

PARTITIONS = 2
RETENTION_S = 60.0

Op = tuple[Any, ...]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, PARTITIONS - 1), st.integers(1, 7)),
        # A small tiering commit in every partition: what compaction is for.
        st.tuples(st.just("append_tier"), st.integers(1, 4)),
        st.tuples(st.just("tier")),
        st.tuples(st.just("trim")),
        st.tuples(st.just("trim_later")),
        st.tuples(
            st.just("read"),
            st.integers(0, PARTITIONS - 1),
            st.integers(0, 40),
            st.integers(1, 9),
        ),
        st.tuples(st.just("scan")),
        st.tuples(st.just("compact")),
        st.tuples(st.just("expire")),
        st.tuples(st.just("orphans")),
        st.tuples(st.just("scan_open")),
        st.tuples(st.just("scan_next")),
        st.tuples(st.just("plan")),
        st.tuples(st.just("plan_next")),
    ),
    min_size=1,
    max_size=14,
)


def _settings(kind: str, data_dir: Path, redis: RedisServer) -> Settings:
    hot: dict[str, Any] = (
        {"type": "disk", "fsync": "never"}
        if kind == "disk"
        else {"type": "redis", "url": redis.url}
    )
    return Settings.explicit(
        data_dir=data_dir,
        tenant="default",
        hot=hot,
        tiering={"hot_retention_s": RETENTION_S, "enabled": False},
        compaction={"enabled": False},
        # As aggressive as it gets: every snapshot replaced a minute ago goes, but the
        # current one and those open scans and plans hold.
        expiry={"enabled": False, "retention_s": RETENTION_S, "keep_last": 1, "orphan_age_s": 0},
        server={"default_read_records": 1000},
    )


async def _check_reads(
    svc: StreamTables, name: str, model: list[list[int]], p: int, offset: int, n: int
) -> None:
    if offset > len(model[p]):
        offset = len(model[p])
    res = await svc.read("default", "ns", name, p, offset, max_records=n)
    got = [(r["_offset"], r["v"]) for b in res.batches for r in b.to_pylist()]
    want = list(enumerate(model[p]))[offset : offset + n]
    assert got == want, (p, offset, n)
    # The whole partition, from 0, in as many calls as it takes.
    seen: list[tuple[int, int]] = []
    at = 0
    while at < len(model[p]):
        res = await svc.read("default", "ns", name, p, at, max_records=5)
        rows = [(r["_offset"], r["v"]) for b in res.batches for r in b.to_pylist()]
        assert rows, f"empty read at {at} below HW {len(model[p])}"
        seen.extend(rows)
        at = res.next_offset
    assert seen == list(enumerate(model[p]))


async def _check_scan(svc: StreamTables, name: str, model: list[list[int]]) -> None:
    result = await svc.scan("default", "ns", name)
    rows = [r for b in [b async for b in result.batches] for r in b.to_pylist()]
    got = sorted((r["_partition"], r["_offset"], r["v"]) for r in rows)
    assert len(got) == len(rows) == sum(len(m) for m in model)
    assert got == [(p, o, v) for p in range(PARTITIONS) for o, v in enumerate(model[p])]


async def _take(it: Any, n: int) -> Any:
    for _ in range(n):
        try:
            yield await it.__anext__()
        except StopAsyncIteration:
            return


def _expected(model: list[list[int]]) -> list[tuple[int, int, int]]:
    return [(p, o, v) for p in range(PARTITIONS) for o, v in enumerate(model[p])]


def _rows(batches: list[pa.RecordBatch]) -> list[tuple[int, int, int]]:
    return sorted((r["_partition"], r["_offset"], r["v"]) for b in batches for r in b.to_pylist())


class _OpenPlan:
    """A read plan executed one data file at a time, as a Spark executor would."""

    def __init__(self, plan: Any, expected: list[tuple[int, int, int]]) -> None:
        self.plan = plan
        self.expected = expected
        self.left = list(plan.files)
        self.batches: list[pa.RecordBatch] = []

    def next_file(self) -> bool:
        """Read one more file; True once every file is read."""
        import pyarrow.parquet as pq

        if self.left:
            f = self.left.pop(0)
            self.batches.extend(
                pq.read_table(f.url).select(["_partition", "_offset", "v"]).to_batches()
            )
        return not self.left


async def _finish_plan(svc: StreamTables, name: str, op: _OpenPlan) -> None:
    while not op.next_file():
        pass
    rows = _rows(op.batches)
    for r in op.plan.hot_ranges:
        at = r.from_offset
        while at < r.to_offset:
            res = await svc.read(
                "default", "ns", name, r.partition, at, max_records=r.to_offset - at
            )
            rows.extend(
                (r.partition, x["_offset"], x["v"])
                for b in res.batches
                for x in b.to_pylist()
                if x["_offset"] < r.to_offset
            )
            at = res.next_offset
    assert sorted(rows) == op.expected


def _run(kind: str, redis: RedisServer, program: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        svc = build_service(_settings(kind, Path(tmp), redis))
        assert svc.cold is not None
        c = Components(svc.settings, svc.meta, svc.hot, svc.cold)
        name = f"t{uuid.uuid4().hex[:10]}"
        model: list[list[int]] = [[] for _ in range(PARTITIONS)]
        counter = 0
        scans: list[tuple[Any, list[pa.RecordBatch], list[tuple[int, int, int]]]] = []
        plans: list[_OpenPlan] = []

        async def main() -> None:
            nonlocal counter
            await svc.create_table("default", "ns", name, {"v": "int64"}, PARTITIONS)
            d = (await svc.table("default", "ns", name)).definition
            for op in program:
                if op[0] == "append":
                    _, p, n = op
                    values = list(range(counter, counter + n))
                    counter += n
                    batch = pa.record_batch({"v": pa.array(values, pa.int64())})
                    await svc.append("default", "ns", name, [batch], partition=p)
                    model[p].extend(values)
                elif op[0] == "append_tier":
                    for p in range(PARTITIONS):
                        values = list(range(counter, counter + op[1]))
                        counter += op[1]
                        batch = pa.record_batch({"v": pa.array(values, pa.int64())})
                        await svc.append("default", "ns", name, [batch], partition=p)
                        model[p].extend(values)
                    await asyncio.to_thread(tier_table, c, d, trim=False)
                elif op[0] == "tier":
                    await asyncio.to_thread(tier_table, c, d, trim=False)
                elif op[0] == "trim":
                    # Within the retention: trims nothing tiered less than 60 s ago.
                    assert await asyncio.to_thread(trim_hot, c, d) == {}
                elif op[0] == "trim_later":
                    # As if the retention had passed since every commit so far.
                    later = time.time() + RETENTION_S + 1
                    await asyncio.to_thread(trim_hot, c, d, now=later)
                elif op[0] == "read":
                    await _check_reads(svc, name, model, op[1], op[2], op[3])
                elif op[0] == "compact":
                    await asyncio.to_thread(compact_table, c, d)
                elif op[0] == "expire":
                    # A minute on: every snapshot replaced before now is past retention.
                    later = time.time() + RETENTION_S + 1
                    await asyncio.to_thread(expire_table, c, d, now=later)
                elif op[0] == "orphans":
                    await asyncio.to_thread(clean_orphans, c, d, now=time.time() + 1)
                elif op[0] == "scan_open":
                    result = await svc.scan("default", "ns", name)
                    it = result.batches
                    first = [b async for b in _take(it, 1)]
                    scans.append((it, first, _expected(model)))
                elif op[0] == "scan_next" and scans:
                    it, got, want = scans.pop(0)
                    got.extend([b async for b in it])
                    assert _rows(got) == want
                elif op[0] == "plan":
                    plan = await svc.plan("default", "ns", name)
                    plans.append(_OpenPlan(plan, _expected(model)))
                elif op[0] == "plan_next" and plans:
                    if plans[0].next_file():
                        await _finish_plan(svc, name, plans.pop(0))
                elif op[0] == "scan":
                    await _check_scan(svc, name, model)
            # Finally, the open scans and plans, every partition and the whole table.
            for it, got, want in scans:
                got.extend([b async for b in it])
                assert _rows(got) == want
            for open_plan in plans:
                await _finish_plan(svc, name, open_plan)
            for p in range(PARTITIONS):
                await _check_reads(svc, name, model, p, 0, 1000)
            await _check_scan(svc, name, model)

        try:
            asyncio.run(main())
        finally:
            svc.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["disk", "redis"])
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(program=ops)
# The interleavings the leases exist for, always checked: a plan and a scan opened on
# small files, compaction and expiry (and the orphan clean-up) while they are open, then
# the plan read file by file and the scan finished, and more tiering on top.
@example(
    program=[
        ("append_tier", 2),
        ("append_tier", 3),
        ("append", 0, 2),
        ("plan",),
        ("scan_open",),
        ("compact",),
        ("expire",),
        ("orphans",),
        ("plan_next",),
        ("append_tier", 1),
        ("compact",),
        ("expire",),
        ("plan_next",),
        ("scan_next",),
        ("read", 0, 1, 4),
        ("plan_next",),
    ]
)
@example(
    program=[
        ("append_tier", 1),
        ("append_tier", 1),
        ("append_tier", 1),
        ("trim_later",),
        ("plan",),
        ("compact",),
        ("append_tier", 2),
        ("expire",),
        ("plan_next",),
        ("compact",),
        ("expire",),
        ("orphans",),
        ("plan_next",),
        ("plan_next",),
        ("scan",),
    ]
)
def test_stream_table_matches_model(
    kind: str, redis_server: RedisServer, program: list[Op]
) -> None:
    _run(kind, redis_server, program)
