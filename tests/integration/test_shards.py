"""Moving partitions between hot-tier shards under load, and crashes at every step of a
move (issue 13).

Real processes throughout: three redis-server shards, two gateway processes sharing one
metadata store and warehouse (one of them tiering on a short schedule), idempotent
producers and following consumers over gRPC, and a mover. The mover of the load test runs
in this process; the crash tests run it as a subprocess and SIGKILL it between steps.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import redis

from gateway.config import RedisShardConfig
from gateway.hot import PartitionId
from gateway.hot.redis import RedisHotLog, partition_keys
from gateway.meta import MetadataStore
from tests.services import REPO_ROOT, GatewayProcess, RedisServer

pytestmark = pytest.mark.integration

SHARDS = ("default", "b", "c")
PARTITIONS = 2


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[dict[str, RedisServer]]:
    started = {n: RedisServer(tmp_path / f"redis-{n}").start() for n in SHARDS}
    try:
        yield started
    finally:
        for server in started.values():
            server.stop()


def shard_env(shards: dict[str, RedisServer], tmp_path: Path, *, tiering: bool) -> dict[str, str]:
    env = {
        "TIDEGATE_HOT__TYPE": "redis",
        "TIDEGATE_HOT__SHARDS": json.dumps([{"name": n, "url": s.url} for n, s in shards.items()]),
        "TIDEGATE_METADATA__URL": f"sqlite:///{tmp_path / 'meta.db'}",
        "TIDEGATE_TIERING__ENABLED": "true" if tiering else "false",
        "TIDEGATE_TIERING__INTERVAL_S": "0.5",
        "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
    }
    return env


class Mover:
    """The operator's side, in this process: the metadata store and every shard."""

    def __init__(self, shards: dict[str, RedisServer], tmp_path: Path) -> None:
        self.meta = MetadataStore(f"sqlite:///{tmp_path / 'meta.db'}")
        self.hot = RedisHotLog(
            shards=[RedisShardConfig(name=n, url=s.url) for n, s in shards.items()]
        )
        self.hot.bind_placements(self.meta)

    def part(self, tenant: str, table: str, p: int) -> PartitionId:
        ns, name = table.split(".")
        return PartitionId(tenant, self.meta.get_table(tenant, ns, name).table_id, p)

    def segments(self, part: PartitionId) -> list[tuple[str, int, int | None]]:
        return [(s.shard, s.start, s.end) for s in self.hot.chain(part, refresh=True).segments]

    def close(self) -> None:
        self.hot.close()
        self.meta.close()


def follow(gw: GatewayProcess, table: str, want: int, out: dict[int, list[tuple[int, int, int]]]):
    """Follow every partition through ``gw`` until ``want`` records arrived in all."""
    with gw.client() as c, c.consumer(table, poll_interval=0.05, max_records=500) as consumer:
        deadline = time.monotonic() + 180
        got = 0
        while got < want and time.monotonic() < deadline:
            for batch in consumer.poll(timeout=1):
                for r in batch.to_pylist():
                    out.setdefault(r["_partition"], []).append((r["_offset"], r["w"], r["i"]))
                    got += 1


def produce(gw: GatewayProcess, table: str, writer: int, n: int, acks: list[Any]) -> None:
    with gw.client() as c, c.producer(table, batch_records=25, linger=0.005) as producer:
        futures: list[tuple[int, int, Future[Any]]] = []
        for i in range(n):
            p = i % PARTITIONS
            futures.append((p, i, producer.send({"w": writer, "i": i}, partition=p)))
            if i % 50 == 49:
                time.sleep(0.01)  # a steady stream, not one burst
        producer.flush()
        for p, i, fut in futures:
            meta = fut.result()
            assert meta.partition == p
            acks.append((p, meta.offset, writer, i))


