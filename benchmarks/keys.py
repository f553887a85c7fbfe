"""Primary-key tables against what a user would use instead, on the same gateway and the
same redis-server, in the same run (issue 42):

- **upserts**: ``versions`` passes over ``keys`` keys (each pass a new version of every key,
  in batches of ``batch_records`` rows sent one at a time by the sync SDK): to a key table,
  the same rows appended to an append-only table, and the same rows written with redis-py as
  one hash per key (``HSET`` of a batch in one pipeline);
- **point lookups**: ``get`` of 1 key and of 100 keys (p50/p99) against redis-py
  ``HGETALL`` of the same keys (one pipeline for 100);
- **scans**: the current state of the key table (``keys`` live keys made by ``versions``
  changes each) against a scan of an append-only table of ``keys`` rows.

- **the lake half** (the Redis gateway, whose tables a job beside it tiers): tiering the
  key table (its changelog, and the state table it applies it to) against tiering the
  append-only table of the same rows; then ``get`` of 1 and of 100 keys once the hot tier
  holds none of them (answered from the state table in Iceberg) against ``HGETALL``.

The first lookups are answered by the hot tier's key index (nothing is tiered yet).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import redis

from benchmarks.harness import Bench, compare
from benchmarks.loadgen import Result, Workload
from gateway.client import Client
from tests.services import GatewayProcess

SCHEMA = {"id": "int64", "region": "string", "v": "int64", "note": "string"}
#: Keys per lookup call, and the share of ``lookups`` calls made of that size.
LOOKUPS = {1: 1.0, 100: 1 / 6}


def _note_of(w: Workload) -> str:
    return "x" * max(1, w.record_bytes - 24)


def _passes(w: Workload) -> list[list[pa.RecordBatch]]:
    """``versions`` passes over the keys, each in shuffled batches of ``batch_records``."""
    rng = random.Random(42)
    note = _note_of(w)
    passes = []
    for version in range(w.versions):
        ids = list(range(w.keys))
        rng.shuffle(ids)
        passes.append(
            [
                pa.record_batch(
                    {
                        "id": pa.array(chunk, pa.int64()),
                        "region": ["eu"] * len(chunk),
                        "v": pa.array([version] * len(chunk), pa.int64()),
                        "note": [note] * len(chunk),
                    }
                )
                for chunk in (
                    ids[i : i + w.batch_records] for i in range(0, w.keys, w.batch_records)
                )
            ]
        )
    return passes


def _timed(result: Result, batches: list[pa.RecordBatch], write: Callable[[Any], Any]) -> None:
    started = time.perf_counter()
    for b in batches:
        sent = time.perf_counter()
        write(b)
        result.ack.record_value(max(1, int((time.perf_counter() - sent) * 1e6)))
        result.records += b.num_rows
        result.batches += 1
        result.bytes += b.nbytes
    result.seconds = time.perf_counter() - started


def _hset(r: redis.Redis, prefix: str) -> Callable[[pa.RecordBatch], None]:
    def write(b: pa.RecordBatch) -> None:
        pipe = r.pipeline(transaction=False)
        for row in b.to_pylist():
            pipe.hset(
                f"{prefix}:{row['id']}:{row['region']}",
                mapping={"v": row["v"], "note": row["note"]},
            )
        pipe.execute()

    return write


def _redis_rows(w: Workload, url: str, passes: list[list[pa.RecordBatch]]) -> list[Result]:
    """The baselines: HSET of every row, then HGETALL lookups."""
    prefix = f"bench-keys-{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(url)
    try:
        upserts = Result(f"{w.name}-upserts", "redis-py HSET, a hash per key (baseline)")
        _timed(upserts, [b for p in passes for b in p], _hset(r, prefix))
        lookups = []
        for size, share in LOOKUPS.items():
            count = max(1, int(w.lookups * share))
            res = Result(f"{w.name}-get-{size}", f"redis-py HGETALL of {size} key(s) (baseline)")
            rng = random.Random(size)

            def get(ids: list[int], res: Result = res) -> None:
                pipe = r.pipeline(transaction=False)
                for i in ids:
                    pipe.hgetall(f"{prefix}:{i}:eu")
                found = sum(1 for h in pipe.execute() if h)
                res.records += found

            _lookups(res, count, lambda n=size, rng=rng: rng.sample(range(w.keys), n), get)
            lookups.append(res)
        return [upserts, *lookups]
    finally:
        for keys in _chunks(list(r.scan_iter(f"{prefix}:*", count=10_000)), 10_000):
            r.delete(*keys)
        r.close()


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _lookups(
    res: Result, count: int, draw: Callable[[], list[int]], get: Callable[[list[int]], None]
) -> None:
    started = time.perf_counter()
    for _ in range(count):
        ids = draw()
        sent = time.perf_counter()
        get(ids)
        res.ack.record_value(max(1, int((time.perf_counter() - sent) * 1e6)))
        res.batches += 1
    res.seconds = time.perf_counter() - started


def _gets(client: Client, keyed: str, w: Workload, suffix: str, where: str) -> dict[str, Result]:
    """``get`` of 1 and of 100 random keys of ``keyed``, ``w.lookups`` calls in all."""
    out: dict[str, Result] = {}
    for size, share in LOOKUPS.items():
        res = Result(f"{w.name}-get-{size}{suffix}", f"tidegate get of {size} key(s) {where}")
        rng = random.Random(size)

        def get(ids: list[int], res: Result = res) -> None:
            keys = pa.table({"id": pa.array(ids, pa.int64()), "region": ["eu"] * len(ids)})
            res.records += client.get(keyed, keys).num_rows

        count = max(1, int(w.lookups * share))
        _lookups(res, count, lambda n=size, rng=rng: rng.sample(range(w.keys), n), get)
        out[f"get-{size}"] = res
    return out


def _scan(client: Client, table: str, rows: int, system: str, name: str) -> Result:
    """The median of three full scans of ``table`` (each must return ``rows`` rows)."""
    res = Result(name, system)
    took = []
    for _ in range(3):
        sent = time.perf_counter()
        got = client.scan(table, mode="server").num_rows
        took.append(time.perf_counter() - sent)
        res.ack.record_value(max(1, int(took[-1] * 1e6)))
        if got != rows:
            res.errors += 1
    res.seconds = statistics.median(took)
    res.records, res.batches = rows, 1
    return res


def _tidegate_rows(
    gw: GatewayProcess, w: Workload, hot: str, passes: list[list[pa.RecordBatch]]
) -> dict[str, Result]:
    ns = f"bench{uuid.uuid4().hex[:8]}"
    keyed, plain, single = f"{ns}.keyed", f"{ns}.plain", f"{ns}.single"
    out: dict[str, Result] = {}
    with Client(gw.grpc_target, api_key=gw.api_key) as client:
        client.create_table(keyed, SCHEMA, partitions=w.partitions, primary_key=["id", "region"])
        client.create_table(plain, SCHEMA, partitions=w.partitions, key_columns=["id", "region"])
        client.create_table(single, SCHEMA, partitions=w.partitions, key_columns=["id", "region"])
        every = [b for p in passes for b in p]
        for table, what in ((plain, "append-only table"), (keyed, "key table upserts")):
            res = Result(f"{w.name}-upserts", f"tidegate {what} ({hot} hot tier)")
            _timed(res, every, lambda b, t=table: client.append(t, b))
            out[what] = res
        for b in passes[0]:  # a table of `keys` rows, for the scan's baseline
            client.append(single, b)
        out.update(_gets(client, keyed, w, "", f"({hot} hot tier)"))
        out["scan-plain"] = _scan(
            client, single, w.keys, f"tidegate scan of {w.keys:,} rows, append-only ({hot} hot "
            "tier)", f"{w.name}-scan",
        )  # fmt: skip
        out["scan-keyed"] = _scan(
            client, keyed, w.keys, f"tidegate scan of {w.keys:,} keys x {w.versions} versions "
            f"({hot} hot tier)", f"{w.name}-scan",
        )  # fmt: skip
        for table in (keyed, plain, single):
            client.drop_table(table)
    return out


def _lake_rows(b: Bench, w: Workload, passes: list[list[pa.RecordBatch]]) -> dict[str, Result]:
    """Tiering a key table against an append-only one of the same rows, then lookups of
    keys the hot tier no longer holds, on the Redis gateway (tiered here, as a job beside
    it would, with no hot retention: each tiering trims what it moved)."""
    from gateway.lake.tiering import tier_table

    gw = b.tiered
    ns = f"bench{uuid.uuid4().hex[:8]}"
    keyed, plain = f"{ns}.keyed", f"{ns}.plain"
    out: dict[str, Result] = {}
    with Client(gw.grpc_target, api_key=gw.api_key) as client:
        client.create_table(keyed, SCHEMA, partitions=w.partitions, primary_key=["id", "region"])
        client.create_table(plain, SCHEMA, partitions=w.partitions, key_columns=["id", "region"])
        written = 0
        for b_ in (b_ for p in passes for b_ in p):
            client.append(keyed, b_)
            client.append(plain, b_)
            written += b_.num_rows
        with b.components(hot_retention_s=0) as c:
            for table, what in ((plain, "append-only table"), (keyed, "key table")):
                res = Result(f"{w.name}-tiering", f"tidegate tiering of the {what} (redis)")
                started = time.perf_counter()
                moved = tier_table(c, c.meta.get_table(gw.tenant, *table.split(".")))
                res.seconds = time.perf_counter() - started
                # Per row written (the key table's changelog holds more records: an
                # update is two), so the ratio is one of times.
                assert moved.records >= written, (table, moved.records, written)
                res.records, res.batches = written, 1
                res.ack.record_value(max(1, int(res.seconds * 1e6)))
                out[f"tier-{what}"] = res
        info = client.describe_table(keyed).partition_info
        if any(p.hot_bytes for p in info):
            raise AssertionError(f"the hot tier still holds changes of {keyed}: {info}")
        out.update(_gets(client, keyed, w, "-cold", "in Iceberg only (redis)"))
        for table in (keyed, plain):
            client.drop_table(table)
    return out


async def run(b: Bench, w: Workload) -> list[dict[str, Any]]:
    passes = _passes(w)
    hset, *hget = (
        r.summary() for r in await asyncio.to_thread(_redis_rows, w, b.redis.url, passes)
    )
    rows: list[dict[str, Any]] = [hset, *hget]
    for hot, gw in b.gateways.items():
        got = await asyncio.to_thread(_tidegate_rows, gw, w, hot, passes)
        plain = compare(got["append-only table"].summary(), [hset])
        rows += [plain, compare(got["key table upserts"].summary(), [plain, hset])]
        rows += [compare(got[f"get-{n}"].summary(), [hget[i]]) for i, n in enumerate(LOOKUPS)]
        scan_plain = got["scan-plain"].summary()
        rows += [scan_plain, compare(got["scan-keyed"].summary(), [scan_plain])]
    lake = await asyncio.to_thread(_lake_rows, b, w, passes)
    tier_plain = lake["tier-append-only table"].summary()
    rows += [tier_plain, compare(lake["tier-key table"].summary(), [tier_plain])]
    rows += [compare(lake[f"get-{n}"].summary(), [hget[i]]) for i, n in enumerate(LOOKUPS)]
    return rows
