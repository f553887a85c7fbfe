"""Issue 30.1: lake work follows what changed. With 2,000 idle tables on either hot tier,
a tiering pass visits none of them (the job's report, the hot tier's own counters); an
append to one of them marks it, and the next pass tiers it."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import redis
from sqlalchemy.orm import Session

from gateway.config import Settings
from gateway.core import StreamTables
from gateway.hot import PartitionId
from gateway.hot.disk import DiskHotLog
from gateway.hot.disk.log import MIN_OPEN_FILES
from gateway.lake.components import Components
from gateway.lake.runners import LocalRunner
from gateway.lake.scheduler import changed_tables, run_once
from gateway.meta.engine import SQLITE_BEGIN
from gateway.meta.models import PartitionRecord, TableRecord, Tenant, utcnow
from gateway.metrics import HOT_DISK_EVICTIONS
from gateway.server.app import build_service
from tests.lake.conftest import FIELDS, tier_settings

pytestmark = pytest.mark.anyio

IDLE = 2_000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def settings_of(hot_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    redis_server = request.getfixturevalue("redis_server") if hot_kind == "redis" else None
    return tier_settings(hot_kind, tmp_path, redis_server), redis_server


def _bulk_tables(svc: StreamTables, tenant: str, n: int, partitions: int = 4) -> list[str]:
    """``n`` tables of ``tenant`` in the metadata store in one transaction (as many
    creates through the API would leave them, minus their minutes on a loaded machine;
    their Iceberg tables are never needed: nothing asks to tier them)."""
    ids = [str(uuid.uuid4()) for _ in range(n)]
    now = utcnow()
    # A writer's transaction, as the store's own (``BEGIN IMMEDIATE`` on SQLite): a
    # deferred one that reads first may meet "database is locked" at its first write,
    # without SQLite's busy wait, while the service records its marks.
    engine = svc.meta.engine.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})
    with Session(engine) as session, session.begin():
        if session.get(Tenant, tenant) is None:
            session.add(Tenant(id=tenant, status="active", created_at=now))
            session.flush()
        session.add_all(
            TableRecord(
                id=i,
                tenant_id=tenant,
                namespace="idle",
                name=f"t{k}",
                schema_json='[{"name": "k", "type": "string", "nullable": true}]',
                partitions=partitions,
                key_columns_json="[]",
                created_at=now,
                schema_version=0,
            )
            for k, i in enumerate(ids)
        )
        session.flush()
        session.add_all(
            PartitionRecord(table_id=i, partition=p, shard="default")
            for i in ids
            for p in range(partitions)
        )
    return ids


def _redis_calls(probe: redis.Redis) -> int:
    """Commands the Redis server ran so far (its own counters), INFO aside (``probe``:
    one connection, so that counting adds no handshake of its own)."""
    stats = probe.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")


async def test_a_tiering_pass_visits_no_idle_table(settings_of: Any) -> None:
    settings, redis_server = settings_of
    tenant = f"t{uuid.uuid4().hex[:8]}"
    svc = build_service(settings)
    try:
        # A few tables written once (to be tiered, then left idle)...
        active = [f"a{k}" for k in range(3)]
        for name in active:
            await svc.create_table(tenant, "ns", name, FIELDS, 4)
            batch = pa.record_batch({"k": ["x"], "n": [1]})
            await svc.append(tenant, "ns", name, [batch], partition=0)
        # ... and 2,000 never written.
        _bulk_tables(svc, tenant, IDLE)
    finally:
        svc.close()  # records what it acknowledged, as its once-a-second loop does

    with Components.open(settings) as c:
        first = run_once(c, LocalRunner(c), "tier", changed=True)
        assert first.ok and first.records == 3
        assert sorted(r.table for r in first.tables) == [f"ns.{n}" for n in active]
        if isinstance(c.hot, DiskHotLog):
            assert c.hot.open_files > 0  # a visit opens the partitions it reads
        # One file in one partition each: nothing for compaction to rewrite, no visit.
        assert changed_tables(c, "compact") == []

    # Idle now: passes find nothing to visit and touch neither tier for it (a fresh
    # disk hot tier opens a partition's files at its first use: none is opened).
    with Components.open(settings) as c:
        probe = redis.Redis.from_url(redis_server.url) if redis_server is not None else None
        before = _redis_calls(probe) if probe is not None else 0
        for _ in range(3):
            assert changed_tables(c, "tier") == []
            idle = run_once(c, LocalRunner(c), "tier", changed=True)
            assert idle.ok and idle.tables == [] and idle.records == 0
        if probe is not None:
            assert _redis_calls(probe) == before
            probe.close()
        else:
            assert isinstance(c.hot, DiskHotLog) and c.hot.open_files == 0

    # An append to an idle table marks it; the next pass tiers it, and only it.
    svc = build_service(settings)
    try:
        await svc.append(tenant, "idle", "t1234", [pa.record_batch({"k": ["late"]})])
    finally:
        svc.close()
    with Components.open(settings) as c:
        [due] = changed_tables(c, "tier")
        assert (due.namespace, due.name) == ("idle", "t1234")
        after = run_once(c, LocalRunner(c), "tier", changed=True)
        assert after.ok and [r.table for r in after.tables] == ["idle.t1234"]
        assert after.records == 1
        snap = c.cold.table(due).snapshot()
        assert sum(snap.watermark(p) for p in range(due.partitions)) == 1
        assert changed_tables(c, "tier") == []
        assert changed_tables(c, "compact") == []

    # A second file in a partition that has one: now compaction has work there.
    svc = build_service(settings)
    try:
        await svc.append(tenant, "ns", "a0", [pa.record_batch({"k": ["y"], "n": [2]})], partition=0)
    finally:
        svc.close()
    with Components.open(settings) as c:
        assert run_once(c, LocalRunner(c), "tier", changed=True).records == 1
        assert [(t.namespace, t.name) for t in changed_tables(c, "compact")] == [("ns", "a0")]
        compacted = run_once(c, LocalRunner(c), "compact", changed=True)
        assert compacted.ok and [r.table for r in compacted.tables] == ["ns.a0"]


def _evictions() -> float:
    """Partitions the disk hot tier closed past its bound so far (its own counter)."""
    return HOT_DISK_EVICTIONS._value.get()


def _hot_calls(probe: redis.Redis | None) -> float:
    """What the hot tier did so far that a look at a partition costs: Redis commands, or
    the disk tier's evictions (with the bound at its least, a look at a written partition
    not open reopens it and evicts another)."""
    return _redis_calls(probe) if probe is not None else _evictions()


async def test_storage_sampling_looks_only_at_tables_whose_storage_moved(
    settings_of: Any,
) -> None:
    """Metering's storage sample (and the hot-bytes quota) of a tenant with 2,000 idle
    tables and a few busy ones looks at the busy ones only: no hot-tier call for a table
    never written or unchanged since the last sample, and the sums stay exact."""
    settings, redis_server = settings_of
    if redis_server is None:
        values = settings.model_dump()
        values["hot"]["max_open_files"] = MIN_OPEN_FILES  # evictions show every reopen
        settings = Settings.explicit(**values)
    tenant = f"t{uuid.uuid4().hex[:8]}"
    written = [f"w{k}" for k in range(4)]
    svc = build_service(settings)
    try:
        for name in written:
            await svc.create_table(tenant, "ns", name, FIELDS, 4)
            for p in range(4):
                batch = pa.record_batch({"k": [f"{name}-{p}"], "n": [p]})
                await svc.append(tenant, "ns", name, [batch], partition=p)
        _bulk_tables(svc, tenant, IDLE)
    finally:
        svc.close()

    def exact(s: StreamTables, every: bool = False) -> int:
        """The hot bytes of the written tables (with ``every``, of all 2,004 tables: the
        idle ones hold none, and nothing here writes to them)."""
        return sum(
            s.hot.offsets(PartitionId(tenant, d.table_id, p)).size_bytes
            for d in s.meta.list_tables(tenant)
            if every or d.name in written
            for p in range(d.partitions)
        )

    probe = redis.Redis.from_url(redis_server.url) if redis_server is not None else None
    svc = build_service(settings)
    try:
        before = _hot_calls(probe)
        hot, cold = svc.storage_of(tenant)
        first = _hot_calls(probe) - before
        # The written tables' 16 partitions were looked at, none of the 8,000 idle ones.
        assert 0 < first <= 16 * 4 if probe is not None else first <= 16
        assert cold == 0  # nothing tiered yet
        assert hot == exact(svc, every=True) == exact(svc) > 0

        # Unchanged since: a sample again looks at no table at all.
        for _ in range(3):
            before = _hot_calls(probe)
            assert svc.storage_of(tenant) == (hot, 0)
            assert _hot_calls(probe) == before

        # An append (not yet recorded in the metadata store) is seen at once, and only
        # its table is looked at again.
        await svc.append(tenant, "ns", "w2", [pa.record_batch({"k": ["more"], "n": [9]})])
        before = _hot_calls(probe)
        grown, _ = svc.storage_of(tenant)
        assert 0 < _hot_calls(probe) - before <= 4 * 4 if probe is not None else True
        assert grown == exact(svc) > hot
    finally:
        svc.close()

    # Tiering moves the written tables' bytes to the lake: the next sample sees it.
    with Components.open(settings) as c:
        assert run_once(c, LocalRunner(c), "tier", changed=True).records == 17
    svc = build_service(settings)
    try:
        hot_after, cold_after = svc.storage_of(tenant)
        assert cold_after > 0 and hot_after == exact(svc)
        before = _hot_calls(probe)
        assert svc.storage_of(tenant) == (hot_after, cold_after)
        assert _hot_calls(probe) == before
    finally:
        svc.close()
        if probe is not None:
            probe.close()
