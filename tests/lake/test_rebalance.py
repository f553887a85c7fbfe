"""Rebalancing hot-tier shards (issue 13): heat, the plan, its execution, draining.

Against four real redis-server shards, the metadata store on SQLite and a local catalog;
the heat is measured in this process, and once by Spark tasks (the same numbers).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Settings
from gateway.hot import PartitionId
from gateway.lake.components import Components
from gateway.lake.rebalance import (
    Heat,
    Move,
    Plan,
    measure_heat,
    partition_heat,
    plan_moves,
    run_plan,
)
from gateway.lake.shards import drain_shard, move_partition
from gateway.wire.errors import InvalidRequest
from tests.services import RedisServer

pytestmark = pytest.mark.integration

SHARDS = ("s1", "s2", "s3", "s4")
FIELDS = [{"name": "v", "type": "int64"}]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RedisServer]]:
    started = {n: RedisServer(tmp_path_factory.mktemp(f"rb-{n}")).start() for n in SHARDS}
    try:
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture
def c(servers: dict[str, RedisServer], tmp_path: Path) -> Iterator[Components]:
    settings = Settings.explicit(
        data_dir=tmp_path,
        hot={"type": "redis", "shards": [{"name": n, "url": s.url} for n, s in servers.items()]},
    )
    with Components.open(settings) as components:
        yield components


def table(
    c: Components, tenant: str, partitions: int, shards: tuple[str, ...] | None = None
) -> tuple[str, list[PartitionId]]:
    c.meta.ensure_tenant(tenant)
    name = f"t{uuid.uuid4().hex[:8]}"
    d = c.meta.create_table(
        tenant, "ns", name, FIELDS, partitions, (), shards or tuple(c.hot.shard_names())
    )
    return f"ns.{name}", [PartitionId(tenant, d.table_id, p) for p in range(partitions)]


def load(c: Components, part: PartitionId, batches: int, size: int, at_us: int = 0) -> None:
    """``batches`` batches of 10 records and ``size`` bytes, appended now (or at ``at_us``)."""
    for i in range(batches):
        c.hot.append(part, bytes(size), 10, (at_us or int(time.time() * 1e6)) + i)


def shard_of(c: Components, part: PartitionId) -> str:
    (p,) = [
        p
        for p in c.meta.placements(tenant=part.tenant)
        if (p.table_id, p.partition) == (part.table_id, part.partition)
    ]
    return p.shard


def shared_ratio(heat: list[Heat], pins: dict[str, str]) -> float:
    loads: dict[str, float] = {}
    for h in heat:
        loads[h.shard] = loads.get(h.shard, 0.0) + h.load
    return Plan.ratio(loads, [s for s in SHARDS if s not in pins])


def now_heat(c: Components) -> list[Heat]:
    return measure_heat(c, 3600.0)


def test_heat_counts_only_the_window(c: Components) -> None:
    _, (part,) = table(c, f"h{uuid.uuid4().hex[:8]}", 1)
    c.hot.append(part, bytes(100), 5, 1_000)  # long ago
    c.hot.append(part, bytes(300), 7, 2_000_000_000_000_000)
    c.hot.append(part, bytes(200), 3, 2_000_000_000_000_001)
    (p,) = c.meta.placements(tenant=part.tenant)
    h = partition_heat(c.hot, p, 10.0, 2_000_000_000_000_002)
    assert (h.bytes_per_s, h.records_per_s, h.hot_bytes) == (50.0, 1.0, 600)


def test_rebalance_a_hot_tenant_within_the_band(c: Components) -> None:
    hot_tenant, quiet, pinned = (f"{k}{uuid.uuid4().hex[:8]}" for k in "hqp")
    c.meta.ensure_tenant(pinned)
    c.meta.pin_shards(pinned, ["s4"])
    # The hot tenant's partitions all landed on s1; the quiet one is spread out.
    hot_name, hot_parts = table(c, hot_tenant, 6, ("s1",))
    _, quiet_parts = table(c, quiet, 6)
    _, pinned_parts = table(c, pinned, 2)
    assert {shard_of(c, p) for p in pinned_parts} == {"s4"}
    assert "s4" not in {shard_of(c, p) for p in quiet_parts}
    for part in hot_parts:
        load(c, part, 20, 4000)
    for part in quiet_parts:
        load(c, part, 4, 1000)
    for part in pinned_parts:
        load(c, part, 30, 4000)  # hot, but on its own shard: nobody else's business
    pins = c.meta.shard_pins()
    before = now_heat(c)
    assert shared_ratio(before, pins) > 1.25
    plan = plan_moves(before, c.hot.shard_names(), pins, band=1.25)
    # Only the hot tenant's partitions move (that suffices), never onto a reserved shard.
    assert plan.moves
    assert {m.tenant for m in plan.moves} == {hot_tenant}
    assert all(m.target != "s4" for m in plan.moves)
    assert len(plan.moves) < len(hot_parts)
    outcomes = run_plan(plan, lambda m: move_partition(c, m.tenant, m.table, m.partition, m.target))
    assert [o.state for o in outcomes] == ["done"] * len(plan.moves)
    after = now_heat(c)
    assert shared_ratio(after, pins) <= 1.25
    for p in c.meta.placements():
        if p.shard == "s4":
            assert p.tenant == pinned
    # A second run finds nothing to do.
    assert plan_moves(after, c.hot.shard_names(), pins, band=1.25).moves == []
    # And moving someone else onto a reserved shard is refused.
    with pytest.raises(InvalidRequest):
        move_partition(c, hot_tenant, hot_name, 0, "s4")


def test_drain_moves_everything_off_and_waits_for_tiered_segments(c: Components) -> None:
    tenant = f"d{uuid.uuid4().hex[:8]}"
    _, parts = table(c, tenant, 3, ("s3",))
    for part in parts:
        load(c, part, 3, 100)
    moves, left = drain_shard(c, "s3")
    assert len(moves) == 3 and {m.source for m in moves} == {"s3"}
    assert "s3" not in {m.target for m in moves}
    assert len({m.target for m in moves}) == 3  # spread over the others
    mine = {(p.table_id, p.partition) for p in left}
    assert {(p.table_id, p.partition) for p in parts} <= mine  # sealed segments still there
    for part in parts:  # tiering has moved them: trim drops them
        c.hot.trim(part, 30)
    _, left = drain_shard(c, "s3")
    assert not [p for p in left if p.tenant == tenant]


def test_one_tenants_failing_move_does_not_stop_anothers(c: Components) -> None:
    """A tenant whose table was dropped after planning fails its first move and skips its
    second; the other tenant's moves run all the same."""
    doomed, fine = (f"{k}{uuid.uuid4().hex[:8]}" for k in "xy")
    doomed_name, doomed_parts = table(c, doomed, 2, ("s1",))
    fine_name, fine_parts = table(c, fine, 2, ("s1",))
    plan = Plan(1.25, {}, {})
    for name, parts in ((doomed_name, doomed_parts), (fine_name, fine_parts)):
        for part in parts:
            plan.moves.append(Move(part.tenant, name, part.partition, "s1", "s2", 1.0))
    c.meta.drop_table(doomed, "ns", doomed_name.split(".")[1])
    outcomes = run_plan(
        plan,
        lambda m: move_partition(c, m.tenant, m.table, m.partition, m.target),
        parallel=1,  # one lane at a time: the doomed tenant's lane runs first
    )
    assert [o.state for o in outcomes] == ["failed", "skipped", "done", "done"]
    assert outcomes[0].error.startswith("TABLE_NOT_FOUND")
    assert outcomes[1].error.startswith("an earlier move failed: TABLE_NOT_FOUND")
    assert {shard_of(c, p) for p in fine_parts} == {"s2"}


@pytest.mark.spark
def test_spark_measures_the_same_heat(c: Components, spark: Any) -> None:
    from tiering.rebalance import SparkHeat

    _, parts = table(c, f"k{uuid.uuid4().hex[:8]}", 3)
    now_us = 1_000_000 * (10**9) + 100
    for n, part in enumerate(parts):
        load(c, part, n + 1, 500, now_us - 1000)
    placements = [p for p in c.meta.placements() if p.tenant == parts[0].tenant]
    local = [partition_heat(c.hot, p, 60.0, now_us) for p in placements]
    remote = SparkHeat(c.settings, spark, slices=2).measure(c, placements, 60.0, now_us)
    assert sorted(remote, key=lambda h: h.partition) == local
