"""The stream-table model, checked by hypothesis: random interleavings of appends,
tiering runs (local runner), hot retention trims (within and past the retention),
compaction, snapshot expiry (with file deletion) and orphan clean-up, table retention by
record count, a schema change adding a nullable column, stream reads, scans, scans left
open across other operations, and read plans executed file by file across other
operations, on both hot tiers. Every stream read, scan and plan equals a reference model
(as of when the scan or plan was taken): no gap, no duplicate, no reordering, the same
values, wherever the tier boundary falls; rows below a partition's earliest offset are
gone (a read there is OFFSET_OUT_OF_RANGE naming it) and the added column is null for the
rows written before it; and no file an open scan or plan needs is deleted while its lease
lasts (its read would fail). A retention removes hot records at once, so the scans and
plans open when it runs are finished first (one open across it may lose them)."""

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
from gateway.lake.retention import retain_table
from gateway.lake.tiering import tier_table, trim_hot
from gateway.server.app import build_service
from gateway.wire.errors import OffsetOutOfRange
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
        # Keep the last N records of each partition (retention by count).
        st.tuples(st.just("retention"), st.integers(0, 12)),
        st.tuples(st.just("add_column")),
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
        retention={"enabled": False, "settle_s": 0},
        # As aggressive as it gets: every snapshot replaced a minute ago goes, but the
        # current one and those open scans and plans hold.
        expiry={"enabled": False, "retention_s": RETENTION_S, "keep_last": 1, "orphan_age_s": 0},
        server={"default_read_records": 1000},
    )


#: Per partition, the rows by offset: ``(v, w)``, ``w`` None for rows written before the
#: column was added (or the table without it). Offsets below ``earliest`` are gone.
Model = list[list[tuple[int, int | None]]]


def _row(r: dict[str, Any]) -> tuple[int, int | None]:
    return (r["v"], r.get("w"))


async def _check_reads(
    svc: StreamTables,
    name: str,
    model: Model,
    earliest: list[int],
    p: int,
    offset: int,
    n: int,
) -> None:
    if offset > len(model[p]):
        offset = len(model[p])
    if offset < earliest[p]:
        with pytest.raises(OffsetOutOfRange) as caught:
            await svc.read("default", "ns", name, p, offset, max_records=n)
        assert caught.value.details["earliest"] == earliest[p]
        offset = earliest[p]
    res = await svc.read("default", "ns", name, p, offset, max_records=n)
    got = [(r["_offset"], _row(r)) for b in res.batches for r in b.to_pylist()]
    want = list(enumerate(model[p]))[offset : offset + n]
    assert got == want, (p, offset, n)
    # The whole partition, from its earliest offset, in as many calls as it takes.
    seen: list[tuple[int, tuple[int, int | None]]] = []
    at = earliest[p]
    while at < len(model[p]):
        res = await svc.read("default", "ns", name, p, at, max_records=5)
        rows = [(r["_offset"], _row(r)) for b in res.batches for r in b.to_pylist()]
        assert rows, f"empty read at {at} below HW {len(model[p])}"
        seen.extend(rows)
        at = res.next_offset
    assert seen == list(enumerate(model[p]))[earliest[p] :]


async def _check_scan(svc: StreamTables, name: str, model: Model, earliest: list[int]) -> None:
    result = await svc.scan("default", "ns", name)
    rows = [r for b in [b async for b in result.batches] for r in b.to_pylist()]
    got = sorted((r["_partition"], r["_offset"], _row(r)) for r in rows)
    assert len(got) == len(rows)
    assert got == _expected(model, earliest)


async def _take(it: Any, n: int) -> Any:
    for _ in range(n):
        try:
            yield await it.__anext__()
        except StopAsyncIteration:
            return


Expected = list[tuple[int, int, tuple[int, int | None]]]


def _expected(model: Model, earliest: list[int]) -> Expected:
    return [
        (p, o, v) for p in range(PARTITIONS) for o, v in enumerate(model[p]) if o >= earliest[p]
    ]


def _rows(batches: list[pa.RecordBatch]) -> Expected:
    return sorted((r["_partition"], r["_offset"], _row(r)) for b in batches for r in b.to_pylist())


