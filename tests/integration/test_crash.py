"""kill -9 during appends: nothing acknowledged is lost, nothing is torn or duplicated."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from gateway.wire.errors import TidegateError
from tests.integration.conftest import gateway_env
from tests.services import GatewayProcess, RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 3


def _hammer(
    gw: GatewayProcess,
    table: str,
    acks: list[tuple[int, int, int, int]],
    stop: threading.Event,
    ids: itertools.count[int],
) -> None:
    """Append batches with unique ids until the gateway dies; record what was acknowledged."""
    try:
        with gw.client(timeout=10) as c:
            while not stop.is_set():
                batch_id = next(ids)
                n = 1 + batch_id % 7
                rows = pa.table(
                    {
                        "batch": pa.array([batch_id] * n, pa.int64()),
                        "i": pa.array(range(n), pa.int64()),
                    }
                )
                (r,) = c.append(table, rows, partition=batch_id % PARTITIONS)
                acks.append((r.partition, r.base_offset, r.count, batch_id))
    except TidegateError:
        return  # the gateway is gone: stop writing


def _crash_and_verify(tmp_path: Path, env: dict[str, str], kill_extra: RedisServer | None) -> None:
    gw = GatewayProcess(tmp_path / "gw", env).start()
    table = "crash.events"
    with gw.client() as c:
        c.create_table(table, {"batch": "int64", "i": "int64"}, partitions=PARTITIONS)
    acks: list[tuple[int, int, int, int]] = []
    stop = threading.Event()
    ids = itertools.count()
    writers = [
        threading.Thread(target=_hammer, args=(gw, table, acks, stop, ids)) for _ in range(6)
    ]
    for w in writers:
        w.start()
    deadline = time.monotonic() + 30
    while len(acks) < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(acks) >= 300, f"writers made no progress: {gw.log()}"
    gw.kill()  # SIGKILL while appends are in flight
    if kill_extra is not None:
        kill_extra.kill()
        kill_extra.start()
    stop.set()
    for w in writers:
        w.join(30)
    attempted = next(ids)
    acknowledged = list(acks)

    gw2 = GatewayProcess(tmp_path / "gw", env, tenant=gw.tenant, api_key=gw.api_key)
    gw2.start()
    try:
        with gw2.client() as c:
            stored: dict[int, list[tuple[int, int, int]]] = {}
            for p in range(PARTITIONS):
                rows = c.read(table, partition=p, offset=0, max_records=1_000_000).to_pylist()
                assert [r["_offset"] for r in rows] == list(range(len(rows))), (
                    "offsets must stay dense"
                )
                stored[p] = [(r["_offset"], r["batch"], r["i"]) for r in rows]
            by_batch = Counter(b for rows in stored.values() for _, b, _ in rows)
            # Every acknowledged batch is there, at its acknowledged offsets, whole.
            for p, base, count, batch_id in acknowledged:
                got = stored[p][base : base + count]
                assert [(o, b, i) for o, b, i in got] == [
                    (base + i, batch_id, i) for i in range(count)
                ]
            # Every stored batch is whole and stored once: n rows, i = 0..n-1 in order.
            for batch_id, n in by_batch.items():
                assert n == 1 + batch_id % 7, f"batch {batch_id} is torn or duplicated"
            assert len(by_batch) >= len(acknowledged)
            assert len(by_batch) <= attempted
            # The log keeps working after recovery.
            (r,) = c.append(table, [{"batch": -1, "i": 0}], partition=0)
            assert r.base_offset == len(stored[0])
    finally:
        gw2.stop()


def test_kill_gateway_disk_tier(tmp_path: Path) -> None:
    _crash_and_verify(tmp_path, gateway_env("disk", None), None)


def test_kill_gateway_and_redis(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path / "redis").start()
    try:
        _crash_and_verify(tmp_path, gateway_env("redis", redis), redis)
    finally:
        redis.stop()


@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_idempotent_retry_across_restart(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    redis = request.getfixturevalue("redis_server") if kind == "redis" else None
    env = gateway_env(kind, redis)
    gw = GatewayProcess(tmp_path / "gw", env).start()
    table = f"idem{kind}.t"
    try:
        with gw.client() as c:
            c.create_table(table, {"v": "int64"}, partitions=2)
            first = [
                c.append(
                    table, [{"v": s}, {"v": s}], partition=1, producer_id="prod-a", sequence=s
                )[0]
                for s in range(5)
            ]
            assert [r.base_offset for r in first] == [0, 2, 4, 6, 8]
            again = c.append(
                table, [{"v": 4}, {"v": 4}], partition=1, producer_id="prod-a", sequence=4
            )[0]
            assert (again.base_offset, again.count, again.duplicate) == (8, 2, True)
        gw.kill()
        gw = GatewayProcess(tmp_path / "gw", env, tenant=gw.tenant, api_key=gw.api_key).start()
        with gw.client() as c:
            retried = c.append(
                table, [{"v": 4}, {"v": 4}], partition=1, producer_id="prod-a", sequence=4
            )[0]
            assert (retried.base_offset, retried.count, retried.duplicate) == (8, 2, True)
            nxt = c.append(table, [{"v": 5}], partition=1, producer_id="prod-a", sequence=5)[0]
            assert (nxt.base_offset, nxt.duplicate) == (10, False)
            from gateway.wire.errors import OutOfOrderSequence

            with pytest.raises(OutOfOrderSequence):
                c.append(table, [{"v": 7}], partition=1, producer_id="prod-a", sequence=7)
            values = c.read(table, partition=1, offset=0).column("v").to_pylist()
            assert values == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5]
    finally:
        gw.stop()
