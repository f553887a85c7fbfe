"""The write path of primary-key tables (issue 42) through the core, in process: what
resolving writes into a changelog costs against appending the same rows.

``python -m benchmarks.key_writes [--batches 200] [--rows 100] [--keys 20000]`` writes
``batches`` batches of ``rows`` rows (id int64, region string, v int64, note string) to
one partition of each hot tier (disk with ``fsync="batch"``, and a redis-server of its
own), through ``StreamTables.append``: to an append-only table, then to a key table
(keys drawn from ``keys`` ids, so most writes after the first pass update a live key:
``-U``/``+U``), then deletes of a batch of keys per batch; then ``get`` of 1 and of 100
keys (p50, p99) and a scan of the key table's current state. Prints rows per second
and latencies; the machine is whatever runs it, so compare figures of one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from gateway.config import Settings
from gateway.core import StreamTables
from gateway.lake.components import Components
from gateway.lake.tiering import tier_table
from gateway.server.app import build_service
from tests.services import RedisServer

FIELDS = [
    {"name": "id", "type": "int64"},
    {"name": "region", "type": "string"},
    {"name": "v", "type": "int64"},
    {"name": "note", "type": "string"},
]
SCHEMA = pa.schema(
    [("id", pa.int64()), ("region", pa.string()), ("v", pa.int64()), ("note", pa.string())]
)


def batch(rng: random.Random, rows: int, keys: int, step: int) -> pa.RecordBatch:
    ids = [rng.randrange(keys) for _ in range(rows)]
    return pa.record_batch(
        [ids, ["eu"] * rows, [step] * rows, [f"note-{step}-{i}" for i in ids]], schema=SCHEMA
    )


def percentiles(took: list[float]) -> str:
    took.sort()
    n = len(took)
    return f"p50 {took[n // 2] * 1000:.2f} ms, p99 {took[int(n * 0.99)] * 1000:.2f} ms"


async def run(svc: StreamTables, label: str, args: argparse.Namespace) -> None:
    rng = random.Random(1)
    plain, keyed = f"p{uuid.uuid4().hex[:8]}", f"k{uuid.uuid4().hex[:8]}"
    await svc.create_table("bench", "ns", plain, FIELDS, 1)
    await svc.create_table("bench", "ns", keyed, FIELDS, 1, primary_key=["id", "region"])
    data = [batch(rng, args.rows, args.keys, s) for s in range(args.batches)]
    for name, what in ((plain, "append-only"), (keyed, "key table upserts")):
        started = time.perf_counter()
        stored = 0
        for b in data:
            got = await svc.append("bench", "ns", name, [b])
            stored += sum(r.count for r in got)
        took = time.perf_counter() - started
        print(
            f"{label} {what}: {args.batches * args.rows / took:,.0f} rows/s "
            f"({stored:,} records stored for {args.batches * args.rows:,} rows)"
        )
    kinds = pa.array([3] * args.rows, pa.int8())
    started = time.perf_counter()
    for b in data[: args.batches // 4]:
        await svc.append("bench", "ns", keyed, [b.append_column("_change", kinds)])
    took = time.perf_counter() - started
    print(f"{label} key table deletes: {(args.batches // 4) * args.rows / took:,.0f} rows/s")
    for n in (1, 100):
        took_each: list[float] = []
        for _ in range(200):
            ids = [rng.randrange(args.keys) for _ in range(n)]
            keys = pa.table({"id": pa.array(ids, pa.int64()), "region": ["eu"] * n})
            started = time.perf_counter()
            await svc.get("bench", "ns", keyed, keys)
            took_each.append(time.perf_counter() - started)
        print(f"{label} get {n} key(s): {percentiles(took_each)}")
    started = time.perf_counter()
    result = await svc.scan("bench", "ns", keyed)
    rows = sum([b.num_rows async for b in result.batches])
    took = time.perf_counter() - started
    print(f"{label} scan of current state: {rows:,} live keys in {took:.3f} s")
    await lake(svc, label, args, plain, keyed, data)


async def lake(
    svc: StreamTables,
    label: str,
    args: argparse.Namespace,
    plain: str,
    keyed: str,
    data: list[pa.RecordBatch],
) -> None:
    """The lake half: tiering costs, and writes and lookups of keys held in Iceberg only."""
    assert svc.cold is not None
    c = Components(svc.settings, svc.meta, svc.hot, svc.cold)

    def tier(name: str, what: str) -> None:
        d = svc.meta.get_table("bench", "ns", name)
        started = time.perf_counter()
        r = tier_table(c, d)
        took = time.perf_counter() - started
        print(
            f"{label} tiering {what}: {r.records:,} records in {took:.3f} s "
            f"({r.records / took:,.0f} records/s)"
        )

    tier(plain, "the append-only table")
    tier(keyed, "the key table (changelog + state table)")
    rng = random.Random(2)
    again = data[: args.batches // 4]
    started = time.perf_counter()
    for b in again:
        await svc.append("bench", "ns", keyed, [b])
    took = time.perf_counter() - started
    print(
        f"{label} upserts of keys held in Iceberg only: {len(again) * args.rows / took:,.0f} rows/s"
    )
    tier(keyed, "those changes (copy-on-write of the files they touch)")
    for n in (1, 100):
        took_each: list[float] = []
        for _ in range(200):
            ids = [rng.randrange(args.keys) for _ in range(n)]
            keys = pa.table({"id": pa.array(ids, pa.int64()), "region": ["eu"] * n})
            started = time.perf_counter()
            await svc.get("bench", "ns", keyed, keys)
            took_each.append(time.perf_counter() - started)
        print(f"{label} get {n} key(s) held in Iceberg only: {percentiles(took_each)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--keys", type=int, default=20_000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tg-keywrites-"))
    redis_server = RedisServer(root / "redis").start()
    try:
        for label, hot in (
            ("disk", {"type": "disk", "fsync": "batch"}),
            ("redis", {"type": "redis", "url": redis_server.url}),
        ):
            hot_settings: dict[str, Any] = hot
            settings = Settings.explicit(
                data_dir=root / label,
                hot=hot_settings,
                tiering={"enabled": False, "hot_retention_s": 0},
            )
            svc = build_service(settings)
            try:
                asyncio.run(run(svc, label, args))
            finally:
                svc.close()
    finally:
        redis_server.stop()


if __name__ == "__main__":
    main()
