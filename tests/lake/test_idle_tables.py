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

from gateway.core import StreamTables
from gateway.hot.disk import DiskHotLog
from gateway.lake.components import Components
from gateway.lake.runners import LocalRunner
from gateway.lake.scheduler import changed_tables, run_once
from gateway.meta.models import PartitionRecord, TableRecord, Tenant, utcnow
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
    with Session(svc.meta.engine) as session, session.begin():
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