def test_moves_under_load_lose_and_duplicate_nothing(
    shards: dict[str, RedisServer], tmp_path: Path
) -> None:
    data = tmp_path / "gw"
    gw1 = GatewayProcess(data, shard_env(shards, tmp_path, tiering=True)).start()
    gw2 = GatewayProcess(
        data, shard_env(shards, tmp_path, tiering=False), tenant=gw1.tenant, api_key=gw1.api_key
    ).start()
    mover = Mover(shards, tmp_path)
    table = "ld.ev"
    per_writer = 1500
    try:
        with gw1.client() as c:
            c.create_table(table, {"w": "int64", "i": "int64"}, partitions=PARTITIONS)
        parts = [mover.part(gw1.tenant, table, p) for p in range(PARTITIONS)]
        total = 2 * per_writer
        acks: list[Any] = []
        seen: list[dict[int, list[tuple[int, int, int]]]] = [{}, {}]
        threads = [
            threading.Thread(target=produce, args=(gw1, table, 1, per_writer, acks)),
            threading.Thread(target=produce, args=(gw2, table, 2, per_writer, acks)),
            threading.Thread(target=follow, args=(gw1, table, total, seen[0])),
            threading.Thread(target=follow, args=(gw2, table, total, seen[1])),
        ]
        for t in threads:
            t.start()
        # Back and forth while the producers run: each partition gets several seals.
        route = ["b", "c", "default", "b", "c"]
        moves = 0
        for target in route:
            time.sleep(0.4)
            for part in parts:
                if mover.hot.chain(part, refresh=True).active.shard != target:
                    mover.hot.move(part, target)
                    moves += 1
        for t in threads:
            t.join(240)
            assert not t.is_alive(), f"a client got stuck\n{gw1.log()}"
        assert moves >= 2 * (len(route) - 1)
        # Every acknowledged record exactly once, offsets dense, at the acknowledged offset.
        assert len(acks) == total
        assert len({(w, i) for _, _, w, i in acks}) == total
        by_offset = {(p, o): (w, i) for p, o, w, i in acks}
        assert len(by_offset) == total, "two records acknowledged at one offset"
        for p in range(PARTITIONS):
            offsets = sorted(o for q, o in by_offset if q == p)
            assert offsets == list(range(len(offsets))), "offsets must stay dense"
        for follower in seen:
            for p in range(PARTITIONS):
                rows = follower[p]
                assert [o for o, _, _ in rows] == list(range(len(rows))), "a follower saw a gap"
                assert {(p, o): (w, i) for o, w, i in rows} == {
                    k: v for k, v in by_offset.items() if k[0] == p
                }
        # Several sealed segments were made; tiering then drops them all.
        deadline = time.monotonic() + 90
        while any(len(mover.segments(part)) > 1 for part in parts):
            assert time.monotonic() < deadline, (
                f"sealed segments were never dropped: {[mover.segments(p) for p in parts]}"
            )
            time.sleep(0.3)
        for part in parts:
            assert mover.hot.chain(part).active.seq >= len(route) - 1
            for seq in range(mover.hot.chain(part).active.seq):
                for server in shards.values():
                    with redis.Redis(port=server.port) as raw:
                        assert not raw.exists(partition_keys(part, seq)[0])
        # And the whole log reads back, now from Iceberg, exactly as acknowledged.
        with gw2.client() as c:
            for p in range(PARTITIONS):
                rows = c.read(table, partition=p, offset=0, max_records=10 * total).to_pylist()
                assert {(p, r["_offset"]): (r["w"], r["i"]) for r in rows} == {
                    k: v for k, v in by_offset.items() if k[0] == p
                }
    finally:
        mover.close()
        gw2.stop()
        gw1.stop()


# Crashes ----------------------------------------------------------------------------------
#: A mover that runs the steps of one move, reports each on stdout and waits after the one
#: named ``stop_after``, where the test SIGKILLs it.
MOVER_SCRIPT = """
import json, sys, time
from gateway.config import RedisShardConfig
from gateway.hot import PartitionId
from gateway.hot.redis import RedisHotLog
from gateway.meta import MetadataStore
from gateway.hot.placement import Segment

cfg = json.loads(sys.argv[1])
meta = MetadataStore(cfg["meta"])
hot = RedisHotLog(shards=[RedisShardConfig(**s) for s in cfg["shards"]])
hot.bind_placements(meta)
part = PartitionId(*cfg["part"])
target = cfg["target"]

def step(name):
    print(name, flush=True)
    if name == cfg["stop_after"]:
        time.sleep(600)  # the test SIGKILLs us here

hot.begin_move(part, target)
step("intent")
chain = hot.chain(part, refresh=True)
end, producers = hot.seal(part, chain.active)
step("sealed")
hot.open_segment(part, chain.active.seq + 1, target, end, producers)
step("opened")
hot.finish_move(part)
step("recorded")
"""

STEPS = ["intent", "sealed", "opened", "recorded"]


