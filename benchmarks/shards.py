"""Hot-tier shards: what a partition move costs, and what rebalancing achieves.

On three redis-server shards of the run's own and the metadata store on SQLite, through
the Redis hot tier itself (``RedisHotLog``), since a move is an operator job, not a
request:

- **move time against the un-tiered backlog**: a partition holding ``backlog_mb`` MB is
  moved (seal, open, record; nothing copied). The baseline, in the same run, copies the
  same bytes to another Redis with redis-py (XRANGE then pipelined XADD), which is what a
  move that copies would at least cost; the forced drain's copy of the sealed segment
  (``shard drain --force``) is timed beside it.
- **append latency during moves**: one writer appending 64 KiB batches, steady, then while
  the partition moves back and forth every ``move_every_s``.
- **skewed workload**: one tenant's partitions all hot on one shard; the max/mean shard load
  before and after the rebalancing plan.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from benchmarks.harness import Bench
from benchmarks.loadgen import Result, Workload
from gateway.config import RedisShardConfig
from gateway.hot import PartitionId
from gateway.hot.redis import RedisHotLog, partition_keys
from gateway.lake.rebalance import Plan, partition_heat, plan_moves
from gateway.meta import MetadataStore
from tests.services import RedisServer

SHARDS = ("a", "b", "c")
CHUNK = 1 << 20


def _part(meta: MetadataStore, shards: tuple[str, ...], partitions: int = 1) -> list[PartitionId]:
    tenant = f"b{uuid.uuid4().hex[:8]}"
    meta.ensure_tenant(tenant)
    d = meta.create_table(
        tenant,
        "ns",
        f"t{uuid.uuid4().hex[:8]}",
        [{"name": "v", "type": "int64"}],
        partitions,
        (),
        shards,
    )
    return [PartitionId(tenant, d.table_id, p) for p in range(partitions)]


def _fill(hot: RedisHotLog, part: PartitionId, mb: int) -> None:
    payload = bytes(CHUNK)
    for i in range(mb):
        hot.append(part, payload, 1024, 1_000_000 + i)


def _copy(src: RedisServer, dst: RedisServer, part: PartitionId) -> float:
    """Copy the partition's stream to another Redis with redis-py; seconds taken."""
    log_key = partition_keys(part)[0]
    a, b = redis.Redis(port=src.port), redis.Redis(port=dst.port)
    started = time.perf_counter()
    try:
        cursor = "-"
        while True:
            entries = a.xrange(log_key, cursor, "+", count=64)
            if cursor != "-":
                entries = entries[1:]
            if not entries:
                break
            pipe = b.pipeline(transaction=False)
            for entry_id, fields in entries:
                pipe.xadd(log_key + ":copy", fields, id=entry_id)
            pipe.execute()
            cursor = entries[-1][0].decode()
        return time.perf_counter() - started
    finally:
        b.delete(log_key + ":copy")
        a.close()
        b.close()


def _moves(w: Workload, hot: RedisHotLog, meta: MetadataStore, servers: dict[str, RedisServer]):
    rows = []
    for mb in w.backlog_mb:
        (part,) = _part(meta, ("a",))
        _fill(hot, part, mb)
        started = time.perf_counter()
        hot.move(part, "b")
        took = time.perf_counter() - started
        copy = _copy(servers["a"], servers["c"], part)
        # The forced drain's fallback: the sealed segment copied off 'a' (to 'b').
        started = time.perf_counter()
        hot.copy_segment(part, 0, "b")
        forced = time.perf_counter() - started
        for system, secs in (
            (f"move, no copy, {mb} MB un-tiered", took),
            (f"copy with redis-py, {mb} MB (baseline)", copy),
            (f"forced copy of the sealed segment, {mb} MB (drain --force)", forced),
        ):
            r = Result(f"{w.name}-move", system, batches=1, records=mb * 1024, bytes=mb * CHUNK)
            r.seconds = secs
            r.extra = {"move_s": secs, "backlog_mb": mb, "no_traffic_ok": True}
            rows.append(r.summary())
        hot.drop(part)
    return rows


def _move_loop(
    hot: RedisHotLog, part: PartitionId, w: Workload, stop: threading.Event, done: list[str]
) -> None:
    """Move ``part`` round the shards every ``w.move_every_s`` until ``stop``."""
    while not stop.wait(w.move_every_s):
        target = SHARDS[(len(done) + 1) % len(SHARDS)]
        hot.move(part, target)
        done.append(target)


def _append_latency(w: Workload, hot: RedisHotLog, meta: MetadataStore) -> list[dict[str, Any]]:
    rows = []
    for label, moving in (("appends, steady (baseline)", False), ("appends during moves", True)):
        (part,) = _part(meta, ("a",))
        result = Result(f"{w.name}-append", label)
        stop = threading.Event()
        payload = bytes(64 * 1024)
        moves: list[str] = []
        thread = None
        if moving:
            thread = threading.Thread(target=_move_loop, args=(hot, part, w, stop, moves))
            thread.start()
        started = time.perf_counter()
        while time.perf_counter() - started < w.duration_s:
            t0 = time.perf_counter_ns()
            hot.append(part, payload, 655, time.time_ns() // 1000)
            result.ack.record_value(max(1, (time.perf_counter_ns() - t0) // 1000))
            result.batches += 1
            result.records += 655
            result.bytes += len(payload)
        result.seconds = time.perf_counter() - started
        stop.set()
        if thread:
            thread.join()
        result.extra = {"moves": len(moves)}
        rows.append(result.summary())
        hot.drop(part)
    return rows


def _skew(w: Workload, hot: RedisHotLog, meta: MetadataStore) -> list[dict[str, Any]]:
    hot_parts = _part(meta, ("a",), 6)
    quiet = _part(meta, SHARDS, 6)
    now = time.time_ns() // 1000
    for p in hot_parts:
        for i in range(20):
            hot.append(p, bytes(16 * 1024), 100, now + i)
    for p in quiet:
        for i in range(4):
            hot.append(p, bytes(4 * 1024), 25, now + i)
    tenants = {hot_parts[0].tenant, quiet[0].tenant}
    placements = [p for p in meta.placements() if p.tenant in tenants]
    heat = [partition_heat(hot, p, 60.0, now + 100) for p in placements]
    plan = plan_moves(heat, list(SHARDS), {}, band=1.25)
    r = Result(f"{w.name}-rebalance", "skewed tenant, max/mean shard load")
    r.extra = {
        "max_mean_before": Plan.ratio(plan.before, SHARDS),
        "max_mean_after": Plan.ratio(plan.after, SHARDS),
        "moves": len(plan.moves),
        "only_hot_tenant_moved": all(m.tenant == hot_parts[0].tenant for m in plan.moves),
        "no_traffic_ok": True,
    }
    for p in hot_parts + quiet:
        hot.drop(p)
    return [r.summary()]


def _run_sync(b: Bench, w: Workload) -> list[dict[str, Any]]:
    root: Path = b.workdir / "shards"
    servers = {n: RedisServer(root / n).start() for n in SHARDS}
    meta = MetadataStore(f"sqlite:///{root / 'meta.db'}")
    hot = RedisHotLog(shards=[RedisShardConfig(name=n, url=s.url) for n, s in servers.items()])
    hot.bind_placements(meta)
    try:
        return _moves(w, hot, meta, servers) + _append_latency(w, hot, meta) + _skew(w, hot, meta)
    finally:
        hot.close()
        meta.close()
        for s in servers.values():
            s.stop()


async def run(b: Bench, w: Workload) -> list[dict[str, Any]]:
    return await asyncio.to_thread(_run_sync, b, w)