class _OpenPlan:
    """A read plan executed one data file at a time, as a Spark executor would."""

    def __init__(self, plan: Any, expected: Expected) -> None:
        self.plan = plan
        self.expected = expected
        self.left = list(plan.files)
        self.batches: list[pa.RecordBatch] = []
        self.plan_columns = set(plan.schema.names)

    def next_file(self) -> bool:
        """Read one more file; True once every file is read."""
        import pyarrow.parquet as pq

        if self.left:
            f = self.left.pop(0)
            data = pq.read_table(f.url)
            # A file written before the column was added lacks it: null, as engines read.
            if "w" in self.plan_columns and "w" not in data.column_names:
                data = data.append_column("w", pa.nulls(data.num_rows, pa.int64()))
            wanted = [c for c in ("_partition", "_offset", "v", "w") if c in data.column_names]
            self.batches.extend(data.select(wanted).to_batches())
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
                (r.partition, x["_offset"], _row(x))
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
        model: Model = [[] for _ in range(PARTITIONS)]
        earliest = [0] * PARTITIONS
        added = False
        counter = 0
        scans: list[tuple[Any, list[pa.RecordBatch], Expected]] = []
        plans: list[_OpenPlan] = []

        def batch_of(values: list[int]) -> tuple[pa.RecordBatch, list[tuple[int, int | None]]]:
            cols = {"v": pa.array(values, pa.int64())}
            if added:
                cols["w"] = pa.array([-x for x in values], pa.int64())
            rows = [(x, -x if added else None) for x in values]
            return pa.record_batch(cols), rows

        async def drain() -> None:
            """Finish and check the open scans and plans."""
            for it, got, want in scans:
                got.extend([b async for b in it])
                assert _rows(got) == want
            scans.clear()
            for open_plan in plans:
                await _finish_plan(svc, name, open_plan)
            plans.clear()

        async def main() -> None:
            nonlocal counter, added
            await svc.create_table("default", "ns", name, {"v": "int64"}, PARTITIONS)
            d = (await svc.table("default", "ns", name)).definition
            for op in program:
                if op[0] == "append":
                    _, p, n = op
                    values = list(range(counter, counter + n))
                    counter += n
                    batch, rows = batch_of(values)
                    await svc.append("default", "ns", name, [batch], partition=p)
                    model[p].extend(rows)
                elif op[0] == "append_tier":
                    for p in range(PARTITIONS):
                        values = list(range(counter, counter + op[1]))
                        counter += op[1]
                        batch, rows = batch_of(values)
                        await svc.append("default", "ns", name, [batch], partition=p)
                        model[p].extend(rows)
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
                    await _check_reads(svc, name, model, earliest, op[1], op[2], op[3])
                elif op[0] == "compact":
                    await asyncio.to_thread(compact_table, c, d)
                elif op[0] == "expire":
                    # A minute on: every snapshot replaced before now is past retention.
                    later = time.time() + RETENTION_S + 1
                    await asyncio.to_thread(expire_table, c, d, now=later)
                elif op[0] == "orphans":
                    await asyncio.to_thread(clean_orphans, c, d, now=time.time() + 1)
                elif op[0] == "retention":
                    await drain()
                    keep = op[1] or 1
                    await svc.set_retention("default", "ns", name, retention_records=keep)
                    now = await asyncio.to_thread(c.meta.get_table, "default", "ns", name)
                    result = await asyncio.to_thread(retain_table, c, now)
                    for p in range(PARTITIONS):
                        earliest[p] = max(earliest[p], len(model[p]) - keep)
                        assert result.earliest.get(p, 0) == earliest[p]
                elif op[0] == "add_column" and not added:
                    await svc.alter_schema(
                        "default",
                        "ns",
                        name,
                        [{"op": "add_column", "column": "w", "type": "int64"}],
                    )
                    added = True
                elif op[0] == "scan_open":
                    result = await svc.scan("default", "ns", name)
                    it = result.batches
                    first = [b async for b in _take(it, 1)]
                    scans.append((it, first, _expected(model, earliest)))
                elif op[0] == "scan_next" and scans:
                    it, got, want = scans.pop(0)
                    got.extend([b async for b in it])
                    assert _rows(got) == want
                elif op[0] == "plan":
                    plan = await svc.plan("default", "ns", name)
                    plans.append(_OpenPlan(plan, _expected(model, earliest)))
                elif op[0] == "plan_next" and plans:
                    if plans[0].next_file():
                        await _finish_plan(svc, name, plans.pop(0))
                elif op[0] == "scan":
                    await _check_scan(svc, name, model, earliest)
            # Finally, the open scans and plans, every partition and the whole table.
            await drain()
            for p in range(PARTITIONS):
                await _check_reads(svc, name, model, earliest, p, 0, 1000)
            await _check_scan(svc, name, model, earliest)

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
# Retention and a schema change among tiering and compaction: the straddling file is
# rewritten, the raised T(p) lets tiering go on, the added column reads null before.
@example(
    program=[
        ("append_tier", 3),
        ("append", 0, 5),
        ("add_column",),
        ("append_tier", 2),
        ("plan",),
        ("retention", 6),
        ("read", 0, 0, 9),
        ("append", 1, 4),
        ("compact",),
        ("retention", 9),
        ("tier",),
        ("scan",),
        ("expire",),
        ("retention", 2),
        ("read", 1, 3, 9),
    ]
)
def test_stream_table_matches_model(
    kind: str, redis_server: RedisServer, program: list[Op]
) -> None:
    _run(kind, redis_server, program)