def test_mover_killed_at_each_step(shards: dict[str, RedisServer], tmp_path: Path) -> None:
    """SIGKILL a mover right after each step of a move (one partition per step) while a
    producer appends to every partition through a gateway: the gateway (meeting the seal)
    or the next mover run finishes each move, and nothing is lost or doubled."""
    gw = GatewayProcess(tmp_path / "gw", shard_env(shards, tmp_path, tiering=False)).start()
    mover = Mover(shards, tmp_path)
    table = "cr.ev"
    per_part = 300
    try:
        with gw.client() as c:
            c.create_table(table, {"w": "int64", "i": "int64"}, partitions=len(STEPS))
        parts = [mover.part(gw.tenant, table, p) for p in range(len(STEPS))]
        sources = [mover.hot.chain(part).active.shard for part in parts]
        targets = [next(s for s in SHARDS if s != src) for src in sources]
        acks: list[Any] = []
        stop = threading.Event()
        writer = threading.Thread(
            target=produce_to, args=(gw, table, len(STEPS), per_part, acks, 0.05, stop)
        )
        writer.start()
        for part, target, step in zip(parts, targets, STEPS, strict=True):
            config = {
                "meta": f"sqlite:///{tmp_path / 'meta.db'}",
                "shards": [{"name": n, "url": s.url} for n, s in shards.items()],
                "part": [part.tenant, part.table_id, part.partition],
                "target": target,
                "stop_after": step,
            }
            proc = subprocess.Popen(
                [sys.executable, "-c", MOVER_SCRIPT, json.dumps(config)],
                cwd=str(REPO_ROOT),
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdout is not None
            with proc.stdout:
                while (line := proc.stdout.readline()) and line.strip() != step:
                    pass
                proc.kill()  # SIGKILL right after `step`
                proc.wait(10)
            assert line.strip() == step
        stop.set()  # the writer's last round meets every seal
        writer.join(240)
        assert not writer.is_alive(), gw.log()
        # The gateway finished the sealed moves itself when it met the seals...
        for part, step in zip(parts, STEPS, strict=True):
            _, segments, moving = mover.meta.chain(part.table_id, part.partition)
            assert (len(segments), moving is None) == (
                (1, False) if step == "intent" else (2, True)
            )
        # ...and the next mover run finishes what is left (the move recorded as an intent).
        for part in parts:
            mover.hot.finish_move(part)
        for part, source, target in zip(parts, sources, targets, strict=True):
            segments = mover.segments(part)
            assert mover.meta.chain(part.table_id, part.partition)[2] is None
            assert [s[0] for s in segments] == [source, target]
            assert segments[0][2] == segments[1][1]
        check_log(gw, table, acks, len(STEPS))
    finally:
        mover.close()
        gw.stop()


def produce_to(
    gw: GatewayProcess,
    table: str,
    partitions: int,
    n: int,
    acks: list[Any],
    pause: float,
    stop: threading.Event | None = None,
    first: int = 0,
) -> None:
    """At least ``n`` records to each partition, a few at a time, numbered from ``first``;
    with ``stop``, go on until it is set, then send one more round."""
    with gw.client() as c, c.producer(table, batch_records=10, linger=0.002) as producer:
        futures = []
        i = first
        while i < first + n or (stop is not None and not stop.is_set()):
            for p in range(partitions):
                futures.append((p, i, producer.send({"w": p, "i": i}, partition=p)))
            i += 1
            if i % 20 == 0:
                time.sleep(pause)
        for p in range(partitions):
            futures.append((p, i, producer.send({"w": p, "i": i}, partition=p)))
        producer.flush()
        for p, i, fut in futures:
            acks.append((p, fut.result().offset, p, i))


def check_log(gw: GatewayProcess, table: str, acks: list[Any], partitions: int) -> None:
    """Every partition holds exactly its acknowledged records, at their offsets, densely."""
    assert len({(w, i) for _, _, w, i in acks}) == len(acks)
    with gw.client() as c:
        for p in range(partitions):
            n = sum(1 for q, *_ in acks if q == p)
            rows = c.read(table, partition=p, offset=0, max_records=10 * n).to_pylist()
            assert [r["_offset"] for r in rows] == list(range(n)), "lost, doubled or gapped"
            assert {(p, r["_offset"]): (r["w"], r["i"]) for r in rows} == {
                (q, o): (w, i) for q, o, w, i in acks if q == p
            }


def test_shard_restarts_during_moves(shards: dict[str, RedisServer], tmp_path: Path) -> None:
    """kill -9 and restart of the source shard right after one move, of the target shard
    right after the next, then of the gateway, while a producer appends: no acknowledged
    record is lost or duplicated, and the placement stays consistent."""
    gw = GatewayProcess(tmp_path / "gw", shard_env(shards, tmp_path, tiering=False)).start()
    mover = Mover(shards, tmp_path)
    table = "rs.ev"
    try:
        with gw.client() as c:
            c.create_table(table, {"w": "int64", "i": "int64"}, partitions=1)
        part = mover.part(gw.tenant, table, 0)
        first = mover.hot.chain(part).active.shard
        second, third = (s for s in SHARDS if s != first)
        acks: list[Any] = []
        writer = threading.Thread(target=produce_to, args=(gw, table, 1, 800, acks, 0.03))
        writer.start()
        time.sleep(0.3)
        mover.hot.move(part, second)
        shards[first].restart()  # the source, holding the sealed segment
        time.sleep(0.3)
        mover.hot.move(part, third)
        shards[third].restart()  # the target, holding the new active segment
        time.sleep(0.2)
        gw.restart()
        writer.join(240)
        assert not writer.is_alive(), gw.log()
        segments = mover.segments(part)
        assert [s[0] for s in segments] == [first, second, third]
        assert segments[0][2] == segments[1][1] and segments[1][2] == segments[2][1]
        check_log(gw, table, acks, 1)
    finally:
        mover.close()
        gw.stop()


def test_admin_api_lists_placements_and_moves_a_partition(
    shards: dict[str, RedisServer], tmp_path: Path
) -> None:
    gw = GatewayProcess(tmp_path / "gw", shard_env(shards, tmp_path, tiering=False)).start()
    mover = Mover(shards, tmp_path)
    try:
        with gw.client() as c:
            c.create_table("adm.ev", {"w": "int64", "i": "int64"}, partitions=1)
            c.append("adm.ev", [{"w": 0, "i": i} for i in range(3)], partition=0)
        auth = {"authorization": f"Bearer {gw.operator_key}"}
        with gw.http_client(api_key=None, headers=auth) as h:
            listed = h.get("/v1/admin/placements", params={"tenant": gw.tenant}).json()
            assert listed["shards"] == list(SHARDS)
            (p,) = listed["placements"]
            source = p["shard"]
            target = next(s for s in SHARDS if s != source)
            moved = h.post(
                "/v1/admin/placements/move",
                json={"tenant": gw.tenant, "table": "adm.ev", "partition": 0, "target": target},
            )
            assert moved.status_code == 200, moved.text
            assert moved.json()["segments"] == [
                {"shard": source, "start": 0, "end": 3},
                {"shard": target, "start": 3, "end": None},
            ]
            # a shard reserved for another tenant is refused
            mover.meta.ensure_tenant("someone")
            mover.meta.pin_shards("someone", [source])
            refused = h.post(
                "/v1/admin/placements/move",
                json={"tenant": gw.tenant, "table": "adm.ev", "partition": 0, "target": source},
            )
            assert refused.status_code == 400
            assert "reserved for another tenant" in refused.text
            # a tenant key may not use the admin API
            with gw.http_client() as tenant_http:
                assert tenant_http.get("/v1/admin/placements").status_code == 403
        with gw.client() as c:
            (r,) = c.append("adm.ev", [{"w": 0, "i": 3}], partition=0)
            assert r.base_offset == 3
            rows = c.read("adm.ev", partition=0, offset=0).to_pylist()
            assert [x["i"] for x in rows] == [0, 1, 2, 3]
    finally:
        mover.close()
        gw.stop()


# Forced drain -----------------------------------------------------------------------------
#: ``drain_shard(force=True)`` with every copy batch small, printing and waiting (for the
#: SIGKILL) at ``stop_at``: "partial" (some batches copied, no meta yet), "staged" (copy
#: finished, chain not yet swapped) or "swapped" (chain swapped, source not yet tombstoned).
DRAIN_SCRIPT = """
import sys, time
import gateway.hot.redis.moves as moves
from gateway.config import Settings
from gateway.hot.redis.shard import Shard
from gateway.lake.components import Components
from gateway.lake.shards import drain_shard

stop_at = sys.argv[1]
moves.COPY_CHUNK = 2
original = Shard.call
copied = [0]

def step(name):
    print(name, flush=True)
    if name == stop_at:
        time.sleep(600)  # the test SIGKILLs us here

def call(self, what, fn, *, retry):
    if what.startswith("drop of") and " on " in what:
        step("swapped")
    out = original(self, what, fn, retry=retry)
    if what.startswith("copy of") and " to " in what:
        copied[0] += 1
        if copied[0] == 2:
            step("partial")
    return out

Shard.call = call
with Components.open(Settings()) as c:
    replace = c.meta.replace_chain

    def replace_chain(*args, **kwargs):
        if not args[4]:  # a copy's swap, not a move's
            step("staged")
        return replace(*args, **kwargs)

    c.meta.replace_chain = replace_chain
    drain_shard(c, "b", force=True)
print("finished", flush=True)
"""


def test_forced_drain_survives_sigkill_and_the_shard_going_away(
    shards: dict[str, RedisServer], tmp_path: Path
) -> None:
    """``drain b --force`` while a producer appends: SIGKILLed at each step of the copy of
    a sealed segment and run again, the chain is always the old one or the new one; once
    it completes, shard b is stopped for good and every acknowledged record still reads
    exactly once, at its offset, with its append time."""
    env = shard_env(shards, tmp_path, tiering=False)
    gw = GatewayProcess(tmp_path / "gw", env).start()
    mover = Mover(shards, tmp_path)
    table = "fd.ev"
    job_env = {k: v for k, v in gw.env().items() if k != "TIDEGATE_SERVER__GRPC_PORT"}
    try:
        with gw.client() as c:
            c.create_table(table, {"w": "int64", "i": "int64"}, partitions=2)
        parts = [mover.part(gw.tenant, table, p) for p in range(2)]
        # Partition 0 starts on 'default' and moves to 'b' (a sealed segment elsewhere, then
        # one on b); partition 1 appends to 'b' from the start.
        for part, first in zip(parts, ("default", "b"), strict=True):
            if mover.hot.chain(part, refresh=True).active.shard != first:
                mover.hot.move(part, first)
        acks: list[Any] = []
        produce_to(gw, table, 2, 30, acks, 0.0)
        mover.hot.move(parts[0], "b")
        produce_to(gw, table, 2, 30, acks, 0.0, first=100)
        with gw.client() as c:
            times = {
                (p, r["_offset"]): r["_timestamp"]
                for p in range(2)
                for r in c.read(table, partition=p, offset=0, max_records=1000).to_pylist()
            }
        stop = threading.Event()
        writer = threading.Thread(
            target=produce_to, args=(gw, table, 2, 50, acks, 0.02, stop, 1000), daemon=True
        )
        writer.start()
        for stop_at in ("partial", "staged", "swapped"):
            proc = subprocess.Popen(
                [sys.executable, "-c", DRAIN_SCRIPT, stop_at],
                cwd=str(REPO_ROOT),
                env=job_env,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdout is not None
            with proc.stdout:
                while (line := proc.stdout.readline()) and line.strip() != stop_at:
                    pass
                proc.kill()
                proc.wait(10)
            assert line.strip() == stop_at, f"the drain never reached {stop_at}"
            # The old chain or the new one: dense, every segment on a live shard's keys.
            for part in parts:
                segs = mover.segments(part)
                assert all(a[2] == b[1] for a, b in itertools.pairwise(segs)), segs
            with gw.client() as c:
                for p in range(2):
                    rows = c.read(table, partition=p, offset=0, max_records=10_000).to_pylist()
                    assert [r["_offset"] for r in rows] == list(range(len(rows)))
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "shard", "drain", "b", "--force"],
            cwd=str(REPO_ROOT),
            env=job_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "b is empty" in done.stdout
        assert mover.meta.placements(shard="b") == []
        shards["b"].stop()  # the failing shard is gone for good
        stop.set()
        writer.join(240)
        assert not writer.is_alive(), gw.log()
        check_log(gw, table, acks, 2)
        with gw.client() as c:
            for p in range(2):
                rows = c.read(table, partition=p, offset=0, max_records=1000).to_pylist()
                for r in rows:
                    if (p, r["_offset"]) in times:
                        assert r["_timestamp"] == times[(p, r["_offset"])]
        for part in parts:
            assert "b" not in {s[0] for s in mover.segments(part)}
    finally:
        mover.close()
        gw.stop()
