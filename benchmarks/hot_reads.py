"""What a hot read costs the gateway, in process, by the way its answer is built:

    python -m benchmarks.hot_reads [--reads 300] [--out FILE] [--read-at-only]

On each hot tier, a partition filled as the ``read-hot`` workload fills it (200,000 records
of 100 bytes in 1,000-record appends) is read in 10,000-record calls from spread offsets,
and each call's answer is built as an edge builds it: the gRPC ``Read`` as the SDK asks
(``raw_hot``: hot batches as stored), the gRPC ``Read`` without it and Flight's ``DoGet``
(each with the hot records decoded and encoded again, as before, or spliced into their
stored bytes, ``as_ipc``), Flight's readers drained as Flight drains them. It prints the
wall time and the process's CPU time per call (the CPU time holds on a loaded machine
better than the wall time does): the gateway's own work, without the network.

``--read-at-only`` times the Redis tier's ``read_at`` alone (the read script's round
trip), for batches as the gateway stores them and for incompressible 100 KB ones; it runs
on code older than the spliced reads too, so a checkout before a change can be measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.loadgen import BatchFactory, record_schema
from gateway.config import Settings
from gateway.core import ReadResult, StreamTables
from gateway.server.app import build_service
from gateway.wire.schema import fields_to_json
from tests.services import RedisServer

RECORDS, APPEND, READ = 200_000, 1_000, 10_000
TENANT = "bench"


def _flight(result: ReadResult) -> int:
    """Drain a Flight answer as Flight does: readers to their end, the last batch."""
    from gateway.server.flight.reads import _read_chunk  # (not in older checkouts)

    n = 0
    for item in _read_chunk(result, pa.py_buffer(b"{}")):
        if isinstance(item, pa.RecordBatchReader):
            n += sum(b.num_rows for b in item)
        else:
            n += item[0].num_rows
    return n


def _grpc(result: ReadResult) -> int:
    from gateway.server.grpc.service.reads import _read_messages

    msgs, _ = _read_messages(result)
    return sum(m.ByteSize() for m in msgs)


#: path -> (read keywords, what the edge does with the answer).
PATHS: dict[str, tuple[dict[str, bool], Callable[[ReadResult], int]]] = {
    "grpc raw_hot (the SDK)": ({"raw_hot": True}, _grpc),
    "grpc decoded": ({}, _grpc),
    "grpc spliced": ({"as_ipc": True}, _grpc),
    "flight decoded": ({}, _flight),
    "flight spliced": ({"as_ipc": True}, _flight),
}


async def _fill(svc: StreamTables) -> None:
    schema = record_schema()
    await svc.create_table(TENANT, "b", "t", fields_to_json(schema), 1)
    factory = BatchFactory(APPEND, 100)
    for i in range(RECORDS // APPEND):
        await svc.append(TENANT, "b", "t", [factory.batch(i)], partition=0)


async def _fill_and_measure(svc: StreamTables, reads: int) -> dict[str, dict[str, float]]:
    await _fill(svc)
    out: dict[str, dict[str, float]] = {}
    for path, (kw, edge) in PATHS.items():

        async def one(i: int, kw: dict[str, bool] = kw) -> ReadResult:
            offset = (i * READ + 17 * (i % 3)) % (RECORDS - READ)
            return await svc.read(TENANT, "b", "t", 0, offset, READ, None, **kw)

        await _loop(one, edge, 10)  # warm
        wall, cpu = time.perf_counter(), time.process_time()
        await _loop(one, edge, reads)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        out[path] = {
            "wall_ms_per_read": 1000 * wall / reads,
            "cpu_ms_per_read": 1000 * cpu / reads,
            "records_per_cpu_s": READ * reads / cpu,
        }
        print(f"  {path:24s} wall {out[path]['wall_ms_per_read']:6.2f} ms  "
              f"cpu {out[path]['cpu_ms_per_read']:6.2f} ms  "
              f"{out[path]['records_per_cpu_s'] / 1e6:6.2f} M records per CPU second")  # fmt: skip
    return out


async def _loop(
    one: Callable[[int], Awaitable[ReadResult]], edge: Callable[[ReadResult], int], n: int
) -> None:
    for i in range(n):
        edge(await one(i))


def run(reads: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for tier in ("disk", "redis"):
        work = Path(tempfile.mkdtemp(prefix="tg-hot-reads-"))
        redis = RedisServer(work / "redis").start() if tier == "redis" else None
        hot = {"type": "redis", "url": redis.url} if redis else {"type": "disk", "fsync": "batch"}
        svc = build_service(Settings.explicit(data_dir=work, hot=hot, cold={}))
        try:
            print(f"{tier} hot tier:")
            results[tier] = asyncio.run(_fill_and_measure(svc, reads))
        finally:
            svc.close()
            if redis is not None:
                redis.stop()
    return results


def read_at_only(reads: int) -> dict[str, float]:
    """Wall milliseconds per ``read_at`` of 10,000 records on the Redis tier."""
    from gateway.hot import PartitionId
    from gateway.hot.redis import RedisHotLog
    from gateway.wire.codec import encode_batch

    redis = RedisServer(Path(tempfile.mkdtemp(prefix="tg-read-at-")) / "redis").start()
    out: dict[str, float] = {}
    try:
        log = RedisHotLog(redis.url)
        factory = BatchFactory(APPEND, 100)
        shapes: dict[str, Callable[[int], bytes]] = {
            "stored read-hot batches (zstd)": lambda i: encode_batch(factory.batch(i)),
            "incompressible 100 KB batches": lambda i: bytes(range(256)) * 400,
        }
        for n, (name, payload) in enumerate(shapes.items()):
            part = PartitionId("bench", f"t{n}", 0)
            for i in range(RECORDS // APPEND):
                log.append(part, payload(i), APPEND, i)
            wall = time.perf_counter()
            for i in range(reads):
                log.read_at(part, (i * READ + 17) % (RECORDS - READ), READ, 64 << 20)
            out[name] = 1000 * (time.perf_counter() - wall) / reads
            print(f"  {name} ({len(payload(0))} bytes each): {out[name]:.2f} ms per read_at")
        log.close()
    finally:
        redis.stop()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hot_reads", description=__doc__)
    parser.add_argument("--reads", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--read-at-only", action="store_true")
    ns = parser.parse_args(argv)
    results: dict[str, Any] = read_at_only(ns.reads) if ns.read_at_only else run(ns.reads)
    if ns.out is not None:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
