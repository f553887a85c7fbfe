"""The hot tiers' key index alone (issue 42): what keys cost an append, what a lookup
costs, and what opening a disk partition costs with and without its checkpoint.

``python -m benchmarks.hot_keyindex [--batches 1000] [--rows 100]`` appends ``batches``
batches of ``rows`` rows (40 bytes each) to a partition of each hot tier (disk with
``fsync="batch"``, and a redis-server of its own), once without keys and once with a
13-byte key per row (over 200,000 distinct keys); then asks ``latest_offsets`` for 1 key
and for 1000 keys (p50, p99), with redis-py ``HMGET`` of the same 1000 fields on the same
hash as the Redis baseline; then opens the disk partition again from its ``keys.idx``
checkpoint and without it (a rebuild from the log). Prints the figures; the machine is
whatever runs it, so compare figures of one run only.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis

from gateway.hot import HotLog, PartitionId
from gateway.hot.disk import DiskHotLog
from gateway.hot.disk.keyindex import KEYS_FILE
from gateway.hot.redis import RedisHotLog
from gateway.hot.redis.scripts import segment_keys
from tests.services import RedisServer


def keys_of(batch: int, rows: int) -> list[bytes]:
    return [f"user-{(batch * rows + i) * 7919 % 200_000:08d}".encode() for i in range(rows)]


ASKED = [f"user-{i * 13 % 200_000:08d}".encode() for i in range(1000)]


def percentiles(fn: Callable[[], object], n: int) -> str:
    took = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        took.append(time.perf_counter() - started)
    took.sort()
    return f"p50 {took[n // 2] * 1000:.3f} ms, p99 {took[int(n * 0.99)] * 1000:.3f} ms"


def appends(log: HotLog, label: str, batches: int, rows: int) -> PartitionId:
    """Append plain, then keyed; returns the keyed partition."""
    payload = os.urandom(rows * 40)
    part = PartitionId("bench", uuid.uuid4().hex, 0)
    for keyed in (False, True):
        part = PartitionId("bench", uuid.uuid4().hex, 0)
        started = time.perf_counter()
        for b in range(batches):
            log.append(part, payload, rows, 0, keys=keys_of(b, rows) if keyed else None)
        took = time.perf_counter() - started
        kind = "keyed" if keyed else "plain"
        print(f"{label} append {kind}: {batches * rows / took:,.0f} rows/s")
    one = percentiles(lambda: log.latest_offsets(part, ASKED[:1]), 300)
    print(f"{label} latest_offsets 1 key: {one}")
    many = percentiles(lambda: log.latest_offsets(part, ASKED), 60)
    print(f"{label} latest_offsets 1000 keys: {many}")
    return part


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=100)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tg-keyindex-"))

    disk = DiskHotLog(root / "hot", fsync="batch")
    part = appends(disk, "disk", args.batches, args.rows)
    disk.close()
    folder = root / "hot" / part.tenant / part.table_id / "0"
    for label in ("from keys.idx", "rebuilt from the log"):
        if label.startswith("rebuilt"):
            (folder / KEYS_FILE).unlink()
        disk = DiskHotLog(root / "hot", fsync="batch")
        started = time.perf_counter()
        n = disk.key_count(part)  # the first use opens the partition
        print(f"disk open {label}: {(time.perf_counter() - started) * 1000:.0f} ms, {n} keys")
        disk.close()

    server = RedisServer(root / "redis").start()
    try:
        hot = RedisHotLog(server.url)
        part = appends(hot, "redis", args.batches, args.rows)
        raw = redis.Redis.from_url(server.url)
        index = segment_keys(part)[2]
        baseline = percentiles(lambda: raw.hmget(index, ASKED), 60)
        print(f"redis HMGET 1000 fields (baseline): {baseline}")
        raw.close()
        hot.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
